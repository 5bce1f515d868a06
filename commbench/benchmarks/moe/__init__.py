"""MoE expert-parallel dispatch and combine (DeepSeek-V3 shape by default).

Each rank holds `tokens` tokens of `hidden` elements; a seeded router picks `topk` of
`experts` experts per token; experts are spread evenly over the ranks. Dispatch sends each
token's activations to the ranks hosting its experts; combine sends the expert outputs back
and reduces them at the source. Both are timed separately, with their stages.

Two implementations of the same exchange (rows say which ran, in `engine`):

- torch (gloo on CPU tensors, nccl on CUDA tensors, one code,
  backends/moe/torch_normal.py): layout, counts, sync, pack, a2a, unpack on the device; fp8 rows
  are a float8_e4m3fn payload plus fp32 scales, quantised from bf16 activations;
- host (mpi): numpy layout and reduction, rows moved by one MPI_Alltoallw (host.py).

  dispatch: layout (routing -> per-rank counts and row order), counts (all_to_all of the
            counts), sync (torch: the split sizes to the host), pack (rows into send
            order), a2a (the all_to_all itself), unpack (expert copies: regroup received
            rows by local expert, Megatron's sort_chunks_by_idxs; rank copies arrive
            grouped by source, as DeepEP returns them, so there is nothing to unpack)
  combine:  pack (expert copies: back to source order), a2a, reduce (bf16 -> fp32,
            weighted sum into each source token)

Payloads travel as raw bytes (uint8): fp8 is H + H/32 bytes a token (e4m3 plus one fp32
scale per 128 elements), bf16 2H; gloo and MPI have no fp8 type and dispatch does no
arithmetic, so nccl carries bytes too. Rows say so in `payload_carried_as`.

A benchmark never imports torch at import time: the device path is an engine of
backends/moe/ (engines.py picks it for the comm and imports it when first asked), driven
here, and checked against expectations computed here from the regenerated routing.

The benchmark is a package because its paths are one job seen from several backends:
this module holds what every path shares (parameters, plan, measurement, a point's shape),
and each path drives its engine stage by stage in a module of its own, in the order a
reader meets them: host.py (the host path and the base every path extends), device.py
(torch, normal mode), low_latency.py, hierarchical.py, jax_path.py; engines.py picks the
engine for the comm.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commbench import moe as M
from commbench.core.errors import UsageError
from commbench.moe.shape import DEEPSEEK_V3

from ..base import Benchmark, Param, Traffic, register
from .device import DevicePath
from .engines import engine, has_engine
from .hierarchical import HierarchicalPath
from .host import HEADER, HostPath, _no_lap, send_order
from .jax_path import JaxPath, refusal
from .low_latency import LowLatencyPath

MODES = ("normal", "low_latency")
PATHS = ("flat", "hierarchical")

@dataclass
class MoEPlan:
    """What both paths share, worked out on the host at setup: this rank's routing and
    layout (in send order), the rows every rank sends every other (each rank's routing
    regenerated locally), and the row sizes."""

    point: object
    routing_for: object
    rank: int
    topk: np.ndarray
    weights: np.ndarray
    layout: M.Layout          # this rank's, in send order
    matrix: np.ndarray        # rows sent [src, dst]
    local: int                # counts exchanged per destination (local experts, or 1)
    rb_d: int                 # dispatch bytes a row
    rb_c: int                 # combine bytes a row

    @property
    def n_recv(self) -> int:
        return int(self.matrix[:, self.rank].sum())

    def source_layout(self, src: int) -> M.Layout:
        """Rank src's layout in send order, from its regenerated routing."""
        if src == self.rank:
            return self.layout
        p, world = self.point.params, self.matrix.shape[0]
        r = self.routing_for(src)
        return send_order(M.dispatch_layout(r.topk_idx, p["experts"], world, p["copies"], weights=r.weights))


@register
class MoE(Benchmark):
    """Expert-parallel dispatch + combine, DeepSeek-V3 shape by default."""

    name = "moe"
    sized = False
    min_world = 1
    host_only_on = ("mpi",)  # the host path needs CPU buffers; torch backends run the device path
    params = {
        "tokens": Param(DEEPSEEK_V3.tokens, "tokens per rank", int, minimum=1),
        "hidden": Param(DEEPSEEK_V3.hidden, "hidden size H", int, minimum=1),
        "experts": Param(DEEPSEEK_V3.experts, "routed experts E", int, minimum=1),
        "topk": Param(DEEPSEEK_V3.topk, "experts per token K", int, minimum=1),
        "dispatch_dtype": Param(DEEPSEEK_V3.dispatch_dtype, "fp8 (H + H/32 bytes) or bf16 (2H)", str,
                                choices=("fp8", "bf16")),
        "combine_dtype": Param("bf16", "combine payload", str, choices=("bf16",)),
        "copies": Param("rank", "rank: one copy per destination rank (DeepEP normal); "
                        "expert: one per (token, expert) (Megatron all-to-all)", str, choices=("rank", "expert")),
        "routing": Param("uniform", "uniform, balanced, zipf, hot_rank, group_limited", str,
                         choices=tuple(M.ROUTINGS)),
        "alpha": Param(1.0, "zipf exponent (skew)", float, minimum=0.0),
        "ratio": Param(2.0, "hot_rank: the hot rank's experts are this many times as likely", float, minimum=1.0),
        "max_groups": Param(DEEPSEEK_V3.max_groups, "group_limited: groups a token may reach (M)", int, minimum=1),
        "groups": Param(0, "group_limited: expert groups (0: one per rank)", int, minimum=0),
        "seed": Param(0, "routing seed", int, minimum=0),
        "mode": Param("normal", "normal: counts exchanged, split sizes synced to the host (DeepEP normal, Megatron); "
                      "low_latency: a fixed capacity per (source, expert), no count exchange, no host sync "
                      "(DeepEP's decode kernels; copies=expert)", str, choices=MODES),
        "capacity": Param(0, "low_latency: row slots per (source rank, expert); 0: tokens per rank, which never "
                          "overflows", int, minimum=0),
        "path": Param("flat", "flat: one all_to_all; hierarchical: across nodes once per (token, node) to the peer "
                      "with the same local rank, then over the scale-up tier inside the node (DeepEP internode)",
                      str, choices=PATHS),
    }

    stages = 2

    # --- presentation: the point's shape and weak scaling's measure live here; the table,
    # figures and report section are the report layer's view "moe" (report/moe_view.py) ---
    view = "moe"
    collective_rows = False  # two stages of a routed all-to-all whose bytes follow the routing

    def describe(self, params):
        return shape(params)

    def scaling_metric(self, rows):
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
        if params.get("mode") == "low_latency":
            keep += ("capacity",)
        return {k: (v if k not in ("alpha", "ratio", "max_groups", "groups", "capacity") or k in keep
                    else self.params[k].default) for k, v in params.items()}

    def refusal(self, backend: str, device: str, params: dict) -> str | None:
        """The host path (mpi) has one flat, normal exchange."""
        asked = {k: v for k, v in params.items() if k in ("mode", "path")}
        odd = [f"{k}={v}" for k, v in asked.items() if (v if isinstance(v, list) else [v]) != [self.params[k].default]]
        if backend in self.host_only_on and odd:
            return f"moe {', '.join(odd)} runs on the device path (gloo, nccl), not on {backend}"
        if backend == "jax":  # its own engine, over ragged_all_to_all where that runs (jax_path.py)
            return refusal(device, odd)
        return None

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
        if p["mode"] == "low_latency" and p["copies"] != "expert":
            raise UsageError("moe: mode=low_latency sends one row per (token, expert), as DeepEP's decode kernels "
                             "do: use copies=expert")
        if p["mode"] == "low_latency" and p["path"] != "flat":
            raise UsageError("moe: mode=low_latency is one flat exchange (DeepEP's decode kernels): use path=flat")

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
    @staticmethod
    def path(comm, params: dict):
        """The device path where the backend has an engine (engines.py; torch: gloo, nccl),
        in the mode and path asked; else the host path (refused for anything but flat normal: refusal())."""
        if comm.backend == "jax":  # stages of its own, no host sync (jax_path.py); flat normal only
            return JaxPath(engine(comm))
        if not has_engine(comm):
            return HostPath()
        if params["mode"] == "low_latency":
            return LowLatencyPath(engine(comm, "low_latency"))
        if params["path"] == "hierarchical":
            return HierarchicalPath(engine(comm, "hierarchical"))
        return DevicePath(engine(comm))

    def setup(self, comm, point):
        p, world, rank = point.params, comm.size, comm.rank
        routing_for = self.routing_for(p, world)
        r = routing_for(rank)
        layout = send_order(M.dispatch_layout(r.topk_idx, p["experts"], world, p["copies"], weights=r.weights))
        plan = MoEPlan(point, routing_for, rank, r.topk_idx, r.weights, layout,
                       M.global_layout(routing_for, p["experts"], world, p["copies"]),
                       p["experts"] // world if p["copies"] == "expert" else 1,
                       M.token_bytes(p["hidden"], p["dispatch_dtype"]), M.token_bytes(p["hidden"], "bf16"))
        path = self.path(comm, p)
        b = path.setup(comm, plan)
        b.path = path
        return b

    def fill(self, comm, b):
        b.path.fill(comm, b)

    # --- the operations (each path's own; lap() after each of its stages) ---------------
    def dispatch(self, comm, b, lap=_no_lap):
        b.path.dispatch(comm, b, lap)

    def experts(self, comm, b):
        """Identity experts, untimed."""
        b.path.experts(comm, b)

    def combine(self, comm, b, lap=_no_lap):
        b.path.combine(comm, b, lap)

    def op(self, comm, b):
        def round_trip():
            self.dispatch(comm, b)
            self.experts(comm, b)
            self.combine(comm, b)
        return round_trip

    def check(self, comm, b):
        return b.path.check(comm, b)

    # --- measurement --------------------------------------------------------------
    def measure(self, harness, comm, point, b):
        p, world, me = point.params, comm.size, comm.rank
        plan = b.plan
        nodes = getattr(comm, "node_of_rank", None)
        nodes = np.zeros(world, np.int64) if nodes is None else np.asarray(nodes)[:world]
        rows = []
        for stage, names, rb in (("dispatch", b.path.dispatch_stages, plan.rb_d),
                                 ("combine", b.path.combine_stages, plan.rb_c)):
            if stage == "combine":
                self.experts(comm, b)
            fn = self.dispatch if stage == "dispatch" else self.combine

            # Bytes per rank (dispatch side counts; combine counts them at the expert side,
            # as DeepEP does), then the most loaded rank's figure.
            acc = b.path.accounting(plan, me, nodes, rb)
            keys = ("logical_nbytes", "remote_nbytes", "scaleup_nbytes", "scaleout_nbytes")
            mine = [acc[k] for k in keys] + [max(acc["logical_nbytes"], acc["sent_logical_nbytes"])]
            *mx, moved = comm.max_over_ranks(np.array(mine, dtype=np.float64))
            traffic = Traffic(int(moved), self.busbw_factor(world))
            # Held on a device, the hold let go before each stage that waits for the device
            # on the host (the normal mode's sync) and put up again after it.
            frag, _ = harness.time_steps(comm, point, lambda lap, fn=fn: fn(comm, b, lap), traffic, stage=stage,
                                         laps=names, hold=b.path.hold, host_waits=b.path.host_waits.get(stage, ()))
            t_us = frag["time_us_p50"]
            extra = {}
            # The hierarchical path has two all-to-all stages (a2a_out, a2a_in).
            a2a = sum(v for k, v in frag.items() if k.startswith("stage_us_a2a"))
            extra["outside_a2a_pct"] = 100.0 * max(0.0, t_us - a2a) / t_us if t_us > 0 else 0.0
            for k, v in zip(keys, mx):
                extra[k] = int(v)
                extra[k.replace("_nbytes", "_gbps")] = v / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
            extra.update(b.path.stage_info(acc, stage))
            rows.append({**frag, "nbytes": int(moved), "dtype": p[f"{stage}_dtype"], **extra})
        load = plan.matrix.sum(axis=0)
        imb, hot = M.load_imbalance(load)
        info = {"engine": b.path.name, "load_max_over_mean": imb, "hottest_rank": hot, "recv_rows_max": int(load.max()),
                "recv_rows_mean": float(load.mean()), "payload_carried_as": "uint8",
                "pack_method": b.pack_method,
                "bandwidth_note": "bytes of the most loaded rank / slowest-rank p50"}
        if me == 0:  # only rank 0 writes rows; zipf's expectation is a Monte-Carlo estimate
            exp_imb, _ = M.expected_load_imbalance(p["routing"], p["experts"], p["topk"], world,
                                                   seed=p["seed"], **self.routing_params(p, world))
            info["expected_load_max_over_mean"] = float(exp_imb)
        info.update(b.path.row_info(b))
        b.path.release(comm, b)
        return [{**r, **info} for r in rows]


# --- a point's shape in words, and weak scaling's measure -------------------------------

# Routing -> (its skew parameter, short name in a terminal cell, name in the report, axis label).
SKEW_AXES = {"zipf": ("alpha", "a", "alpha", "Zipf exponent alpha"),
             "hot_rank": ("ratio", "r", "ratio", "hot-rank load ratio"),
             "group_limited": ("max_groups", "M", "M", "max node groups per token (M)")}


# Shown in every shape, or as the routing's skew, the mode and the path: never again as key=value.
_IN_SHAPE = {"tokens", "hidden", "experts", "topk", "routing", "mode", "path", "capacity", "copies"} | \
    {a[0] for a in SKEW_AXES.values()}


def shape(p: dict, terminal: bool = True, vary=()) -> str:
    """The point's shape in a cell: T, H, E, K, copies (in the terminal always; in the
    report when it varies: rank and expert copies differ several times in bytes), routing
    and its skew, a mode or path that is not the default, and any other param in `vary`
    (those that take several values among the rows shown: dispatch dtype, seed, ...)."""
    axis = SKEW_AXES.get(p.get("routing"))
    skew = f" {axis[1] if terminal else axis[2]}={p.get(axis[0])}" if axis else ""
    copies = f"{p.get('copies')} " if terminal else (f"copies={p.get('copies')} " if "copies" in vary else "")
    # The dispatch's mode and path, where they are not the default one (normal, flat).
    modes = "".join(f" {v}" for v in (p.get("mode"), p.get("path")) if v not in (None, "normal", "flat"))
    if p.get("mode") == "low_latency" and p.get("capacity"):
        modes += f" cap={p['capacity']}"
    extra = "".join(f" {k}={p[k]}" for k in vary if k not in _IN_SHAPE and k in p)
    return (f"T={p.get('tokens')} H={p.get('hidden')} E={p.get('experts')} K={p.get('topk')} "
            f"{copies}{p.get('routing')}{skew}{modes}{extra}")


def scaling_metric(m) -> tuple:
    """Tokens per second per rank, each stage apart. Bytes per rank are the wrong measure
    here: in weak scaling the tokens per rank are fixed, but the remote share of each
    rank's copies (and so its bytes) grows with world, so a byte rate would flatter larger
    worlds."""
    tokens = m["params"].map(lambda p: (p or {}).get("tokens"))
    if tokens.map(lambda t: t is None or (isinstance(t, float) and math.isnan(t))).any():
        raise UsageError("moe rows need params with 'tokens' for tokens/s per rank")
    t_us = m["time_us_p50"].astype(float)
    return "tokens_per_s_per_rank", np.where(t_us > 0, tokens.astype(float) / (t_us * 1e-6), np.nan)
