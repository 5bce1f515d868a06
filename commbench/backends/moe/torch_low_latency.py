"""MoE dispatch and combine in low-latency mode (DeepEP's decode kernels), on torch tensors.

Every (source rank, expert) pair owns a fixed region of `capacity` row slots on the
receiver. As in DeepEP's kernels (csrc/kernels/internode_ll.cu, `dispatch`: one put per
routed (token, expert) row into its slot of the receiver's region, then one count per
(expert, source)), only the routed rows travel; the regions are where they land:

  layout  each (token, k) row's place among the routed rows: its rank among the tokens
          routed to its expert (one stable sort, on the device)
  pack    the routed rows into send order (destination, local expert, slot), and in front
          of each destination's rows a header holding its per-expert row counts: the
          counts ride with the rows, no exchange of their own
  a2a     one all_to_all_single with split sizes: the routed rows and the headers
  unpack  each arrived row into its fixed slot, by the counts in its source's header
          (DeepEP's receive phase copies each arrived row into its expert's packed
          buffer likewise)

Combine: pack (each arrived row's expert output, read from its slot, into arrival order),
a2a (splits reversed, no headers), reduce (each (token, k) row weighted, summed into the
token with index_add_).

No step reads the device on the host: split sizes are Python ints an all_to_all_single
needs before it starts, where DeepEP's one-sided puts need none. They come from the point's
routing, known at setup (every rank regenerates every rank's), so the timed step still
waits for nothing on the host and can be enqueued behind a stream hold or captured in a
CUDA graph. A row beyond its region's capacity (only with a capacity below the tokens per
rank) goes to a sink row that is never sent, and its combine reads a zero row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from commbench.moe.accounting import COUNT_NBYTES

from .torch_normal import count, decode_rows, reduce_rows, row_nbytes, token_activations, token_rows


def wide(rows: torch.Tensor) -> torch.Tensor:
    """(n, rb) uint8 rows as (n, rb / w) words of the widest integer w that divides rb: on
    CPU, index_copy_ of uint8 rows copies byte by byte (12 ms for 7.6 MB of fp8 rows, against
    3 ms as int64)."""
    for dt, w in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if rows.shape[1] % w == 0:
            return rows.view(dt)
    return rows


def header_rows(local: int, rb: int) -> int:
    """Rows of a count header: one int64 count per local expert."""
    return -(-local * COUNT_NBYTES // rb)


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
    hdr: int                    # count header rows in front of each destination's rows
    send_split: list            # dispatch rows to each destination: header + routed rows
    recv_split: list            # dispatch rows from each source: header + routed rows
    topk: torch.Tensor          # (T, K) int64
    weights: torch.Tensor       # (T, K) float32
    src_d: torch.Tensor         # (T + world * hdr, rb_d) uint8: the encoded token rows, then the count headers
    tok: torch.Tensor           # (T*K,) the token of each (token, k) row
    gather: torch.Tensor        # (sum(send_split) + 1,) the row of src_d each send row copies; a sink at the end
    send_d: torch.Tensor        # (sum(send_split), rb_d): per destination its header, then its rows
    land_d: torch.Tensor        # (sum(recv_split), rb_d): per source its header and rows, as they arrive
    arr_d: torch.Tensor         # (arrived, rb_d): the arrived rows without the headers
    recv_d: torch.Tensor        # (world * local * C, rb_d): the fixed slots [source][local expert][slot]
    send_c: torch.Tensor        # (world * local * C, rb_c): expert output, in the slots the rows came in
    out_c: torch.Tensor         # (arrived, rb_c): combine's send buffer, in arrival order
    recv_c: torch.Tensor        # (routed + 1, rb_c): back in dispatch send order; the last row zero
    hdr_land: torch.Tensor      # (world * hdr,) rows of land_d holding the headers
    out: torch.Tensor           # (T, H) fp32 combine result
    scratch: torch.Tensor       # (chunk, H) fp32
    kept: torch.Tensor | None = None         # (E,) rows sent to each expert: its count, at most C
    slot_c: torch.Tensor | None = None       # (T*K,) row of recv_c for each (token, k); the zero row when over
    recv_counts: torch.Tensor | None = None  # (world, local) int64: the counts each source's header held
    arrived: torch.Tensor | None = None      # (arrived,) the slot (row of recv_d) of each arrived row
    cpu_threads: int | None = None           # torch's intra-op threads on CPU while the point runs
    threads_before: int | None = None
    stride: int = 0                          # token ids' stride (token_activations)

    @property
    def local(self) -> int:
        return self.num_experts // self.world

    def received(self) -> torch.Tensor:
        """(world, local, C, rb_d): the fixed slots."""
        return self.recv_d.view(self.world, self.local, self.capacity, self.rb_d)

    def received_counts(self) -> torch.Tensor:
        return self.recv_counts


def splits(send_per_expert, recv_per_source_expert, capacity: int, world: int, hdr: int) -> tuple[list, list]:
    """Dispatch split sizes in rows (send to each destination, receive from each source):
    a header and the routed rows within capacity."""
    send = np.minimum(np.asarray(send_per_expert, np.int64), capacity).reshape(world, -1).sum(axis=1) + hdr
    recv = np.minimum(np.asarray(recv_per_source_expert, np.int64), capacity).sum(axis=1) + hdr
    return [int(v) for v in send], [int(v) for v in recv]


class LowLatencyMoE:
    """The low-latency engine; built on the normal engine's rows and reduction."""

    method = "routed rows into fixed slots per (source, expert), one all_to_all_single with split sizes"
    # Sends only the routed rows (accounting.EXCHANGE_SPLIT), not the whole slot table.
    split_sizes = True

    def __init__(self, engine):
        self.engine, self.comm, self.device = engine, engine.comm, engine.device

    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, hidden: int, dtype: str,
              capacity: int, recv_per_source_expert: np.ndarray, stride: int = 0) -> LowLatencyState:
        """recv_per_source_expert: int (world, local), the rows each source routes to each of
        this rank's experts (from its regenerated routing): the receive split sizes.
        capacity: slots per (source, expert), the same on every rank (0: this rank's tokens,
        right only where every rank has as many); stride: token_activations', 0: this rank's
        tokens."""
        dev, world = self.device, self.comm.size
        T, K = topk.shape
        C = int(capacity) if capacity else int(T)  # a token reaches an expert once: T never overflows
        rb_d, rb_c = row_nbytes(hidden, dtype), 2 * hidden
        E = num_experts
        hdr = header_rows(E // world, rb_d)
        send_split, recv_split = splits(np.bincount(np.asarray(topk).ravel(), minlength=E), recv_per_source_expert,
                                        C, world, hdr)
        n_send, n_recv = sum(send_split), sum(recv_split)
        before, threads = self.engine.limit_threads()

        def empty(*shape, dt=torch.uint8):
            return torch.empty(*shape, dtype=dt, device=dev)

        def header_index(split):  # the first hdr rows of each peer's chunk
            start = np.concatenate(([0], np.cumsum(split)[:-1]))
            return torch.as_tensor((start[:, None] + np.arange(hdr)).ravel(), dtype=torch.int64).to(dev)
        src = torch.zeros(T + world * hdr, rb_d, dtype=torch.uint8, device=dev)  # headers zero past the counts
        stride = stride or int(T)
        src[:T] = token_rows(self.comm.rank, torch.arange(T, device=dev), stride, hidden, dtype)
        gather = torch.zeros(n_send + 1, dtype=torch.int64, device=dev)
        gather[header_index(send_split)] = torch.arange(T, T + world * hdr, device=dev)  # the layout fills the rest
        n_arr = n_recv - world * hdr
        st = LowLatencyState(
            world, self.comm.rank, E, T, K, hidden, dtype, C, rb_d, rb_c, hdr, send_split, recv_split,
            torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int64).to(dev),
            torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev),
            src, torch.arange(T, device=dev).repeat_interleave(K), gather,
            empty(n_send, rb_d), empty(n_recv, rb_d), empty(n_arr, rb_d), empty(E * C, rb_d), empty(E * C, rb_c),
            empty(n_arr, rb_c), empty(n_send - world * hdr + 1, rb_c), header_index(recv_split),
            empty(T, hidden, dt=torch.float32), empty(max(1, min(T * K, 4096)), hidden, dt=torch.float32))
        st.cpu_threads, st.threads_before, st.stride = threads, before, stride
        return st

    def release(self, st: LowLatencyState) -> None:
        self.engine.release(st)

    def fill(self, st: LowLatencyState) -> None:
        st.recv_d.zero_()
        st.recv_c.zero_()  # its last row is what an over-capacity row's combine reads: adds nothing

    # --- dispatch ------------------------------------------------------------------------
    def layout(self, st: LowLatencyState) -> None:
        e = st.topk.reshape(-1)
        n = e.numel()
        order = torch.sort(e, stable=True).indices          # (expert, token) order
        counts = count(e, st.num_experts)
        start = torch.cumsum(counts, 0) - counts
        pos = torch.empty_like(e)
        pos[order] = torch.arange(n, device=e.device) - start[e[order]]
        st.kept = counts.clamp(max=st.capacity)
        first = torch.cumsum(st.kept, 0) - st.kept            # expert e's first row among the routed rows
        fits = pos < st.capacity
        at = first[e] + pos
        st.slot_c = torch.where(fits, at, st.recv_c.shape[0] - 1)
        # Each send row's token: a scatter of T*K indices, so pack moves each row once.
        slot = torch.where(fits, at + st.hdr * (e // st.local + 1), st.gather.shape[0] - 1)
        st.gather.index_copy_(0, slot, st.tok)

    def pack(self, st: LowLatencyState) -> None:
        hdr = st.src_d[st.num_tokens:].view(st.world, -1)
        hdr[:, :st.local * COUNT_NBYTES].copy_(st.kept.view(torch.uint8).view(st.world, -1))
        torch.index_select(wide(st.src_d), 0, st.gather[:-1], out=wide(st.send_d))

    def exchange(self, st: LowLatencyState) -> None:
        rb = st.rb_d
        self.comm.all_to_all(st.send_d.view(-1), st.land_d.view(-1), [c * rb for c in st.send_split],
                             [c * rb for c in st.recv_split])()

    def unpack(self, st: LowLatencyState) -> None:
        """Each arrived row into its slot, by the counts its source's header carried."""
        world, local, n = st.world, st.local, st.arr_d.shape[0]
        hdr = st.land_d.index_select(0, st.hdr_land).view(world, -1)[:, :local * COUNT_NBYTES]
        st.recv_counts = hdr.reshape(-1).view(torch.int64).view(world, local)
        lens = st.recv_counts.reshape(-1)
        # n, the rows this rank receives, is known at setup: repeat_interleave needs no sync.
        region = torch.repeat_interleave(torch.arange(world * local, device=lens.device), lens, output_size=n)
        j = torch.arange(n, device=lens.device)
        st.arrived = region * st.capacity + j - (torch.cumsum(lens, 0) - lens)[region]
        torch.index_select(wide(st.land_d), 0, j + st.hdr * (region // local + 1), out=wide(st.arr_d))
        wide(st.recv_d).index_copy_(0, st.arrived, wide(st.arr_d))

    def dispatch(self, st: LowLatencyState, lap) -> None:
        for stage in (self.layout, self.pack, self.exchange, self.unpack):
            stage(st)
            lap()

    # --- identity experts (untimed) -------------------------------------------------------
    def experts(self, st: LowLatencyState) -> None:
        """Each used slot's row dequantised to bf16, into the same slot of the combine buffer."""
        rows = st.arrived
        out = torch.empty(rows.numel(), st.hidden, dtype=torch.bfloat16, device=self.device)
        decode_rows(st.recv_d.index_select(0, rows), st.hidden, st.dtype, out)
        st.send_c.view(torch.bfloat16).view(-1, st.hidden).index_copy_(0, rows, out)

    # --- combine -------------------------------------------------------------------------
    def combine_pack(self, st: LowLatencyState) -> None:
        torch.index_select(wide(st.send_c), 0, st.arrived, out=wide(st.out_c))

    def combine_exchange(self, st: LowLatencyState) -> None:
        rb = st.rb_c
        self.comm.all_to_all(st.out_c.view(-1), st.recv_c[:-1].reshape(-1), [(c - st.hdr) * rb for c in st.recv_split],
                             [(c - st.hdr) * rb for c in st.send_split])()

    def reduce(self, st: LowLatencyState) -> None:
        back = st.recv_c.view(torch.bfloat16).view(-1, st.hidden).index_select(0, st.slot_c)
        reduce_rows(st.out, back, st.tok, st.weights.reshape(-1), st.scratch)

    def combine(self, st: LowLatencyState, lap) -> None:
        for stage in (self.combine_pack, self.combine_exchange, self.reduce):
            stage(st)
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
                want = token_rows(src, torch.as_tensor(idx).to(self.device), st.stride, st.hidden, st.dtype)
                if not torch.equal(got[src, lo, :idx.size], want):
                    return False
        return True

    def check_combine(self, st: LowLatencyState, factor: np.ndarray) -> bool:
        x = token_activations(st.rank, torch.arange(st.num_tokens, device=self.device), st.stride, st.hidden)
        f = torch.as_tensor(np.asarray(factor, dtype=np.float64)).to(self.device)
        return bool(torch.allclose(st.out, (x.to(torch.float64) * f.unsqueeze(1)).to(torch.float32), rtol=1e-5,
                                   atol=0))
