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
nothing costs anything.

The pairs benchmark has a hook of its own, as a test hook too: COMMBENCH_PLANT_PAIR=A-B (two
ranks) and COMMBENCH_PLANT_PAIR_DELAY_US=D make every exchange between ranks A and B last D
microseconds longer (both ends sleep D after each one), so a test can plant one slow link and
check that the verdict names it; COMMBENCH_PLANT_PAIRS_BASE_US=B adds B to every pair's
exchanges first, a base rate that sets the pace instead of a loopback host's few cores (as
a shaped link does between namespace hosts). Rows of a planted run carry planted_pair and
planted_base_us."""
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
    pair_setting(environ)  # refused with the rest, before any rank starts
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


PAIR_ENV = "COMMBENCH_PLANT_PAIR"
PAIR_DELAY_ENV = "COMMBENCH_PLANT_PAIR_DELAY_US"
PAIRS_BASE_ENV = "COMMBENCH_PLANT_PAIRS_BASE_US"
# A planted delay may reach a second per exchange, no more (as MAX_PCT: a slow link, not a
# hang the watchdog would blame on the benchmark).
MAX_PAIR_DELAY_US = 1e6


def _delay_us(environ, name: str) -> float:
    raw = environ.get(name, "0")
    try:
        us = float(raw)
    except ValueError:
        us = float("nan")
    if not 0 <= us <= MAX_PAIR_DELAY_US:  # NaN fails too
        raise UsageError(f"{name} must be a number from 0 to {MAX_PAIR_DELAY_US:g} (microseconds), got {raw!r}")
    return us


def pair_setting(environ=None) -> tuple[frozenset, float, float] | None:
    """The planted pair (its two ranks, or none), its delay and the base delay of every
    pair, in microseconds; None when neither is set. Anything else refused in one line,
    before any rank starts."""
    environ = os.environ if environ is None else environ
    raw = environ.get(PAIR_ENV, "").strip()
    base = _delay_us(environ, PAIRS_BASE_ENV)
    if not raw and not base:
        return None
    ends = raw.split("-") if raw else []
    if raw and (len(ends) != 2 or not all(e.strip().isdigit() for e in ends) or ends[0].strip() == ends[1].strip()):
        raise UsageError(f"{PAIR_ENV} names one pair of ranks as A-B (two different ranks), got {raw!r}")
    return frozenset(int(e) for e in ends), _delay_us(environ, PAIR_DELAY_ENV), base


def pair_tags() -> dict:
    """What every row of a planted pairs run says of the hook ({} when it is off)."""
    s = pair_setting()
    if s is None:
        return {}
    return {**({"planted_pair": "-".join(map(str, sorted(s[0])))} if s[0] else {}),
            **({"planted_base_us": s[2]} if s[2] else {})}


def pair_op(op, rank: int, peer: int):
    """op, followed by the planted delay: the base delay of every pair, plus the planted
    pair's when rank and peer are its two ends; op itself when there is none. The delay
    sleeps, where the point hook spins: a slow link keeps its ends waiting, not computing,
    and a spin would take the cores of the round's other pairs on a loopback host with fewer
    cores than ranks, slowing them too (a sleep's late wake-up, tens of microseconds, is
    noise beside delays of milliseconds). The Python loop times it (the compiled loop has
    no sleep)."""
    s = pair_setting()
    delay_us = 0.0 if s is None else s[2] + (s[1] if {rank, peer} == s[0] else 0.0)
    if not delay_us:
        return op
    delay_s = delay_us * 1e-6

    def slowed():
        op()
        time.sleep(delay_s)
    return slowed


def point_name(point) -> str:
    return f"{point.benchmark}:{point.dtype}:{point.nbytes}"


def planted_pct(point) -> float | None:
    """The delay in per cent planted on this point, or None when the point is not named."""
    s = setting()
    return s[1] if s is not None and point_name(point) in s[0] else None


def warning_line(points, environ=None) -> str | None:
    """The start of a run says loudly that the hook is on, and where (None: it is off)."""
    s = setting(environ)
    pair = pair_setting(environ)
    if pair is not None:
        ends, us, base = pair
        what = "; ".join(x for x in (f"every exchange {base:g} us" if base else "",
                                     f"ranks {'-'.join(map(str, sorted(ends)))} {us:g} us more" if ends else "") if x)
        return (f"warning: {PAIRS_BASE_ENV}, {PAIR_ENV} or {PAIR_DELAY_ENV} is set: the pairs benchmark's test hook "
                f"slows {what} (unset them to measure); rows carry planted_pair, planted_base_us")
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
