"""A hierarchical MoE dispatch that loses a row on the first tier: rank 2 (node 1's
forwarder for rank 0's tokens at --ranks-per-node 2) zeroes the payload of the first row
that reached it, before forwarding. The check must fail at the destinations."""
from commbench.benchmarks.base import register
from commbench.benchmarks.moe import MoE
from commbench.benchmarks.moe.host import _no_lap


@register
class MoEHierDropForwarded(MoE):
    name = "moe_hier_drop_forwarded"

    def dispatch(self, comm, b, lap=_no_lap):
        stages = []

        def after_stage():
            stages.append(1)
            st = b.state
            if len(stages) == 4 and comm.rank == 2 and st.n_recv1:  # after a2a_out
                st.pool[st.num_tokens, :st.rb_d] = 0  # ids kept: the row is still routed
            lap()
        super().dispatch(comm, b, after_stage)
