"""MoE dispatch and combine in low-latency mode (DeepEP's decode kernels), on torch tensors.

Every (source rank, expert) pair owns a fixed region of `capacity` row slots, whether the
routing fills it or not, so nothing about the routing has to be known before the exchange:

  layout  each (token, k) slot's place in its expert's region: the rank of the token among
          those routed to that expert (one stable sort, on the device)
  pack    the token rows into their slots (index_copy_), and each region's row count into
          a header row in front of it: the counts ride with the rows, no exchange of their own
  a2a     one all_to_all_single with equal splits: the padded regions, used or not

Combine: pack (nothing: the experts write their output into the slots the rows came in),
a2a (equal splits back), reduce (each (token, k) row read from its slot, weighted, summed
into the token with index_add_).

No step reads anything on the host: a slot beyond the capacity (only with a capacity
below the tokens per rank) goes to a sink row that is never sent, and its combine weight
reads a zero row, so even the overflow needs no sync. That is what lets the whole step be
enqueued behind a stream hold, or captured in a CUDA graph. The price is the padding: a rank
sends E x (capacity + 1) rows whatever its routing; rows report the padded bytes beside the
useful ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .torch_normal import count, decode_rows, reduce_rows, row_nbytes, token_activations, token_rows

HEADER_NBYTES = 8  # an int64 row count at the start of each region's header row


@dataclass
class LowLatencyState:
    world: int
    rank: int
    num_experts: int
    num_tokens: int
    top_k: int
    hidden: int
    dtype: str
    capacity: int
    rb_d: int
    rb_c: int
    topk: torch.Tensor          # (T, K) int64
    weights: torch.Tensor       # (T, K) float32
    x: torch.Tensor             # (T, rb_d) uint8: the encoded token rows
    send_d: torch.Tensor        # (E * (C + 1) + 1, rb_d): regions [dest][local expert], then a sink row
    recv_d: torch.Tensor        # (E * (C + 1), rb_d): regions [source][local expert]
    send_c: torch.Tensor        # (E * (C + 1), rb_c): expert output, in the slots the rows came in
    recv_c: torch.Tensor        # (E * (C + 1) + 1, rb_c): back in this rank's slots; the last row zero
    out: torch.Tensor           # (T, H) fp32 combine result
    scratch: torch.Tensor       # (chunk, H) fp32
    slot: torch.Tensor | None = None     # (T*K,) row of send_d for each (token, k); the sink when over capacity
    counts: torch.Tensor | None = None   # (E,) rows this rank routes to each expert
    cpu_threads: int | None = None       # torch's intra-op threads on CPU while the point runs
    threads_before: int | None = None

    @property
    def local(self) -> int:
        return self.num_experts // self.world

    @property
    def region(self) -> int:
        return self.capacity + 1

    def received(self) -> torch.Tensor:
        """(world, local, C + 1, rb_d): row 0 of each region is its header."""
        return self.recv_d.view(self.world, self.local, self.region, self.rb_d)

    def received_counts(self) -> torch.Tensor:
        """(world, local) int64: rows each source put in each local expert's region."""
        hdr = self.received()[:, :, 0, :HEADER_NBYTES].contiguous()
        return hdr.view(torch.int64).view(self.world, self.local)


class LowLatencyMoE:
    """The low-latency engine; built on the normal engine's rows and reduction."""

    method = "fixed slots per (source, expert), one all_to_all_single with equal splits"

    def __init__(self, engine):
        self.engine, self.comm, self.device = engine, engine.comm, engine.device

    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, hidden: int, dtype: str,
              capacity: int) -> LowLatencyState:
        dev, world = self.device, self.comm.size
        T, K = topk.shape
        C = int(capacity) if capacity else int(T)  # a token reaches an expert once: T never overflows
        rb_d, rb_c = row_nbytes(hidden, dtype), 2 * hidden
        E = num_experts
        before, threads = self.engine.limit_threads()

        def empty(*shape, dt=torch.uint8):
            return torch.empty(*shape, dtype=dt, device=dev)
        st = LowLatencyState(
            world, self.comm.rank, E, T, K, hidden, dtype, C, rb_d, rb_c,
            torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int64).to(dev),
            torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev),
            token_rows(self.comm.rank, torch.arange(T, device=dev), T, hidden, dtype),
            empty(E * (C + 1) + 1, rb_d), empty(E * (C + 1), rb_d), empty(E * (C + 1), rb_c),
            empty(E * (C + 1) + 1, rb_c), empty(T, hidden, dt=torch.float32),
            empty(max(1, min(T * K, 4096)), hidden, dt=torch.float32))
        st.recv_c[-1].zero_()  # the row an over-capacity slot's combine reads: adds nothing
        st.cpu_threads, st.threads_before = threads, before
        return st

    def release(self, st: LowLatencyState) -> None:
        self.engine.release(st)

    def fill(self, st: LowLatencyState) -> None:
        st.recv_d.zero_()
        st.recv_c[:-1].zero_()

    # --- dispatch ------------------------------------------------------------------------
    def layout(self, st: LowLatencyState) -> None:
        e = st.topk.reshape(-1)
        n = e.numel()
        order = torch.sort(e, stable=True).indices          # (expert, token) order
        st.counts = count(e, st.num_experts)
        start = torch.cumsum(st.counts, 0) - st.counts
        pos = torch.empty_like(e)
        pos[order] = torch.arange(n, device=e.device) - start[e[order]]
        sink = st.num_experts * st.region
        st.slot = torch.where(pos < st.capacity, e * st.region + 1 + pos, torch.full_like(pos, sink))

    def pack(self, st: LowLatencyState) -> None:
        tok = torch.arange(st.num_tokens, device=self.device).repeat_interleave(st.top_k)
        st.send_d.index_copy_(0, st.slot, st.x.index_select(0, tok))
        hdr = st.send_d[:-1].view(st.num_experts, st.region, st.rb_d)[:, 0, :HEADER_NBYTES]
        hdr.copy_(st.counts.clamp(max=st.capacity).view(torch.uint8).view(st.num_experts, HEADER_NBYTES))

    def exchange(self, st: LowLatencyState) -> None:
        self.comm.all_to_all(st.send_d[:-1].reshape(-1), st.recv_d.view(-1))()

    def dispatch(self, st: LowLatencyState, lap) -> None:
        for stage in (self.layout, self.pack, self.exchange):
            stage(st)
            lap()

    # --- identity experts (untimed) -------------------------------------------------------
    def experts(self, st: LowLatencyState) -> None:
        """Each used slot's row dequantised to bf16, into the same slot of the combine buffer."""
        cnt = st.received_counts()
        used = torch.arange(st.capacity, device=self.device) < cnt.unsqueeze(2)   # (world, local, C)
        flat = torch.nonzero(used.reshape(-1)).squeeze(1)                        # region r, slot j: r*C + j
        rows = (flat // st.capacity) * st.region + 1 + flat % st.capacity
        out = torch.empty(rows.numel(), st.hidden, dtype=torch.bfloat16, device=self.device)
        decode_rows(st.recv_d.index_select(0, rows), st.hidden, st.dtype, out)
        st.send_c.view(torch.bfloat16).view(-1, st.hidden).index_copy_(0, rows, out)

    # --- combine -------------------------------------------------------------------------
    def combine_exchange(self, st: LowLatencyState) -> None:
        self.comm.all_to_all(st.send_c.view(-1), st.recv_c[:-1].reshape(-1))()

    def reduce(self, st: LowLatencyState) -> None:
        back = st.recv_c.view(torch.bfloat16).view(-1, st.hidden).index_select(0, st.slot)
        tok = torch.arange(st.num_tokens, device=self.device).repeat_interleave(st.top_k)
        reduce_rows(st.out, back, tok, st.weights.reshape(-1), st.scratch)

    def combine(self, st: LowLatencyState, lap) -> None:
        lap()  # pack: the experts wrote into the slots the rows came in
        self.combine_exchange(st)
        lap()
        self.reduce(st)
        lap()

    # --- checks (untimed) ------------------------------------------------------------------
    def check_counts(self, st: LowLatencyState, expected: np.ndarray) -> bool:
        want = torch.as_tensor(np.minimum(np.asarray(expected, dtype=np.int64), st.capacity)).to(self.device)
        return bool(torch.equal(st.received_counts(), want.view(st.world, st.local)))

    def check_rows(self, st: LowLatencyState, expected: list) -> bool:
        """expected[src][l]: the token indices of source src routed to this rank's local
        expert l, in token order: they fill that region's first slots."""
        got = st.received()
        for src, per_expert in enumerate(expected):
            for lo, idx in enumerate(per_expert):
                idx = np.asarray(idx, dtype=np.int64)[:st.capacity]
                want = token_rows(src, torch.as_tensor(idx).to(self.device), st.num_tokens, st.hidden, st.dtype)
                if not torch.equal(got[src, lo, 1:1 + idx.size], want):
                    return False
        return True

    def check_combine(self, st: LowLatencyState, factor: np.ndarray) -> bool:
        x = token_activations(st.rank, torch.arange(st.num_tokens, device=self.device), st.num_tokens, st.hidden)
        f = torch.as_tensor(np.asarray(factor, dtype=np.float64)).to(self.device)
        return bool(torch.allclose(st.out, (x.to(torch.float64) * f.unsqueeze(1)).to(torch.float32), rtol=1e-5,
                                   atol=0))
