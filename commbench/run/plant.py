"""A test hook, not a feature: a slowdown planted in named points so that the regression gate
(tools/ab_gate.py) can be checked against a change of known size.

COMMBENCH_PLANT_POINTS="all_reduce:float32:65536,..." names points (benchmark:dtype:nbytes);
COMMBENCH_PLANT_DELAY_PCT=20 makes each of their operations last 20 % longer: after each one
every rank spins (not sleeps: a sleep wakes up tens of microseconds late) for 20 % of the op's
median time, measured once before the point and agreed across ranks. The same spin on every
rank keeps the ranks in step; a spin sized by each op's own time would include the wait for a
slower peer and turn every wait into a new one. Where the op has the MPI backend's compiled
timing loop the spin runs inside it (mpi_timeloop: spin_s), so a planted point is timed like
any other; elsewhere the Python loop times a wrapper, and a fair A/B plants the same points at
0 % on the other side, which pays the wrapper's call too. Unset, nothing is wrapped and
nothing costs anything."""
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
    rank times a few ops and they agree on the slowest rank's median).

    An op with a compiled timing loop (the MPI backend's plain collectives) keeps it: the spin
    runs in that C loop, inside each call's timed window, so a planted point is timed by the
    same loop as every other point of the sweep and the spin is the only difference. At 0 %
    such an op is returned as it is."""
    compiled = getattr(op, "compiled_loop", None)
    if pct == 0:
        # The Python loop's wrapper costs a call: the unplanted side pays it too.
        return op if compiled is not None else (lambda: op())
    clock = time.perf_counter
    comm.barrier()
    t = compiled(50, False) if compiled is not None else comm.time_ops(lambda: op(), 50)
    delay_s = float(comm.max_over_ranks(np.array([float(np.median(t))]))[0]) * pct / 100.0

    def slowed():
        op()
        end = clock() + delay_s
        while clock() < end:
            pass
    if compiled is not None:
        slowed.compiled_loop = compiled.with_spin(delay_s)
    return slowed
