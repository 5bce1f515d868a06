"""One line of judgement a summary finding ends with: a number in words, by the bounds of
analyse/thresholds.py."""
from __future__ import annotations

from commbench.analyse.thresholds import (
    CEILING_AT_LINK_PCT,
    CEILING_BELOW_PCT,
    CEILING_GOOD_PCT,
    EFFICIENCY_SCALES_PCT,
    EFFICIENCY_SOME_LOSS_PCT,
    LATENCY_BELOW_FLOOR_X,
    LATENCY_FEW_STEPS_X,
    LATENCY_LINK_X,
)
from commbench.core.schema import has
from commbench.report.fmt import fmt


def judge_ceiling(pct, doubt=None) -> str:
    """A rate as a share of its link's line rate, in words; doubt: why the ceiling carries no
    verdict (a loopback probe that was disturbed or spread too far)."""
    if has(doubt):
        return f"cannot judge against the line rate: {doubt}"
    if not has(pct) or fmt(pct) == "-":
        return "no ceiling to judge against (report --profile NAME sets one)"
    p = float(pct)
    if p >= CEILING_AT_LINK_PCT:
        return "at the link's rate: the link is the limit"
    if p >= CEILING_GOOD_PCT:
        return "good: within 2x of the link's rate"
    if p >= CEILING_BELOW_PCT:
        return "well below the link's rate"
    return "far below the link's rate: per-operation overhead decides"


def judge_efficiency(pct: float) -> str:
    """A weak-scaling efficiency, in words."""
    if pct >= EFFICIENCY_SCALES_PCT:
        return "scales: per-rank throughput holds"
    if pct >= EFFICIENCY_SOME_LOSS_PCT:
        return "some loss per rank as ranks are added"
    return "per-rank throughput drops as ranks are added"


def judge_latency(p50: float, floor) -> str:
    """Small-message latency against the profile's latency floor (one message between two
    ranks), in words."""
    if not has(floor) or not float(floor) > 0:
        return "no latency floor in the profile to judge against"
    x = p50 / float(floor)
    if x < LATENCY_BELOW_FLOOR_X:
        # The floor is one library's two-rank exchange (loopback: MPI's); another backend's
        # path can beat it.
        return f"{x:.1f}x the latency floor: below it, the floor was measured on another path"
    if x <= LATENCY_LINK_X:
        return f"{x:.1f}x the latency floor: what the link allows"
    if x <= LATENCY_FEW_STEPS_X:
        return f"{x:.1f}x the latency floor: a few steps, or overhead per call"
    return f"{x:.0f}x the latency floor: per-call overhead dominates"
