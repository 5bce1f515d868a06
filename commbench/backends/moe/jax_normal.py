"""The MoE dispatch/combine engine of the jax backend: rows move by
jax.lax.ragged_all_to_all, the primitive JAX's MoE layers use, with no host sync: the
offsets and sizes it takes are device arrays.

Every stage is one compiled shard_map program over the world's mesh (so every rank runs the
same programs in the same order), followed by block_until_ready so the host clock brackets
it. Arrays are global with one block per rank: a rank's (1, ...) slice is its own. Row
buffers have static shapes, so they are sized to the most any rank sends (N_SEND) or
receives (N_RECV), from the host's regenerated layout; only the first sum(sizes) rows of a
rank's buffer hold rows, and the programs mask the rest.

  dispatch: layout (destination ranks and send order from the routing: one stable sort),
            counts (all_gather of every rank's counts per (destination, local expert), and
            from them the offsets ragged_all_to_all takes: where a rank's rows start in its
            send buffer and land in each receiver's), pack (rows into send order), a2a (the
            ragged_all_to_all), unpack (expert copies: rows regrouped by local expert)
  combine:  pack (expert copies: back to arrival order), a2a (the reverse
            ragged_all_to_all), reduce (bf16 rows to fp32, weighted for expert copies, summed
            into their tokens)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class JaxMoEState:
    """One rank's arrays (global, one block per rank) and the point's shape."""

    copies: str
    world: int
    rank: int
    num_experts: int
    num_tokens: int
    hidden: int
    rb_d: int
    rb_c: int
    n_send: int
    n_recv: int
    programs: dict
    compile_ms: float
    arrays: dict = field(default_factory=dict)
    cpu_threads: int | None = None  # XLA's own thread pool: not set per point

    @property
    def local(self) -> int:
        return self.num_experts // self.world if self.copies == "expert" else 1


class JaxMoE:
    """setup() compiles the stage programs once per point; dispatch(st, lap) and
    combine(st, lap) run them; counts_received(), received() and combined() give this
    rank's results as numpy for the checks. `ragged` is the exchange
    (jax.lax.ragged_all_to_all unless replaced: the tests' emulation on XLA:CPU)."""

    name = "jax"
    dispatch_stages = ("layout", "counts", "pack", "a2a", "unpack")
    combine_stages = ("pack", "a2a", "reduce")

    def __init__(self, comm):
        self.comm = comm
        self.jax = comm.jax
        self.ragged = None

    @property
    def exchange(self) -> str:
        return "jax.lax.ragged_all_to_all" if self.ragged is None else getattr(self.ragged, "__name__", "replaced")

    @property
    def method(self) -> str:
        return f"take on the device, {self.exchange} with device offsets (no host sync)"

    # --- arrays ------------------------------------------------------------------------
    def to_global(self, local: np.ndarray):
        """This rank's block (1, ...) as a global array over the world's mesh."""
        jax, comm = self.jax, self.comm
        local = np.ascontiguousarray(local)
        shape = (comm.size,) + local.shape[1:]
        return jax.make_array_from_single_device_arrays(
            shape, comm.sharding(comm.mesh(comm.ranks)), [jax.device_put(local, comm.local_device)])

    @staticmethod
    def local(arr) -> np.ndarray:
        return np.asarray(arr.addressable_shards[0].data)[0]

    # --- setup (untimed) ---------------------------------------------------------------
    def setup(self, topk: np.ndarray, weights: np.ndarray, x_rows: np.ndarray, num_experts: int, copies: str,
              hidden: int, n_send: int, n_recv: int, answer) -> JaxMoEState:
        """x_rows (T, rb_d) uint8: the token rows to dispatch. answer(src, token): the
        identity experts' value for a row (jnp operations), carried back in bf16."""
        comm, jax = self.comm, self.jax
        world, T, K = comm.size, int(topk.shape[0]), int(topk.shape[1])
        most = comm.max_over_ranks(np.array([n_send, n_recv], dtype=np.float64))
        n_send_max, n_recv_max = max(1, int(most[0])), max(1, int(most[1]))
        rb_d, rb_c = int(x_rows.shape[1]), 2 * hidden
        local_c = num_experts // world if copies == "expert" else 1
        progs = self._programs(world, T, K, num_experts, copies, hidden, rb_d, rb_c, local_c, n_send_max,
                               n_recv_max, answer)
        st = JaxMoEState(copies, world, comm.rank, num_experts, T, hidden, rb_d, rb_c, n_send, n_recv, {}, 0.0)
        st.arrays.update(topk=self.to_global(topk.astype(np.int32)[None]),
                         weights=self.to_global(weights.astype(np.float32)[None]),
                         x=self.to_global(x_rows[None]))
        # Compile every stage now, on abstract arrays of the shapes each will see (the
        # outputs of the stages before it): the point's compile time, outside every sample.
        t0 = time.perf_counter()
        abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in st.arrays.items()}
        for name, (fn, ins, outs) in progs.items():
            lowered = fn.lower(*[abstract[i] for i in ins])
            st.programs[name] = (lowered.compile(), ins, outs)
            for key, o in zip(outs, jax.tree_util.tree_leaves(lowered.out_info)):
                abstract[key] = jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding)
        st.compile_ms = (time.perf_counter() - t0) * 1e3
        return st

    def _programs(self, world, T, K, E, copies, H, rb_d, rb_c, local_c, NS, NR, answer) -> dict:
        """name -> (jitted shard_map program, input names, output names), in the order they
        run. Per-device functions see their rank's block with its leading axis of 1."""
        jax = self.jax
        lax, jnp = jax.lax, jax.numpy
        mesh = self.comm.mesh(self.comm.ranks)
        axis = mesh.axis_names[0]

        expert = copies == "expert"
        per_rank = E // world  # experts a rank hosts
        ragged = self.ragged or lax.ragged_all_to_all

        def excl(v):
            return jnp.cumsum(v) - v

        def layout(topk, weights):
            flat = topk[0].reshape(-1)
            if expert:
                # Megatron's permute: rows ordered (expert, token), so grouped by rank too.
                order = jnp.argsort(flat, stable=True)
                counts = jnp.bincount(flat, length=E).astype(jnp.int32)
                send = counts.reshape(world, per_rank).sum(axis=1)
                w = weights[0].reshape(-1)[order]
            else:
                # One row per (token, destination rank): each token's destinations sorted,
                # repeats keyed `world` so one stable sort puts them last.
                dest = jnp.sort(topk[0] // per_rank, axis=1)
                first = jnp.concatenate([jnp.ones((T, 1), bool), dest[:, 1:] != dest[:, :-1]], axis=1)
                key = jnp.where(first, dest, world).reshape(-1)
                order = jnp.argsort(key, stable=True)
                send = counts = jnp.bincount(key, length=world + 1)[:world].astype(jnp.int32)
                w = jnp.ones(T * K, jnp.float32)
            return ((order // K).astype(jnp.int32)[None], w[None], send[None], counts[None])

        def counts(c):
            m = lax.all_gather(c[0], axis)                      # [source, destination x local]
            me = lax.axis_index(axis)
            rows = m.reshape(world, world, local_c).sum(axis=2)  # rows [source, destination]
            mine = lax.dynamic_slice_in_dim(m, me * local_c, local_c, axis=1)
            in_off = excl(rows[me])                              # my rows for d start here
            out_off = (jnp.cumsum(rows, axis=0) - rows)[me]      # and land here in d's buffer
            recv = rows[:, me]
            c_in_off = excl(recv)                                # combine: the reverse
            c_out_off = (jnp.cumsum(rows, axis=1) - rows)[:, me]
            return tuple(v[None].astype(jnp.int32) for v in (mine, in_off, out_off, recv, c_in_off, c_out_off))

        def pack(x, order):
            return (jnp.take(x[0], order[0, :NS], axis=0, mode="clip")[None],)

        def a2a(send, in_off, sizes, out_off, recv_sizes):
            out = jnp.zeros((NR, rb_d), jnp.uint8)
            return (ragged(send[0], out, in_off[0], sizes[0], out_off[0], recv_sizes[0], axis_name=axis)[None],)

        def unpack(recv, counts_recv):
            # Arrivals are ordered (source, local expert); the order the experts hold them
            # is (local expert, source): grouped[j] = arrived[perm[j]].
            lens = counts_recv[0].reshape(-1)
            starts = (jnp.cumsum(lens) - lens).reshape(world, local_c).T.reshape(-1)
            lens_t = counts_recv[0].T.reshape(-1)
            base = jnp.repeat(starts - excl(lens_t), lens_t, total_repeat_length=NR)
            perm = (base + jnp.arange(NR)).astype(jnp.int32)
            return perm[None], jnp.take(recv[0], perm, axis=0, mode="clip")[None]

        def experts(rows):
            hdr = lax.bitcast_convert_type(rows[0, :, :8].reshape(NR, 2, 4), jnp.int32)
            val = answer(hdr[:, 0], hdr[:, 1]).astype(jnp.bfloat16)
            bits = lax.bitcast_convert_type(jnp.broadcast_to(val[:, None], (NR, H)), jnp.uint8)
            return (bits.reshape(NR, rb_c)[None],)

        def combine_pack(out_rows, perm, recv_sizes):
            # Row j of the experts' output arrived perm[j]-th; rows past those received go
            # nowhere (index NR is dropped).
            n = recv_sizes[0].sum()
            to = jnp.where(jnp.arange(NR) < n, perm[0], NR)
            return (jnp.zeros((NR, rb_c), jnp.uint8).at[to].set(out_rows[0], mode="drop")[None],)

        def combine_a2a(send, c_in_off, recv_sizes, c_out_off, send_sizes):
            out = jnp.zeros((NS, rb_c), jnp.uint8)
            return (ragged(send[0], out, c_in_off[0], recv_sizes[0], c_out_off[0], send_sizes[0],
                           axis_name=axis)[None],)

        def reduce(back, order, send_w, send_sizes):
            vals = lax.bitcast_convert_type(back[0].reshape(NS, H, 2), jnp.bfloat16).astype(jnp.float32)
            n = send_sizes[0].sum()
            valid = jnp.arange(NS) < n
            tok = jnp.where(valid, order[0, :NS], T)            # rows past the sent ones: dropped
            if expert:
                vals = vals * send_w[0, :NS, None]
            return (jax.ops.segment_sum(vals, tok, num_segments=T)[None],)

        send_c = "expert_out" if expert else "send_c"  # rank copies: the answers are in arrival order already
        stages = {
            "layout": (layout, ("topk", "weights"), ("order", "send_w", "send_sizes", "counts")),
            "counts": (counts, ("counts",), ("counts_recv", "in_off", "out_off", "recv_sizes", "c_in_off", "c_out_off")),
            "pack": (pack, ("x", "order"), ("send_d",)),
            "a2a": (a2a, ("send_d", "in_off", "send_sizes", "out_off", "recv_sizes"), ("recv_d",)),
            "experts": (experts, ("expert_in" if expert else "recv_d",), (send_c,)),
            "combine_a2a": (combine_a2a, ("send_c", "c_in_off", "recv_sizes", "c_out_off", "send_sizes"), ("recv_c",)),
            "reduce": (reduce, ("recv_c", "order", "send_w", "send_sizes"), ("out",)),
        }
        if expert:
            stages["unpack"] = (unpack, ("recv_d", "counts_recv"), ("perm", "expert_in"))
            stages["combine_pack"] = (combine_pack, ("expert_out", "perm", "recv_sizes"), ("send_c",))
        P = jax.sharding.PartitionSpec
        order = ("layout", "counts", "pack", "a2a", "unpack", "experts", "combine_pack", "combine_a2a", "reduce")
        return {name: (jax.jit(jax.shard_map(stages[name][0], mesh=mesh, in_specs=P(axis), out_specs=P(axis))),
                       *stages[name][1:]) for name in order if name in stages}

    # --- running -----------------------------------------------------------------------
    def _run(self, st: JaxMoEState, name: str) -> None:
        """One stage's program, if it has one here (rank copies: no unpack and no combine
        pack, arrivals being in the order the experts read them), blocked on."""
        if name not in st.programs:
            return
        prog, ins, outs = st.programs[name]
        results = prog(*[st.arrays[i] for i in ins])
        for key, arr in zip(outs, results):
            st.arrays[key] = arr
        for arr in results:  # the host clock must bracket the stage's work, not its dispatch
            arr.block_until_ready()

    def fill(self, st: JaxMoEState) -> None:
        """Results of an earlier round dropped, so a row that never arrives shows."""
        for key in ("recv_d", "expert_in", "recv_c", "out"):
            st.arrays.pop(key, None)

    def dispatch(self, st: JaxMoEState, lap) -> None:
        for name in ("layout", "counts", "pack", "a2a", "unpack"):
            self._run(st, name)
            lap()

    def experts(self, st: JaxMoEState) -> None:
        self._run(st, "experts")

    def combine(self, st: JaxMoEState, lap) -> None:
        for name in ("combine_pack", "combine_a2a", "reduce"):
            self._run(st, name)
            lap()

    def release(self, st: JaxMoEState) -> None:
        st.arrays.clear()

    # --- results for the checks (numpy, this rank's) ------------------------------------
    def counts_received(self, st: JaxMoEState) -> np.ndarray:
        """[source, local expert] as exchanged (one column for rank copies)."""
        return self.local(st.arrays["counts_recv"]).astype(np.int64)

    def received(self, st: JaxMoEState) -> np.ndarray:
        """The dispatched rows as the experts read them (grouped by local expert for expert
        copies, by source for rank copies), the first n_recv."""
        key = "expert_in" if st.copies == "expert" else "recv_d"
        return self.local(st.arrays[key])[:st.n_recv]

    def combined(self, st: JaxMoEState) -> np.ndarray:
        return self.local(st.arrays["out"])
