"""Faults inside the jax backend's compiled programs, which the exact checks must catch:

  all_gather_jax_drop    rank 1's element 0 is zeroed before the all_gather, inside the
                         program (an element that never arrived)
  all_reduce_jax_corrupt rank 1 adds 1 to element 0 of the psum result, inside the program
  moe_jax_emulated_drop_row
                         rank 1 loses the first row it received in the dispatch (the MoE
                         engine driven through jax_ragged_plugin's exchange)
"""
import numpy as np
from jax_ragged_plugin import MoEJaxEmulated

from commbench.benchmarks.base import register
from commbench.benchmarks.collectives import AllGather, AllReduce
from commbench.benchmarks.moe.host import _no_lap


def _on_rank_1_first(x, value):
    """x with element 0 replaced by value(x[0]) on rank 1 of the mesh (inside shard_map)."""
    import jax

    from commbench.backends.jax_dist import AXIS

    jnp = jax.numpy
    hit = (jax.lax.axis_index(AXIS) == 1) & (jnp.arange(x.shape[0]) == 0)
    return jnp.where(hit, value(x), x)


@register
class AllGatherJaxDrop(AllGather):
    name = "all_gather_jax_drop"

    def op(self, comm, b):
        from commbench.backends.jax_dist import AXIS, JaxOp

        lax = comm.jax.lax
        return JaxOp(comm, "all_gather", lambda x: lax.all_gather(_on_rank_1_first(x, lambda v: v * 0), AXIS,
                                                                  tiled=True), b.send, b.recv)


@register
class AllReduceJaxCorrupt(AllReduce):
    name = "all_reduce_jax_corrupt"

    def op(self, comm, b):
        from commbench.backends.jax_dist import AXIS, JaxOp

        lax = comm.jax.lax
        src = b.recv if self.placement(comm, b.point) == "in-place" else b.send
        return JaxOp(comm, "psum", lambda x: _on_rank_1_first(lax.psum(x, AXIS), lambda v: v + 1), src, b.recv)


@register
class MoEJaxEmulatedDropRow(MoEJaxEmulated):
    name = "moe_jax_emulated_drop_row"

    def dispatch(self, comm, b, lap=_no_lap):
        super().dispatch(comm, b, lap)
        if comm.rank == 1:
            st, eng = b.state, b.path.engine
            key = "expert_in" if st.copies == "expert" else "recv_d"
            rows = np.array(eng.local(st.arrays[key]))
            rows[0] = 0
            st.arrays[key] = eng.to_global(rows[None])
