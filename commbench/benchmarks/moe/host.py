"""The moe benchmark's host path: numpy layout, packing and reduction around the backend's
row exchange (one MPI_Alltoallw on mpi). It runs where the backend has no device engine
(engines.py): mpi, on CPU buffers.

Rows are raw bytes: a header naming (source rank, token), then bytes that depend on both,
so any misplaced or torn row shows; the identity experts answer each row with its token's
value (token_value) in bf16.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from commbench import moe as M
from commbench.core.errors import UsageError
from commbench.core.units import INT_MAX

HEADER = 8  # bytes at the start of each dispatched row: int32 source rank, int32 token index


def _no_lap() -> None:
    """A stage boundary nobody is timing (the --check run)."""


def _bf16(values_f32: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16) by truncation; exact for the small integers used."""
    return (np.ascontiguousarray(values_f32, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def token_value(src: np.ndarray | int, token: np.ndarray) -> np.ndarray:
    """The scalar each token carries through the identity experts: a small integer (exact
    in bf16) that differs by source rank and token."""
    return (1 + (np.asarray(src, dtype=np.int64) * 31 + np.asarray(token, dtype=np.int64)) % 61).astype(np.float32)


def make_x(rank: int, tokens: int, row_nbytes: int) -> np.ndarray:
    """Dispatch input (tokens, row_nbytes) uint8: a header naming (rank, token), then bytes
    that depend on both, so any misplaced or torn row shows."""
    t = np.arange(tokens, dtype=np.int64)
    body = (np.arange(row_nbytes, dtype=np.int64)[None, :] + t[:, None] * 7 + rank * 13) % 251
    x = body.astype(np.uint8)
    hdr = np.stack([np.full(tokens, rank, np.int32), t.astype(np.int32)], axis=1)
    x[:, :HEADER] = hdr.view(np.uint8).reshape(tokens, HEADER)
    return x


def send_order(layout: M.Layout) -> M.Layout:
    """Expert copies are sent sorted by expert (Megatron's permute), so each destination's
    chunk is grouped by local expert and the receiver regroups with counts alone."""
    if layout.copies != "expert":
        return layout
    perm = np.argsort(layout.send_expert, kind="stable")
    return replace(layout, send_token_idx=layout.send_token_idx[perm], send_expert=layout.send_expert[perm],
                   send_weight=layout.send_weight[perm])


def regroup_perm(counts_src_expert: np.ndarray) -> np.ndarray:
    """Received rows are ordered (source, local expert); the permutation that orders them
    (local expert, source): out[j] = in[perm[j]]."""
    m = np.asarray(counts_src_expert, dtype=np.int64)
    world, local = m.shape
    lens = m.ravel()
    starts = np.cumsum(lens) - lens
    order = np.arange(world * local).reshape(world, local).T.ravel()
    lens_t, starts_t = lens[order], starts[order]
    total = int(lens.sum())
    begin_t = np.cumsum(lens_t) - lens_t
    return np.repeat(starts_t - begin_t, lens_t) + np.arange(total, dtype=np.int64)


def inverse_perm(perm: np.ndarray) -> np.ndarray:
    """inv[perm[j]] = j: turns 'out[j] = in[perm[j]]' into 'out[inv[i]] = in[i]'."""
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=perm.dtype)
    return inv


def reduce_bf16_rows(bits: np.ndarray, layout: M.Layout, tokens: int, weighted: bool,
                     block_tokens: int = 32) -> np.ndarray:
    """Combine's source-side reduction straight from bf16 rows (uint16 bits, send order):
    same result as moe.combine_reduce. Tokens are reduced a block at a time so the fp32
    block being summed stays in cache (out is 117 MB at DeepSeek-V3 size; summing copy by
    copy over all of it took ~1.4x longer), and within a block the c-th copies of its
    tokens form one duplicate-free `out[tok] += rows`. Rows are widened to fp32 through one
    small scratch buffer rather than all at once (a 400 MB temporary at full size)."""
    idx, w = layout.send_token_idx, layout.send_weight
    out = np.zeros((tokens, bits.shape[1]), np.float32)
    if idx.size == 0:
        return out
    order = np.argsort(idx, kind="stable")               # rows grouped by token
    starts = np.searchsorted(idx[order], np.arange(tokens + 1))
    copy_no = np.arange(order.size) - np.repeat(starts[:-1], np.diff(starts))
    scratch = np.empty((block_tokens, bits.shape[1]), np.uint32)
    for t0 in range(0, tokens, block_tokens):
        lo, hi = starts[t0], starts[min(t0 + block_tokens, tokens)]
        rows, cn = order[lo:hi], copy_no[lo:hi]
        for c in range(int(cn.max()) + 1 if cn.size else 0):
            r = rows[cn == c]
            buf = scratch[:r.size]
            buf[...] = np.take(bits, r, axis=0, mode="clip")  # indices valid by construction
            buf <<= 16
            vals = buf.view(np.float32)
            if weighted:
                vals *= w[r, None]
            out[idx[r]] += vals
    return out


@dataclass
class HostBufs:
    plan: object              # moe.MoEPlan: routing, the host layout, row sizes
    x: np.ndarray
    send_d: object
    recv_d: object
    send_c: object
    recv_c: object
    counts_send: object
    counts_recv: object
    expert_in: np.ndarray | None
    expert_out: np.ndarray | None
    out: np.ndarray | None = None
    recv_rows: np.ndarray | None = None   # expert copies: where each arriving row went
    pack_method: str = ""
    path: object = None


class ExchangePath:
    """What the MoE benchmark asks of a path besides its stages: the bytes one rank moves
    per tier (the flat all_to_all's, from the routing's counts, by default), row fields of
    its own, and a release after the point."""

    hold = False  # a step that never waits for the device on the host may be timed held
    # Per stage ("dispatch", "combine"): the laps that wait for the device on the host; a
    # held step lets its hold go before them and puts it up again after (TorchComm.time_steps).
    host_waits: dict = {}

    def accounting(self, plan, rank: int, node_of_rank, row_nbytes: int) -> dict:
        return M.dispatch_bytes(plan.layout.send_counts, plan.matrix[:, rank], rank, node_of_rank, row_nbytes)

    def stage_info(self, acc: dict, stage: str) -> dict:
        """Row fields of one stage from its accounting (the low-latency path's padded bytes)."""
        return {}

    def row_info(self, b) -> dict:
        return {}

    def release(self, comm, b) -> None:
        pass


class EnginePath(ExchangePath):
    """A path driving a device engine (backends/moe/, picked for the comm by engines.py):
    every stage is the engine's, on the state its setup made (b.state)."""

    def __init__(self, engine):
        self.engine = engine

    def fill(self, comm, b) -> None:
        self.engine.fill(b.state)

    def dispatch(self, comm, b, lap=_no_lap) -> None:
        self.engine.dispatch(b.state, lap)

    def experts(self, comm, b) -> None:
        self.engine.experts(b.state)

    def combine(self, comm, b, lap=_no_lap) -> None:
        self.engine.combine(b.state, lap)

    def release(self, comm, b) -> None:
        self.engine.release(b.state)


class HostPath(ExchangePath):
    """Layout, packing and reduction in numpy on host buffers; the rows move through
    comm.rows_all_to_all (MPI datatypes on mpi, a staging gather/scatter elsewhere)."""

    name = "host"
    dispatch_stages = ("layout", "counts", "pack", "a2a", "unpack")
    combine_stages = ("pack", "a2a", "reduce")

    def setup(self, comm, plan) -> HostBufs:
        world, rank = comm.size, comm.rank
        p = plan.point.params
        n_send, n_recv, rb_d, rb_c = plan.layout.num_rows, plan.n_recv, plan.rb_d, plan.rb_c
        if comm.backend == "mpi" and max(n_send, n_recv) * max(rb_d, rb_c) > INT_MAX:
            raise UsageError(f"moe: rank {rank} would move {max(n_send, n_recv) * max(rb_d, rb_c)} bytes in one call, "
                             f"over the 2^31-1 count MPI takes without MPI-4 large-count calls: fewer tokens")
        expert = p["copies"] == "expert"
        return HostBufs(
            plan, make_x(rank, plan.num_tokens, rb_d),
            comm.alloc(n_send * rb_d, "uint8"), comm.alloc(n_recv * rb_d, "uint8"),
            comm.alloc(n_recv * rb_c, "uint8"), comm.alloc(n_send * rb_c, "uint8"),
            comm.alloc(world * plan.local, "int32"), comm.alloc(world * plan.local, "int32"),
            np.empty((n_recv, rb_d), np.uint8) if expert else None,
            np.empty((n_recv, rb_c), np.uint8) if expert else None,
        )

    def fill(self, comm, b: HostBufs) -> None:
        comm.host_view(b.recv_d)[:] = 0
        comm.host_view(b.recv_c)[:] = 0

    def dispatch(self, comm, b: HostBufs, lap=_no_lap) -> None:
        plan = b.plan
        p, world = plan.point.params, comm.size
        lay = send_order(M.dispatch_layout(plan.topk, p["experts"], world, p["copies"], weights=plan.weights))
        cs = comm.host_view(b.counts_send)
        cs[:] = lay.tokens_per_expert if p["copies"] == "expert" else lay.send_counts
        lap()
        comm.all_to_all(b.counts_send, b.counts_recv)()
        per = self.counts_matrix(comm, b)
        recv_counts = per.sum(axis=1)
        lap()
        # Expert copies land regrouped by local expert (Megatron's sort_chunks_by_idxs):
        # arrival j goes to row recv_rows[j]; rank copies stay grouped by source (DeepEP).
        b.recv_rows = inverse_perm(regroup_perm(per)) if b.expert_in is not None else None
        ex = comm.rows_all_to_all(plan.rb_d, b.x, lay.send_token_idx, lay.send_counts, b.expert_in, recv_counts,
                                  b.recv_rows, b.send_d, b.recv_d)
        ex.pack()
        lap()
        ex.run()
        lap()
        ex.unpack()
        lap()
        b.pack_method = ex.method

    def experts(self, comm, b: HostBufs) -> None:
        """Identity experts (untimed): each output row is its input token's value in bf16,
        read from the header the row arrived with."""
        rb_d, rb_c = b.plan.rb_d, b.plan.rb_c
        rows_in = b.expert_in if b.expert_in is not None else comm.host_view(b.recv_d).reshape(-1, rb_d)
        hdr = np.ascontiguousarray(rows_in[:, :HEADER]).view(np.int32)
        vals = _bf16(token_value(hdr[:, 0], hdr[:, 1]))
        out = b.expert_out if b.expert_out is not None else comm.host_view(b.send_c).reshape(-1, rb_c)
        out.view(np.uint16)[:] = vals[:, None]

    def combine(self, comm, b: HostBufs, lap=_no_lap) -> None:
        plan = b.plan
        lay = plan.layout
        # Expert copies go back in arrival order: the row that arrived j-th sits at
        # recv_rows[j] of the expert output.
        ex = comm.rows_all_to_all(plan.rb_c, b.expert_out, b.recv_rows, plan.matrix[:, comm.rank], None,
                                  lay.send_counts, None, b.send_c, b.recv_c)
        ex.pack()
        lap()
        ex.run()
        lap()
        back = comm.host_view(b.recv_c).view(np.uint16).reshape(lay.num_rows, -1)
        b.out = reduce_bf16_rows(back, lay, plan.num_tokens, weighted=lay.copies == "expert")
        lap()

    def check(self, comm, b: HostBufs) -> bool:
        plan = b.plan
        p, world, me = plan.point.params, comm.size, comm.rank
        if not np.array_equal(self.counts_matrix(comm, b).sum(axis=1), plan.matrix[:, me]):
            return False
        # Every row I received, in order: grouped by source, each source's rows in its send order.
        want = []
        for src in range(world):
            lay = plan.source_layout(src)
            off = lay.send_offsets
            want.append(make_x(src, plan.tokens_of(src), plan.rb_d)[lay.send_token_idx[off[me]:off[me + 1]]])
            if p["copies"] == "expert":  # per-expert counts as exchanged
                got = comm.host_view(b.counts_recv).reshape(world, plan.local)[src]
                if not np.array_equal(got, lay.tokens_per_expert[me * plan.local:(me + 1) * plan.local]):
                    return False
        got = comm.host_view(b.recv_d).reshape(-1, plan.rb_d)
        if b.expert_in is not None:  # arrivals were placed regrouped by expert: undo that
            got = b.expert_in[b.recv_rows]
        if not np.array_equal(got, np.concatenate(want) if want else got):
            return False
        # combine(dispatch(x)) with identity experts: x times the copies (rank), or x times
        # the sum of its weights (expert, weighted; float32 sums: rtol 1e-5).
        x = token_value(me, np.arange(plan.num_tokens))
        weighted = p["copies"] == "expert"
        expect = (x * M.combine_factor(plan.layout, weighted)).astype(np.float32)
        got = b.out
        if got is None or got.shape[0] != plan.num_tokens:
            return False
        if weighted:
            return bool(np.allclose(got, expect[:, None], rtol=1e-5, atol=0))
        return bool(np.array_equal(got, np.broadcast_to(expect[:, None], got.shape)))

    def release(self, comm, b: HostBufs) -> None:
        """Nothing to give back."""

    def row_info(self, b: HostBufs) -> dict:
        return {}

    @staticmethod
    def counts_matrix(comm, b: HostBufs) -> np.ndarray:
        """The exchanged counts as [source, local expert] (one column for rank copies)."""
        return comm.host_view(b.counts_recv).reshape(comm.size, b.plan.local).astype(np.int64)
