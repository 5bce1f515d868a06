"""The moe dispatcher allgather on the host (mpi): Megatron-Core's
MoEAllGatherTokenDispatcher. Every rank gathers every rank's tokens and routing (top-k
expert ids and weights), keeps the rows of its own experts, and after the experts
sums its weighted outputs per token into a buffer the size of all gathered tokens, which
one reduce-scatter returns to the sources.

  dispatch: gather (MPI_Allgather of the tokens, padded to the largest rank's count, and
            of the routing), select (the rows of this rank's experts: one per (token,
            local expert), ordered by local expert, for expert copies; one per token with
            a local expert, in (source, token) order, for rank copies)
  combine:  reduce (the selected rows' outputs into per-token partial sums: weighted for
            expert copies, one per token for rank copies), reduce_scatter (MPI_Reduce_
            scatter_block of those fp32 partial sums: MPI has no bf16 sum)

Bytes: logical_nbytes is algorithmic, the routed rows this rank's experts take (what the
all-to-all paths move, DeepEP's figure); remote/scaleup/scaleout_nbytes are physical,
what left the rank: its padded tokens and routing to every other rank in dispatch, fp32
partial sums of the padded tokens for every other rank in combine.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M
from commbench.moe.layout import copy_number

from .host import HEADER, ExchangePath, _bf16, _from_bf16, _no_lap, make_x, regroup_perm, token_value

_BLOCK_ROWS = 1024  # rows widened to fp32 at once in the reduce: bounds the temporary


@dataclass
class AllGatherBufs:
    plan: object
    tokens: int               # this rank's tokens
    max_tokens: int           # the largest rank's: every rank's block is padded to it
    x_send: object
    x_all: object
    r_send: object            # int32 (max_tokens, 2K): K expert ids (-1: padding), K weights' bits
    r_all: object
    partial: object           # float32 (world * max_tokens * H): this rank's per-token sums
    out_recv: object          # float32 (max_tokens * H): the reduce-scatter's share
    ops: tuple                # prepared gather_x, gather_r, reduce_scatter
    expert_in: np.ndarray | None = None  # the selected rows, as the experts read them
    expert_out: np.ndarray | None = None
    sel_rows: np.ndarray | None = None   # gathered row of each selected row
    sel_w: np.ndarray | None = None      # its weight in the partial sum
    out: np.ndarray | None = None
    pack_method: str = ("MPI_Allgather of the padded tokens and the routing; MPI_Reduce_scatter_block "
                        "of fp32 per-token partial sums")
    path: object = None


class AllGatherHostPath(ExchangePath):
    name = "host"
    dispatch_stages = ("gather", "select")
    combine_stages = ("reduce", "reduce_scatter")
    exchange_laps = ("gather", "reduce_scatter")  # what outside_a2a_pct counts as the exchange

    def setup(self, comm, plan) -> AllGatherBufs:
        world, me = comm.size, comm.rank
        p = plan.point.params
        k, h = p["topk"], p["hidden"]
        tokens = [plan.tokens_of(s) for s in range(world)]  # this step's (ranks may differ)
        t_max = max(tokens)
        self._counted = 0  # measure asks the accounting of dispatch, then of combine
        self._per_peer = {"dispatch": t_max * (plan.rb_d + 8 * k), "combine": t_max * h * 4}
        x_send, x_all = comm.alloc(t_max * plan.rb_d, "uint8"), comm.alloc(world * t_max * plan.rb_d, "uint8")
        r_send, r_all = comm.alloc(t_max * 2 * k, "int32"), comm.alloc(world * t_max * 2 * k, "int32")
        partial, out_recv = comm.alloc(world * t_max * h, "float32"), comm.alloc(t_max * h, "float32")
        xs = comm.host_view(x_send)
        xs[:] = 0
        xs[:tokens[me] * plan.rb_d] = make_x(me, tokens[me], plan.rb_d).ravel()
        ops = (comm.all_gather(x_send, x_all), comm.all_gather(r_send, r_all), comm.reduce_scatter(partial, out_recv))
        return AllGatherBufs(plan, tokens[me], t_max, x_send, x_all, r_send, r_all, partial, out_recv, ops,
                             np.empty((plan.n_recv, plan.rb_d), np.uint8))

    def fill(self, comm, b: AllGatherBufs) -> None:
        for buf in (b.x_all, b.r_all, b.out_recv):
            comm.host_view(buf)[:] = 0
        b.expert_in[:] = 0
        b.out = None

    def dispatch(self, comm, b: AllGatherBufs, lap=_no_lap) -> None:
        plan, k = b.plan, b.plan.point.params["topk"]
        r = comm.host_view(b.r_send).reshape(b.max_tokens, 2 * k)
        r[:, :k] = -1
        r[:b.tokens, :k] = plan.topk
        r[:b.tokens, k:] = np.ascontiguousarray(plan.weights, dtype=np.float32).view(np.int32)
        gather_x, gather_r, _ = b.ops
        gather_x()
        gather_r()
        lap()
        b.sel_rows, b.sel_w = self.select(comm.host_view(b.r_all).reshape(-1, 2 * k), plan, comm.rank)
        x_all = comm.host_view(b.x_all).reshape(-1, plan.rb_d)
        if b.sel_rows.size != b.expert_in.shape[0]:  # not the rows the routing sends here: the check says so
            b.expert_in = np.empty((b.sel_rows.size, plan.rb_d), np.uint8)
        np.take(x_all, b.sel_rows, axis=0, out=b.expert_in, mode="clip")  # indices valid by construction
        lap()

    @staticmethod
    def select(routing_all: np.ndarray, plan, me: int) -> tuple[np.ndarray, np.ndarray]:
        """From every rank's gathered routing, the gathered rows this rank's experts take and
        each one's weight in its token's partial sum."""
        p = plan.point.params
        k, local = p["topk"], p["experts"] // plan.matrix.shape[0]
        ids = routing_all[:, :k]
        mine = (ids >= me * local) & (ids < (me + 1) * local)
        if p["copies"] == "rank":  # one row per token with a local expert; unweighted, as the host path
            rows = np.flatnonzero(mine.any(axis=1))
            return rows, np.ones(rows.size, np.float32)
        rows, slots = np.nonzero(mine)                            # (gathered row, k) in row order
        order = np.argsort(ids[rows, slots], kind="stable")      # by local expert, then source, token
        weights = np.ascontiguousarray(routing_all[:, k:]).view(np.float32)
        return rows[order], weights[rows, slots][order]

    def experts(self, comm, b: AllGatherBufs) -> None:
        """Identity experts (untimed): each output row is its token's value in bf16, read
        from the header the row arrived with."""
        hdr = np.ascontiguousarray(b.expert_in[:, :HEADER]).view(np.int32)
        vals = _bf16(token_value(hdr[:, 0], hdr[:, 1]))
        b.expert_out = np.empty((vals.size, b.plan.rb_c // 2), np.uint16)
        b.expert_out[:] = vals[:, None]

    def combine(self, comm, b: AllGatherBufs, lap=_no_lap) -> None:
        h = b.plan.point.params["hidden"]
        part = comm.host_view(b.partial).reshape(-1, h)
        part[:] = 0
        idx = b.sel_rows
        # A token picked for several local experts has several rows: the c-th rows of the
        # tokens form one duplicate-free `part[idx] += rows`.
        cn = copy_number(_Rows(idx)) if idx.size else idx
        for c in range(int(cn.max()) + 1 if cn.size else 0):
            sel = np.flatnonzero(cn == c)
            for s0 in range(0, sel.size, _BLOCK_ROWS):
                r = sel[s0:s0 + _BLOCK_ROWS]
                vals = _from_bf16(b.expert_out[r])
                vals *= b.sel_w[r, None]
                part[idx[r]] += vals
        lap()
        b.ops[2]()
        lap()
        b.out = comm.host_view(b.out_recv).reshape(b.max_tokens, h)[:b.tokens]

    def check(self, comm, b: AllGatherBufs) -> bool:
        """The selected rows are the rows the all-to-all paths deliver (each source's, in its
        send order; regrouped by local expert for expert copies), and combine(dispatch(x))
        through identity experts = x times the copies (rank, exact) or the weight sum
        (expert, rtol 1e-5)."""
        plan = b.plan
        p, world, me = plan.point.params, comm.size, comm.rank
        want, counts = [], []
        for src in range(world):
            lay = plan.source_layout(src)
            off = lay.send_offsets
            want.append(make_x(src, lay.num_tokens, plan.rb_d)[lay.send_token_idx[off[me]:off[me + 1]]])
            counts.append(lay.tokens_per_expert[me * plan.local:(me + 1) * plan.local])
        want = np.concatenate(want)
        if p["copies"] == "expert":
            want = want[regroup_perm(np.array(counts, dtype=np.int64))]
        if not np.array_equal(b.expert_in, want):
            return False
        weighted = p["copies"] == "expert"
        expect = (token_value(me, np.arange(b.tokens)) * M.combine_factor(plan.layout, weighted)).astype(np.float32)
        if b.out is None or b.out.shape[0] != b.tokens:
            return False
        if weighted:
            return bool(np.allclose(b.out, expect[:, None], rtol=1e-5, atol=0))
        return bool(np.array_equal(b.out, np.broadcast_to(expect[:, None], b.out.shape)))

    def accounting(self, plan, rank, node_of_rank, row_nbytes) -> dict:
        """Algorithmic logical_nbytes (the routed rows, as the all-to-all paths count them);
        physical remote/scaleup/scaleout_nbytes: what left the rank for other ranks."""
        stage = ("dispatch", "combine")[min(self._counted, 1)]
        self._counted += 1
        acc = super().accounting(plan, rank, node_of_rank, row_nbytes)
        node = np.asarray(node_of_rank)
        other = np.arange(node.shape[0]) != rank
        same = node == node[rank]
        per = self._per_peer[stage]
        acc.update(remote_nbytes=int(other.sum()) * per, scaleup_nbytes=int((other & same).sum()) * per,
                   scaleout_nbytes=int((~same).sum()) * per, sent_logical_nbytes=int(other.sum()) * per)
        return acc

    def row_info(self, b: AllGatherBufs) -> dict:
        return {"padded_tokens": b.max_tokens, "combine_carried_as": "float32",
                "bytes_note": "logical_nbytes: algorithmic (the routed rows this rank's experts take, as the "
                              "all-to-all dispatchers count them); remote/scaleup/scaleout_nbytes: physical, what "
                              "left the rank (its tokens padded to the largest rank's count plus 8 bytes of routing "
                              "per top-k slot to every other rank; combine: fp32 partial sums of those tokens)"}


@dataclass
class _Rows:
    """moe.copy_number's view of the selected rows: which token each is."""
    send_token_idx: np.ndarray
