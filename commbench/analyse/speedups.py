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


# A speedup or slowdown is judged only on at least this many pairs of repeats, each pair
# (repeat k of the variant and repeat k of the baseline) in launches of their own that ran
# next to each other. A launch can hold a point at one of several speeds for its whole life
# (where the library's shared-memory segment landed, which cores its ranks got): one pair
# is one draw of those modes, and two pairs that share a slow mode on one side agree by
# chance often enough to flip a verdict between two identical runs; three rarely do.
MIN_PAIRS = 3
_RUNS_EACH = {1: "one run each", 2: "two runs each"}
_TO_JUDGE = f"--repeat {MIN_PAIRS} to judge"


def launch_started_ns(launch_id) -> int | None:
    """When a launch began, from its id ('<pid>-<ns since the epoch>', as run/launcher.py
    makes them); None for an id that does not say."""
    head, _, tail = str(launch_id or "").partition("-")
    return int(tail) if head.isdigit() and tail.isdigit() else None


def repeat_of(row) -> int:
    """A row's repeat number (1 where it has none: a run without --repeat, an import)."""
    try:
        return max(1, int(row.get("repeat") or 1))
    except (TypeError, ValueError):  # NaN where other rows of the table have one
        return 1


def _launches(rows) -> dict[int, set]:
    """repeat -> the launch ids its rows carry (None for a row without one)."""
    out: dict[int, set] = {}
    for r in rows:
        lid = r.get("launch")
        out.setdefault(repeat_of(r), set()).add(lid if isinstance(lid, str) and lid else None)
    return out


def pairing(base_rows, var_rows) -> tuple[int, str, str]:
    """Whether the rows of two variants (every size of one comparison) hold enough evidence
    for a verdict: (pairs, why not, what would give it). pairs: the repeats both hold; why
    not '' when there are at least MIN_PAIRS of them, each repeat a launch of its own (its
    own launch id) and the pairs interleaved (both launches of repeat k started before
    either launch of repeat k+1, as `run --np N --repeat 3` alternates the variants). Under
    an external launcher every repeat runs in the one launch: they share its speed, and
    agree for that reason alone."""
    base, var = _launches(base_rows), _launches(var_rows)
    reps = sorted(set(base) & set(var))
    n = len(reps)
    if n < MIN_PAIRS:
        return n, _RUNS_EACH.get(n, "no repeat of both"), _TO_JUDGE
    ids = [base[k] for k in reps] + [var[k] for k in reps]
    if any(None in s for s in ids):
        return n, f"{n} repeats each, not recorded as launches of their own (rows without a launch id)", \
            f"run --np N {_TO_JUDGE}"
    for side in (base, var):
        seen = [lid for k in reps for lid in side[k]]
        if any(len(side[k]) > 1 for k in reps) or len(set(seen)) < len(seen):
            return n, f"{n} repeats each, but not each in a fresh launch (repeats in one launch share its speed: an " \
                      f"external launcher or a resume runs them so)", f"run --np N {_TO_JUDGE}"
    starts = [(launch_started_ns(next(iter(base[k]))), launch_started_ns(next(iter(var[k])))) for k in reps]
    if any(t is None for pair in starts for t in pair):
        return n, f"{n} repeats each, in launches whose order is not recorded", f"run --np N {_TO_JUDGE}"
    if any(max(a) >= min(b) for a, b in zip(starts, starts[1:])):
        return n, f"{n} repeats each, not interleaved (repeat k of the two variants did not run next to each other)", \
            f"run --np N {_TO_JUDGE} alternates them"
    return n, "", ""


def usable_pairs(base_rows, var_rows, untrusted) -> list[tuple]:
    """At one size, (baseline row, variant row) for each repeat both hold a usable row of
    (untrusted(row) says why a row is not); paired by repeat number, so a repeat left out on
    one side never pairs its neighbours."""
    b = {repeat_of(r): r for r in base_rows if not untrusted(r)}
    v = {repeat_of(r): r for r in var_rows if not untrusted(r)}
    return [(b[k], v[k]) for k in sorted(set(b) & set(v))]


def size_verdict(pairs: list[tuple]) -> bool | None:
    """At one size, from its usable pairs: True when the variant is clearly faster in every
    pair (its p90 below the baseline's p50: nine in ten of its iterations beat the
    baseline's median), False when it is clearly slower in every pair (the baseline's p90
    below its p50), None otherwise or with fewer than MIN_PAIRS pairs."""
    if len(pairs) < MIN_PAIRS:
        return None
    if all(_below(y["time_us_p90"], x["time_us_p50"]) for x, y in pairs):
        return True
    if all(_below(x["time_us_p90"], y["time_us_p50"]) for x, y in pairs):
        return False
    return None


def _below(a, b) -> bool:
    try:
        return float(a) < float(b)
    except (TypeError, ValueError):
        return False


def judged_from(sizes, judged, want: bool) -> int | None:
    """The smallest size from which every larger size was judged `want` (True: clearly
    faster, False: clearly slower); None when the largest was not."""
    start = None
    for s, j in sorted(zip(sizes, judged), key=lambda p: p[0], reverse=True):
        if j is not want:
            break
        start = s
    return start
