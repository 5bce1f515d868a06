"""A test hook, not a feature: a slowdown planted in named points so that the regression gate
(tools/ab_gate.py) can be checked against a change of known size.

COMMBENCH_PLANT_POINTS="all_reduce:float32:65536,..." names points (benchmark:dtype:nbytes);
COMMBENCH_PLANT_DELAY_PCT=20 makes each of their operations last 20 % longer: after each one
every rank spins (not sleeps: a sleep wakes up tens of microseconds late) for 20 % of the op's
median time, measured once before the point and agreed across ranks. The same spin on every
rank keeps the ranks in step; a spin sized by each op's own time would include the wait for a
slower peer and turn every wait into a new one. A named point runs through the Python timing loop (the wrapper has no compiled
loop), so a fair A/B plants the same points at 0 % on the other side: the delay is then the
only difference. Unset, nothing is wrapped and nothing costs anything."""
from __future__ import annotations

import os
import time

import numpy as np

from commbench.core.errors import UsageError

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
        raise UsageError(f"{PCT_ENV} must be a number >= 0, got {os.environ.get(PCT_ENV)!r}")
    return pct


def wrap(op, pct: float, comm):
    """op, followed by a spin of pct per cent of its median time (collective over comm: every
    rank times a few ops and they agree on the slowest rank's median)."""
    if pct == 0:
        return lambda: op()  # the same loop as a planted point, without the spin
    clock = time.perf_counter
    comm.barrier()
    t = comm.time_ops(lambda: op(), 50)
    delay_s = float(comm.max_over_ranks(np.array([float(np.median(t))]))[0]) * pct / 100.0

    def slowed():
        op()
        end = clock() + delay_s
        while clock() < end:
            pass
    return slowed
