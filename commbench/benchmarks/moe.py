"""MoE expert-parallel dispatch and combine (DeepSeek-V3 shape by default).

Each rank holds `tokens` tokens of `hidden` elements; a seeded router picks `topk` of
`experts` experts per token; experts are spread evenly over the ranks. Dispatch sends each
token's activations to the ranks hosting its experts; combine sends the expert outputs back
and reduces them at the source. Both are timed separately, with their stages:

  dispatch: layout (routing -> per-rank counts and row order), counts (all_to_all of the
            counts), pack (gather rows into send order), a2a (the all_to_all itself),
            unpack (expert copies: regroup received rows by local expert, Megatron's
            sort_chunks_by_idxs; rank copies arrive grouped by source, as DeepEP returns
            them, so there is nothing to unpack)
  combine:  pack (expert copies: back to source order), a2a, reduce (bf16 -> fp32,
            weighted sum into each source token)

Payloads travel as raw bytes (uint8): fp8 is H + H/32 bytes a token (e4m3 plus one fp32
scale per 128 elements), bf16 2H; no backend here has an fp8 type and none needs one,
since dispatch does no arithmetic. Rows say so in `payload_carried_as`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import moe as M
from ..errors import UsageError
from ..units import INT_MAX
from .base import Benchmark, Param, Traffic, register

DISPATCH_STAGES = ("layout", "counts", "pack", "a2a", "unpack")
COMBINE_STAGES = ("pack", "a2a", "reduce")
def _no_lap() -> None:
    """A stage boundary nobody is timing (the --check run)."""


HEADER = 8  # bytes at the start of each dispatched row: int32 source rank, int32 token index


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
class MoEBufs:
    point: object
    routing_for: object
    topk: np.ndarray
    weights: np.ndarray
    layout: M.Layout          # this rank's, in send order
    matrix: np.ndarray        # rows sent [src, dst], every rank's routing regenerated
    local: int                # counts exchanged per destination (local experts, or 1)
    rb_d: int                 # dispatch bytes a row
    rb_c: int                 # combine bytes a row
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


@register
class MoE(Benchmark):
    """Expert-parallel dispatch + combine, DeepSeek-V3 shape by default."""

    name = "moe"
    sized = False
    min_world = 1
    cpu_only = True
    params = {
        "tokens": Param(4096, "tokens per rank", int, minimum=1),
        "hidden": Param(7168, "hidden size H", int, minimum=1),
        "experts": Param(256, "routed experts E", int, minimum=1),
        "topk": Param(8, "experts per token K", int, minimum=1),
        "dispatch_dtype": Param("fp8", "fp8 (H + H/32 bytes) or bf16 (2H)", str, choices=("fp8", "bf16")),
        "combine_dtype": Param("bf16", "combine payload", str, choices=("bf16",)),
        "copies": Param("rank", "rank: one copy per destination rank (DeepEP normal); "
                        "expert: one per (token, expert) (Megatron all-to-all)", str, choices=("rank", "expert")),
        "routing": Param("uniform", "uniform, balanced, zipf, hot_rank, group_limited", str,
                         choices=tuple(M.ROUTINGS)),
        "alpha": Param(1.0, "zipf exponent (skew)", float, minimum=0.0),
        "ratio": Param(2.0, "hot_rank: the hot rank's experts are this many times as likely", float, minimum=1.0),
        "max_groups": Param(4, "group_limited: groups a token may reach (M)", int, minimum=1),
        "groups": Param(0, "group_limited: expert groups (0: one per rank)", int, minimum=0),
        "seed": Param(0, "routing seed", int, minimum=0),
    }

    stages = 2

    # --- presentation hooks (the code: moe_view) ---
    collective_rows = False  # two stages of a routed all-to-all whose bytes follow the routing

    def describe(self, params):
        from .moe_view import shape

        return shape(params)

    def tables(self, rows, plain):
        from .moe_view import terminal_table

        return [terminal_table(rows, plain)]

    def figures(self, rows, out_dir):
        from .moe_view import figures

        return figures(rows, out_dir, self.name)

    def report_sections(self, rows, figures):
        from .moe_view import section

        return [section(rows, figures)]

    def scaling_metric(self, rows):
        from .moe_view import scaling_metric

        return scaling_metric(rows)

    def memory_nbytes(self, point):
        """x, dispatch send/receive, combine send/receive (and the expert-ordered copies for
        expert copies), and combine's fp32 output, at the expected copies per token."""
        p, w = point.params, max(point.world, 1)
        rb_d, rb_c = M.token_bytes(p["hidden"], p["dispatch_dtype"]), M.token_bytes(p["hidden"], "bf16")
        copies = p["topk"] if p["copies"] == "expert" else M.expected_dest_ranks(p["experts"], p["topk"], w)
        rows = p["tokens"] * copies
        extra = 2 if p["copies"] == "expert" else 1
        return int(p["tokens"] * rb_d + rows * (2 * rb_d + 2 * rb_c) + (extra - 1) * rows * (rb_d + rb_c)
                   + p["tokens"] * p["hidden"] * 4)

    def max_count(self, point):
        # Rows travel as bytes: a receive buffer's byte offsets reach its size. Expected
        # rows, doubled for routing skew; setup checks the real layout again.
        p = point.params
        copies = p["topk"] if p["copies"] == "expert" else M.expected_dest_ranks(p["experts"], p["topk"], point.world)
        return int(2 * p["tokens"] * copies * M.token_bytes(p["hidden"], p["dispatch_dtype"]))

    def plan_nbytes(self, point):
        # Host-side packing and the combine reduction run at about 1 GB/s on the loopback:
        # five times the planning rate's worth of bytes.
        p = point.params
        return 5 * int(p["tokens"] * p["topk"] * M.token_bytes(p["hidden"], p["dispatch_dtype"]))

    # --- pure helpers -----------------------------------------------------------
    @staticmethod
    def routing_params(p: dict, world: int) -> dict:
        """The chosen routing's own parameters (the others' are ignored)."""
        own = {"zipf": {"alpha": p["alpha"]}, "hot_rank": {"ratio": p["ratio"]},
               "group_limited": {"groups": p["groups"] or world, "max_groups": p["max_groups"]}}
        return own.get(p["routing"], {})

    def canonical_params(self, params):
        own = {"zipf": ("alpha",), "hot_rank": ("ratio",), "group_limited": ("max_groups", "groups")}
        keep = own.get(params["routing"], ())
        return {k: (v if k not in ("alpha", "ratio", "max_groups", "groups") or k in keep else self.params[k].default)
                for k, v in params.items()}

    def routing_for(self, p: dict, world: int):
        own = self.routing_params(p, world)

        def make(rank: int) -> M.Routing:
            return M.make_routing(p["routing"], num_tokens=p["tokens"], num_experts=p["experts"], top_k=p["topk"],
                                  rank=rank, world=world, seed=p["seed"], **own)
        return make

    def validate(self, point):
        p, world = point.params, point.world
        try:
            own = self.routing_params(p, world)
            M.validate_routing_params(p["routing"], own, p["experts"], p["topk"], world, p["tokens"])
            M.token_bytes(p["hidden"], p["dispatch_dtype"])
        except ValueError as e:
            raise UsageError(f"moe: {e}") from None
        if p["hidden"] * 2 < HEADER:
            raise UsageError(f"moe: hidden {p['hidden']} is too small to carry a row header")

    def busbw_factor(self, world):
        return (world - 1) / world

    def traffic(self, point):  # S is known per stage only, after the layout (measure)
        return Traffic(0, self.busbw_factor(point.world))

    # --- ceiling hooks: each row carries the bytes the most loaded rank moved per tier
    # (measure), so the ceiling compares those over the row's time; busbw, over all the
    # bytes moved, is no one link's rate. Nothing reduces in a switch.
    inswitch_applies = False

    def latency_only(self, row):
        return False

    def tier_nbytes(self, row, world, domains, inswitch):
        up, out = float(row.get("scaleup_nbytes") or 0), float(row.get("scaleout_nbytes") or 0)
        if len(set(domains)) == 1:  # one scale-up domain: every remote byte rides the scale-up links
            return up + out, 0.0
        return up, out

    def busbw_is_link_rate(self, scaleup_nbytes, scaleout_nbytes):
        return False

    def tier_note(self, nodes, domains):
        if len(set(nodes)) > len(set(domains)):
            return ("scaleout_nbytes counts bytes between nodes, some of which stay inside a scale-up "
                    "domain: the NIC term is an upper bound")
        return None

    # --- setup ------------------------------------------------------------------
    def setup(self, comm, point):
        p, world, rank = point.params, comm.size, comm.rank
        routing_for = self.routing_for(p, world)
        r = routing_for(rank)
        layout = send_order(M.dispatch_layout(r.topk_idx, p["experts"], world, p["copies"], weights=r.weights))
        matrix = M.global_layout(routing_for, p["experts"], world, p["copies"])
        local = p["experts"] // world if p["copies"] == "expert" else 1
        rb_d, rb_c = M.token_bytes(p["hidden"], p["dispatch_dtype"]), M.token_bytes(p["hidden"], "bf16")
        n_send, n_recv = layout.num_rows, int(matrix[:, rank].sum())
        if comm.backend == "mpi" and max(n_send, n_recv) * max(rb_d, rb_c) > INT_MAX:
            raise UsageError(f"moe: rank {rank} would move {max(n_send, n_recv) * max(rb_d, rb_c)} bytes in one call, "
                             f"over the 2^31-1 count MPI takes without MPI-4 large-count calls: fewer tokens")
        expert = p["copies"] == "expert"
        return MoEBufs(
            point, routing_for, r.topk_idx, r.weights, layout, matrix, local, rb_d, rb_c,
            make_x(rank, p["tokens"], rb_d),
            comm.alloc(n_send * rb_d, "uint8"), comm.alloc(n_recv * rb_d, "uint8"),
            comm.alloc(n_recv * rb_c, "uint8"), comm.alloc(n_send * rb_c, "uint8"),
            comm.alloc(world * local, "int32"), comm.alloc(world * local, "int32"),
            np.empty((n_recv, rb_d), np.uint8) if expert else None,
            np.empty((n_recv, rb_c), np.uint8) if expert else None,
        )

    def fill(self, comm, b):
        comm.host_view(b.recv_d)[:] = 0
        comm.host_view(b.recv_c)[:] = 0

    # --- the operations ---------------------------------------------------------
    def dispatch(self, comm, b, lap=_no_lap):
        """One dispatch; lap() after each of DISPATCH_STAGES (the harness's clock)."""
        p, world = b.point.params, comm.size
        lay = send_order(M.dispatch_layout(b.topk, p["experts"], world, p["copies"], weights=b.weights))
        cs = comm.host_view(b.counts_send)
        cs[:] = lay.tokens_per_expert if p["copies"] == "expert" else lay.send_counts
        lap()
        comm.all_to_all(b.counts_send, b.counts_recv)()
        per = self._counts_matrix(comm, b)
        recv_counts = per.sum(axis=1)
        lap()
        # Expert copies land regrouped by local expert (Megatron's sort_chunks_by_idxs):
        # arrival j goes to row recv_rows[j]; rank copies stay grouped by source (DeepEP).
        b.recv_rows = inverse_perm(regroup_perm(per)) if b.expert_in is not None else None
        ex = comm.rows_all_to_all(b.rb_d, b.x, lay.send_token_idx, lay.send_counts, b.expert_in, recv_counts,
                                  b.recv_rows, b.send_d, b.recv_d)
        ex.pack()
        lap()
        ex.run()
        lap()
        ex.unpack()
        lap()
        b.pack_method = ex.method
        return per

    def experts(self, comm, b, per):
        """Identity experts (untimed): each output row is its input token's value in bf16,
        read from the header the row arrived with."""
        rows_in = b.expert_in if b.expert_in is not None else comm.host_view(b.recv_d).reshape(-1, b.rb_d)
        hdr = np.ascontiguousarray(rows_in[:, :HEADER]).view(np.int32)
        vals = _bf16(token_value(hdr[:, 0], hdr[:, 1]))
        out = b.expert_out if b.expert_out is not None else comm.host_view(b.send_c).reshape(-1, b.rb_c)
        out.view(np.uint16)[:] = vals[:, None]

    def combine(self, comm, b, lap=_no_lap):
        """One combine; lap() after each of COMBINE_STAGES."""
        lay = b.layout
        # Expert copies go back in arrival order: the row that arrived j-th sits at
        # recv_rows[j] of the expert output.
        ex = comm.rows_all_to_all(b.rb_c, b.expert_out, b.recv_rows, b.matrix[:, comm.rank], None, lay.send_counts, None,
                                  b.send_c, b.recv_c)
        ex.pack()
        lap()
        ex.run()
        lap()
        back = comm.host_view(b.recv_c).view(np.uint16).reshape(lay.num_rows, -1)
        b.out = reduce_bf16_rows(back, lay, b.point.params["tokens"], weighted=lay.copies == "expert")
        lap()

    def op(self, comm, b):
        def round_trip():
            per = self.dispatch(comm, b)
            self.experts(comm, b, per)
            self.combine(comm, b)
        return round_trip

    # --- correctness --------------------------------------------------------------
    def check(self, comm, b):
        p, world, me = b.point.params, comm.size, comm.rank
        got_counts = self._counts_matrix(comm, b).sum(axis=1)
        if not np.array_equal(got_counts, b.matrix[:, me]):
            return False
        # Every row I received, in order: grouped by source, each source's rows in its send order.
        want = []
        for src in range(world):
            r = b.routing_for(src)
            lay = send_order(M.dispatch_layout(r.topk_idx, p["experts"], world, p["copies"], weights=r.weights))
            off = lay.send_offsets
            want.append(make_x(src, p["tokens"], b.rb_d)[lay.send_token_idx[off[me]:off[me + 1]]])
            if p["copies"] == "expert":  # per-expert counts as exchanged
                local = p["experts"] // world
                got = comm.host_view(b.counts_recv).reshape(world, local)[src]
                if not np.array_equal(got, lay.tokens_per_expert[me * local:(me + 1) * local]):
                    return False
        got = comm.host_view(b.recv_d).reshape(-1, b.rb_d)
        if b.expert_in is not None:  # arrivals were placed regrouped by expert: undo that
            got = b.expert_in[b.recv_rows]
        if not np.array_equal(got, np.concatenate(want) if want else got):
            return False
        # combine(dispatch(x)) with identity experts: x times the copies (rank), or x times
        # the sum of its weights (expert, weighted; float32 sums: rtol 1e-5).
        x = token_value(me, np.arange(p["tokens"]))
        weighted = p["copies"] == "expert"
        expect = (x * M.combine_factor(b.layout, weighted)).astype(np.float32)
        got = b.out
        if got is None or got.shape[0] != p["tokens"]:
            return False
        if weighted:
            return bool(np.allclose(got, expect[:, None], rtol=1e-5, atol=0))
        return bool(np.array_equal(got, np.broadcast_to(expect[:, None], got.shape)))

    # --- measurement --------------------------------------------------------------
    def measure(self, harness, comm, point, b):
        p, world, me = point.params, comm.size, comm.rank
        nodes = getattr(comm, "node_of_rank", None)
        nodes = np.zeros(world, np.int64) if nodes is None else np.asarray(nodes)[:world]
        recv_counts = b.matrix[:, me]
        rows = []
        per = None
        for stage, names, rb in (("dispatch", DISPATCH_STAGES, b.rb_d), ("combine", COMBINE_STAGES, b.rb_c)):
            if stage == "combine":
                self.experts(comm, b, per)
            fn = self.dispatch if stage == "dispatch" else self.combine

            # Bytes per rank (dispatch side counts; combine counts them at the expert side,
            # as DeepEP does), then the most loaded rank's figure.
            acc = M.dispatch_bytes(b.layout.send_counts, recv_counts, me, nodes, rb)
            keys = ("logical_nbytes", "remote_nbytes", "scaleup_nbytes", "scaleout_nbytes")
            mine = [acc[k] for k in keys] + [max(acc["logical_nbytes"], acc["sent_logical_nbytes"])]
            *mx, moved = comm.max_over_ranks(np.array(mine, dtype=np.float64))
            traffic = Traffic(int(moved), self.busbw_factor(world))
            frag, _ = harness.time_steps(comm, point, lambda lap, fn=fn: fn(comm, b, lap), traffic, stage=stage,
                                         laps=names)
            t_us = frag["time_us_p50"]
            extra = {}
            a2a = frag["stage_us_a2a"]
            extra["outside_a2a_pct"] = 100.0 * max(0.0, t_us - a2a) / t_us if t_us > 0 else 0.0
            for k, v in zip(keys, mx):
                extra[k] = int(v)
                extra[k.replace("_nbytes", "_gbps")] = v / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
            if stage == "dispatch":
                per = self._counts_matrix(comm, b)
            rows.append({**frag, "nbytes": int(moved), "dtype": p[f"{stage}_dtype"], **extra})
        load = b.matrix.sum(axis=0)
        imb, hot = M.load_imbalance(load)
        info = {"load_max_over_mean": imb, "hottest_rank": hot, "recv_rows_max": int(load.max()),
                "recv_rows_mean": float(load.mean()), "payload_carried_as": "uint8",
                "pack_method": b.pack_method,
                "bandwidth_note": "bytes of the most loaded rank / slowest-rank p50"}
        if me == 0:  # only rank 0 writes rows; zipf's expectation is a Monte-Carlo estimate
            exp_imb, _ = M.expected_load_imbalance(p["routing"], p["experts"], p["topk"], world,
                                                   seed=p["seed"], **self.routing_params(p, world))
            info["expected_load_max_over_mean"] = float(exp_imb)
        return [{**r, **info} for r in rows]

    @staticmethod
    def _counts_matrix(comm, b) -> np.ndarray:
        """The exchanged counts as [source, local expert] (one column for rank copies)."""
        return comm.host_view(b.counts_recv).reshape(comm.size, b.local).astype(np.int64)
