"""What the host's state can explain of a change between compare's two sides.

A change is judged ("faster"/"slower") only when it is beyond what the host's state can
explain; within it the point is "cannot judge", with the reason. What the host can explain at
a point is a factor, the product of those that apply (docs/verdicts.md, "compare"):

* the runs: the sides ran in blocks (every run of one side before every run of the other,
  from the runs' control timestamps or their meta.json started/finished), their times are not
  recorded (imports), one run a side, or fewer than MIN_RUNS a side: RUNS_APART_FACTOR;
* the control: the sides' control measurements (meta.json `controls`: a fixed-work CPU loop and
  an 8-byte ping-pong at the start and end of every launch) differ by a ratio;
* disturbed rows: a row whose rank waited for a CPU w % of the point's time (or lost w % to
  steal) can be slowed by up to 1 / (1 - w/100) by that alone (at most DISTURBED_CAP).

Rows that ran oversubscribed or carry a warning other than "disturbed" are never evidence
(verdicts.untrusted_reason). Pure functions over meta.json dicts and compare's rows.
"""
from __future__ import annotations

import math
from datetime import datetime

from commbench.analyse.intervals import _num
from commbench.analyse.verdicts import untrusted_reason
from commbench.core.schema import has

# Runs in blocks: identical code, three runs and then three more on a 2-core VM (load average
# under 0.5), read 23-54 % faster at 26 of 28 points (all_reduce 8 B: 0.68 vs 0.45 us), with
# intervals that excluded zero: the host holds a speed for seconds to minutes, so runs made
# one after another share it and the spread within a side does not see the drift between the
# sides. 2x covers the largest of those (1.54x) with room. One run a side, and fewer than
# MIN_RUNS runs a side, are judged alike: one launch can sit at one of several speeds for its
# whole life (float32 16 KiB all_reduce at 7.8 us in some launches, 10.2 us in others).
RUNS_APART_FACTOR = 2.0
MIN_RUNS = 3
# 1 / (1 - w) grows without bound as a rank's wait nears the whole point; a row that waited
# 90 % or more, or a disturbed row whose counters were not recorded, counts as this.
DISTURBED_CAP = 10.0
AB_HINT = "commbench ab --rounds 3"
_CONTROLS = (("cpu_loop_us", "cpu loop"), ("pingpong_us", "ping-pong"))


def _unix_s(text) -> float:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return math.nan


def run_span(meta: dict | None) -> tuple[float, float] | None:
    """(start, end) of a run in Unix seconds: its controls' timestamps, else its meta.json
    started/finished (whole seconds); None when not recorded. An import's `started` is when
    it was imported, not when it ran: None."""
    if not isinstance(meta, dict) or meta.get("imported_from"):
        return None
    ts = [_num(c.get("unix_s")) for c in meta.get("controls") or [] if isinstance(c, dict)]
    ts = [t for t in ts if math.isfinite(t)]
    if ts:
        return min(ts), max(ts)
    start = _unix_s(meta.get("started"))
    end = _unix_s(meta.get("finished"))
    if not math.isfinite(start):
        return None
    return start, end if math.isfinite(end) and end >= start else start


def runs_order(base_metas: dict, new_metas: dict) -> tuple[str, str]:
    """("interleaved" | "apart" | "not recorded", the sentence that says so). Apart: every run
    of one side ended before (or in the same second as) every run of the other started."""
    spans = [{run: run_span(m) for run, m in metas.items()} for metas in (base_metas, new_metas)]
    missing = [run for s in spans for run, v in s.items() if v is None]
    tail = (f"within {RUNS_APART_FACTOR:g}x that is the host's drift as much as a change "
            f"(commbench ab interleaves)")
    if missing or not all(spans):
        which = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return "not recorded", (f"not interleaved: when the runs ran is not recorded ({which or 'no run'}), so "
                                f"they are taken as run apart; {tail}")
    (b, n) = ([v for v in s.values()] for s in spans)
    for first, then, a, z in ((b, n, "base", "new"), (n, b, "new", "base")):
        if max(e for _, e in first) <= min(s for s, _ in then):
            return "apart", f"not interleaved: every {a} run ran before every {z} run; {tail}"
    return "interleaved", "interleaved"


def control_figures(metas: dict) -> dict:
    """{field: the geometric mean of a side's control figures over its runs and both ends of
    their launches} for the fields recorded (positive numbers only)."""
    out = {}
    for field, _ in _CONTROLS:
        v = [_num(c.get(field)) for m in metas.values() if isinstance(m, dict)
             for c in m.get("controls") or [] if isinstance(c, dict)]
        v = [x for x in v if x > 0 and math.isfinite(x)]
        if v:
            out[field] = math.exp(sum(math.log(x) for x in v) / len(v))
    return out


def control_moved(base_metas: dict, new_metas: dict) -> tuple[float, str]:
    """(factor, sentence): how far apart the sides' controls are, the larger of the CPU loop's
    and the ping-pong's ratios either way (1.0 and '' when a side recorded none): "the host
    moved: control cpu loop +38 % on the new side"."""
    b, n = control_figures(base_metas), control_figures(new_metas)
    best = (-1.0, "")
    for field, name in _CONTROLS:
        if field in b and field in n:
            r = n[field] / b[field]
            f = max(r, 1.0 / r)
            if f > best[0]:
                best = (f, f"the host moved: control {name} {(f - 1.0) * 100.0:+.0f} % on the "
                           f"{'new' if r > 1 else 'base'} side")
    return best if best[1] else (1.0, "")


def host_context(base_metas: dict | None, new_metas: dict | None, order: str | None = None) -> dict:
    """What compare_runs needs of the runs' meta.json: {run: meta} a side. order forces the
    runs' order (tools/ab_replay.py draws runs as if interleaved)."""
    base_metas, new_metas = base_metas or {}, new_metas or {}
    found, line = runs_order(base_metas, new_metas)
    factor, moved = control_moved(base_metas, new_metas)
    have = [bool(control_figures(m)) for m in (base_metas, new_metas)]
    note = "" if have[0] == have[1] else (f"control: recorded on the {'base' if have[0] else 'new'} side only, so "
                                          f"whether the host moved between the sides is not known")
    return {"order": order or found, "order_line": "" if order else line, "control_factor": factor,
            "control_line": moved, "control_note": note}


def runs_reason(ctx: dict | None, one_each: bool, base_runs: int, new_runs: int):
    """(label, factor, sentence) of the runs, or None when they are interleaved and enough, or
    when there is no context (a caller that judges frames alone: the statistics and the rows)."""
    if ctx is None:
        return None
    if one_each:
        return "one run each", RUNS_APART_FACTOR, f"one run each ({AB_HINT} to judge)"
    if ctx["order"] in ("apart", "not recorded"):
        return "not interleaved", RUNS_APART_FACTOR, ctx["order_line"]
    few = [(n, s) for n, s in ((base_runs, "base"), (new_runs, "new")) if n < MIN_RUNS]
    if few:
        n, side = few[0]
        return ("fewer than 3 runs", RUNS_APART_FACTOR,
                f"{n} run(s) on the {side} side: faster/slower needs {MIN_RUNS} a side, interleaved ({AB_HINT})")
    return None


def row_reason(run: str, row: dict):
    """(label, factor, sentence) of one row the host disturbed, or None. Oversubscribed rows
    and rows with a warning besides "disturbed": factor inf (never evidence)."""
    why = untrusted_reason(row)
    if not why:
        return None
    if why.startswith("oversubscribed"):
        return "oversubscribed", math.inf, f"run {run} {why}"
    warning = row.get("warning")
    if has(warning) and str(warning).split("disturbed: ")[0].strip("; "):
        return "carries a warning", math.inf, f"run {run} carries a warning"
    wait, steal = (_num(row.get(k)) for k in ("host_wait_pct", "host_steal_pct"))
    w, what = max(((x, k) for x, k in ((wait, "waited for a CPU"), (steal, "lost to CPU steal")) if math.isfinite(x)),
                  default=(math.nan, ""))
    if not math.isfinite(w):
        return ("disturbed", DISTURBED_CAP, f"disturbed: run {run} ran disturbed, by how much not recorded "
                                            f"(taken as up to {DISTURBED_CAP:g}x)")
    f = DISTURBED_CAP if w >= 100.0 else min(DISTURBED_CAP, 1.0 / (1.0 - max(w, 0.0) / 100.0))
    return "disturbed", f, f"disturbed: run {run} {what} {w:.0f} % of the point's time (up to {f:.2g}x)"


def point_reasons(ctx, one_each: bool, row: dict, rows: list, thr: float) -> tuple[list, bool]:
    """(the reasons that apply at one matched point, largest factor first; whether one is a
    row the host disturbed). rows: (run, row) of both sides' rows of the point as compared."""
    out = [runs_reason(ctx, one_each, int(row["base_runs"]), int(row["new_runs"]))]
    if ctx and ctx["control_factor"] > 1.0 + thr:  # a smaller move cannot change a verdict alone
        out.append(("the host moved", ctx["control_factor"], ctx["control_line"]))
    rs = [x for x in (row_reason(run, r) for run, r in rows) if x]
    if rs:
        out.append(max(rs, key=lambda x: x[1]))
    return sorted((x for x in out if x), key=lambda x: -x[1]), bool(rs)


def judge(out: list, ctx: dict | None, one_each: bool, rows_of, keys: tuple, thr: float) -> None:
    """Apply the rule to compare's matched rows (in place): a "faster"/"slower" no larger than
    the factor the host's state explains becomes "cannot judge" (caveat: each reason); beyond it
    stays judged and its caveat says what it rests on. A point with a disturbed, oversubscribed
    or warned row is never "not significant" either: the host could hide a change as well as
    make one. rows_of(key) -> [(run, row)]. Sets explained_factor and explained_by."""
    for row in out:
        if row["only_in"]:
            continue
        reasons, disturbed = point_reasons(ctx, one_each, row, rows_of(tuple(row[k] for k in keys)), thr)
        factor = math.prod(f for _, f, _ in reasons)
        row["explained_factor"] = factor
        row["explained_by"] = "; ".join(f"{lab} {f:.3g}x" for lab, f, _ in reasons)
        said = "; ".join(s for _, _, s in reasons)
        v, ratio = row["verdict"], row["ratio"]
        if v in ("slower", "faster") and math.isfinite(ratio) and ratio > 0:
            if abs(math.log(ratio)) <= math.log(factor):
                row.update(verdict="cannot judge", caveat=f"{v}? {said}")
            elif reasons:
                row["caveat"] = f"beyond the {factor:.3g}x the host's state can explain: {said}"
        elif v == "not significant" and disturbed:
            row.update(verdict="cannot judge", caveat=said)


def header_lines(ctx: dict | None, one_each: bool, thr: float) -> list[str]:
    """What the header says of the runs and the control, for every point at once."""
    if not ctx:
        return []
    out = []
    if one_each:
        out.append(f"one run each: a change within {RUNS_APART_FACTOR:g}x is not judged ({AB_HINT} to judge)")
    elif ctx["order"] != "interleaved":
        out.append(ctx["order_line"])
    if ctx["control_factor"] > 1.0 + thr:
        out.append(f"{ctx['control_line']}: a change within {ctx['control_factor']:.3g}x is not judged")
    elif ctx["control_line"]:  # recorded on both sides, and steady: say so
        out.append(ctx["control_line"].replace("the host moved: control", "control steady:") +
                   " (within the threshold)")
    if ctx["control_note"]:
        out.append(ctx["control_note"])
    return out
