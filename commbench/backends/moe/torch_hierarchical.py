"""Hierarchical (two-tier) MoE dispatch and combine on torch tensors: DeepEP's internode
normal kernels over two all_to_all_single calls, the same code on gloo (CPU) and nccl (CUDA).

A token bound for another node crosses the scale-out tier once per (token, destination
node), to that node's forwarder (commbench.moe.accounting.forwarder: the rank with the
sender's local index), which fans it out over the scale-up tier to the destination ranks of
its node. Tokens bound for the sender's own node take the scale-up tier directly. The bytes
this moves are commbench.moe.accounting.hierarchical_rows' figures.

Dispatch stages:

  layout   routing -> (token, remote node) rows in forwarder order, packed with
           index_select; each first-tier row is the token's row, then its K expert ids
           (int32) and, for expert copies, its K routing weights (fp32), as bytes: the
           forwarder needs the ids to route and the weights to reduce in combine
  counts   all_to_all of the first-tier counts
  sync     first-tier split sizes to the host
  a2a_out  first tier: all_to_all_single over all ranks; only the forwarders of remote
           nodes receive rows
  forward  from the rows that arrived and this rank's own tokens, the second-tier rows to
           each destination rank of this node (one per (token, rank) with rank copies, one
           per (token, expert) with expert copies), ordered (destination, source, local
           expert, token); their counts per (source, local expert) exchanged with an
           all_to_all and synced to the host; packed with index_select
  a2a_in   second tier: all_to_all_single in which a rank only sends to its own node
  unpack   arrivals (grouped by forwarder) regrouped as the flat path delivers them:
           by source, in the source's send order (rank copies), then by local expert
           (expert copies), an index computed from the exchanged counts alone

Combine reverses it: pack (back to second-tier arrival order), a2a_in (to the forwarders),
forward (the forwarder sums the partial rows of each token from its node's ranks in fp32,
weighted for expert copies, and returns one bf16 row per (token, node), as DeepEP's
combine does), a2a_out (to the sources), reduce (the source adds those rows to its own
node's partial sum, fp32 index_add_).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .torch_normal import (
    StateRows,
    chunk_rows,
    count,
    decode_rows,
    reduce_rows,
    row_nbytes,
    token_activations,
    token_rows,
)


def block_index(lens: torch.Tensor, order: torch.Tensor, total: int) -> torch.Tensor:
    """Arrivals come as blocks of lens[b] rows, b in arrival order; the index that lays the
    blocks out in `order` (block ids): grouped[j] = arrived[index[j]]. `total` is the rows
    in all (known on the host) so repeat_interleave needs no sync."""
    starts = torch.cumsum(lens, 0) - lens
    lens_t, starts_t = lens[order], starts[order]
    begin_t = torch.cumsum(lens_t, 0) - lens_t
    base = torch.repeat_interleave(starts_t - begin_t, lens_t, output_size=total)
    return base + torch.arange(total, dtype=torch.int64, device=lens.device)


def meta_nbytes(top_k: int, copies: str) -> int:
    """Bytes appended to a first-tier row: K int32 expert ids, and K fp32 weights for expert
    copies (the forwarder weights the partial sums it returns in combine)."""
    return 4 * top_k * (2 if copies == "expert" else 1)


@dataclass
class HierState(StateRows):
    top_k: int
    rb_d: int
    rb_c: int
    rbx: int                    # first-tier row bytes: rb_d + meta
    n_send1: int                # first-tier rows sent / received
    n_recv1: int
    n_send2: int                # second-tier rows sent / received (incl. to itself)
    n_recv: int
    node_of: torch.Tensor       # (world,) node index of each rank
    fwd_of_node: torch.Tensor   # (nodes,) the forwarder of this rank's tokens in each node
    my_node: int
    topk: torch.Tensor
    pool: torch.Tensor          # (T + n_recv1, rbx): own token rows, then first-tier arrivals
    send1: torch.Tensor
    send2: torch.Tensor
    recv2: torch.Tensor
    received: torch.Tensor      # (n_recv, rb_d) rows as the experts hold them
    expert_out: torch.Tensor    # (n_recv, H) bf16
    send_c2: torch.Tensor
    recv_c2: torch.Tensor
    partial: torch.Tensor       # (T + n_recv1, H) fp32: the forwarder's sums per pool row
    send_c1: torch.Tensor
    recv_c1: torch.Tensor
    out: torch.Tensor           # (T, H) fp32
    scratch: torch.Tensor
    counts1_recv: torch.Tensor  # (world,)
    counts2_recv: torch.Tensor  # (world forwarders * world sources * local,)
    cpu_threads: int | None = None
    threads_before: int | None = None
    tok1: torch.Tensor | None = None
    counts1: torch.Tensor | None = None
    split1: tuple | None = None
    pool_idx2: torch.Tensor | None = None
    weight2: torch.Tensor | None = None
    split2: tuple | None = None
    perm: torch.Tensor | None = None
    stride: int = 0             # token ids' stride (token_activations): the most tokens of any rank

    @property
    def local(self) -> int:
        return self.local_experts()


class HierMoE:
    """The two-tier variant of TorchMoE (whose comm, device and thread limit it shares)."""

    method = "index_select on the device, two all_to_all_single tiers (scale-out, then scale-up)"

    def __init__(self, engine):
        self.engine = engine
        self.comm = engine.comm
        self.device = engine.device

    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, copies: str, hidden: int, dtype: str,
              nodes: np.ndarray, fwd_of_node: np.ndarray, sizes: dict, stride: int = 0) -> HierState:
        """sizes: the host's n_send1, n_recv1, n_send2, n_recv for this rank (buffers are sized
        once; the syncs check the device agrees). nodes: node index (0..) of each rank.
        stride: token_activations' (0: this rank's tokens). The pool holds this rank's own
        tokens (T, whatever the other ranks hold), then what the first tier brings."""
        dev, world, me = self.device, self.comm.size, self.comm.rank
        T, K = topk.shape
        rb_d, rb_c = row_nbytes(hidden, dtype), 2 * hidden
        rbx = rb_d + meta_nbytes(K, copies)
        local = num_experts // world if copies == "expert" else 1
        s1, r1, s2, r2 = (sizes[k] for k in ("n_send1", "n_recv1", "n_send2", "n_recv"))

        def empty(*shape, dt=torch.uint8):
            return torch.empty(*shape, dtype=dt, device=dev)
        threads_before, cpu_threads = self.engine.limit_threads()
        topk_t = torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int64).to(dev)
        # Own token rows with their routing appended, as they travel on the first tier; the
        # router hands both over together, so joining them is not a timed stage.
        pool = empty(T + r1, rbx)
        stride = stride or int(T)
        pool[:T, :rb_d] = token_rows(me, torch.arange(T, device=dev), stride, hidden, dtype)
        pool[:T, rb_d:rb_d + 4 * K] = topk_t.to(torch.int32).view(torch.uint8).view(T, 4 * K)
        if copies == "expert":
            w = torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev)
            pool[:T, rb_d + 4 * K:] = w.view(torch.uint8).view(T, 4 * K)
        chunk = min(max(s2, s1, 1), chunk_rows(dev, hidden))
        return HierState(
            copies, dtype, world, me, num_experts, T, hidden, K, rb_d, rb_c, rbx, s1, r1, s2, r2,
            torch.as_tensor(np.asarray(nodes, dtype=np.int64)).to(dev),
            torch.as_tensor(np.asarray(fwd_of_node, dtype=np.int64)).to(dev), int(nodes[me]), topk_t,
            pool, empty(s1 * rbx), empty(s2 * rb_d), empty(r2 * rb_d), empty(r2, rb_d),
            empty(r2, hidden, dt=torch.bfloat16), empty(r2 * rb_c), empty(s2 * rb_c),
            empty(T + r1, hidden, dt=torch.float32), empty(r1 * rb_c), empty(s1 * rb_c),
            empty(T, hidden, dt=torch.float32), empty(chunk, hidden, dt=torch.float32),
            empty(world, dt=torch.int64), empty(world * world * local, dt=torch.int64), cpu_threads, threads_before,
            stride=stride)

    def release(self, st: HierState) -> None:
        self.engine.release(st)

    def fill(self, st: HierState) -> None:
        """Receive buffers zeroed, so a row that never arrives shows."""
        for buf in (st.pool[st.num_tokens:], st.recv2, st.received, st.recv_c2, st.recv_c1):
            buf.zero_()

    # --- dispatch -------------------------------------------------------------------
    def layout(self, st: HierState) -> None:
        """(token, remote node) rows keyed by their forwarder (every node has its own), one
        stable sort: rows grouped by forwarder rank, tokens ascending; the rest keyed
        `world` and sorted last. Then the pack."""
        T, W = st.num_tokens, st.world
        nn = st.fwd_of_node.numel()
        dnode = st.node_of[st.topk // (st.num_experts // W)]
        reach = torch.zeros(T, nn, dtype=torch.bool, device=self.device).scatter_(1, dnode, True)
        reach[:, st.my_node] = False
        key = torch.where(reach, st.fwd_of_node.unsqueeze(0), W).reshape(-1)
        st.tok1 = torch.sort(key, stable=True).indices // nn
        st.counts1 = count(key, W + 1)[:W]
        torch.index_select(st.pool[:T], 0, st.tok1[:st.n_send1], out=st.rows(st.send1, st.n_send1, st.rbx))

    def exchange_counts(self, st: HierState) -> None:
        self.comm.all_to_all(st.counts1, st.counts1_recv)()

    def sync(self, st: HierState) -> None:
        both = torch.cat([st.counts1, st.counts1_recv]).tolist()
        st.split1 = (both[:st.world], both[st.world:])
        self._sized(st, "first-tier", st.split1, st.n_send1, st.n_recv1)

    def exchange_out(self, st: HierState) -> None:
        rb = st.rbx
        send, recv = st.split1
        self.comm.all_to_all(st.send1, st.pool[st.num_tokens:].reshape(-1), [c * rb for c in send],
                             [c * rb for c in recv])()

    def forward(self, st: HierState) -> None:
        """Second-tier rows from every pool row (own tokens and first-tier arrivals) to each
        of its destinations on this node, keyed (destination, source, local expert) and
        stable-sorted, so each key's rows keep the source's token order."""
        T, W, K, L = st.num_tokens, st.world, st.top_k, st.local
        per_rank = st.num_experts // W
        n1 = st.n_recv1
        meta = st.pool[:, st.rb_d:]
        ids = meta[:, :4 * K].contiguous().view(torch.int32).to(torch.int64)
        src = torch.cat([torch.full((T,), st.rank, dtype=torch.int64, device=self.device),
                         torch.repeat_interleave(torch.arange(W, device=self.device), st.counts1_recv,
                                                 output_size=n1)])
        dest = ids // per_rank
        on = st.node_of[dest] == st.my_node
        nkeys = W * W * L
        if st.copies == "rank":  # one row per distinct (pool row, destination rank)
            ds = torch.sort(torch.where(on, dest, W), dim=1).values
            first = torch.ones_like(on)
            first[:, 1:] = ds[:, 1:] != ds[:, :-1]
            key = torch.where(first & (ds < W), ds * W + src.unsqueeze(1), nkeys)
        else:
            key = torch.where(on, (dest * W + src.unsqueeze(1)) * L + ids % per_rank, nkeys)
        key = key.reshape(-1)
        order = torch.sort(key, stable=True).indices
        st.pool_idx2 = order // K
        st.weight2 = meta[:, 4 * K:].contiguous().view(torch.float32).reshape(-1)[order] \
            if st.copies == "expert" else None
        counts2 = count(key, nkeys + 1)[:nkeys]
        self.comm.all_to_all(counts2, st.counts2_recv)()
        both = torch.cat([counts2.view(W, -1).sum(dim=1), st.counts2_recv.view(W, -1).sum(dim=1)]).tolist()
        st.split2 = (both[:W], both[W:])
        self._sized(st, "second-tier", st.split2, st.n_send2, st.n_recv)
        torch.index_select(st.pool[:, :st.rb_d], 0, st.pool_idx2[:st.n_send2],
                           out=st.rows(st.send2, st.n_send2, st.rb_d))

    def exchange_in(self, st: HierState) -> None:
        rb = st.rb_d
        send, recv = st.split2
        self.comm.all_to_all(st.send2, st.recv2, [c * rb for c in send], [c * rb for c in recv])()

    def unpack(self, st: HierState) -> None:
        """Arrivals are blocks (forwarder, source, local expert); each source reaches this
        rank through one forwarder, so ordering the blocks (source, forwarder) gives the flat
        path's order by source, and (local expert, source, forwarder) its regroup by expert."""
        W, L = st.world, st.local
        blocks = torch.arange(W * W * L, device=self.device).view(W, W, L)
        order = (blocks.permute(1, 0, 2) if L == 1 else blocks.permute(2, 1, 0)).reshape(-1)
        st.perm = block_index(st.counts2_recv, order, st.n_recv)
        torch.index_select(st.rows(st.recv2, st.n_recv, st.rb_d), 0, st.perm, out=st.received)

    def dispatch(self, st: HierState, lap) -> None:
        for stage in (self.layout, self.exchange_counts, self.sync, self.exchange_out, self.forward,
                      self.exchange_in, self.unpack):
            stage(st)
            lap()

    def experts(self, st: HierState) -> None:
        """Identity experts (untimed): each received row dequantised back to bf16."""
        decode_rows(st.received, st.hidden, st.dtype, st.expert_out)

    # --- combine --------------------------------------------------------------------
    def combine_pack(self, st: HierState) -> None:
        send = st.rows(st.send_c2, st.n_recv, st.rb_c).view(torch.bfloat16)
        send.index_copy_(0, st.perm, st.expert_out)  # row j of the output arrived perm[j]-th

    def combine_exchange_in(self, st: HierState) -> None:
        rb = st.rb_c
        send, recv = st.split2
        self.comm.all_to_all(st.send_c2, st.recv_c2, [c * rb for c in recv], [c * rb for c in send])()

    def combine_forward(self, st: HierState) -> None:
        """Partial sums per pool row (fp32, weighted for expert copies); the first-tier
        arrivals' sums go back as one bf16 row each, the own tokens' stay for reduce."""
        n = st.n_send2
        back = st.rows(st.recv_c2, n, st.rb_c).view(torch.bfloat16)
        w = st.weight2[:n] if st.weight2 is not None else None
        reduce_rows(st.partial, back, st.pool_idx2[:n], w, st.scratch)
        st.rows(st.send_c1, st.n_recv1, st.rb_c).view(torch.bfloat16).copy_(st.partial[st.num_tokens:])

    def combine_exchange_out(self, st: HierState) -> None:
        rb = st.rb_c
        send, recv = st.split1
        self.comm.all_to_all(st.send_c1, st.recv_c1, [c * rb for c in recv], [c * rb for c in send])()

    def reduce(self, st: HierState) -> None:
        st.out.copy_(st.partial[:st.num_tokens])
        rows = st.rows(st.recv_c1, st.n_send1, st.rb_c).view(torch.bfloat16)
        step = st.scratch.shape[0]
        for lo in range(0, rows.shape[0], step):
            hi = min(rows.shape[0], lo + step)
            buf = st.scratch[:hi - lo]
            buf.copy_(rows[lo:hi])
            st.out.index_add_(0, st.tok1[lo:hi], buf)

    def combine(self, st: HierState, lap) -> None:
        for stage in (self.combine_pack, self.combine_exchange_in, self.combine_forward, self.combine_exchange_out,
                      self.reduce):
            stage(st)
            lap()

    # --- checks (untimed, on the device) --------------------------------------------
    @staticmethod
    def _sized(st: HierState, tier: str, split, n_send: int, n_recv: int) -> None:
        if sum(split[0]) != n_send or sum(split[1]) != n_recv:
            raise RuntimeError(f"moe: rank {st.rank} would send {sum(split[0])} and receive {sum(split[1])} "
                               f"{tier} rows; its buffers were sized for {n_send} and {n_recv}")

    def check_counts(self, st: HierState, first_tier: np.ndarray, per_source: np.ndarray) -> bool:
        """first_tier (world,): the (token, node) rows each source sends this rank;
        per_source (world, local): the rows this rank ends up with from each source (per
        local expert), summed over the forwarders they came through."""
        got1 = st.counts1_recv.cpu().numpy()
        got2 = st.counts2_recv.view(st.world, st.world, st.local).sum(dim=0).cpu().numpy()
        return np.array_equal(got1, first_tier) and np.array_equal(got2, np.asarray(per_source).reshape(got2.shape))

    def check_rows(self, st: HierState, sources: list, regroup: np.ndarray | None) -> bool:
        """As TorchMoE.check_rows: the flat path's arrivals, rebuilt from each source's routing."""
        return self.engine.check_rows(st, sources, regroup)

    def check_combine(self, st: HierState, factor: np.ndarray, weighted: bool) -> bool:
        """x times `factor` per token: exactly for rank copies (the partial sums are small
        integers times a power of two, exact in bf16); for expert copies each node's
        weighted partial sum crosses the first tier once in bf16, so within 2^-8."""
        x = token_activations(st.rank, torch.arange(st.num_tokens, device=self.device), st.stride, st.hidden)
        f = torch.as_tensor(np.asarray(factor, dtype=np.float64)).to(self.device)
        expect = (x.to(torch.float64) * f.unsqueeze(1)).to(torch.float32)
        if weighted:
            return bool(torch.allclose(st.out, expect, rtol=2.0 ** -8, atol=0))
        return bool(torch.equal(st.out, expect))
