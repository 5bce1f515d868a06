"""`commbench compare` as a person reads it: the headline (verdict counts and what they rest
on), the line a failed data check opens with, the table of matched points and the points
found on one side only. The numbers are analyse.compare's; the command's flow (load both
sides, judge, print, write CSV) is commands/compare.py."""
from __future__ import annotations

import json
import math

from rich.markup import escape

from commbench.analyse.compare import FDR_Q, ONE_RUN_CAVEAT, REPEAT_HINT, check_failed, split_only, summary
from commbench.core.units import fmt_size
from commbench.report import terminal
from commbench.report.fmt import size_cells
from commbench.report.tables import ALWAYS, COMPACT, WIDE, add_column, print_table, table


def _params_text(key: str) -> str:
    """A params key (canonical JSON, params_key) as k=v words."""
    return " ".join(f"{k}={v}" for k, v in json.loads(key).items())


def _runs_text(col) -> str:
    """'3' or '2-3': how many runs a side held over the matched points."""
    lo, hi = int(col.min()), int(col.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def headline(df, threshold_pct: float | None = None) -> tuple[str, str]:
    """(title, caption) of the compare table: the verdict counts, and on what they rest."""
    matched, _ = split_only(df)
    s = summary(df)
    counts = f"{s['slower']} slower, {s['faster']} faster, {s['not significant']} not significant"
    if s["check failed"]:
        counts = f"{s['check failed']} check failed (wrong results, not judged), " + counts
    if s["cannot judge"]:
        counts += f", {s['cannot judge']} cannot judge ({_cannot_judge_why(matched)})"
    thr = f"threshold {threshold_pct:g} %; " if threshold_pct is not None else ""
    single = s["one run per side"]
    if not len(matched) or single == len(matched):
        return (f"compare: {counts} -- {ONE_RUN_CAVEAT}" if len(matched) else f"compare: {counts}",
                (f"{thr}ratio = new p50 / base p50; +- is the ~95 % interval of the p50 inside one run, which does "
                 f"not see how much a point moves from run to run; a change counts when it passes the threshold, "
                 f"the intervals do not overlap and it is beyond what the host's state can explain (one run each: "
                 f"2x); {REPEAT_HINT}"))
    runs = f"{_runs_text(matched['base_runs'])} base vs {_runs_text(matched['new_runs'])} new runs"
    title = f"compare over {runs}: {counts}"
    if single:
        title += f" ({single} point(s) had one run per side: cannot separate noise from change)"
    return (title, (f"{thr}p50 = geometric mean of the runs' p50s (lowest..highest run); change with its ~95 % "
                    f"interval from a t-test on the runs' log p50s, the spread between runs pooled over "
                    f"neighbouring sizes; a change counts when it passes the threshold and survives "
                    f"Benjamini-Hochberg at {FDR_Q:.0%} over all points (q-value), so identical code is called "
                    f"changed anywhere in a sweep at most {FDR_Q:.0%} of the time, and is beyond what the host's "
                    f"state can explain (runs in blocks, the control, disturbed rows)"))


def _why_one(caveat: str, explained_by: str) -> str:
    """The one reason a point is counted under: the timing methods the sides measured by
    (different methods measure different things), a repeat guard, or the largest of the host's
    factors (host_moved: its label, "disturbed", "the host moved", "not interleaved", ...)."""
    if caveat.startswith("timing "):
        return caveat
    if "repeats within a run spread" in caveat or "a speed the host takes" in caveat:
        return "the repeats' own spread"
    first = explained_by.split("; ")[0].rsplit(" ", 1)[0] if explained_by and explained_by != "nan" else ""
    return {"the host moved": "the host moved (control)"}.get(first, first or "the host")


def _cannot_judge_why(matched) -> str:
    """Why the points that cannot be judged cannot, counted by reason (_why_one)."""
    bad = matched[matched["verdict"] == "cannot judge"]
    by = bad["explained_by"].astype(str) if "explained_by" in bad else [""] * len(bad)
    why: dict = {}
    for c, e in zip(bad["caveat"].astype(str), by):
        w = _why_one(c, e)
        why[w] = why.get(w, 0) + 1
    return why.popitem()[0] if len(why) == 1 else ", ".join(f"{n} {w}" for w, n in why.items())


def check_line(df, runs_check_failed, fail_on_regression: bool) -> str:
    """The line that opens compare's output when a side's data check failed (its rows say
    check = fail, or its meta.json says check_failed): '' when none did."""
    bad = check_failed(df)
    if not len(bad) and not runs_check_failed:
        return ""
    parts = []
    for side in ("base", "new"):
        pts = bad[bad["check_failed"].isin([side, "both"])]
        if len(pts):
            r = pts.iloc[0]
            parts.append(f"the {side} side's data check failed at {len(pts)} point(s) "
                         f"({r['benchmark']} {fmt_size(int(r['nbytes']))} B {r['dtype']} world {r['world']} first)")
    if runs_check_failed:
        parts.append(f"meta.json of {', '.join(runs_check_failed)} says check_failed")
    then = "the regression gate fails" if fail_on_regression else "compare --fail-on-regression fails on this"
    return f"check failed: {'; '.join(parts)}: those results are wrong, whatever their speed; {then}"


def print_compare(df, only=None, console=None, threshold_pct: float | None = None, all_points: bool = True,
                  wide: bool | None = None) -> None:
    """Rich table of a compare_runs frame (matched points), then the points found on one
    side only. all_points=False shows only the faster/slower points. No number is cut
    (tables.print_table): secondary columns give way on a narrow terminal; wide (`--wide`)
    keeps them all."""
    console = console or terminal.make_console()
    wide = bool(wide)
    plain = not terminal.stdout_is_tty()
    matched, only_df = split_only(df)
    if only is not None:
        only_df = only
    shown = matched if all_points else matched[matched["verdict"] != "not significant"]
    opt = ("dtype", "variant", "placement", "params", "stage")
    cols_opt = {c: matched[c].astype(str).nunique() > 1 for c in ("backend",) + opt}
    repeats = bool(len(matched)) and bool((matched[["base_runs", "new_runs"]].max(axis=1) > 1).any())
    s = summary(df)
    title, caption = headline(df, threshold_pct)
    t = table(title, caption, plain)
    for h in ["benchmark"] + [c for c in ("backend",) if cols_opt[c]]:
        add_column(t, h, left=True)
    add_column(t, "world")
    add_column(t, "size (B)")
    for c in opt:
        if cols_opt[c]:
            add_column(t, c, left=True, wrap=c == "params", words=c == "params")
    add_column(t, "base p50 (us)")
    add_column(t, "new p50 (us)")
    add_column(t, "change")
    if repeats:  # what the verdict rests on, then the runs' own range
        add_column(t, "95% interval")
        add_column(t, "base runs (us)", level=COMPACT)
        add_column(t, "new runs (us)", level=COMPACT)
    add_column(t, "busbw base (GB/s)", level=WIDE)
    add_column(t, "busbw new (GB/s)", level=WIDE)
    add_column(t, "busbw change", level=COMPACT)
    add_column(t, "verdict", left=True, level=ALWAYS, wrap=True)
    pm_sign = "+-" if plain else "\u00b1"

    def p50_cell(p50, lo, hi, runs):
        if not math.isfinite(p50):
            return "-"
        if runs == 1 and math.isfinite(lo) and math.isfinite(hi):  # one run: its own interval
            return f"{p50:.2f} {pm_sign}{(hi - lo) / 2:.2f}"
        return f"{p50:.2f}"

    def range_cell(runs, run_p50s):
        v = [float(x) for x in str(run_p50s).split(";") if x]
        return f"{min(v):.2f}..{max(v):.2f}" if runs > 1 and v else "-"

    records = shown.to_dict("records")
    sizes = size_cells([r["nbytes"] for r in records])  # one format down the column
    for r, size in zip(records, sizes):
        style = {"slower": "red", "faster": "green"}.get(r["verdict"], "red" if r.get("check_failed") else None)
        verdict = r["verdict"] + ("" if r.get("check_failed") else " (1 run/side: noise or change?)"
                                  if r["caveat"] == ONE_RUN_CAVEAT
                                  else f" ({r['caveat']})" if r["caveat"] else "")
        cells = [r["benchmark"]] + ([r["backend"]] if cols_opt["backend"] else []) + \
            [str(r["world"]), size] + \
            [(_params_text(r[c]) if c == "params" else str(r[c])) for c in opt if cols_opt[c]] + \
            [p50_cell(r["base_p50_us"], r["base_ci_lo"], r["base_ci_hi"], r["base_runs"]),
             p50_cell(r["new_p50_us"], r["new_ci_lo"], r["new_ci_hi"], r["new_runs"]),
             f"{_pct_text(r['change_pct'])}%"]
        if repeats:
            cells += [f"{_pct_text(r['change_lo_pct'])}..{_pct_text(r['change_hi_pct'])}%"
                      if math.isfinite(r["change_lo_pct"]) else "-",
                      range_cell(r["base_runs"], r["base_run_p50s_us"]),
                      range_cell(r["new_runs"], r["new_run_p50s_us"])]
        cells += [_f(r["base_busbw_gbps"]), _f(r["new_busbw_gbps"]),
                  f"{_pct_text(r['busbw_change_pct'])}%" if math.isfinite(r["busbw_change_pct"]) else "-"]
        t.add_row(*map(escape, cells), f"[{style}]{escape(verdict)}[/{style}]" if style and not plain
                  else escape(verdict))
    if len(shown) or not len(matched):
        print_table(console, t, wide)
    else:  # every point judged "not significant": none was left unjudged (shown holds those)
        console.print(f"{title}: no point changed by more than the threshold and its interval")
        if s["one run per side"]:
            console.print(REPEAT_HINT)
    for line in df.attrs.get("host", []):  # the runs' order and the control, for every point
        console.print(escape(f"host: {line}"), soft_wrap=True, highlight=False)
    if len(only_df):
        o = table(f"points on one side only ({s['only in base']} base, {s['only in new']} new)", "", plain)
        for h in ("only in", "benchmark", "world", "sizes", "dtype", "variant", "placement", "params", "stage"):
            add_column(o, h, left=True, wrap=h == "params", words=h == "params")
        gkeys = ["only_in", "benchmark", "world", "dtype", "variant", "placement", "params", "stage"]
        for key, g in only_df.groupby(gkeys, sort=False):
            r = dict(zip(gkeys, key))
            sizes = sorted(int(x) for x in g["nbytes"])
            sz = fmt_size(sizes[0]) if len(sizes) == 1 else \
                f"{fmt_size(sizes[0])}..{fmt_size(sizes[-1])} ({len(sizes)})"
            o.add_row(*map(escape, (r["only_in"], r["benchmark"], str(r["world"]), sz, r["dtype"], r["variant"],
                                    r["placement"], _params_text(r["params"]), r["stage"])))
        print_table(console, o, wide)


def _pct_text(v: float) -> str:
    """A change in per cent, short: an interval over 2-3 noisy runs can reach +5000 %."""
    if v > 9999:
        return ">+9999"
    return f"{v:+.1f}" if abs(v) < 100 else f"{v:+.0f}"


def _f(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"
