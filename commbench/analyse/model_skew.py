"""Skewed routing in the what-if model (docs/model.md#skewed-routing): how much more than the
uniform expectation the most loaded rank moves, from a named workload's expected load or
from a recorded trace, and a MoE time with its bandwidth term scaled by that.

A dispatch finishes when its most loaded rank does, so that rank's bytes set the bandwidth
term; the latency terms (one alpha per tier, the low-latency kernels' F) do not depend on
the bytes and stay as they are. The skew is that rank's bytes over the uniform expectation
at the nominal shape (T tokens a rank), counted as the dispatcher moves them:

- picks (expert copies: alltoall, low-latency): (token, expert) pairs landing on a rank;
- rank copies (deepep-normal, hierarchical on NVLink): tokens sending a rank at least one
  pick; a token's second pick on the hot rank costs nothing more, so this skew is lower;
- node copies (deepep-normal, hierarchical on the NIC): tokens sending a node at least one
  pick, one NIC copy forwarded inside the node.

Each is the largest of received and sent (a rank holding more tokens sends more). A
time-varying workload's skew is the mean over its steps: time is linear in the skew, so the
mean step time is the uniform latency plus the mean skew times the uniform bandwidth term.
"""
from __future__ import annotations

import numpy as np

from commbench import moe as MOE
from commbench.analyse.fabric import placement

# Tokens drawn to estimate a workload's copies per pick on its hottest rank and node (the
# picks themselves have expected_rank_load_share's exact or Monte-Carlo share).
COPY_SAMPLE_TOKENS = 1 << 16


def _bound(lat: float, nvl: float, nic: float) -> str:
    """Which term decides a time (as analyse.model's): latency, NVLink or NIC bandwidth."""
    return max((lat, "latency-bound"), (nvl, "NVLink-bound"), (nic, "NIC-bound"))[1]


def case_skews(skew: dict, case: str) -> tuple[float, float]:
    """(NVLink skew, NIC skew) of accounting case `case`: picks for one copy per (token,
    expert), rank and node copies for the cases that send one copy per rank or node."""
    if case == "flat":
        return skew["skew"], skew["skew"]
    return skew["rank_skew"], skew["node_skew"]


def with_skew(detail: dict, nvl_skew: float, nic_skew: float | None = None) -> dict:
    """A MoE stage's time (analyse.model.moe_time_us's dict) with the most loaded rank's
    bytes: each tier's bytes and bandwidth time times its skew (nic_skew None: the same as
    NVLink's), the latency kept."""
    nic_skew = nvl_skew if nic_skew is None else nic_skew
    nic, nvl, lat = detail["nic_us"] * nic_skew, detail["nvl_us"] * nvl_skew, detail["latency_us"]
    return {**detail, "nic_us": nic, "nvl_us": nvl, "time_us": lat + max(nic, nvl),
            "v_nic_nbytes": detail["v_nic_nbytes"] * nic_skew, "v_nvl_nbytes": detail["v_nvl_nbytes"] * nvl_skew,
            "bound": _bound(lat, nvl, nic), **_bottleneck(detail, nic, nvl)}


def _bottleneck(detail: dict, nic_us: float, nvl_us: float) -> dict:
    """The tier that sets the time once each tier's bytes are skewed (it may move)."""
    names = detail.get("tier_names")
    if not names:
        return {}
    nic_name, nvl_name = names
    return {"bottleneck": nic_name if nic_name is not None and nic_us >= nvl_us else nvl_name}


def copy_hits(dest: np.ndarray, bins: int) -> np.ndarray:
    """Tokens that send each bin (rank or node) at least one pick; dest int [tokens, K]."""
    d = np.sort(np.asarray(dest).reshape(-1, np.asarray(dest).shape[-1]), axis=1)
    first = np.ones(d.shape, dtype=bool)
    first[:, 1:] = d[:, 1:] != d[:, :-1]
    return np.bincount(d[first], minlength=bins)


def _ratio(hits: np.ndarray, at: int | None = None) -> float:
    """hits at `at` (None: the largest) over the mean."""
    mean = hits.sum() / hits.size
    return float((hits.max() if at is None else hits[at]) / mean) if mean > 0 else 1.0


def _knobs_text(own: dict) -> str:
    return "".join(f" {k}={v}" for k, v in own.items())


def _tokens_per_rank(name: str, tokens: int, world: int, seed: int, step: int, own: dict) -> np.ndarray:
    """Tokens each source rank holds at a step: the workload's own split where it has one
    (ragged sources, bursts), else `tokens` on every rank."""
    split = getattr(MOE, "tokens_per_rank", None)
    if split is None:
        return np.full(world, tokens, dtype=np.int64)
    return np.asarray(split(name, tokens, world, seed, step=step, **own), dtype=np.int64)


def _copy_skew(dest: np.ndarray, bins: int, share: np.ndarray) -> float:
    """Copy skew of the bin (rank or node) that takes the largest share of picks: its exact
    picks skew (share x bins) times its copies-per-pick over the mean copies-per-pick, both
    from the sample `dest` [tokens, K]. The ratio's sampling noise mostly cancels (where a
    bin holds one expert, copies are picks and it is exactly 1), and taking the picks'
    hottest bin leaves no max-of-noise bias."""
    hot = int(np.argmax(share))
    hits, picks = copy_hits(dest, bins), np.bincount(dest.ravel(), minlength=bins)
    per_pick = (hits[hot] / picks[hot]) / (hits.sum() / picks.sum()) if picks[hot] else 1.0
    return max(float(share[hot]) * bins * per_pick, 1.0)  # the picks' hottest gets at least the mean


def _sampled_copy_skews(name, experts, topk, world, G, seed, step, own, share) -> tuple[float, float] | None:
    """(rank, node) copy skews, from COPY_SAMPLE_TOKENS tokens of the routing (rank 0's
    stream: a source's tokens follow the same distribution on every rank); None where
    every rank takes the same share (by symmetry every rank and node gets the mean)."""
    if np.allclose(share, 1.0 / world, rtol=1e-12, atol=0):
        return None
    r = MOE.make_routing(name, num_tokens=COPY_SAMPLE_TOKENS, num_experts=experts, top_k=topk, rank=0,
                         world=world, seed=seed, **({"step": step} if step else {}), **own)
    dest = r.topk_idx // (experts // world)
    nodes = world // G
    node_s = _copy_skew(dest // G, nodes, share.reshape(nodes, G).sum(axis=1)) if nodes > 1 else 1.0
    return _copy_skew(dest, world, share), node_s


def workload_skew(name: str, experts: int, topk: int, world: int, tokens: int, *, seed: int = 0,
                  steps: int = 1, G: int | None = None, **own) -> dict:
    """The skews a named routing workload puts on its most loaded rank at `world`, G ranks
    a scale-up domain (None: one domain).

    Per step s: each rank's share of picks from moe.routing.expected_rank_load_share (the
    expectation over the routing's distribution; exact or Monte-Carlo, as that says) and
    the copy skews of that hottest rank and node (_sampled_copy_skews), scaled by the step's
    tokens over the nominal world x tokens; sent = each source rank's tokens over `tokens`.
    Each skew of a step is the larger of received and sent; the result holds their means
    over the steps: skew (picks), rank_skew, node_skew, and worst (the largest step's picks
    skew), received, sent, steps, label and basis (one line).
    Raises ValueError (one line) for an unknown workload or knobs it does not take.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    G = world if G is None else G
    picks, ranks, nodes, recv, sent, sampled = [], [], [], [], [], False
    for s in range(steps):
        step = {"step": s} if s else {}  # step 0 is the routing every workload had before steps
        share = np.asarray(MOE.expected_rank_load_share(name, experts, topk, world, seed=seed, **step, **own))
        t = _tokens_per_rank(name, tokens, world, seed, s, own)
        scale = float(t.sum()) / (tokens * world)  # the step's tokens over the nominal
        d = float(t.max()) / tokens
        r = float(share.max()) * world * scale
        copies = _sampled_copy_skews(name, experts, topk, world, G, seed, s, own, share)
        sampled = sampled or copies is not None
        rank_s, node_s = copies or (1.0, 1.0)
        recv.append(r)
        sent.append(d)
        picks.append(max(r, d))
        ranks.append(max(rank_s * scale, d))
        nodes.append(max(node_s * scale, d))
    skew = float(np.mean(picks))
    label = f"{name}{_knobs_text(own)}"
    who = "the busiest rank sends" if np.mean(sent) > np.mean(recv) else "the hottest rank receives"
    basis = (f"{label} seed={seed}, T={tokens}: {who} {skew:.2f}x the uniform mean of picks, expected over the routing's "
             f"distribution; copies a rank x{np.mean(ranks):.2f}, a node x{np.mean(nodes):.2f}"
             + (f" (copies per pick: Monte-Carlo, {COPY_SAMPLE_TOKENS} tokens)" if sampled else "")
             + (f"; mean over {steps} steps, worst step x{max(picks):.2f}" if steps > 1 else ""))
    return {"skew": skew, "rank_skew": float(np.mean(ranks)), "node_skew": float(np.mean(nodes)),
            "worst": float(max(picks)), "received": float(np.mean(recv)), "sent": float(np.mean(sent)),
            "steps": steps, "label": label, "basis": basis}


def trace_skew(trace, world: int, G: int | None = None) -> dict:
    """The skews a recorded trace puts on its most loaded rank when re-sharded to `world`,
    G ranks a domain (None: one), counted on the trace's own rows, step by step: picks
    (trace.rank_loads(world)), rank and node copies (copy_hits), each the most loaded over
    the mean. A trace's tokens split in equal contiguous chunks, so every source rank sends
    the mean and the receivers decide. Means over the steps, as workload_skew's.
    Raises ValueError (one line) where the world does not divide the trace's experts or
    tokens."""
    G = world if G is None else G
    label = f"trace {trace.label}"
    loads = np.asarray(trace.rank_loads(world), dtype=np.float64)
    if loads.ndim != 2 or loads.shape[1] != world:
        raise ValueError(f"{label}: rank loads at world {world} have shape {loads.shape}, not [steps, {world}]")
    if not np.all(loads.sum(axis=1) > 0):
        raise ValueError(f"{label}: a step routes no token")
    picks = loads.max(axis=1) / loads.mean(axis=1)
    dest = np.asarray(trace.topk) // (trace.num_experts // world)
    ranks = [_ratio(copy_hits(d, world)) for d in dest]
    nodes = [_ratio(copy_hits(d // G, world // G)) if world > G else 1.0 for d in dest]
    skew, steps = float(picks.mean()), int(loads.shape[0])
    rec = getattr(trace, "recorded_world", None)
    where = f"recorded at EP {rec}, re-sharded to {world}" if rec and rec != world else f"at EP {world}"
    basis = (f"{label} ({steps} step{'s' if steps != 1 else ''}, {where}): the hottest rank receives "
             f"{skew:.2f}x the mean of picks, copies a rank x{np.mean(ranks):.2f}, a node x{np.mean(nodes):.2f}, "
             f"counted on the trace's rows" + (f"; mean over the steps, worst step x{picks.max():.2f}"
                                               if steps > 1 else ""))
    return {"skew": skew, "rank_skew": float(np.mean(ranks)), "node_skew": float(np.mean(nodes)),
            "worst": float(picks.max()), "received": skew, "sent": 1.0, "steps": steps, "label": label,
            "basis": basis}


def moe_row(p: int, fabric, case: str, dispatcher: str, d: dict, c: dict, skew: dict | None) -> dict:
    """One MoE projection row: uniform (skew None) or the most loaded rank's under `skew`
    (d and c already scaled by with_skew; nvl_skew / nic_skew say by how much)."""
    nvl_s, nic_s = case_skews(skew, case) if skew else (1.0, 1.0)
    return {"kind": "moe", "case": case, "dispatcher": dispatcher, "world": p, **placement(p, fabric),
            "routing": skew["label"] if skew else "uniform", "skew": nvl_s, "nvl_skew": nvl_s,
            "nic_skew": nic_s if d["v_nic_nbytes"] > 0 else None, "skew_basis": skew["basis"] if skew else "",
            "dispatch_us": d["time_us"], "combine_us": c["time_us"],
            "dispatch_bw_us": max(d["nic_us"], d["nvl_us"]), "dispatch_latency_us": d["latency_us"],
            "combine_bw_us": max(c["nic_us"], c["nvl_us"]), "combine_latency_us": c["latency_us"],
            "nic_copies_per_token": d["nic_copies_per_token"],
            "nvl_copies_per_token": d["nvl_copies_per_token"],
            "dispatch_v_nic_nbytes": d["v_nic_nbytes"], "dispatch_v_nvl_nbytes": d["v_nvl_nbytes"],
            "dispatch_bottleneck": d["bottleneck"], "combine_bottleneck": c["bottleneck"],
            "dispatch_bound": d["bound"], "combine_bound": c["bound"]}
