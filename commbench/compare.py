"""Compare two runs point by point: is the new run faster, slower, or within noise?

Rows keep summary statistics, not raw samples, so each side's uncertainty is rebuilt
from what a row holds (see point_ci). A change counts only when BOTH hold:

1. |new p50 / base p50 - 1| exceeds the threshold (default 5 %): run-to-run drift that a
   single run's samples cannot show (clock boost, placement, a neighbour on the fabric)
   is often a few per cent, so smaller changes are not called even when "significant";
2. the two ~95 % confidence intervals do not overlap (a conservative test: two disjoint
   95 % intervals mean p < 0.05 for the difference with room to spare).

Pure pandas/numpy.
"""
from __future__ import annotations

import json
import math

from .analysis import params_key

# placement: nccl-tests' in-place and out-of-place columns are different operations (at one
# rank an in-place all_reduce moves nothing), so only like is compared with like.
KEYS = ("benchmark", "backend", "world", "nbytes", "dtype", "variant", "placement", "params", "stage")
VERDICTS = ("faster", "slower", "not significant")
# z for a two-sided 95 % interval.
Z95 = 1.959964
# sqrt(pi/2): the median of n normal samples has standard error ~1.2533 sigma/sqrt(n).
_MEDIAN_SE = math.sqrt(math.pi / 2)


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def point_ci(row) -> tuple[float, float, str]:
    """(low, high, basis) of a ~95 % confidence interval for the row's time_us_p50.

    commbench's own rows: p50 is the median of `iters` per-iteration times. Its
    distribution-free asymptotic interval is p50 +- z * 1/(2 f(m) sqrt(n)), where 1/f(m),
    the slope of the quantile function at the median, is unknown without samples. It is
    estimated from the kept quantiles as (p90 - p50) / 0.4. Iteration times are
    right-skewed (a floor plus a tail), and on a skewed or even a normal distribution the
    quantile function is steeper between p50 and p90 than at p50, so this overstates
    the width (by ~28 % for a normal distribution): the interval is conservative. Unlike
    mean +- z*std/sqrt(n), it ignores the handful of huge outliers (a descheduled rank)
    that inflate std without moving the median. Basis "median (p50..p90 spread)".

    Imported rows (spread "std"): their p50 is the tool's mean, so the interval is the
    mean's, mean +- z * std / sqrt(n). Basis "mean (std)".

    Imported rows with spread "none" (the tool printed only an average), or rows without
    iters: (nan, nan, "no spread").
    """
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    p50 = _num(get("time_us_p50"))
    n = _num(get("iters"))
    spread = get("spread")
    spread = spread if isinstance(spread, str) else ""
    if not (math.isfinite(p50) and math.isfinite(n) and n >= 2):
        return math.nan, math.nan, "no spread"
    if spread == "none":
        return math.nan, math.nan, "no spread"
    if spread == "std":
        std = _num(get("time_us_std"))
        if not math.isfinite(std):
            return math.nan, math.nan, "no spread"
        h = Z95 * std / math.sqrt(n)
        return p50 - h, p50 + h, "mean (std)"
    p90 = _num(get("time_us_p90"))
    if not math.isfinite(p90):
        std = _num(get("time_us_std"))
        if not math.isfinite(std):
            return math.nan, math.nan, "no spread"
        h = Z95 * _MEDIAN_SE * std / math.sqrt(n)
        return p50 - h, p50 + h, "median (std)"
    h = Z95 * max(p90 - p50, 0.0) / 0.4 / (2.0 * math.sqrt(n))
    return p50 - h, p50 + h, "median (p50..p90 spread)"


def _blank(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _keyed(df):
    """One row per point: canonical keys, and duplicates (repeated runs on one side)
    merged: median p50 and busbw, the union of their intervals."""
    import pandas as pd

    if df is None or len(df) == 0:
        return pd.DataFrame(columns=list(KEYS) + ["run", "p50", "busbw", "ci_lo", "ci_hi", "basis", "iters"])
    recs = []
    for r in df.to_dict("records"):
        lo, hi, basis = point_ci(r)
        recs.append({
            "benchmark": str(r.get("benchmark")), "backend": _blank(r.get("backend")),
            "world": int(r.get("world")), "nbytes": int(r.get("nbytes") or 0), "dtype": _blank(r.get("dtype")),
            "variant": _blank(r.get("variant")) or "default", "placement": _blank(r.get("placement")),
            "params": params_key(r.get("params")),
            "stage": _blank(r.get("stage")), "run": _blank(r.get("run")), "p50": _num(r.get("time_us_p50")),
            "busbw": _num(r.get("busbw_gbps")), "ci_lo": lo, "ci_hi": hi, "basis": basis,
            "iters": _num(r.get("iters")),
        })
    k = pd.DataFrame(recs)
    if not k.duplicated(list(KEYS)).any():
        return k
    out = []
    for key, g in k.groupby(list(KEYS), sort=False):
        has_ci = g["ci_lo"].notna().all()
        out.append({**dict(zip(KEYS, key)), "run": ",".join(sorted(set(g["run"]))),
                    "p50": float(g["p50"].median()), "busbw": float(g["busbw"].median()),
                    "ci_lo": float(min(g["ci_lo"].min(), g["p50"].min())) if has_ci else math.nan,
                    "ci_hi": float(max(g["ci_hi"].max(), g["p50"].max())) if has_ci else math.nan,
                    "basis": g["basis"].iloc[0] + (f" x{len(g)} runs" if has_ci else ""),
                    "iters": float(g["iters"].sum())})
    return pd.DataFrame(out)


COLUMNS = list(KEYS) + [
    "base_run", "new_run", "base_p50_us", "new_p50_us", "ratio", "change_pct", "base_ci_lo", "base_ci_hi",
    "new_ci_lo", "new_ci_hi", "base_busbw_gbps", "new_busbw_gbps", "busbw_change_pct", "verdict", "basis",
    "only_in",
]


def compare_runs(base_df, new_df, threshold_pct: float = 5.0):
    """One row per point of either run, matched on (benchmark, backend, world, nbytes,
    dtype, variant, params, stage).

    Matched points: ratio = new p50 / base p50, change_pct = (ratio - 1) * 100,
    busbw_change_pct, both intervals (point_ci) and verdict: "slower" when change_pct >
    threshold and the new interval lies wholly above the base one, "faster" the mirror,
    else "not significant". When either side has no spread (an imported file with only
    averages) the threshold alone decides and basis says "threshold only (no spread)".
    only_in is "".

    Points in one run only: only_in "base" or "new", verdict "only in base"/"only in new",
    the other side's columns NaN.
    """
    import pandas as pd

    if not threshold_pct >= 0:
        from .errors import UsageError

        raise UsageError(f"threshold must be >= 0 per cent, got {threshold_pct}")
    b, n = _keyed(base_df), _keyed(new_df)
    m = b.merge(n, on=list(KEYS), how="outer", suffixes=("_b", "_n"), indicator=True)
    out = []
    thr = threshold_pct / 100.0
    for r in m.to_dict("records"):
        row = {k: r[k] for k in KEYS}
        row.update(base_run=r.get("run_b"), new_run=r.get("run_n"), base_p50_us=r.get("p50_b"),
                   new_p50_us=r.get("p50_n"), base_ci_lo=r.get("ci_lo_b"), base_ci_hi=r.get("ci_hi_b"),
                   new_ci_lo=r.get("ci_lo_n"), new_ci_hi=r.get("ci_hi_n"), base_busbw_gbps=r.get("busbw_b"),
                   new_busbw_gbps=r.get("busbw_n"))
        side = r["_merge"]
        if side != "both":
            row.update(ratio=math.nan, change_pct=math.nan, busbw_change_pct=math.nan,
                       verdict="only in base" if side == "left_only" else "only in new",
                       basis="", only_in="base" if side == "left_only" else "new")
            out.append(row)
            continue
        bp, np_ = float(r["p50_b"]), float(r["p50_n"])
        ratio = np_ / bp if bp > 0 else math.nan
        change = (ratio - 1.0) * 100.0
        bb, nb = float(r["busbw_b"]), float(r["busbw_n"])
        bw_change = (nb / bb - 1.0) * 100.0 if bb > 0 and math.isfinite(nb) else math.nan
        have_ci = all(math.isfinite(float(r[c])) for c in ("ci_lo_b", "ci_hi_b", "ci_lo_n", "ci_hi_n"))
        verdict = "not significant"
        if math.isfinite(ratio):
            if ratio - 1.0 > thr and (not have_ci or r["ci_lo_n"] > r["ci_hi_b"]):
                verdict = "slower"
            elif 1.0 - ratio > thr and (not have_ci or r["ci_hi_n"] < r["ci_lo_b"]):
                verdict = "faster"
        basis = (f"{r['basis_b']} vs {r['basis_n']}" if r["basis_b"] != r["basis_n"] else r["basis_b"]) \
            if have_ci else "threshold only (no spread)"
        row.update(ratio=ratio, change_pct=change, busbw_change_pct=bw_change, verdict=verdict, basis=basis,
                   only_in="")
        out.append(row)
    res = pd.DataFrame(out, columns=COLUMNS)
    if len(res):
        res["_o"] = res["only_in"].map({"": 0, "base": 1, "new": 2})
        res = res.sort_values(["_o", "benchmark", "backend", "world", "dtype", "variant", "placement", "params",
                               "stage",
                               "nbytes"], kind="stable").drop(columns="_o").reset_index(drop=True)
    return res


def regressions(df):
    """The matched points that got slower."""
    return df[df["verdict"] == "slower"]


def split_only(df):
    """(matched, only_in_one_run) parts of a compare_runs frame."""
    only = df["only_in"].astype(str) != ""
    return df[~only], df[only]


def exit_status(df, fail_on_regression: bool) -> int:
    """The CLI's exit status: 1 when asked to fail on a regression and any point is slower."""
    return 1 if fail_on_regression and len(regressions(df)) else 0


def summary(df) -> dict:
    matched, only = split_only(df)
    counts = {v: int((matched["verdict"] == v).sum()) for v in VERDICTS}
    counts["only in base"] = int((only["only_in"] == "base").sum())
    counts["only in new"] = int((only["only_in"] == "new").sum())
    return counts


def _params_text(key: str) -> str:
    """A params key (canonical JSON, params_key) as k=v words."""
    return " ".join(f"{k}={v}" for k, v in json.loads(key).items())


def print_compare(df, only=None, console=None, threshold_pct: float | None = None, all_points: bool = True) -> None:
    """Rich table of a compare_runs frame (matched points), then the points found in one
    run only. all_points=False shows only the faster/slower points."""
    from rich.markup import escape

    from .report import _console, stdout_is_tty
    from .units import fmt_size
    from .viewkit import table

    console = console or _console()
    plain = not stdout_is_tty()
    matched, only_df = split_only(df)
    if only is not None:
        only_df = only
    shown = matched if all_points else matched[matched["verdict"] != "not significant"]
    opt = ("dtype", "variant", "placement", "params", "stage")
    cols_opt = {c: matched[c].astype(str).nunique() > 1 for c in ("backend",) + opt}
    s = summary(df)
    thr = f"threshold {threshold_pct:g} %; " if threshold_pct is not None else ""
    t = table(f"compare: {s['slower']} slower, {s['faster']} faster, {s['not significant']} not significant",
              f"{thr}ratio = new p50 / base p50; a change counts when it passes the threshold and the "
              "~95 % intervals (\u00b1) do not overlap", plain)
    heads = ["benchmark"] + [c for c in ("backend",) if cols_opt[c]] + ["world", "size"] + \
        [c for c in opt if cols_opt[c]] + \
        ["base p50 (us)", "new p50 (us)", "change", "busbw base", "busbw new", "busbw change", "verdict"]
    for h in heads:
        t.add_column(h, justify="left" if h in ("benchmark", "backend", "verdict") + opt else "right")

    def pm(p50, lo, hi):
        if not (math.isfinite(p50)):
            return "-"
        if math.isfinite(lo) and math.isfinite(hi):
            return f"{p50:.2f} \u00b1{(hi - lo) / 2:.2f}" if not plain else f"{p50:.2f} +-{(hi - lo) / 2:.2f}"
        return f"{p50:.2f}"

    for r in shown.to_dict("records"):
        style = {"slower": "red", "faster": "green"}.get(r["verdict"])
        cells = [r["benchmark"]] + ([r["backend"]] if cols_opt["backend"] else []) + \
            [str(r["world"]), fmt_size(int(r["nbytes"]))] + \
            [(_params_text(r[c]) if c == "params" else str(r[c])) for c in opt if cols_opt[c]] + \
            [pm(r["base_p50_us"], r["base_ci_lo"], r["base_ci_hi"]),
             pm(r["new_p50_us"], r["new_ci_lo"], r["new_ci_hi"]),
             f"{r['change_pct']:+.1f}%", _f(r["base_busbw_gbps"]), _f(r["new_busbw_gbps"]),
             f"{r['busbw_change_pct']:+.1f}%" if math.isfinite(r["busbw_change_pct"]) else "-",
             f"[{style}]{r['verdict']}[/{style}]" if style and not plain else r["verdict"]]
        t.add_row(*[c if c.startswith(f"[{style}]") else escape(c) for c in cells])
    if len(shown) or not len(matched):
        console.print(t)
    else:
        console.print(f"{t.title}: no point changed by more than the threshold and its intervals")
    if len(only_df):
        o = table(f"points in one run only ({s['only in base']} base, {s['only in new']} new)", "", plain)
        for h in ("only in", "benchmark", "world", "sizes", "dtype", "variant", "placement", "params", "stage"):
            o.add_column(h)
        gkeys = ["only_in", "benchmark", "world", "dtype", "variant", "placement", "params", "stage"]
        for key, g in only_df.groupby(gkeys, sort=False):
            r = dict(zip(gkeys, key))
            sizes = sorted(int(x) for x in g["nbytes"])
            sz = fmt_size(sizes[0]) if len(sizes) == 1 else \
                f"{fmt_size(sizes[0])}..{fmt_size(sizes[-1])} ({len(sizes)})"
            o.add_row(*map(escape, (r["only_in"], r["benchmark"], str(r["world"]), sz, r["dtype"], r["variant"],
                                    r["placement"], _params_text(r["params"]), r["stage"])))
        console.print(o)


def _f(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _refuse_duplicates(df) -> None:
    """A point twice in one run (two writers, or a resume that raced a running run) has no
    one time to compare: say which, rather than guess. Repeated runs on one side are fine."""
    from .errors import UsageError

    if df.empty or "point_key" not in df.columns:
        return
    dup = df[df.duplicated(["run", "point_key", "stage"], keep=False)]
    if len(dup):
        r = dup.iloc[0]
        raise UsageError(f"run {r['run']} holds point {r['point_key']} ({r['stage'] or 'one stage'}) more than once: "
                         f"compare will not guess which to use")


def compare_paths(base, new, threshold_pct: float = 5.0, fail_on_regression: bool = False, console=None,
                  all_points: bool = True, csv_out=None) -> int:
    """`commbench compare BASE NEW`: load both (run directories or lists of them), print,
    optionally write the frame as CSV; returns the exit status (exit_status)."""
    from .results import load

    base = [base] if isinstance(base, (str, bytes)) or not hasattr(base, "__iter__") else list(base)
    new = [new] if isinstance(new, (str, bytes)) or not hasattr(new, "__iter__") else list(new)
    sides = [load(base), load(new)]
    for side in sides:
        _refuse_duplicates(side)
    df = compare_runs(*sides, threshold_pct)
    print_compare(df, console=console, threshold_pct=threshold_pct, all_points=all_points)
    if csv_out:
        df.to_csv(csv_out, index=False)
    return exit_status(df, fail_on_regression)


__all__ = ["compare_runs", "regressions", "split_only", "exit_status", "summary", "print_compare", "compare_paths",
           "point_ci", "KEYS", "COLUMNS", "VERDICTS"]
