"""What-if cost model: alpha-beta times of collectives and MoE dispatch on a two-tier
fabric (docs/model.md; the flat formulas and MoE bytes in docs/ceilings.md#formulas).

A fabric has a scale-up tier (NVLink-like, G ranks per domain) and an optional
scale-out tier (NIC). Each tier is (alpha, B): alpha the per-step latency in us, B the
per-direction bandwidth in GB/s (1e9 B/s). gamma is the reduction cost per byte; it
defaults to 0 because a GPU reduces at memory bandwidth, far above any link, and
overlaps the reduction with the transfer. Every projection should be printed with
ASSUMPTIONS.
"""
from __future__ import annotations

import dataclasses
import math

from commbench.analyse import latency as _latency
from commbench.analyse import moe_stacks
from commbench.analyse.collectives import (  # noqa: F401
    ALL_REDUCE_ALGOS,
    NCCL_CANDIDATES,
    NCCL_NAMES,
    TREE_BW_FACTOR,
    _bound,
    _net_gbps,
    all_gather_detail,
    all_gather_time_us,
    all_reduce_detail,
    all_reduce_time_us,
    all_to_all_detail,
    all_to_all_time_us,
    nccl_label,
    nccl_pick,
    nvls_usable,
    reduce_scatter_detail,
    reduce_scatter_time_us,
)
from commbench.analyse.fabric import (  # noqa: F401
    Fabric,
    Terms,
    Tier,
    _check_p,
    _domain,
    _flat_tier,
    _lg,
    _scaleout,
    _xfer_us,
    fabric_from_profile,
    fabric_from_rates,
    placement,
    ranks_per_domain,
)
from commbench.analyse.model_skew import case_skews, moe_row, with_skew
from commbench.benchmarks import registry
from commbench.core.errors import UsageError
from commbench.moe import accounting
from commbench.moe.shape import DEEPSEEK_V3

ASSUMPTIONS: list[str] = [
    "alpha-beta (Hockney) model: each step costs alpha + bytes/B; no congestion, "
    "contention, incast or switch queuing",
    "B is per direction per GPU; sending and receiving overlap fully",
    "one NIC per GPU; NCCL spreads a domain's inter-domain traffic over min(G, rails) NICs "
    "(rail-optimised rings and trees), so a ring all_reduce, all_gather or reduce_scatter crossing domains "
    "runs at min(B_up, rails x B_nic)",
    "placement: p ranks fill the fewest scale-up domains that hold them in equal parts, "
    "G = the largest divisor of p not above the domain size, N = p/G domains (128 ranks on "
    "72-GPU racks: 2 racks x 64 GPUs, 8 idle in each; 12 on 8-GPU nodes: 2 x 6); the formulas "
    "need the same G in every domain",
    "all_reduce as NCCL runs it: NVLS at the profile's in-switch rate, its latency (NCCL's 25 us) apart "
    "from its bandwidth ramp (the first ramp x G bytes at half the in-switch rate; ramp 3.1 MiB a GPU, fitted "
    "on CoreWeave's GB200 rack at 512 MiB), no gain at <= 4 GPUs a domain; Tree / NVLSTree / hierarchical with their phases overlapped; NCCL's pick is the fastest of Ring, "
    "Tree and NVLS(Tree), each at its fastest protocol",
    "Tree and NVLSTree at the rate they reach: the double binary tree sends the reduce up and the broadcast "
    "down each link in opposite directions, so a domain's NICs carry S each way on two domains, 1.5 S on "
    "three, 2 S from four on (Tree busbw up to 2 x 0.92 x R_net on two domains); NVLSTree's network S on "
    "two domains, 2 S above (NCCL tuning.cc:320); Tree's chain inside a domain carries 2 S at 0.92 of B_up",
    *_latency.ASSUMPTIONS,
    "MPI-style flat algorithms (recursive doubling, Rabenseifner) run at the slowest link: above one "
    "scale-up domain (p > G) every step costs the scale-out tier; they, hierarchical and a fabric without "
    "a GPU profile (loopback) pay the tiers' alphas per step",
    "pairwise all_to_all above one domain: (p-G)/p of the bytes cross the rank's NIC and "
    "(G-1)/p stay on scale-up, both at once; on NCCL the sends to all peers are posted at once, so the "
    "per-peer latencies overlap (one step of each tier used); MPI-style (loopback) pays p-1 steps in turn",
    "gamma (reduction cost per byte) is 0 unless set: GPUs reduce at memory bandwidth "
    "and overlap it with the transfer",
    "recursive doubling and Rabenseifner round lg p up for p not a power of two",
    "MoE volumes are expectations under uniform top-k routing; with --workload or --trace a second "
    "row per case scales each tier's bytes by the most loaded rank's skew (docs/model.md#skewed-routing); "
    "time = slower tier at the MoE kernel efficiencies (the profile's, or --stack's) + one alpha per tier used "
    "+ the kernels' fixed cost",
    "MoE combine moves the same copies as dispatch, in BF16 (2 bytes per element)",
    "rates are whatever the fabric was built from: line rates give a lower bound on "
    "time; achieved (calibrated) rates give a realistic estimate",
]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "moe")


# ------------------------------------------------------------------ MoE

# The benchmark's dispatcher names (benchmarks/moe/dispatchers.py) for the byte accounting's
# cases, and the flag each adds: alltoall sends one copy per (token, expert), deepep-normal
# one per (token, rank) over the nodes a node-limited routing allows, hierarchical one NIC
# copy per (token, node) forwarded inside it; low-latency is alltoall's bytes plus the fixed
# cost F of DeepEP's low-latency kernels. The accounting's own names stay accepted.
MOE_DISPATCHERS = {"alltoall": ("flat", False), "deepep-normal": ("node_limited", False),
                   "hierarchical": ("hierarchical", False), "low-latency": ("flat", True)}
MOE_DISPATCHER_OF_CASE = {"flat": "alltoall", "node_limited": "deepep-normal", "hierarchical": "hierarchical"}
MOE_DEFAULT_DISPATCHERS = ("alltoall", "hierarchical", "deepep-normal")


def moe_case(name: str) -> tuple[str, str, bool]:
    """(accounting case, dispatcher name, low-latency) for a dispatcher or accounting case name."""
    if name in MOE_DISPATCHERS:
        case, ll = MOE_DISPATCHERS[name]
        return case, name, ll
    if name in MOE_DISPATCHER_OF_CASE:
        return name, MOE_DISPATCHER_OF_CASE[name], False
    raise UsageError(f"unknown MoE dispatcher {name!r}; the model has {', '.join(MOE_DISPATCHERS)} "
                     f"(or the cases {', '.join(accounting.CASES)})")


def moe_scenario_defaults() -> dict:
    """DeepSeek-V3's MoE layer (moe/shape.py): tokens per rank, H, FP8 dispatch rows
    (H + H/32 = 7392 bytes), experts, top-K, and M, the nodes a token may reach."""
    s = DEEPSEEK_V3
    return {"tokens": s.tokens, "hidden": s.hidden, "token_nbytes": accounting.token_bytes(s.hidden, s.dispatch_dtype),
            "experts": s.experts, "topk": s.topk, "M": s.max_groups}


def moe_nvl_efficiency(G: int, terms: Terms) -> float:
    """NVLink efficiency inside a MoE kernel with G ranks a domain: moe_nvl_efficiency up to
    8 (the DeepEP H800 node it was measured on), times moe_nvl_falloff for each doubling
    above (the profiles' 0.88: DeepEP's rows of the Hybrid-EP README's GB200 table, 448 GB/s at
    8 ranks, 394 at 16; Hybrid-EP's own rows fall less: docs/model.md#kernel-stacks)."""
    return moe_stacks.nvl_rate_gbps(1.0, G, 1, terms)


def moe_time_us(case: str, tokens: int, hidden: int, token_nbytes: int | None, experts: int,
                topk: int, p: int, G: int | None, M: int | None, fabric: Fabric,
                stage: str = "dispatch", low_latency: bool = False) -> dict:
    """Time of one MoE dispatch or combine, docs/model.md#moe-dispatch-and-combine:

        t = max(V_nic / (e_nic B_nic), V_nvl / (e_nvl(G) B_nvl)) + alpha_nic [if V_nic > 0]
            + alpha_nvl [if V_nvl > 0] + F [low-latency kernels]

    e_nic, e_nvl(G) and F are the fabric's terms (Terms; 1, 1 and 0 unless a profile sets them),
    or a kernel stack's (moe_stacks.with_stack: its F paid by every call, its NVLink ceiling
    across domains).

    V_nic, V_nvl: expected bytes one rank sends per tier (accounting.dispatch_volume_nbytes)
    for case "flat", "hierarchical" or "node_limited", or the dispatcher modelled by one
    (MOE_DISPATCHERS: alltoall, hierarchical, deepep-normal, low-latency). The latency term is one alpha per
    tier used: the copies to all peers go out at once, and the hierarchical cases forward
    after the NIC hop. Combine moves the same copies back; token_nbytes None means the
    stage's DeepSeek-V3 row (FP8 H + H/32 for dispatch, BF16 2H for combine).

    G None takes the fabric's placement (ranks_per_domain: p in equal parts over the fewest
    domains); M is capped at the N = p/G domains there are.

    Returns time_us, nic_us, nvl_us, latency_us, v_nic_nbytes, v_nvl_nbytes,
    nic_copies_per_token, nvl_copies_per_token, token_nbytes, bottleneck (tier name).
    """
    p = _check_p(p)
    case, _, ll = moe_case(case)
    low_latency = low_latency or ll
    if stage not in ("dispatch", "combine"):
        raise UsageError(f"unknown MoE stage {stage!r}; choose dispatch or combine")
    G = _domain(p, fabric) if G is None else min(int(G), p)
    if G < 1 or p % G:
        raise UsageError(f"MoE needs p={p} to be a multiple of ranks per domain G={G}")
    if case == "node_limited" and M is not None:
        M = min(int(M), p // G)
    try:
        if token_nbytes is None:
            token_nbytes = accounting.token_bytes(hidden, "fp8" if stage == "dispatch" else "bf16")
        nic_c, nvl_c = accounting.dispatch_copies_per_token(case, experts, topk, p, G, M)
        v_nic, v_nvl = accounting.dispatch_volume_nbytes(case, tokens, hidden, token_nbytes,
                                                         experts, topk, p, G, M)
    except ValueError as e:
        raise UsageError(str(e)) from None
    up, terms = fabric.scaleup, fabric.terms
    nvl_us = v_nvl / (moe_stacks.nvl_rate_gbps(up.bandwidth_gbps, G, p // G, terms) * 1e3)
    nic_us, lat = 0.0, (up.alpha_us if v_nvl > 0 else 0.0)
    nic = None
    if v_nic > 0:
        nic = _scaleout(fabric, f"MoE {stage} at p={p}")
        nic_us = v_nic / (nic.bandwidth_gbps * terms.moe_nic_efficiency * 1e3)
        lat += nic.alpha_us
    lat += moe_stacks.fixed_us(terms, low_latency, v_nic > 0)  # a stack's (moe_stacks.with_stack) or the profile's F
    return {
        "time_us": max(nic_us, nvl_us) + lat,
        "bound": _bound(lat, nvl_us, nic_us),
        "nic_us": nic_us,
        "nvl_us": nvl_us,
        "latency_us": lat,
        "v_nic_nbytes": v_nic,
        "v_nvl_nbytes": v_nvl,
        "nic_copies_per_token": nic_c,
        "nvl_copies_per_token": nvl_c,
        "token_nbytes": int(token_nbytes),
        "bottleneck": nic.name if nic is not None and nic_us >= nvl_us else up.name,
        "tier_names": (nic.name if nic is not None else None, up.name),  # (NIC, NVLink): a skew may move the bottleneck
    }


# ------------------------------------------------------------------ calibration

def calibrate_fabric(fit_rows, base: Fabric) -> Fabric:
    """base with its scale-up alpha and B replaced by what a measured single-domain
    (e.g. loopback) run shows.

    Uses the all_to_all fits (send_recv when there are none) of analysis.fit_table at
    the smallest world with >= 2 ranks; among several fits there (dtypes, runs), the
    one with most points, then the lowest rms error. The fit is t = alpha + S/B in the
    same S the model uses, so:
    - pairwise all_to_all, t = (p-1) alpha + S/B: alpha per step = alpha_us / (p-1),
      B = the fit's bandwidth;
    - send_recv, one step: alpha = alpha_us, B = the fit's bandwidth.
    Fits without a finite bandwidth (latency-only sweeps) are not used.
    """
    rows = fit_rows.to_dict("records") if hasattr(fit_rows, "to_dict") else list(fit_rows)
    for bench in ("all_to_all", "send_recv"):
        cand = [r for r in rows if r.get("benchmark") == bench and int(r.get("world", 0)) >= 2
                and r.get("bandwidth_gbps") is not None and math.isfinite(float(r["bandwidth_gbps"]))
                and float(r["bandwidth_gbps"]) > 0]
        if cand:
            break
    else:
        raise UsageError("the measured run has no all_to_all or send_recv sweep to calibrate from")
    p = min(int(r["world"]) for r in cand)
    if base.domain_gpus is not None and p > base.domain_gpus:
        raise UsageError(f"the smallest measured world ({p}) spans more than one scale-up domain "
                         f"(G={base.domain_gpus}); it cannot calibrate the scale-up tier")
    best = min((r for r in cand if int(r["world"]) == p),
               key=lambda r: (-int(r.get("points", 0)), float(r.get("rms_rel_err_pct", 0.0))))
    steps = p - 1 if bench == "all_to_all" else 1
    tier = Tier(base.scaleup.name, float(best["alpha_us"]) / steps, float(best["bandwidth_gbps"]))
    return dataclasses.replace(base, scaleup=tier)


# ------------------------------------------------------------------ projection

def project(kind: str, worlds, fabric: Fabric, sizes_nbytes=None, moe_shape: dict | None = None,
            algos=None, cases=MOE_DEFAULT_DISPATCHERS, skipped: list | None = None,
            skew_of=None) -> list[dict]:
    """Rows of a what-if table, one per (world, size, algorithm) or (world, case).

    Every row carries the world's placement (placement(): domain_ranks, domains, placement).

    - all_reduce: algos from ALL_REDUCE_ALGOS (default all of them).
    - all_gather / reduce_scatter (ring), all_to_all (pairwise): algos ignored.
    Collective rows: kind, algo, world, nbytes, time_us, algbw_gbps = S/t, busbw_gbps
    (algbw times the benchmark's busbw factor; above the link rate for inswitch, see docs/model.md).

    - moe: moe_shape (default moe_scenario_defaults()) over `cases` (dispatcher names or
      accounting cases, moe_case); rows: kind, case, dispatcher, routing, skew, world,
      dispatch_us, combine_us, their bandwidth and latency terms (dispatch_bw_us,
      dispatch_latency_us, combine_bw_us, combine_latency_us), nic_copies_per_token,
      nvl_copies_per_token, dispatch_v_nic_nbytes, dispatch_v_nvl_nbytes, dispatch_bottleneck,
      combine_bottleneck. Cases that do not fit a world (the experts do not spread evenly over
      p ranks, a node limit the domains cannot take) are left out; `skipped`, when given a
      list, gets one {kind, world, case, dispatcher, reason} per case left out, so a caller
      can say why.
      skew_of(p, G) -> dict (model_skew.workload_skew / trace_skew at world p, G ranks a
      domain) adds, beside each uniform row, one whose bytes are the most loaded rank's
      (model_skew.with_skew, each tier by the case's skew: case_skews); a world where it
      raises ValueError gets its uniform rows and one skipped entry.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown projection kind {kind!r}; choose one of {', '.join(KINDS)}")
    worlds = [_check_p(p) for p in worlds]
    out = []
    if kind == "moe":
        shape = {**moe_scenario_defaults(), **(moe_shape or {})}
        for p in worlds:
            if p > _domain(p, fabric):
                _scaleout(fabric, f"MoE at p={p}")  # say so rather than drop every case
            skew = None
            for name in cases:
                case, disp, _ = moe_case(name)
                try:
                    d = moe_time_us(name, shape["tokens"], shape["hidden"], shape["token_nbytes"],
                                    shape["experts"], shape["topk"], p, None, shape["M"], fabric, "dispatch")
                    c = moe_time_us(name, shape["tokens"], shape["hidden"], None, shape["experts"],
                                    shape["topk"], p, None, shape["M"], fabric, "combine")
                except UsageError as e:
                    if skipped is not None:
                        skipped.append({"kind": kind, "world": p, "case": case, "dispatcher": disp, "reason": str(e)})
                    continue
                out.append(moe_row(p, fabric, case, disp, d, c, None))
                if skew_of is None:
                    continue
                if skew is None:
                    try:
                        skew = skew_of(p, _domain(p, fabric))
                    except ValueError as e:  # this world cannot take the workload or trace: say so once
                        skew = str(e)
                        if skipped is not None:
                            skipped.append({"kind": kind, "world": p, "case": "", "reason": skew})
                if isinstance(skew, dict):
                    nvl_s, nic_s = case_skews(skew, case)
                    out.append(moe_row(p, fabric, case, disp, with_skew(d, nvl_s, nic_s), with_skew(c, nvl_s, nic_s),
                                       skew))
        return out

    if not sizes_nbytes:
        raise UsageError(f"a {kind} projection needs message sizes")
    if kind == "all_reduce":
        algos = list(algos or ALL_REDUCE_ALGOS)
        for a in algos:
            if a not in ALL_REDUCE_ALGOS:
                raise UsageError(f"unknown all_reduce algorithm {a!r}; choose one of {', '.join(ALL_REDUCE_ALGOS)}")
    else:
        algos = ["pairwise" if kind == "all_to_all" else "ring"]

    bench = registry()[kind]  # the busbw factor F(p) of docs/collectives.md#algbw-and-busbw is the benchmark's
    for p in worlds:
        for S in sizes_nbytes:
            for a in algos:
                if kind == "all_reduce":
                    d = all_reduce_detail(a, p, S, fabric)
                elif kind == "all_gather":
                    d = all_gather_detail(p, S, fabric)
                elif kind == "reduce_scatter":
                    d = reduce_scatter_detail(p, S, fabric)
                else:
                    d = all_to_all_detail(p, S, fabric)
                t = d["time_us"]
                extra = {"bound": d["bound"], "nccl": nccl_label(d) if d["nccl"] else "-", "proto": d["proto"]}
                algbw = S / (t * 1e3) if t > 0 else math.inf
                f = bench.busbw_factor(p)
                out.append({"kind": kind, "algo": a, "world": p, **placement(p, fabric), "nbytes": int(S),
                            "time_us": t, "algbw_gbps": algbw, "busbw_gbps": algbw * f if f > 0 else 0.0, **extra})
    return out
