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
# The most a point may be slowed: 10 times its own time on top. The gate plants 20 %; far
# more than this turns a sweep into a wait, and infinity would spin every rank until the
# watchdog ends the run and blames the collective.
MAX_PCT = 1000.0


def setting(environ=None) -> tuple[tuple[str, ...], float] | None:
    """The points the hook names (benchmark:dtype:bytes) and the delay in per cent, or None
    when it names none. Anything else is refused in one line, before any rank starts."""
    environ = os.environ if environ is None else environ
    names = tuple(dict.fromkeys(x.strip() for x in environ.get(POINTS_ENV, "").split(",") if x.strip()))
    if not names:
        return None
    bad = next((x for x in names if len(x.split(":")) != 3 or not x.rsplit(":", 1)[1].isdigit()), None)
    if bad is not None:
        raise UsageError(f"{POINTS_ENV} names points as benchmark:dtype:bytes, got {bad!r}")
    raw = environ.get(PCT_ENV, "0")
    try:
        pct = float(raw)
    except ValueError:
        pct = float("nan")
    if not 0 <= pct <= MAX_PCT:  # NaN fails too
        raise UsageError(f"{PCT_ENV} must be a number from 0 to {MAX_PCT:g} (per cent), got {raw!r}")
    return names, pct


def point_name(point) -> str:
    return f"{point.benchmark}:{point.dtype}:{point.nbytes}"


def planted_pct(point) -> float | None:
    """The delay in per cent planted on this point, or None when the point is not named."""
    s = setting()
    return s[1] if s is not None and point_name(point) in s[0] else None


def warning_line(points, environ=None) -> str | None:
    """The start of a run says loudly that the hook is on, and where (None: it is off)."""
    s = setting(environ)
    if s is None:
        return None
    names, pct = s
    hit = list(dict.fromkeys(point_name(p) for p in points if point_name(p) in names))
    where = (f"slows {len(hit)} point(s) of this run by {pct:g} %: {', '.join(hit[:6])}"
             + (f" and {len(hit) - 6} more" if len(hit) > 6 else "") if hit else "names no point of this run")
    return (f"warning: {POINTS_ENV} and {PCT_ENV}={pct:g} are set: the regression gate's test hook {where}; "
            f"their rows carry planted_delay_pct (unset both to measure)")


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
