"""compare's two guards for runs made with `run --repeat N`: what a point's repeats within a
run say about whether the sides' difference can be a change at all (compare.compare_runs
applies them after the t-test and Benjamini-Hochberg). Pure Python over compare's rows.

key_of(row) -> the point's key (compare._key); keys: the names of its fields (compare.KEYS)."""
from __future__ import annotations

import math

from commbench.analyse.intervals import _num

# Neighbouring sizes (each side) whose repeats' spread the spread guard pools (spread_guard).
GUARD_WINDOW = 1


def repeats_by_run(df, key_of) -> dict:
    """(key, run) -> the p50s of that run's repeats of the point, for the runs that repeated it
    (run --repeat N); one pass over the frame, which both guards read."""
    per: dict = {}
    if df is None or not len(df) or "repeat" not in df.columns:
        return per
    for r in df.to_dict("records"):
        p50 = _num(r.get("time_us_p50"))
        if p50 > 0 and math.isfinite(p50):
            per.setdefault((key_of(r), str(r.get("run"))), []).append(p50)
    return {k: v for k, v in per.items() if len(v) > 1}


def repeat_spreads(*sides: dict) -> dict:
    """key -> the spread of each run's repeats of that point, over the sides' repeats_by_run:
    the standard deviation of log p50 over the run's repeats. Repeats of one run are
    interleaved over the whole run (run --repeat N), so this is how far the host moved the
    point in the seconds between them: on a VM whose cores change speed in stretches of
    seconds it is 30-70 % at some points and 3-9 % at others."""
    out: dict = {}
    for per in sides:
        for (key, _), v in per.items():
            logs = [math.log(x) for x in v]
            mu = sum(logs) / len(logs)
            out.setdefault(key, []).append(math.sqrt(sum((x - mu) ** 2 for x in logs) / (len(logs) - 1)))
    return out


def repeat_p50s(per: dict) -> dict:
    """key -> the p50 of every repeat of that point in one side's repeats_by_run."""
    out: dict = {}
    for (key, _), v in per.items():
        out.setdefault(key, []).extend(v)
    return out


# The share of the faster side's own repeats that, running as slow as the slower side, makes a
# change "cannot judge" (level_guard). Half: replayed on 14 recorded runs of the gate's sweep
# (tools/ab_replay.py, 60 draws), a quarter cost 7 % of the planted points found, half none.
LEVEL_SHARE = 0.5


def level_guard(out: list, base_reps: dict, new_reps: dict, keys: tuple) -> None:
    """A change whose slower level the faster side's own repeats reach, in at least
    LEVEL_SHARE of them, is "cannot judge": that level is a speed the host takes the point to
    on its own. The case it is for: a point that runs at one of two speeds 1.5x apart, each
    repeat drawing one; every base run got at least one fast repeat (its figure, the fastest,
    is fast), every new run got none (int32 192 KiB: 38 us against 55-64 us) -- while most of
    the base runs' own repeats ran at 55-86 us too."""
    for row in out:
        if row["only_in"] or row["verdict"] not in ("slower", "faster"):
            continue
        key = tuple(row[k] for k in keys)
        slower = row["verdict"] == "slower"
        reps = (base_reps if slower else new_reps).get(key)
        level = row["new_p50_us"] if slower else row["base_p50_us"]
        if not reps or not level > 0:
            continue
        n = sum(1 for x in reps if x >= level)
        if n >= LEVEL_SHARE * len(reps):
            side = "base" if slower else "new"
            row.update(verdict="cannot judge",
                       caveat=f"{row['verdict']}? {n} of the {side} side's own {len(reps)} repeats ran at "
                              f"{level:.4g} us or slower, the other side's level: a speed the host takes this point "
                              f"to on its own")


def spread_guard(out: list, spreads: dict, keys: tuple) -> None:
    """A change no larger than the spread of the repeats within a run is "cannot judge": the
    host moved that point by as much between the repeats of one run as the sides differ by,
    and three runs a side that all caught (or all missed) a slow stretch at a range of sizes
    read as a change to the t-test. The spread: the root mean square, over both sides' runs,
    of each run's repeats' standard deviation of log p50 (repeat_spreads), at the point and
    its neighbouring size each side (GUARD_WINDOW) -- the pooled within-run spread. Why not a
    median: on this kind of host a point jumps between speeds 1.5-3x apart in some runs and
    holds one speed in others, and a median over runs then says "steady" at the very points
    whose runs drew different speeds on the two sides (int32 192 KiB: 38 us in every base
    run, 55-64 us in every new one, repeats spreading +-79 % at 384 KiB). Why the neighbours:
    such speeds hold for a range of sizes, and four repeats a run see a point's own
    jumps only now and then."""
    series: dict = {}
    nb = keys.index("nbytes")
    for key in spreads:
        series.setdefault(key[:nb] + key[nb + 1:], []).append(key[nb])
    for sizes in series.values():
        sizes.sort()
    for row in out:
        if row["only_in"] or row["verdict"] not in ("slower", "faster"):
            continue
        key = tuple(row[k] for k in keys)
        if key not in spreads:
            continue
        rest = key[:nb] + key[nb + 1:]
        sizes = series[rest]
        i = sizes.index(key[nb])
        near = [spreads[rest[:nb] + (n,) + rest[nb:]] for n in sizes[max(0, i - GUARD_WINDOW): i + GUARD_WINDOW + 1]]
        sd = [x for runs in near for x in runs]
        spread = math.sqrt(sum(x * x for x in sd) / len(sd))
        if spread >= abs(math.log(row["ratio"])):
            row.update(verdict="cannot judge",
                       caveat=f"{row['verdict']}? the repeats within a run spread "
                              f"+-{(math.exp(spread) - 1) * 100:.0f} %"
                              f" (over {len(sd)} runs of this and the neighbouring sizes), not less than the change "
                              f"({row['change_pct']:+.0f} %)")
