"""What goes where in an expert-parallel dispatch, and what combine must return.

Experts are spread evenly: expert e lives on rank e // (E // world).

Two dispatch semantics (moe-deepseek-v3.md):

- ``copies="rank"``: a token goes once to each distinct rank hosting at least one of
  its experts (DeepEP normal mode); combine returns one partial sum per (token, rank).
- ``copies="expert"``: one row per (token, expert) pair (Megatron all-to-all
  dispatcher, DeepEP low-latency mode); T * K rows in all.

Send rows are grouped by destination rank in rank order, so a rank's send buffer and
``send_counts`` are exactly the input and split sizes of an all_to_all_single.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .routing import Routing

COPIES = ("rank", "expert")


@dataclass(frozen=True, eq=False)
class Layout:
    """One rank's dispatch plan.

    send_counts          int64 (world,)  rows sent to each destination rank
    send_token_idx       int64 (rows,)   local token index of each row, rows ordered by
                                         (dest rank, token, k slot)
    send_expert          int64 (rows,)   expert id of each row ("expert"); -1 ("rank")
    send_weight          float32 (rows,) routing weight of the row's (token, expert)
                                         ("expert"); sum of the token's weights whose
                                         experts live on that rank ("rank")
    tokens_per_expert    int64 (E,)      (token, expert) pairs this rank routes to each
                                         expert, whatever the copies
    dest_ranks_per_token int64 (T,)      distinct destination ranks of each token
    """

    send_counts: np.ndarray
    send_token_idx: np.ndarray
    send_expert: np.ndarray
    send_weight: np.ndarray
    tokens_per_expert: np.ndarray
    dest_ranks_per_token: np.ndarray
    copies: str
    num_tokens: int

    @property
    def world(self) -> int:
        return int(self.send_counts.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.send_token_idx.shape[0])

    @property
    def send_offsets(self) -> np.ndarray:
        """int64 (world + 1,): rows [send_offsets[d], send_offsets[d+1]) go to rank d."""
        return np.concatenate(([0], np.cumsum(self.send_counts))).astype(np.int64)


def _sort_key(values: np.ndarray, world: int) -> np.ndarray:
    # numpy's stable sort is a radix sort for 16-bit keys: much faster than timsort here.
    return values.astype(np.int16) if world <= np.iinfo(np.int16).max else values


def dispatch_layout(topk_idx, num_experts: int, world: int, copies: str,
                    weights: np.ndarray | None = None) -> Layout:
    """Plan one rank's dispatch from its routing.

    ``topk_idx`` may be a Routing, whose weights are then used; otherwise ``weights``
    (float (T, K)) gives them, and without either every slot weighs 1/K.
    """
    if isinstance(topk_idx, Routing):
        weights = topk_idx.weights if weights is None else weights
        topk_idx = topk_idx.topk_idx
    if copies not in COPIES:
        raise ValueError(f"copies must be one of {COPIES}, got {copies!r}")
    if world < 1 or num_experts % world:
        raise ValueError(f"num_experts {num_experts} is not divisible by world {world}")
    topk_idx = np.asarray(topk_idx, dtype=np.int64)
    if topk_idx.ndim != 2:
        raise ValueError(f"topk_idx must be 2-D (tokens, top_k), got shape {topk_idx.shape}")
    num_tokens, top_k = topk_idx.shape
    if topk_idx.size and (topk_idx.min() < 0 or topk_idx.max() >= num_experts):
        raise ValueError(f"expert ids must lie in [0, {num_experts})")
    if weights is None:
        weights = np.full((num_tokens, top_k), 1.0 / max(top_k, 1), dtype=np.float32)
    weights = np.asarray(weights)
    if weights.shape != topk_idx.shape:
        raise ValueError(f"weights shape {weights.shape} != topk_idx shape {topk_idx.shape}")

    dest = topk_idx // (num_experts // world)
    tokens_per_expert = np.bincount(topk_idx.ravel(), minlength=num_experts).astype(np.int64)

    # Sorting each row's K destinations puts a token's copies for one rank side by side:
    # the first of each run is one distinct (token, dest) pair, still in token order.
    slot_order = np.argsort(dest, axis=1, kind="stable")
    dest_sorted = np.take_along_axis(dest, slot_order, axis=1)
    first = np.ones(dest_sorted.shape, dtype=bool)
    first[:, 1:] = dest_sorted[:, 1:] != dest_sorted[:, :-1]
    dest_ranks_per_token = first.sum(axis=1).astype(np.int64)

    if copies == "expert":
        flat_dest = dest.ravel()
        # Flat index t*K + k ascends, so a stable sort by dest gives (dest, token, k).
        order = np.argsort(_sort_key(flat_dest, world), kind="stable")
        send_token_idx = order // max(top_k, 1)
        send_expert = topk_idx.ravel()[order]
        send_weight = weights.ravel()[order].astype(np.float32)
        send_counts = np.bincount(flat_dest, minlength=world)
    else:
        first_flat = np.flatnonzero(first.ravel())
        w_sorted = np.take_along_axis(weights, slot_order, axis=1).ravel()
        # Each row starts with a `first`, so a run never spills into the next token.
        pair_weight = (np.add.reduceat(w_sorted.astype(np.float64), first_flat)
                       if first_flat.size else np.zeros(0))
        pair_token = first_flat // max(top_k, 1)
        pair_dest = dest_sorted.ravel()[first_flat]
        order = np.argsort(_sort_key(pair_dest, world), kind="stable")
        send_token_idx = pair_token[order]
        send_expert = np.full(order.size, -1, dtype=np.int64)
        send_weight = pair_weight[order].astype(np.float32)
        send_counts = np.bincount(pair_dest, minlength=world)

    return Layout(
        send_counts=send_counts.astype(np.int64),
        send_token_idx=send_token_idx.astype(np.int64),
        send_expert=send_expert.astype(np.int64),
        send_weight=send_weight,
        tokens_per_expert=tokens_per_expert,
        dest_ranks_per_token=dest_ranks_per_token,
        copies=copies,
        num_tokens=int(num_tokens),
    )


def recv_counts_from_all(send_counts_matrix: np.ndarray) -> np.ndarray:
    """From the (world, world) matrix of rows sent [src, dst], the rows received
    [dst, src]: row d is rank d's receive split sizes, in source-rank order."""
    m = np.asarray(send_counts_matrix, dtype=np.int64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"send_counts_matrix must be square, got shape {m.shape}")
    return np.ascontiguousarray(m.T)


def global_layout(routing_for_rank: Callable[[int], Routing], num_experts: int, world: int,
                  copies: str) -> np.ndarray:
    """The (world, world) int64 matrix of rows sent [src, dst], from every rank's routing
    regenerated locally: routing is seeded per rank, so any rank can work out exactly
    what it must receive from whom without communicating."""
    m = np.zeros((world, world), dtype=np.int64)
    for src in range(world):
        m[src] = dispatch_layout(routing_for_rank(src), num_experts, world, copies).send_counts
    return m


def combine_factor(layout: Layout, weighted: bool) -> np.ndarray:
    """float64 (T,): what combine(dispatch(x)) with identity experts multiplies each
    token by. Unweighted: its number of copies (distinct dest ranks for "rank", K for
    "expert"). Weighted: the sum of its row weights, which for both copies is the sum
    of its K routing weights (1 up to float32 rounding)."""
    if not weighted and layout.copies == "rank":
        return layout.dest_ranks_per_token.astype(np.float64)
    row_w = layout.send_weight.astype(np.float64) if weighted else None
    return np.bincount(layout.send_token_idx, weights=row_w, minlength=layout.num_tokens)


def combine_expected(x: np.ndarray, layout: Layout, weighted: bool = False) -> np.ndarray:
    """float32 (T, H): what the source should hold after combine(dispatch(x)) with
    identity experts, x times combine_factor."""
    x = np.asarray(x)
    if x.shape[0] != layout.num_tokens:
        raise ValueError(f"x has {x.shape[0]} tokens, layout has {layout.num_tokens}")
    return (x.astype(np.float64) * combine_factor(layout, weighted)[:, None]).astype(np.float32)


def copy_number(layout: Layout) -> np.ndarray:
    """int64 (rows,): which of its token's copies each row is (0, 1, ...), counted in
    send order."""
    idx = layout.send_token_idx
    by_token = np.argsort(idx, kind="stable")
    sorted_idx = idx[by_token]
    pos = np.arange(idx.size)
    new_token = np.ones(idx.size, dtype=bool)
    new_token[1:] = sorted_idx[1:] != sorted_idx[:-1]
    run_start = np.maximum.accumulate(np.where(new_token, pos, 0)) if idx.size else pos
    out = np.empty(idx.size, dtype=np.int64)
    out[by_token] = pos - run_start
    return out


def combine_reduce(recv_back_rows: np.ndarray, layout: Layout, num_tokens: int | None = None,
                   weighted: bool = False) -> np.ndarray:
    """The source-side reduction of combine: add the rows that came back (in send
    order) into float32 (T, H) by send_token_idx, each times send_weight when weighted.

    The rows holding the c-th copy of their token name each token at most once, so
    each copy number is one duplicate-free fancy-index add; there are at most K of
    them (at most min(K, world) for rank copies).
    """
    rows = np.asarray(recv_back_rows)
    num_tokens = layout.num_tokens if num_tokens is None else int(num_tokens)
    if rows.ndim != 2 or rows.shape[0] != layout.num_rows:
        raise ValueError(f"expected ({layout.num_rows}, H) rows, got shape {rows.shape}")
    out = np.zeros((num_tokens, rows.shape[1]), dtype=np.float32)
    copy_no = copy_number(layout)
    for c in range(int(copy_no.max()) + 1 if copy_no.size else 0):
        sel = np.flatnonzero(copy_no == c)
        vals = rows[sel].astype(np.float32, copy=False)
        if weighted:
            vals *= layout.send_weight[sel, None]
        out[layout.send_token_idx[sel]] += vals
    return out


def load_imbalance(recv_rows_per_rank) -> tuple[float, int]:
    """(max / mean, argmax) of the rows each rank receives; (1.0, 0) when nothing moves."""
    load = np.asarray(recv_rows_per_rank, dtype=np.float64)
    mean = load.mean() if load.size else 0.0
    if mean <= 0:
        return 1.0, 0
    hottest = int(np.argmax(load))
    return float(load[hottest] / mean), hottest
