"""The side-by-side maths of variant runs: which variant is the baseline, what the busiest
link carries, from which size a variant wins for good."""
from __future__ import annotations

from commbench.core.errors import UsageError


def wire_gbps(algbw_gbps: float, world: int, inswitch: bool, busbw_gbps: float) -> float:
    """What the busiest link carries: algbw*(n+1)/n with an in-switch reduction (each rank
    sends S once and receives the result once), busbw for ring-like algorithms."""
    return algbw_gbps * (world + 1) / world if inswitch else busbw_gbps


def pick_baseline(names: list[str], given: str | None = None) -> str:
    if given:
        if given not in names:
            raise UsageError(f"baseline variant {given!r} is not among the variants run ({', '.join(names)})")
        return given
    for n in names:
        if "ring" in n and "nvls" not in n:
            return n
    return "default" if "default" in names else names[0]


def crossover_nbytes(sizes, speedups) -> int | None:
    """The smallest size from which a variant beats the baseline at every larger size
    (speedup > 1); None when it never does for good."""
    pairs = sorted(zip(sizes, speedups))
    cross = None
    for s, x in reversed(pairs):
        if x > 1.0:
            cross = s
        else:
            break
    return cross
