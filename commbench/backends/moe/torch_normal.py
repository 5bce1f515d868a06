"""MoE expert-parallel dispatch and combine on torch tensors: the device path of the moe
benchmark. nccl runs it on CUDA tensors and gloo on CPU tensors, the same code, so the
loopback tests what a GPU runs.

Dispatch is DeepEP's normal mode (rank copies) or Megatron's all-to-all dispatcher
(expert copies), in the stages the benchmark times:

  layout  routing -> destination of every (token, k) slot, per-expert and per-rank counts
          (scatter-add counts), row order (one stable sort); all on the device
  counts  all_to_all of the counts
  sync    the split sizes to the host (.tolist()): all_to_all_single takes its splits as
          Python ints, so the host waits for the device here. Megatron's token dispatcher
          pays the same (its output_splits go to the CPU before the all-to-all), and DeepEP's
          normal mode too (the host waits for the received-token count to size its output)
  pack    index_select of the token rows into send order
  a2a     all_to_all_single with those split sizes
  unpack  expert copies: rows regrouped (source, expert) -> (expert, source) by an index
          computed on the device (Megatron's sort_chunks_by_idxs); rank copies stay grouped
          by source, as DeepEP returns them

Combine: pack (expert copies: back to arrival order), a2a (splits reversed, bf16 rows),
reduce (fp32 index_add_ at the source, weighted by the routing weight for expert copies).

Rows travel as uint8 whatever their dtype: gloo has no fp8 type, and dispatch does no
arithmetic on them. fp8 rows are DeepSeek-V3's layout, H float8_e4m3fn values then H/128
fp32 scales (H + H/32 bytes); bf16 rows are 2H bytes.

Token activations are built so that the fp8 round trip is exact (token_activations): the
checks compare bits, not tolerances, except the weighted combine sum.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from commbench.core.whoami import local_ranks

BLOCK = 128          # elements sharing one fp32 scale (DeepSeek-V3's 1x128 blocks)
FP8_MAX = 448.0      # largest float8_e4m3fn value
ID_DIGITS = 8        # leading elements that spell a row's (source, token) in base 16
# Row-wise work with temporaries (widening, dequantising) runs a chunk of rows at a time.
# On CPU a chunk stays in cache: widening 32k rows of 7168 bf16 to fp32 took 126 ms in 8 MiB
# chunks and 224 ms in 64 MiB ones. On a GPU each chunk costs kernel launches: large ones.
CHUNK_NBYTES = {"cpu": 8 << 20, "cuda": 512 << 20}


def row_nbytes(hidden: int, dtype: str) -> int:
    """Bytes of one dispatched row (commbench.moe.accounting.token_bytes' figure)."""
    return hidden + 4 * (hidden // BLOCK) if dtype == "fp8" else 2 * hidden


def chunk_rows(device: torch.device, hidden: int, elem_nbytes: int = 4) -> int:
    """Rows whose (rows, hidden) temporaries of elem_nbytes stay under the device's CHUNK_NBYTES."""
    return max(1, CHUNK_NBYTES.get(device.type, CHUNK_NBYTES["cuda"]) // max(1, hidden * elem_nbytes))


def _chunks(n: int, hidden: int, device: torch.device, elem_nbytes: int = 4):
    step = chunk_rows(device, hidden, elem_nbytes)
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """float32 2**e for integer e in [-126, 127], exactly: the exponent bits written directly."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def token_activations(src: int, token_idx: torch.Tensor, stride: int, hidden: int) -> torch.Tensor:
    """bf16 (n, hidden): the activations of tokens `token_idx` of rank `src`. `stride` is
    at least the tokens of every rank (ranks may hold different counts), the same on all.

    Element h of a token is q * 2**e with
      q = 448 at the last element of each 128-element block (the block's amax),
          1 + a base-16 digit of (src * stride + token) at the first 8 elements (so
          every row of the run differs from every other),
          +-(1 + (h + 7 token + 13 src) % 16) elsewhere;
      e = (31 src + 7 token + 3 block) % 41 - 20, one exponent per block.
    Why the fp8 round trip is exact: every |q| is an integer of at most 4 significant bits
    (1..16, 448 = 7 * 64), so q * 2**e is exact in bf16 and q in float8_e4m3fn; a block's
    amax is 448 * 2**e, so its scale amax / 448 is 2**e exactly, x / scale = q with no
    rounding, and payload * scale gives x back bit for bit.
    """
    dev = token_idx.device
    t = token_idx.to(torch.int64).reshape(-1, 1)
    h = torch.arange(hidden, device=dev, dtype=torch.int64).reshape(1, -1)
    j, block = h % BLOCK, h // BLOCK
    mag = 1 + (h + 7 * t + 13 * src) % 16
    q = torch.where((h + t + src) % 3 == 0, -mag, mag)
    ident = src * stride + t
    digits = 1 + ((ident >> (4 * h.clamp(max=ID_DIGITS - 1))) & 15)
    q = torch.where(h < ID_DIGITS, digits, q)
    q = torch.where(j == BLOCK - 1, torch.full_like(q, int(FP8_MAX)), q)
    e = (31 * src + 7 * t + 3 * block) % 41 - 20
    return (q.to(torch.float32) * pow2(e)).to(torch.bfloat16)


def encode_rows(x: torch.Tensor, dtype: str, out: torch.Tensor) -> None:
    """bf16 (n, H) activations -> dispatch rows (n, row_nbytes) uint8 in `out`.

    fp8: per 128-element block, scale = amax / 448 and payload = x * (448 / amax) cast to
    float8_e4m3fn (DeepEP's per_token_cast_to_fp8); the row is the H payload bytes, then
    the H/128 fp32 scales. In a model this quantisation belongs to the layer before the
    dispatch (DeepEP takes (x, x_scales)), so it runs outside the timed stages."""
    n, hidden = x.shape
    if dtype == "bf16":
        out.copy_(x.contiguous().view(torch.uint8))
        return
    nb = hidden // BLOCK
    for lo, hi in _chunks(n, hidden, x.device):
        xb = x[lo:hi].to(torch.float32).view(hi - lo, nb, BLOCK)
        amax = xb.abs().amax(dim=2).clamp(min=1e-4)
        q = (xb * (FP8_MAX / amax).unsqueeze(2)).to(torch.float8_e4m3fn)
        out[lo:hi, :hidden] = q.view(hi - lo, hidden).view(torch.uint8)
        out[lo:hi, hidden:] = (amax / FP8_MAX).view(torch.uint8)


def decode_rows(rows: torch.Tensor, hidden: int, dtype: str, out: torch.Tensor) -> None:
    """Dispatch rows (n, row_nbytes) uint8 -> bf16 (n, H) in `out`: fp8 payload times its
    block's scale (what an expert reads), or the bf16 bytes as they are."""
    n = rows.shape[0]
    if dtype == "bf16":
        out.copy_(rows.view(torch.bfloat16))
        return
    nb = hidden // BLOCK
    for lo, hi in _chunks(n, hidden, rows.device):
        q = rows[lo:hi, :hidden].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
        scale = rows[lo:hi, hidden:].contiguous().view(torch.float32)
        out[lo:hi] = (q.view(hi - lo, nb, BLOCK) * scale.unsqueeze(2)).view(hi - lo, hidden)


def token_rows(src: int, token_idx: torch.Tensor, stride: int, hidden: int, dtype: str) -> torch.Tensor:
    """The dispatch rows (n, row_nbytes) uint8 of tokens `token_idx` of rank `src`: what the
    source packs, and what the checks expect to receive (stride: token_activations')."""
    n = int(token_idx.numel())
    out = torch.empty((n, row_nbytes(hidden, dtype)), dtype=torch.uint8, device=token_idx.device)
    for lo, hi in _chunks(n, hidden, token_idx.device, 16):  # token_activations' int64 temporaries
        encode_rows(token_activations(src, token_idx[lo:hi], stride, hidden), dtype, out[lo:hi])
    return out


def count(idx: torch.Tensor, n: int) -> torch.Tensor:
    """int64 (n,): occurrences of 0..n-1 in idx. A scatter-add, not torch.bincount: CUDA's
    bincount reads the input's max on the host (a device sync) to size its output."""
    return torch.zeros(n, dtype=torch.int64, device=idx.device).scatter_add_(0, idx, torch.ones_like(idx))


@dataclass
class DeviceLayout:
    """One rank's dispatch plan on the device.

    send_token_idx  int64 (T*K,): local token of each send row, rows grouped by destination
                    rank; only the first sum(send_counts) are rows (rank copies: the rest
                    are repeated (token, rank) slots, sorted last, so sizes need no sync)
    send_weight     float32 (T*K,): routing weight of each row (expert copies), else None
    send_counts     int64 (world,): rows for each destination rank
    counts          int64 (world * local,): what the ranks exchange, rows per (destination
                    rank, local expert) for expert copies, per destination for rank copies
    """

    send_token_idx: torch.Tensor
    send_weight: torch.Tensor | None
    send_counts: torch.Tensor
    counts: torch.Tensor


def device_layout(topk: torch.Tensor, weights: torch.Tensor, num_experts: int, world: int,
                  copies: str) -> DeviceLayout:
    """The host path's send_order(dispatch_layout(...)) on the device, without Python loops
    or host copies. Expert e lives on rank e // (E / world)."""
    top_k = topk.shape[1]
    local = num_experts // world
    flat = topk.reshape(-1)
    if copies == "expert":
        # Megatron's permute: a stable sort of the expert ids orders rows (expert, token);
        # a rank's experts are contiguous, so rows are grouped by destination rank too.
        order = torch.sort(flat, stable=True).indices
        tokens_per_expert = count(flat, num_experts)
        return DeviceLayout(order // top_k, weights.reshape(-1)[order],
                            tokens_per_expert.view(world, local).sum(dim=1), tokens_per_expert)
    # Rank copies: sorting each token's K destinations puts its copies for one rank side
    # by side; the first of each run is one (token, rank) row. Repeats get key `world`, so
    # one stable sort of the flat keys orders the rows (rank, token) and puts repeats last.
    dest = torch.sort(topk // local, dim=1, stable=True).values
    first = torch.ones_like(dest, dtype=torch.bool)
    first[:, 1:] = dest[:, 1:] != dest[:, :-1]
    key = torch.where(first, dest, world).reshape(-1)
    order = torch.sort(key, stable=True).indices
    send_counts = count(key, world + 1)[:world]
    return DeviceLayout(order // top_k, None, send_counts, send_counts)


def regroup_index(counts_src_expert: torch.Tensor, total: int) -> torch.Tensor:
    """Arrivals are ordered (source, local expert); the index that orders them (local
    expert, source): grouped[j] = arrived[index[j]]. `total` (the rows received, known on
    the host after the sync) lets repeat_interleave size its output without a sync."""
    world, local = counts_src_expert.shape
    lens = counts_src_expert.reshape(-1)
    starts = (torch.cumsum(lens, 0) - lens).view(world, local).t().reshape(-1)
    lens_t = counts_src_expert.t().reshape(-1)
    begin_t = torch.cumsum(lens_t, 0) - lens_t
    base = torch.repeat_interleave(starts - begin_t, lens_t, output_size=total)
    return base + torch.arange(total, dtype=torch.int64, device=lens.device)


def reduce_rows(out: torch.Tensor, rows: torch.Tensor, token_idx: torch.Tensor, weight: torch.Tensor | None,
                scratch: torch.Tensor) -> None:
    """Combine's reduction at the source: out (T, H) fp32 = sum over returned bf16 rows of
    row (times its weight) into its token, with index_add_. Rows are widened to fp32 a
    chunk at a time through `scratch` (chunk, H), not all at once (0.9 GB at full size)."""
    out.zero_()
    step = scratch.shape[0]
    for lo in range(0, rows.shape[0], step):
        hi = min(rows.shape[0], lo + step)
        buf = scratch[:hi - lo]
        if weight is None:
            buf.copy_(rows[lo:hi])
        elif buf.is_cuda:  # one kernel, the widening inside it
            torch.mul(rows[lo:hi], weight[lo:hi].unsqueeze(1), out=buf)
        else:  # on CPU a mixed bf16 x fp32 multiply is ~5x slower than widen, then multiply
            buf.copy_(rows[lo:hi])
            buf.mul_(weight[lo:hi].unsqueeze(1))
        out.index_add_(0, token_idx[lo:hi], buf)


@dataclass
class StateRows:
    """What every engine's state starts with (the point's shape and this rank's place), and
    offers: local experts per rank, and byte buffers as rows."""

    copies: str
    dtype: str
    world: int
    rank: int
    num_experts: int
    num_tokens: int
    hidden: int

    def local_experts(self) -> int:
        return self.num_experts // self.world if self.copies == "expert" else 1

    def rows(self, buf: torch.Tensor, n: int, nbytes: int) -> torch.Tensor:
        return buf[:n * nbytes].view(n, nbytes)


@dataclass
class MoEState(StateRows):
    """One rank's buffers and the last dispatch's plan. Buffers are sized once, from the
    host's regenerated layout (n_send, n_recv rows); the sync checks the device agrees."""

    rb_d: int
    rb_c: int
    n_send: int
    n_recv: int
    topk: torch.Tensor
    weights: torch.Tensor
    x: torch.Tensor             # (T, rb_d) uint8: the encoded token rows
    send_d: torch.Tensor        # dispatch send buffer, bytes
    recv_d: torch.Tensor        # dispatch receive buffer, bytes (arrival order)
    expert_in: torch.Tensor | None   # expert copies: (n_recv, rb_d) rows regrouped by expert
    expert_out: torch.Tensor | None  # expert copies: (n_recv, H) bf16 expert output, by expert
    send_c: torch.Tensor        # combine send buffer, bytes (arrival order)
    recv_c: torch.Tensor        # combine receive buffer, bytes (send order)
    out: torch.Tensor           # (T, H) fp32 combine result
    scratch: torch.Tensor       # (chunk, H) fp32, reduce_rows' widening buffer
    counts_recv: torch.Tensor   # (world * local,) int64
    cpu_threads: int | None = None   # torch's intra-op threads on CPU while the point runs
    threads_before: int | None = None
    lay: DeviceLayout | None = None
    send_split: list | None = None
    recv_split: list | None = None
    perm: torch.Tensor | None = None
    stride: int = 0             # token ids' stride (token_activations): the most tokens of any rank

    @property
    def local(self) -> int:
        return self.local_experts()

    @property
    def received(self) -> torch.Tensor:
        """The dispatched rows as the experts read them: grouped by local expert (expert
        copies) or by source (rank copies)."""
        return self.expert_in if self.expert_in is not None else self.rows(self.recv_d, self.n_recv, self.rb_d)


class TorchMoE:
    """The device-side MoE engine the moe benchmark drives on a torch comm (one per comm,
    benchmarks/moe/engines.py). setup() once per point,
    then dispatch(st, lap) / experts(st) / combine(st, lap), each stage also a method of its
    own; check_* compare on the device against expectations the caller computed on the
    host from the regenerated routing."""

    method = "index_select on the device, all_to_all_single with split sizes"

    def __init__(self, comm):
        self.comm = comm
        self.device = comm.tdev

    # --- setup (untimed) -------------------------------------------------------------
    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, copies: str, hidden: int,
              dtype: str, n_send: int, n_recv: int, stride: int = 0) -> MoEState:
        """stride: at least every rank's tokens, the same on all (ranks may hold different
        counts); 0: this rank's."""
        dev, world = self.device, self.comm.size
        num_tokens = int(topk.shape[0])
        stride = stride or num_tokens
        rb_d, rb_c = row_nbytes(hidden, dtype), 2 * hidden
        local = num_experts // world if copies == "expert" else 1
        expert = copies == "expert"

        def empty(n, dt=torch.uint8):
            return torch.empty(n, dtype=dt, device=dev)
        chunk = min(max(n_send, 1), chunk_rows(dev, hidden))
        threads_before, cpu_threads = self.limit_threads()
        st = MoEState(
            copies, dtype, world, self.comm.rank, num_experts, num_tokens, hidden, rb_d, rb_c, n_send, n_recv,
            torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int64).to(dev),
            torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev),
            token_rows(self.comm.rank, torch.arange(num_tokens, device=dev), stride, hidden, dtype),
            empty(n_send * rb_d), empty(n_recv * rb_d),
            empty((n_recv, rb_d)) if expert else None,
            empty((n_recv, hidden), torch.bfloat16) if expert else None,
            empty(n_recv * rb_c), empty(n_send * rb_c),
            empty((num_tokens, hidden), torch.float32), empty((chunk, hidden), torch.float32),
            empty(world * local, torch.int64), cpu_threads, threads_before)
        st.stride = stride
        return st

    def limit_threads(self) -> tuple[int | None, int | None]:
        """On CPU, torch's intra-op threads to this host's cores over its ranks: with the
        default (every core in every rank) the ranks' thread pools fight over the cores, and
        a 64-token reduce took 10 ms instead of 0.1 ms at 2 ranks on 2 cores. Returns (the
        count before, the count set); (None, None) on a GPU."""
        if self.device.type != "cpu":
            return None, None

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        before, threads = torch.get_num_threads(), max(1, cores // max(1, local_ranks(self.comm.size)))
        torch.set_num_threads(threads)
        return before, threads

    def release(self, st: MoEState) -> None:
        """The thread count as it was before limit_threads."""
        if st.threads_before is not None:
            torch.set_num_threads(st.threads_before)
            st.threads_before = None

    def fill(self, st: MoEState) -> None:
        """Receive buffers zeroed, so a row that never arrives shows."""
        for buf in (st.recv_d, st.recv_c, st.expert_in):
            if buf is not None:
                buf.zero_()

    # --- dispatch stages -------------------------------------------------------------
    def layout(self, st: MoEState) -> None:
        st.lay = device_layout(st.topk, st.weights, st.num_experts, st.world, st.copies)

    def exchange_counts(self, st: MoEState) -> None:
        self.comm.all_to_all(st.lay.counts, st.counts_recv)()

    def sync(self, st: MoEState) -> None:
        """One device-to-host copy of the send and receive split sizes (see the module
        docstring: Megatron and DeepEP pay it too)."""
        w = st.world
        recv = st.counts_recv.view(w, -1).sum(dim=1)
        both = torch.cat([st.lay.send_counts, recv]).tolist()
        st.send_split, st.recv_split = both[:w], both[w:]
        if sum(st.send_split) != st.n_send or sum(st.recv_split) != st.n_recv:
            raise RuntimeError(f"moe: rank {st.rank} would send {sum(st.send_split)} and receive "
                               f"{sum(st.recv_split)} rows; its buffers were sized for {st.n_send} and {st.n_recv}")

    def pack(self, st: MoEState) -> None:
        torch.index_select(st.x, 0, st.lay.send_token_idx[:st.n_send], out=st.rows(st.send_d, st.n_send, st.rb_d))

    def exchange(self, st: MoEState) -> None:
        rb = st.rb_d
        self.comm.all_to_all(st.send_d, st.recv_d, [c * rb for c in st.send_split],
                             [c * rb for c in st.recv_split])()

    def unpack(self, st: MoEState) -> None:
        if st.expert_in is None:  # rank copies: arrivals stay grouped by source (DeepEP)
            return
        st.perm = regroup_index(st.counts_recv.view(st.world, st.local), st.n_recv)
        torch.index_select(st.rows(st.recv_d, st.n_recv, st.rb_d), 0, st.perm, out=st.expert_in)

    def dispatch(self, st: MoEState, lap) -> None:
        for stage in (self.layout, self.exchange_counts, self.sync, self.pack, self.exchange, self.unpack):
            stage(st)
            lap()

    # --- identity experts (untimed) --------------------------------------------------
    def experts(self, st: MoEState) -> None:
        """Each received row dequantised back to bf16: the expert output in the order the
        experts hold their rows."""
        out = st.expert_out if st.expert_out is not None else st.rows(st.send_c, st.n_recv, st.rb_c).view(torch.bfloat16)
        decode_rows(st.received, st.hidden, st.dtype, out)

    # --- combine stages ----------------------------------------------------------------
    def combine_pack(self, st: MoEState) -> None:
        if st.expert_out is None:  # rank copies: the output is already in arrival order
            return
        send = st.rows(st.send_c, st.n_recv, st.rb_c).view(torch.bfloat16)
        send.index_copy_(0, st.perm, st.expert_out)  # row j of the output arrived perm[j]-th

    def combine_exchange(self, st: MoEState) -> None:
        rb = st.rb_c
        self.comm.all_to_all(st.send_c, st.recv_c, [c * rb for c in st.recv_split],
                             [c * rb for c in st.send_split])()

    def reduce(self, st: MoEState) -> None:
        n = st.n_send
        back = st.rows(st.recv_c, n, st.rb_c).view(torch.bfloat16)
        weight = st.lay.send_weight[:n] if st.lay.send_weight is not None else None
        reduce_rows(st.out, back, st.lay.send_token_idx[:n], weight, st.scratch)

    def combine(self, st: MoEState, lap) -> None:
        for stage in (self.combine_pack, self.combine_exchange, self.reduce):
            stage(st)
            lap()

    # --- checks (untimed, on the device) -------------------------------------------------
    def check_counts(self, st: MoEState, expected: np.ndarray) -> bool:
        """The exchanged counts as [source, local expert] equal `expected`."""
        want = torch.as_tensor(np.asarray(expected, dtype=np.int64)).to(self.device)
        return bool(torch.equal(st.counts_recv.view(st.world, st.local), want.view(st.world, st.local)))

    def check_rows(self, st: MoEState, sources: list, regroup: np.ndarray | None) -> bool:
        """sources[s] = (source rank, its token indices this rank receives, in its send
        order): the rows every source would send, rebuilt from its routing, concatenated in
        arrival order; regroup (expert copies) reorders them as the experts hold them."""
        want = torch.cat([token_rows(src, torch.as_tensor(np.asarray(idx, dtype=np.int64)).to(self.device),
                                     st.stride, st.hidden, st.dtype) for src, idx in sources]) \
            if sources else st.received[:0]
        if regroup is not None:
            want = want[torch.as_tensor(np.asarray(regroup, dtype=np.int64)).to(self.device)]
        return want.shape == st.received.shape and bool(torch.equal(want, st.received))

    def check_combine(self, st: MoEState, factor: np.ndarray, weighted: bool) -> bool:
        """combine(dispatch(x)) through identity experts is x times `factor` per token:
        exactly (unweighted, small integers), or within float32 rounding (weighted)."""
        x = token_activations(st.rank, torch.arange(st.num_tokens, device=self.device), st.stride, st.hidden)
        f = torch.as_tensor(np.asarray(factor, dtype=np.float64)).to(self.device)
        expect = (x.to(torch.float64) * f.unsqueeze(1)).to(torch.float32)
        if weighted:
            return bool(torch.allclose(st.out, expect, rtol=1e-5, atol=0))
        return bool(torch.equal(st.out, expect))
