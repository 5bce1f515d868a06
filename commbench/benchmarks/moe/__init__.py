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
engine for the comm; steps.py holds the plan and the routing steps (one plan and one set of
buffers per step; docs/moe.md#steps-and-ragged-tokens).
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from commbench import moe as M
from commbench.core.errors import UsageError
from commbench.moe.shape import DEEPSEEK_V3

from ..base import Benchmark, Param, Traffic, register
from . import gpu_dispatchers, replay  # noqa: F401 (gpu_dispatchers registers the torch/GPU-library dispatchers)
from .dispatchers import path_for, skip_reason, unknown, with_fixed
from .host import HEADER, _no_lap, send_order
from .jax_path import refusal
from .steps import (  # noqa: F401 (MoEPlan: where the paths' plan is known to be)
    RAGGED_ROUTINGS,
    MoEPlan,
    StepBufs,
    current,
    load_fields,
    mean_over_steps,
    routing_fields,
    survey,
)

MODES = ("normal", "low_latency")
PATHS = ("flat", "hierarchical")

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
        "routing": Param("uniform", "the routing workload (`commbench list` describes each and its knobs): "
                         + ", ".join(M.ROUTINGS), str, choices=tuple(M.ROUTINGS)),
        "alpha": Param(1.0, "zipf exponent (skew)", float, minimum=0.0),
        "ratio": Param(2.0, "hot_rank: the hot rank's experts are this many times as likely", float, minimum=1.0),
        "max_groups": Param(DEEPSEEK_V3.max_groups, "group_limited: groups a token may reach (M)", int, minimum=1),
        "groups": Param(0, "group_limited: expert groups (0: one per rank)", int, minimum=0),
        "hot_k": Param(0, "hot_experts, spread_hot, rotating_hot: experts in the hot set (0: topk)", int, minimum=0),
        "hot_share": Param(0.5, "hot_experts, spread_hot, rotating_hot: share of all picks landing on the hot "
                           "set, in (0, 1]", float, minimum=0.0),
        "zero": Param(-1, "zero_rank: the rank whose experts get no picks (-1: the last)", int, minimum=-1),
        "ragged_cv": Param(0.5, "source_ragged: coefficient of variation of the tokens per source rank (a seeded "
                           "spread, mean = tokens)", float, minimum=0.0),
        "tokens_by_rank": Param("", "source_ragged: each source rank's tokens, slash-separated "
                                "(4096/1024/2048/512); replaces ragged_cv", str),
        "burst_every": Param(4, "burst: one step in this many (the last) is a burst; needs steps >= it", int,
                             minimum=1),
        "burst_factor": Param(4.0, "burst: a burst step carries this many times the tokens", float, minimum=1.0),
        "seed": Param(0, "routing seed", int, minimum=0),
        "trace": Param("", "a captured routing file (.npy, .npz, .jsonl, .csv; docs/moe.md) replayed instead of "
                       "a generated routing: it sets the routing, experts, topk, steps and tokens per rank "
                       "(its tokens a step / world)", str),
        "steps": Param(1, "routing steps: iteration i of a timed stage runs step i mod steps (time-varying "
                       "workloads); one plan and one set of buffers per step", int, minimum=1),
        "mode": Param("normal", "normal: counts exchanged, split sizes synced to the host (DeepEP normal, Megatron); "
                      "low_latency: a fixed capacity per (source, expert), no count exchange, no host sync "
                      "(DeepEP's decode kernels; copies=expert)", str, choices=MODES),
        "capacity": Param(0, "low_latency: row slots per (source rank, expert); 0: tokens per rank, which never "
                          "overflows", int, minimum=0),
        "path": Param("flat", "flat: one all_to_all; hierarchical: across nodes once per (token, node) to the peer "
                      "with the same local rank, then over the scale-up tier inside the node (DeepEP internode)",
                      str, choices=PATHS),
        "dispatcher": Param("", "a named dispatch/combine implementation (commbench list: deepep-normal, alltoall, "
                            "allgather, ...); it sets copies, mode and path. Empty: chosen by those params", str),
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
        expert copies), and combine's fp32 output, at the expected copies per token, for
        every step's buffers at the most tokens a rank holds."""
        p, w = point.params, max(point.world, 1)
        tokens = self.max_tokens(p, w)
        rb_d, rb_c = M.token_bytes(p["hidden"], p["dispatch_dtype"]), M.token_bytes(p["hidden"], "bf16")
        copies = p["topk"] if p["copies"] == "expert" else M.expected_dest_ranks(p["experts"], p["topk"], w)
        rows = tokens * copies
        extra = 2 if p["copies"] == "expert" else 1
        return p.get("steps", 1) * int(tokens * rb_d + rows * (2 * rb_d + 2 * rb_c)
                                       + (extra - 1) * rows * (rb_d + rb_c) + tokens * p["hidden"] * 4)

    def max_count(self, point):
        # Rows travel as bytes: a receive buffer's byte offsets reach its size. Expected
        # rows, doubled for routing skew; setup checks the real layout again.
        p = point.params
        copies = p["topk"] if p["copies"] == "expert" else M.expected_dest_ranks(p["experts"], p["topk"], point.world)
        tokens = self.max_tokens(p, max(point.world, 1))
        return int(2 * tokens * copies * M.token_bytes(p["hidden"], p["dispatch_dtype"]))

    def plan_nbytes(self, point):
        # Host-side packing and the combine reduction run at about 1 GB/s on the loopback:
        # five times the planning rate's worth of bytes.
        p = point.params
        return 5 * int(p["tokens"] * p["topk"] * M.token_bytes(p["hidden"], p["dispatch_dtype"]))

    # --- pure helpers -----------------------------------------------------------
    @staticmethod
    def routing_params(p: dict, world: int) -> dict:
        """The chosen routing's own parameters (the others' are ignored), in the
        generator's terms: 0 and -1 defaults become "not given" (the generator's default)."""
        def g(k):
            return p.get(k, MoE.params[k].default)
        hot = {"hot_k": g("hot_k") or None, "hot_share": g("hot_share")}
        own = {"zipf": {"alpha": p["alpha"]}, "hot_rank": {"ratio": p["ratio"]},
               "group_limited": {"groups": p["groups"] or world, "max_groups": p["max_groups"]},
               "hot_experts": hot, "spread_hot": hot, "rotating_hot": hot,
               "zero_rank": {"zero": None if g("zero") < 0 else g("zero")},
               "source_ragged": ({"tokens_by_rank": g("tokens_by_rank")} if g("tokens_by_rank")
                                 else {"ragged_cv": g("ragged_cv")}),
               "burst": {"burst_every": g("burst_every"), "burst_factor": g("burst_factor")}}
        return {k: v for k, v in own.get(p["routing"], {}).items() if v is not None}

    def canonical_params(self, params):
        params = with_fixed(params)  # a named dispatcher's copies, mode and path, on the point
        params = replay.canonical(params, {k: v.default for k, v in self.params.items()})
        keep = ROUTING_KNOBS.get(params["routing"], ())
        if params["routing"] == "source_ragged" and params.get("tokens_by_rank"):
            keep = ("tokens_by_rank",)  # the list replaces the spread
        if params.get("mode") == "low_latency":
            keep += ("capacity",)
        knobs = {k for ks in ROUTING_KNOBS.values() for k in ks} | {"capacity"}
        return {k: (v if k not in knobs or k in keep else self.params[k].default) for k, v in params.items()}

    def refusal(self, backend: str, device: str, params: dict) -> str | None:
        """The host path (mpi) has one flat, normal exchange; a trace's values given again, differently."""
        why = replay.refusal(params) or unknown(params.get("dispatcher", ""))
        if why:
            return why
        asked = {k: v for k, v in params.items() if k in ("mode", "path")}
        odd = [f"{k}={v}" for k, v in asked.items() if (v if isinstance(v, list) else [v]) != [self.params[k].default]]
        if backend in self.host_only_on and odd:
            return f"moe {', '.join(odd)} runs on the device path (gloo, nccl), not on {backend}"
        if backend == "jax":  # its own engine, over ragged_all_to_all where that runs (jax_path.py)
            routings = params.get("routing", [])
            ragged = [r for r in (routings if isinstance(routings, list) else [routings]) if r in RAGGED_ROUTINGS]
            if ragged:
                return (f"moe routing={ragged[0]} gives ranks different token counts; the jax engine's arrays "
                        f"have one shape on every rank: run it on mpi, gloo or nccl")
            return refusal(device, odd)
        return None

    def routing_for(self, p: dict, world: int):
        """make(rank, step=0) -> that rank's Routing at that step."""
        trace = replay.trace_of(p)
        if trace is not None:  # the captured routing: step s reads the trace's step s mod steps
            return lambda rank, step=0: trace.routing(rank, world, step)
        own = self.routing_params(p, world)

        def make(rank: int, step: int = 0) -> M.Routing:
            return M.make_routing(p["routing"], num_tokens=p["tokens"], num_experts=p["experts"], top_k=p["topk"],
                                  rank=rank, world=world, seed=p["seed"], step=step, **own)
        return make

    def max_tokens(self, p: dict, world: int) -> int:
        """The most tokens a rank holds at any step (buffer sizes before setup)."""
        if p["routing"] not in M.ROUTINGS:  # a trace: the same tokens on every rank and step
            return int(p["tokens"])
        return M.max_tokens_per_rank(p["routing"], p["tokens"], world, p["seed"], p.get("steps", 1),
                                     **self.routing_params(p, world))

    def validate(self, point):
        replay.validate(point, {k: v.default for k, v in self.params.items()})
        p, world = point.params, point.world
        try:
            own = self.routing_params(p, world)
            if p["routing"] != "trace":  # a trace was checked when read (replay.validate)
                M.validate_routing_params(p["routing"], own, p["experts"], p["topk"], world, p["tokens"])
            M.token_bytes(p["hidden"], p["dispatch_dtype"])
        except ValueError as e:
            raise UsageError(f"moe: {e}") from None
        if unknown(p.get("dispatcher", "")):
            raise UsageError(unknown(p["dispatcher"]))
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
        in the mode and path asked; else the host path (refused for anything but flat normal: refusal());
        a named dispatcher's own path (dispatchers.py)."""
        return path_for(comm, params)

    def skip_reason(self, comm, point) -> str | None:
        """Why the point's dispatcher cannot run on this backend, device or node count."""
        return skip_reason(comm, point.params)

    def setup(self, comm, point):
        """One plan and one set of buffers (a path of its own) per routing step
        (steps.py), every rank's routing of every step regenerated once here."""
        p, world, rank = point.params, comm.size, comm.rank
        make = self.routing_for(p, world)
        surveyed = survey(make, p.get("steps", 1), p["experts"], world, p["copies"], rank)
        most = int(max(s.tokens.max() for s in surveyed))
        bufs = []
        for step, s in enumerate(surveyed):
            r = s.own
            layout = send_order(M.dispatch_layout(r.topk_idx, p["experts"], world, p["copies"], weights=r.weights))
            plan = MoEPlan(point, partial(make, step=step), rank, r.topk_idx, r.weights, layout, s.matrix,
                           p["experts"] // world if p["copies"] == "expert" else 1,
                           M.token_bytes(p["hidden"], p["dispatch_dtype"]), M.token_bytes(p["hidden"], "bf16"),
                           s.tokens, most)
            path = self.path(comm, p)
            b = path.setup(comm, plan)
            b.path = path
            bufs.append(b)
        return StepBufs(bufs, routing_fields([s.stats for s in surveyed]))

    def fill(self, comm, b):
        for s in (b.steps if isinstance(b, StepBufs) else [b]):
            s.path.fill(comm, s)

    # --- the operations (each path's own; lap() after each of its stages), on one step's
    # buffers (a StepBufs: its current step's) ---------------------------------------------
    def dispatch(self, comm, b, lap=_no_lap):
        b = current(b)
        b.path.dispatch(comm, b, lap)

    def experts(self, comm, b):
        """Identity experts, untimed."""
        b = current(b)
        b.path.experts(comm, b)

    def combine(self, comm, b, lap=_no_lap):
        b = current(b)
        b.path.combine(comm, b, lap)

    def op(self, comm, b):
        """A round trip of every step, each on its own buffers."""
        def round_trip():
            for s in (b.steps if isinstance(b, StepBufs) else [b]):
                self.dispatch(comm, s)
                self.experts(comm, s)
                self.combine(comm, s)
        return round_trip

    def check(self, comm, b):
        """Every step's checks (all of them run: a path's check may be collective)."""
        return all([s.path.check(comm, s) for s in (b.steps if isinstance(b, StepBufs) else [b])])

    # --- measurement --------------------------------------------------------------
    def measure(self, harness, comm, point, b):
        """Per stage, the timed loop over the steps (iteration i of the warm-up and of the
        timed loop runs step i mod steps; a point of one step runs it every time). Byte figures are
        the mean over steps of each step's most loaded rank's bytes."""
        p, world, me = point.params, comm.size, comm.rank
        steps = b.steps if isinstance(b, StepBufs) else [b]
        nodes = getattr(comm, "node_of_rank", None)
        nodes = np.zeros(world, np.int64) if nodes is None else np.asarray(nodes)[:world]
        path = steps[0].path
        # Iteration i of each loop (warm-up, timed) runs step i mod steps: restart() puts the
        # loop at step 0, after_each(i) moves it to the step of iteration i + 1.
        cycle = (lambda i: b.goto(i + 1)) if len(steps) > 1 else None
        rows = []
        for stage, names in (("dispatch", path.dispatch_stages), ("combine", path.combine_stages)):
            if stage == "combine":
                # Each step's combine reads a dispatched state of its own step.
                for s in steps:
                    if len(steps) > 1:
                        self.dispatch(comm, s)
                    self.experts(comm, s)
            if isinstance(b, StepBufs):
                b.cur = 0
            fn = self.dispatch if stage == "dispatch" else self.combine

            # Bytes per rank (dispatch side counts; combine counts them at the expert side,
            # as DeepEP does), then the most loaded rank's figure, per step.
            keys = ("logical_nbytes", "remote_nbytes", "scaleup_nbytes", "scaleout_nbytes")
            per_step, infos = [], []
            for s in steps:
                acc = s.path.accounting(s.plan, me, nodes, s.plan.rb_d if stage == "dispatch" else s.plan.rb_c)
                mine = [acc[k] for k in keys] + [max(acc["logical_nbytes"], acc["sent_logical_nbytes"])]
                per_step.append(comm.max_over_ranks(np.array(mine, dtype=np.float64)))
                infos.append(s.path.stage_info(acc, stage))
            *mx, moved = np.mean(per_step, axis=0) if len(per_step) > 1 else per_step[0]
            traffic = Traffic(int(moved), self.busbw_factor(world))
            # Held on a device, the hold let go before each stage that waits for the device
            # on the host (the normal mode's sync) and put up again after it.
            frag, _ = harness.time_steps(comm, point, lambda lap, fn=fn: fn(comm, b, lap), traffic, stage=stage,
                                         laps=names, hold=path.hold, host_waits=path.host_waits.get(stage, ()),
                                         **({"after_each": cycle, "restart": lambda: b.goto(0)} if cycle else {}))
            t_us = frag["time_us_p50"]
            extra = {}
            # The exchange's own laps: a2a (two tiers on the hierarchical path: a2a_out,
            # a2a_in), or those a path names (allgather: gather, reduce_scatter).
            exchange = getattr(path, "exchange_laps", ())
            a2a = sum(v for k, v in frag.items()
                      if k.startswith("stage_us_a2a") or k.removeprefix("stage_us_") in exchange)
            extra["outside_a2a_pct"] = 100.0 * max(0.0, t_us - a2a) / t_us if t_us > 0 else 0.0
            for k, v in zip(keys, mx):
                extra[k] = int(v)
                extra[k.replace("_nbytes", "_gbps")] = v / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
            extra.update(mean_over_steps(infos))
            rows.append({**frag, "nbytes": int(moved), "dtype": p[f"{stage}_dtype"], **extra})
        info = {"engine": path.name, **load_fields([s.plan.matrix for s in steps]),
                "payload_carried_as": "uint8", "pack_method": steps[0].pack_method,
                "bandwidth_note": "bytes of the most loaded rank / slowest-rank p50"
                + (", mean over the routing steps" if len(steps) > 1 else "")}
        if isinstance(b, StepBufs):
            info.update(b.routing)
        if me == 0 and p["routing"] != "trace":  # only rank 0 writes rows; zipf's expectation is a
            # Monte-Carlo estimate; a trace has none but its own load, in the rows
            exp_imb, _ = M.expected_load_imbalance(p["routing"], p["experts"], p["topk"], world,
                                                   seed=p["seed"], **self.routing_params(p, world))
            info["expected_load_max_over_mean"] = float(exp_imb)
        info.update(replay.row_info(p, world))
        info.update(path.row_info(steps[0]))
        for s in reversed(steps):  # the last made first: each release restores what its setup found
            s.path.release(comm, s)
        return [{**r, **info} for r in rows]


# --- a point's shape in words, and weak scaling's measure -------------------------------

# Routing -> the moe params that set it (any other routing's take their defaults).
ROUTING_KNOBS = {"zipf": ("alpha",), "hot_rank": ("ratio",), "group_limited": ("max_groups", "groups"),
                 "hot_experts": ("hot_k", "hot_share"), "spread_hot": ("hot_k", "hot_share"),
                 "rotating_hot": ("hot_k", "hot_share"), "zero_rank": ("zero",),
                 "source_ragged": ("ragged_cv", "tokens_by_rank"), "burst": ("burst_every", "burst_factor")}

# Routing -> (its skew parameter, short name in a terminal cell, name in the report, axis label).
_HOT_AXIS = ("hot_share", "s", "hot share", "share of all picks on the hot experts")
SKEW_AXES = {"zipf": ("alpha", "a", "alpha", "Zipf exponent alpha"),
             "hot_rank": ("ratio", "r", "ratio", "hot-rank load ratio"),
             "group_limited": ("max_groups", "M", "M", "max node groups per token (M)"),
             "hot_experts": _HOT_AXIS, "spread_hot": _HOT_AXIS, "rotating_hot": _HOT_AXIS,
             "source_ragged": ("ragged_cv", "cv", "cv", "tokens per source rank: coefficient of variation"),
             "burst": ("burst_factor", "x", "burst x", "burst: times the tokens of a burst step")}


# Shown in every shape, or as the routing's skew, the mode and the path: never again as key=value.
_IN_SHAPE = {"tokens", "hidden", "experts", "topk", "routing", "mode", "path", "capacity", "copies",
             "tokens_by_rank"} | {a[0] for a in SKEW_AXES.values()}


def shape(p: dict, terminal: bool = True, vary=()) -> str:
    """The point's shape in a cell: T, H, E, K, copies (in the terminal always; in the
    report when it varies: rank and expert copies differ several times in bytes), routing
    and its skew, a mode or path that is not the default, and any other param in `vary`
    (those that take several values among the rows shown: dispatch dtype, seed, ...)."""
    axis = SKEW_AXES.get(p.get("routing"))
    skew = f" {axis[1] if terminal else axis[2]}={p.get(axis[0])}" if axis else ""
    if p.get("routing") == "source_ragged" and p.get("tokens_by_rank"):  # the list, not the spread
        skew = f" tokens={p['tokens_by_rank']}"
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
