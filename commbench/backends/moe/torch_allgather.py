"""MoE dispatch and combine by all-gather and reduce-scatter on torch tensors (gloo on CPU,
nccl on CUDA): Megatron-Core's MoEAllGatherTokenDispatcher.

It mirrors NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py,
class MoEAllGatherTokenDispatcher (lines 103-244 at commit 0014f13713bf):
token_permutation gathers the routing map, the probs and the hidden states over the EP
group (lines 165-182), keeps the columns of the local experts (186-192), reads
tokens_per_expert on the host (194: `.cpu()`) and permutes the rows of the local experts
into expert order (196-205); token_unpermutation adds the expert output (the probs
applied to it by then) back into gathered token order (228-235) and reduce-scatters it
in the probs' dtype, fp32 (238-241). Later versions split the same steps into
dispatch_preprocess, token_dispatch and combine_preprocess (lines 233-373 at commit
d98e8a64dd: the gathers at 290-302, `.cpu()` at 320, the reduce-scatter at 365). Here the
routing travels as top-k ids and weights, (T, K), where
Megatron gathers a dense (T, E) map and probs: the same information, fewer bytes.

Stages the benchmark times:

  dispatch  gather   all_gather of the token rows (padded to the largest rank's token
                     count: all_gather moves equal blocks), of the top-k ids (int32, -1
                     on padding rows, which no expert owns) and of the weights
            select   expert copies (Megatron's): the (token, k) picks of this rank's
                     experts, ordered (local expert, source rank, token) by one stable
                     sort (Megatron's permute); rank copies: the tokens with a pick here,
                     in (source, token) order; their rows by index_select; the counts per
                     (source, local expert) to the host (Megatron's
                     tokens_per_expert.cpu(): the host waits here)
  combine   reduce   fp32 (world * T_max, H) partial sums of the expert output, one per
                     gathered token (index_add_; weighted for expert copies)
            reduce_scatter  of those partial sums: each rank gets its own tokens' sums

Every rank receives every token, whatever the routing: the bytes do not follow the
routing, and its cost is world times the tokens at each rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .torch_normal import StateRows, chunk_rows, count, decode_rows, reduce_rows, row_nbytes, token_rows

# What rows say the exchange was (the row field `exchange`).
EXCHANGE = "all_gather (token rows, top-k ids, weights; padded to T_max) + reduce_scatter (fp32 partial sums)"


@dataclass
class AllGatherState(StateRows):
    """One rank's buffers for the all-gather dispatcher, sized at setup from the host's
    regenerated routing (t_max: the largest rank's tokens; n_recv: picks of local experts)."""

    t_max: int
    rb_d: int
    n_recv: int
    x_send: torch.Tensor        # (t_max, rb_d) uint8: this rank's rows, zero padding after
    ids_send: torch.Tensor      # (t_max, K) int32: top-k ids, -1 on padding rows
    w_send: torch.Tensor        # (t_max, K) float32: weights, 0 on padding rows
    g_x: torch.Tensor           # (world * t_max, rb_d) uint8: every rank's rows
    g_ids: torch.Tensor         # (world * t_max * K,) int32
    g_w: torch.Tensor           # (world * t_max * K,) float32
    src_key: torch.Tensor       # (world * t_max * K,) int64: source rank of each pick times local
    top_k: int
    expert_in: torch.Tensor     # (n_recv, rb_d) uint8: the selected rows (by expert: expert copies)
    expert_out: torch.Tensor    # (n_recv, H) bf16: identity experts' output
    partial: torch.Tensor       # (world * t_max, H) fp32: weighted partial sums, gathered order
    out_full: torch.Tensor      # (t_max, H) fp32: this rank's sums after the reduce_scatter
    scratch: torch.Tensor       # (chunk, H) fp32: reduce_rows' widening buffer
    counts_recv: torch.Tensor   # (world * local,) int64: picks per (source, local expert)
    stride: int = 0             # token ids' stride (torch_normal.token_activations), the same on all ranks
    cpu_threads: int | None = None
    threads_before: int | None = None
    sel_token: torch.Tensor | None = None    # (n_recv,) gathered token row of each selected row
    sel_weight: torch.Tensor | None = None   # (n_recv,) its routing weight (expert copies)
    tokens_per_expert: list | None = None    # host copy, as Megatron reads it

    @property
    def local(self) -> int:
        return self.local_experts()

    @property
    def received(self) -> torch.Tensor:
        return self.expert_in

    @property
    def out(self) -> torch.Tensor:
        """(T, H) fp32: combine's result for this rank's own tokens."""
        return self.out_full[:self.num_tokens]


class AllGatherMoE:
    """The all-gather engine; it borrows the normal engine's thread limit and checks (the
    state offers the same fields: counts_recv, received, out)."""

    method = "all_gather of rows and routing, index_select of the local experts' rows; reduce_scatter of fp32 sums"

    def __init__(self, normal):
        self.normal = normal
        self.comm = normal.comm
        self.device = normal.device

    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, copies: str, hidden: int, dtype: str,
              t_max: int, n_recv: int, stride: int = 0) -> AllGatherState:
        """t_max: the most tokens of any rank (every rank gathers that many from each);
        stride: token ids' stride, at least every rank's tokens at any step (0: t_max)."""
        dev, world, rank = self.device, self.comm.size, self.comm.rank
        num_tokens, top_k = int(topk.shape[0]), int(topk.shape[1])
        if num_tokens > t_max:
            raise RuntimeError(f"moe: rank {rank} has {num_tokens} tokens, more than the {t_max} gathered per rank")
        rb_d, local = row_nbytes(hidden, dtype), num_experts // world  # experts on a rank, either copies
        threads_before, cpu_threads = self.normal.limit_threads()

        def empty(shape, dt=torch.uint8):
            return torch.empty(shape, dtype=dt, device=dev)
        x_send = torch.zeros((t_max, rb_d), dtype=torch.uint8, device=dev)
        stride = stride or t_max
        x_send[:num_tokens] = token_rows(rank, torch.arange(num_tokens, device=dev), stride, hidden, dtype)
        ids_send = torch.full((t_max, top_k), -1, dtype=torch.int32, device=dev)
        ids_send[:num_tokens] = torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int32).to(dev)
        w_send = torch.zeros((t_max, top_k), dtype=torch.float32, device=dev)
        w_send[:num_tokens] = torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev)
        picks = world * t_max * top_k
        src_key = torch.div(torch.arange(picks, device=dev), t_max * top_k, rounding_mode="floor") * local
        chunk = min(max(n_recv, 1), chunk_rows(dev, hidden))
        return AllGatherState(
            copies, dtype, world, rank, num_experts, num_tokens, hidden, t_max, rb_d, n_recv,
            x_send, ids_send, w_send, empty((world * t_max, rb_d)), empty(picks, torch.int32),
            empty(picks, torch.float32), src_key, top_k, empty((n_recv, rb_d)), empty((n_recv, hidden), torch.bfloat16),
            empty((world * t_max, hidden), torch.float32), empty((t_max, hidden), torch.float32),
            empty((chunk, hidden), torch.float32), empty(world * (local if copies == "expert" else 1), torch.int64),
            stride, cpu_threads, threads_before)

    def release(self, st: AllGatherState) -> None:
        self.normal.release(st)

    def fill(self, st: AllGatherState) -> None:
        """Receive buffers zeroed, so a row that never arrives shows."""
        for buf in (st.g_x, st.expert_in, st.out_full):
            buf.zero_()

    # --- dispatch ---------------------------------------------------------------------
    def gather(self, st: AllGatherState) -> None:
        # Flat views: gloo's all_gather wants the input's shape to match a block of the output's.
        self.comm.all_gather(st.x_send.view(-1), st.g_x.view(-1))()
        self.comm.all_gather(st.ids_send.view(-1), st.g_ids)()
        self.comm.all_gather(st.w_send.view(-1), st.g_w)()

    def select(self, st: AllGatherState) -> None:
        local = st.num_experts // st.world
        rel = st.g_ids.to(torch.int64) - st.rank * local
        mine = (rel >= 0) & (rel < local)  # padding ids (-1) are nobody's
        slot = torch.where(mine, st.src_key + rel, st.world * local)
        per_source_expert = count(slot, st.world * local + 1)[:-1].view(st.world, local)
        if st.copies == "expert":
            # One stable sort of the local expert (others last) orders the picks (expert,
            # source, token, k): Megatron's permute of the local map's columns.
            order = torch.sort(torch.where(mine, rel, local), stable=True).indices[:st.n_recv]
            st.sel_token = torch.div(order, st.top_k, rounding_mode="floor")
            st.sel_weight = st.g_w[order]
            st.counts_recv.copy_(per_source_expert.reshape(-1))
        else:
            # One row per gathered token with a pick here, in (source, token) order.
            here = mine.view(-1, st.top_k).any(dim=1)
            st.sel_token = torch.sort(torch.where(here, 0, 1), stable=True).indices[:st.n_recv]
            st.counts_recv.copy_(here.view(st.world, st.t_max).sum(dim=1))
        torch.index_select(st.g_x, 0, st.sel_token, out=st.expert_in)
        # One device-to-host copy: the host waits here, as in Megatron.
        *st.tokens_per_expert, got = torch.cat([per_source_expert.sum(dim=0), st.counts_recv.sum().view(1)]).tolist()
        if got != st.n_recv:
            raise RuntimeError(f"moe: rank {st.rank} selected {got} rows; its buffers were sized for {st.n_recv}")

    def dispatch(self, st: AllGatherState, lap) -> None:
        for stage in (self.gather, self.select):
            stage(st)
            lap()

    def experts(self, st: AllGatherState) -> None:
        """Identity experts (untimed): each selected row dequantised back to bf16."""
        decode_rows(st.expert_in, st.hidden, st.dtype, st.expert_out)

    # --- combine ------------------------------------------------------------------------
    def reduce(self, st: AllGatherState) -> None:
        weight = st.sel_weight if st.copies == "expert" else None
        reduce_rows(st.partial, st.expert_out, st.sel_token, weight, st.scratch)

    def reduce_scatter(self, st: AllGatherState) -> None:
        self.comm.reduce_scatter(st.partial.view(-1), st.out_full.view(-1))()

    def combine(self, st: AllGatherState, lap) -> None:
        for stage in (self.reduce, self.reduce_scatter):
            stage(st)
            lap()

    # --- checks: the normal engine's, on this state's fields ------------------------------
    def check_counts(self, st: AllGatherState, expected: np.ndarray) -> bool:
        return self.normal.check_counts(st, expected)

    def check_rows(self, st: AllGatherState, sources: list, regroup: np.ndarray | None) -> bool:
        return self.normal.check_rows(st, sources, regroup)

    def check_combine(self, st: AllGatherState, factor: np.ndarray, weighted: bool) -> bool:
        return self.normal.check_combine(st, factor, weighted)
