"""A test hook, not a feature: a slowdown planted in named points so that the regression gate
(tools/ab_gate.py) can be checked against a change of known size.

COMMBENCH_PLANT_POINTS="all_reduce:float32:65536,..." names points (benchmark:dtype:nbytes);
COMMBENCH_PLANT_DELAY_PCT=20 makes each of their operations last 20 % longer: the op is timed
and then spins (not sleeps: a sleep wakes up tens of microseconds late) for that share of its
own time. A named point runs through the Python timing loop (the wrapper has no compiled
loop), so a fair A/B plants the same points at 0 % on the other side: the delay is then the
only difference. Unset, nothing is wrapped and nothing costs anything."""
from __future__ import annotations

import os
import time

POINTS_ENV = "COMMBENCH_PLANT_POINTS"
PCT_ENV = "COMMBENCH_PLANT_DELAY_PCT"


def planted_pct(point) -> float | None:
    """The delay in per cent planted on this point, or None when the point is not named."""
    names = os.environ.get(POINTS_ENV, "")
    if not names:
        return None
    me = f"{point.benchmark}:{point.dtype}:{point.nbytes}"
    if me not in {x.strip() for x in names.split(",")}:
        return None
    try:
        pct = float(os.environ.get(PCT_ENV, "0"))
    except ValueError:
        pct = -1.0
    if not pct >= 0:
        from .errors import UsageError

        raise UsageError(f"{PCT_ENV} must be a number >= 0, got {os.environ.get(PCT_ENV)!r}")
    return pct


def wrap(op, pct: float):
    """op, slowed by pct per cent of its own time."""
    clock = time.perf_counter
    k = pct / 100.0

    def slowed():
        t0 = clock()
        op()
        end = clock() + (clock() - t0) * k
        while clock() < end:
            pass
    return slowed
