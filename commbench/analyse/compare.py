"""Compare runs point by point: is the new side faster, slower, or within noise?

Each side is one run or several repeated runs of the same thing. What decides whether a
difference is a change is how much a point moves from one run to the next (clock boost,
placement, a neighbour on the machine or the fabric), and one run's samples cannot show
that: two runs of the same code can differ by several times at one small message while
each run's own interval is a few per cent wide. So:

* With two or more runs on a side, every point is judged on the spread BETWEEN runs: the
  per-run p50s of the point, on a log scale, in a t-test of the difference of the two
  sides' means, the run-to-run variance pooled with the neighbouring sizes
  (_judge_between_runs; between_runs is the point-alone Welch interval). A change counts only when
  1. |ratio - 1| exceeds the threshold (default 5 %), the smallest change worth a line, and
  2. it survives Benjamini-Hochberg at FDR_Q over all the points judged so, which holds the
     chance that identical code is called changed anywhere in a sweep at FDR_Q, and
  3. for runs made with `run --repeat N`, it is larger than the spread of the point's
     repeats within a run, and the faster side's own repeats do not reach the slower side's
     level in half of them (analyse/repeat_guards.py): otherwise "cannot judge".
* Every verdict then passes the host's rule (analyse/host_moved.py): a change no larger than
  what the host's state can explain -- runs in blocks or one run a side, the sides' control
  measurements apart, disturbed rows -- is "cannot judge" with the reason; a point with a
  disturbed or oversubscribed row is never "not significant" either.
* A point whose data check failed on a side ("check failed (new)") has wrong results there:
  its speed is not judged, and the regression gate fails on it (exit_status).
* A point the two sides timed by different methods (the rows' `timing`: back_to_back against
  barrier) measured two different things: "cannot judge", never faster or slower.
* With one run per side there is no run-to-run spread to judge by. The verdict then falls
  back to each run's own ~95 % interval of its p50 (point_ci) and the threshold; the two
  runs ran apart, so the host's rule judges only a change beyond 2x.

Rows keep summary statistics, not raw samples; pure pandas/numpy (the t quantile is
computed in core.stats, so scipy is not needed). The table is drawn by report.compare_view.
"""
from __future__ import annotations

import math

from commbench.analyse import host_moved
from commbench.analyse.analysis import params_key
from commbench.analyse.intervals import _num, between_runs, point_ci  # noqa: F401 (between_runs: the API)
from commbench.analyse.repeat_guards import level_guard, repeat_p50s, repeat_spreads, repeats_by_run, spread_guard
from commbench.analyse.verdicts import untrusted_reason
from commbench.core.errors import UsageError
from commbench.core.stats import bh_adjust, pooled_spread, t_cdf, t_quantile

# placement: nccl-tests' in-place and out-of-place columns are different operations (at one
# rank an in-place all_reduce moves nothing), so only like is compared with like.
KEYS = ("benchmark", "backend", "world", "nbytes", "dtype", "variant", "placement", "params", "stage")
VERDICTS = ("faster", "slower", "not significant", "cannot judge")
ONE_RUN_CAVEAT = "one run per side: cannot separate noise from change"
REPEAT_HINT = ("run the sides in turn, 3 runs each (commbench ab --rounds 3; or runs made a1 b1 a2 b2 a3 b3, "
               "compared A1 A2 A3 -- B1 B2 B3) to judge on the spread between runs")


# False discoveries: the share of "slower"/"faster" calls over a sweep that are noise is held
# at this level (Benjamini-Hochberg); with no change anywhere, the chance of any call at all.
FDR_Q = 0.05
# Neighbouring sizes (each side) whose run-to-run spread a point's judgement pools (stats.pooled_spread).
POOL_WINDOW = 3


def _log_sides(base_p50s, new_p50s):
    """The two sides' log p50s, or None when a p50 is not a positive number or there are
    fewer than 3 runs in all (no spread between runs to judge by)."""
    lb = [math.log(x) for x in map(_num, base_p50s) if x > 0 and math.isfinite(x)]
    ln = [math.log(x) for x in map(_num, new_p50s) if x > 0 and math.isfinite(x)]
    if len(lb) != len(base_p50s) or len(ln) != len(new_p50s) or not lb or not ln or len(lb) + len(ln) < 3:
        return None
    return lb, ln


def _judge_between_runs(out: list, pending: list, thr: float) -> None:
    """Verdicts of the points with repeated runs, all together.

    Each point: the difference of the sides' mean log p50 (the log of the ratio of their
    geometric means), over the run-to-run variance pooled with its neighbouring sizes
    (stats.pooled_spread) -- a t statistic with the pooled degrees of freedom and its ~95 %
    interval. Slower and faster are two questions, each with its own one-sided p-values
    through Benjamini-Hochberg (stats.bh_adjust) over all these points: a point is "slower"
    when its q-value for slower is at most FDR_Q AND the change passes the threshold (and
    "faster" alike). Judging each of 100 points at 5 % calls about 5 of them in a sweep of
    identical code; this calls any of them slower at most 5 % of the time -- the promise a
    regression gate needs -- and any of them faster at most 5 % of the time. A two-sided test
    would spend half of that on the direction the gate does not ask about. p_value and
    q_value are those of the direction the change points to."""
    if not pending:
        return
    groups = [tuple(k for i, k in enumerate(key) if KEYS[i] != "nbytes") for _, key, _ in pending]
    order = sorted(range(len(pending)), key=lambda j: (groups[j], pending[j][1][KEYS.index("nbytes")]))
    ss, dof = [], []
    for j in order:
        lb, ln = pending[j][2]
        s = 0.0
        for v in (lb, ln):
            mu = sum(v) / len(v)
            s += sum((x - mu) ** 2 for x in v)
        ss.append(s)
        dof.append(len(lb) + len(ln) - 2)
    var, df = pooled_spread([groups[j] for j in order], ss, dof, POOL_WINDOW)
    stat = {}
    for pos, j in enumerate(order):
        lb, ln = pending[j][2]
        d = sum(ln) / len(ln) - sum(lb) / len(lb)
        if not (df[pos] > 0 and var[pos] > 0):
            stat[j] = (d, math.nan, (math.nan, math.nan), 0.0)
            continue
        se = math.sqrt(var[pos] * (1.0 / len(lb) + 1.0 / len(ln)))
        slow = 1.0 - t_cdf(d / se, df[pos])  # one-sided: P(a t this large | no change)
        stat[j] = (d, se, (slow, 1.0 - slow), df[pos])
    q_slow = bh_adjust([stat[j][2][0] for j in range(len(pending))])
    q_fast = bh_adjust([stat[j][2][1] for j in range(len(pending))])
    n_judged = int(sum(1 for j in stat if math.isfinite(stat[j][2][0])))
    for j, (idx, _, (lb, ln)) in enumerate(pending):
        d, se, ps, dfj = stat[j]
        row = out[idx]
        ratio = math.exp(d)
        verdict = "not significant"
        if math.isfinite(ps[0]):
            h = t_quantile(0.975, dfj) * se
            up = d > 0
            row.update(change_lo_pct=(math.exp(d - h) - 1.0) * 100.0, change_hi_pct=(math.exp(d + h) - 1.0) * 100.0,
                       p_value=ps[0] if up else ps[1], q_value=float(q_slow[j] if up else q_fast[j]))
            if q_slow[j] <= FDR_Q and ratio - 1.0 > thr:
                verdict = "slower"
            elif q_fast[j] <= FDR_Q and 1.0 - ratio > thr:
                verdict = "faster"
            one = ", the base side's spread for both" if len(ln) == 1 else \
                ", the new side's spread for both" if len(lb) == 1 else ""
            basis = (f"between runs: t on log p50, {len(lb)} vs {len(ln)} runs{one}, spread pooled over neighbouring "
                     f"sizes ({dfj:g} df); false discoveries held at {FDR_Q:.0%} over {n_judged} points, "
                     f"slower and faster each (BH, one-sided)")
        else:
            if ratio - 1.0 > thr:
                verdict = "slower"
            elif 1.0 - ratio > thr:
                verdict = "faster"
            basis = "threshold only (no spread between runs)"
        row.update(ratio=ratio, change_pct=(ratio - 1.0) * 100.0, verdict=verdict, basis=basis)


def _blank(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _center(values) -> float:
    """A side's figure from its runs' values: the geometric mean (the centre between_runs
    tests), or the median when a value is not positive (a zero busbw)."""
    v = [x for x in map(_num, values) if math.isfinite(x)]
    if len(v) < 2:
        return v[0] if v else math.nan  # exactly the run's value, not exp(log(value))
    if all(x > 0 for x in v):
        return math.exp(sum(math.log(x) for x in v) / len(v))
    v.sort()
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def _key(r) -> tuple:
    """A row's point, as KEYS."""
    return (str(r.get("benchmark")), _blank(r.get("backend")), int(r.get("world")), int(r.get("nbytes") or 0),
            _blank(r.get("dtype")), _blank(r.get("variant")) or "default", _blank(r.get("placement")),
            params_key(r.get("params")), _blank(r.get("stage")))


def _rows_by_point(*dfs) -> dict:
    """key -> [(run, row)] over the frames' rows (the host's rule reads them)."""
    out: dict = {}
    for df in dfs:
        for r in (df.to_dict("records") if df is not None and len(df) else []):
            out.setdefault(_key(r), []).append((_blank(r.get("run")), r))
    return out


def _sides(df) -> dict:
    """key -> {run: (p50, ci_lo, ci_hi, basis, busbw)}: one entry per point and run. A point
    twice in one run (only when a frame is passed in directly: compare_paths refuses that)
    keeps the median p50 and the union of the intervals."""
    out: dict = {}
    if df is None or len(df) == 0:
        return out
    for r in df.to_dict("records"):
        key = _key(r)
        lo, hi, basis = point_ci(r)
        out.setdefault(key, {}).setdefault(_blank(r.get("run")), []).append(
            (_num(r.get("time_us_p50")), lo, hi, basis, _num(r.get("busbw_gbps"))))
    for runs in out.values():
        for run, rs in runs.items():
            if len(rs) > 1:
                p50s = sorted(x[0] for x in rs)
                has = all(math.isfinite(x[1]) for x in rs)
                runs[run] = [((p50s[(len(p50s) - 1) // 2] + p50s[len(p50s) // 2]) / 2,
                              min(min(x[1] for x in rs), p50s[0]) if has else math.nan,
                              max(max(x[2] for x in rs), p50s[-1]) if has else math.nan,
                              rs[0][3], _center([x[4] for x in rs]))]
            runs[run] = runs[run][0]
    return out


COLUMNS = list(KEYS) + [
    "base_run", "new_run", "base_runs", "new_runs", "base_p50_us", "new_p50_us", "base_run_p50s_us",
    "new_run_p50s_us", "ratio", "change_pct", "change_lo_pct", "change_hi_pct", "base_ci_lo", "base_ci_hi",
    "new_ci_lo", "new_ci_hi", "base_busbw_gbps", "new_busbw_gbps", "busbw_change_pct", "verdict", "basis",
    "caveat", "only_in", "p_value", "q_value", "check_failed", "explained_factor", "explained_by",
]

# Timing methods a run measures by (the rows' `timing`); an imported row says "imported" and is
# compared as it always was (nccl-tests times back to back, as a run does by default).
_NOT_A_METHOD = ("", "imported")


def _per_point(df, field: str) -> dict:
    """key -> the set of a field's values over a side's rows of that point (all repeats)."""
    out: dict = {}
    if df is None or not len(df) or field not in df.columns:
        return out
    for r in df.to_dict("records"):
        out.setdefault(_key(r), set()).add(_blank(r.get(field)))
    return out


def _check_and_timing(out: list, base_df, new_df) -> None:
    """Mark the points whose data check failed on a side (check_failed: "base", "new" or
    "both"; verdict "check failed (new)"), and make "cannot judge" the matched points whose
    sides were timed by different methods (caveat "timing back_to_back vs barrier")."""
    checks = (_per_point(base_df, "check"), _per_point(new_df, "check"))
    timings = (_per_point(base_df, "timing"), _per_point(new_df, "timing"))
    for row in out:
        key = tuple(row[k] for k in KEYS)
        failed = [s for s, c in zip(("base", "new"), checks) if "fail" in c.get(key, ())]
        row["check_failed"] = "both" if len(failed) == 2 else "".join(failed)
        if row["only_in"]:
            continue
        if failed:
            row["verdict"] = f"check failed ({row['check_failed']})"
            continue
        tb, tn = (sorted(t.get(key, set()) - set(_NOT_A_METHOD)) for t in timings)
        if tb and tn and tb != tn:
            row.update(verdict="cannot judge", caveat=f"timing {'+'.join(tb)} vs {'+'.join(tn)}")


def _side_columns(runs: dict | None, prefix: str) -> dict:
    """The columns of one side of a point: its runs, their p50s and the side's figure and
    interval (one run: its own ~95 % interval; several: the t-interval of their geometric
    mean)."""
    if not runs:
        return {f"{prefix}_run": math.nan, f"{prefix}_runs": 0, f"{prefix}_p50_us": math.nan,
                f"{prefix}_run_p50s_us": "", f"{prefix}_ci_lo": math.nan, f"{prefix}_ci_hi": math.nan,
                f"{prefix}_busbw_gbps": math.nan}
    vals = list(runs.values())
    p50s = [v[0] for v in vals]
    p50 = _center(p50s)
    lo = hi = math.nan
    if len(vals) == 1:
        lo, hi = vals[0][1], vals[0][2]
    elif all(x > 0 for x in p50s):
        logs = [math.log(x) for x in p50s]
        mu = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in logs) / (len(logs) - 1))
        h = t_quantile(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
        lo, hi = math.exp(mu - h), math.exp(mu + h)
    return {f"{prefix}_run": ",".join(runs), f"{prefix}_runs": len(vals), f"{prefix}_p50_us": p50,
            f"{prefix}_run_p50s_us": ";".join(f"{x:.6g}" for x in p50s), f"{prefix}_ci_lo": lo,
            f"{prefix}_ci_hi": hi, f"{prefix}_busbw_gbps": _center(v[4] for v in vals)}


def _repeats(df) -> int:
    """The most repeats any point of the frame has (1 when it has no `repeat` column)."""
    if df is None or not len(df) or "repeat" not in df.columns:
        return 1
    r = df["repeat"].fillna(1)
    return int(r.max()) if len(r) else 1


def _runs(df) -> int:
    """How many runs a side's frame holds."""
    return df["run"].nunique() if df is not None and len(df) and "run" in df.columns else 0


def fold_repeats(base_df, new_df):
    """What the repeats of `run --repeat N` runs count as: (base, new, note).

    * Both sides one run each: every repeat counts as a run, and the point is judged on the
      spread between repeats (note says so: repeats share their run's processes and buffers,
      so what differs between runs -- placement, a slow mode of the host that lasts the whole
      run -- is not in that spread).
    * Otherwise (several runs on a side): each run's figure for a point is its FASTEST repeat
      whose row is not disturbed (the fastest of all when every repeat was), and the runs are
      judged on their spread as without repeats. Why the fastest: what a shared host adds to a
      point (a stolen CPU, a slow mode of the CPU lasting seconds, a neighbour's burst) only
      ever adds time, and it comes in stretches of seconds that an interleaved repeat lands
      outside of; the minimum of repeated timings is the estimator least moved by such noise
      (Chen and Revels, "Robust benchmarking in noisy environments", 2016). The repeats of one
      run are not independent evidence of run-to-run spread, so they never count as runs here.
      Both sides must then take the fastest of as many repeats, or the side with more would be
      faster by the choice alone: note says so when they do not.

    Frames without repeats pass through unchanged (note '')."""
    rb, rn = _repeats(base_df), _repeats(new_df)
    if rb == 1 and rn == 1:
        return base_df, new_df, ""
    if _runs(base_df) == _runs(new_df) == 1:
        out = []
        for df in (base_df, new_df):
            df = df.copy()
            if "repeat" in df.columns:
                df["run"] = df["run"].astype(str) + "/repeat" + df["repeat"].fillna(1).astype(int).astype(str)
            out.append(df)
        return out[0], out[1], "one run a side: each repeat counted as a run (run-to-run placement not in the spread)"
    out = []
    for df in (base_df, new_df):
        if df is None or not len(df) or "repeat" not in df.columns:
            out.append(df)
            continue
        recs = df.to_dict("records")
        best: dict = {}
        for i, r in enumerate(recs):
            k = (_blank(r.get("run")), _key(r))
            clean = untrusted_reason(r) == ""
            p50 = _num(r.get("time_us_p50"))
            rank = (not clean, p50 if math.isfinite(p50) else math.inf)
            if k not in best or rank < best[k][0]:
                best[k] = (rank, i)
        keep = sorted(i for _, i in best.values())
        out.append(df.iloc[keep].reset_index(drop=True))
    note = f"each run: the fastest of its {rb} repeats" if rb == rn else \
        f"each run: the fastest of its repeats ({rb} base, {rn} new: the side with more is favoured)"
    return out[0], out[1], note


def compare_runs(base_df, new_df, threshold_pct: float = 5.0, host: dict | None = None):
    """One row per point of either side, matched on KEYS. Each frame holds one run or
    several (its `run` column tells them apart).

    Matched points: ratio = new / base of the sides' p50 (a side of several runs: the
    geometric mean of their p50s), change_pct = (ratio - 1) * 100, busbw_change_pct, and
    verdict "slower" / "faster" / "not significant":

    * two or more runs on either side (base_runs, new_runs): the change must pass the
      threshold and its ~95 % interval (change_lo_pct..change_hi_pct, between_runs) must
      exclude 0. When there is no spread between runs to judge by (every run of both sides
      gave the same p50) or a p50 is not positive, the threshold alone decides and basis
      says so.
    * one run per side: the change must pass the threshold and the two runs' own ~95 %
      intervals (point_ci) must not overlap; when either has no spread (an imported file
      with only averages) the threshold alone decides. caveat says that this cannot
      separate noise from change.

    Points on one side only: only_in "base" or "new", verdict "only in base"/"only in new",
    the other side's columns NaN.

    Then the host's rule (host_moved.judge): host is host_moved.host_context of the runs'
    meta.json (compare_paths gives it); None (frames alone): only the rows' own state is.
    explained_factor, explained_by: what the host's state can explain at the point; the
    frame's attrs["host"]: the header's lines about the runs and the control.
    """
    import pandas as pd

    if not threshold_pct >= 0:
        raise UsageError(f"threshold must be >= 0 per cent, got {threshold_pct}")
    # With one run a side the repeats are the runs (fold_repeats): the t-test is judged on
    # their spread already, and the guards have nothing to add.
    per = ({}, {}) if _runs(base_df) == _runs(new_df) == 1 else (repeats_by_run(base_df, _key),
                                                                   repeats_by_run(new_df, _key))
    spreads, reps = repeat_spreads(*per), (repeat_p50s(per[0]), repeat_p50s(per[1]))
    raw = (base_df, new_df)  # every repeat: a failed check in one that the fold drops still counts
    one_each = _runs(base_df) == _runs(new_df) == 1
    base_df, new_df, fold_note = fold_repeats(base_df, new_df)
    b, n = _sides(base_df), _sides(new_df)
    thr = threshold_pct / 100.0
    out = []
    pending: list = []  # (row index, key, (base logs, new logs)) of points with repeated runs
    for key in list(b) + [k for k in n if k not in b]:
        sb, sn = b.get(key), n.get(key)
        row = {**dict(zip(KEYS, key)), **_side_columns(sb, "base"), **_side_columns(sn, "new"),
               "ratio": math.nan, "change_pct": math.nan, "change_lo_pct": math.nan, "change_hi_pct": math.nan,
               "busbw_change_pct": math.nan, "caveat": "", "only_in": "", "basis": "",
               "p_value": math.nan, "q_value": math.nan, "explained_factor": 1.0, "explained_by": ""}
        if not sb or not sn:
            side = "base" if sb else "new"
            row.update(verdict=f"only in {side}", only_in=side)
            out.append(row)
            continue
        bp, np_ = row["base_p50_us"], row["new_p50_us"]
        ratio = np_ / bp if bp > 0 else math.nan
        bb, nb = row["base_busbw_gbps"], row["new_busbw_gbps"]
        verdict = "not significant"
        if len(sb) == 1 and len(sn) == 1:
            (_, blo, bhi, bbasis, _), = sb.values()
            (_, nlo, nhi, nbasis, _), = sn.values()
            have_ci = all(math.isfinite(x) for x in (blo, bhi, nlo, nhi))
            if math.isfinite(ratio):
                if ratio - 1.0 > thr and (not have_ci or nlo > bhi):
                    verdict = "slower"
                elif 1.0 - ratio > thr and (not have_ci or nhi < blo):
                    verdict = "faster"
            basis = (f"{bbasis} vs {nbasis}" if bbasis != nbasis else bbasis) if have_ci \
                else "threshold only (no spread)"
            row["caveat"] = ONE_RUN_CAVEAT
        else:
            logs = _log_sides([v[0] for v in sb.values()], [v[0] for v in sn.values()])
            if logs is not None:  # judged below, with its neighbours' spread and the other points' p-values
                ratio = math.exp(sum(logs[1]) / len(logs[1]) - sum(logs[0]) / len(logs[0]))
                pending.append((len(out), key, logs))
            elif math.isfinite(ratio):
                if ratio - 1.0 > thr:
                    verdict = "slower"
                elif 1.0 - ratio > thr:
                    verdict = "faster"
            basis = "threshold only (no spread between runs)"
        row.update(ratio=ratio, change_pct=(ratio - 1.0) * 100.0, verdict=verdict, basis=basis,
                   busbw_change_pct=(nb / bb - 1.0) * 100.0 if bb > 0 and math.isfinite(nb) else math.nan)
        out.append(row)
    _judge_between_runs(out, pending, thr)
    spread_guard(out, spreads, KEYS)
    level_guard(out, *reps, KEYS)
    points = _rows_by_point(base_df, new_df)
    host_moved.judge(out, host, one_each, lambda k: points.get(k, []), KEYS, thr)
    _check_and_timing(out, *raw)
    if fold_note:
        for row in out:
            if not row["only_in"]:
                row["basis"] = f"{row['basis']}; {fold_note}"
    res = pd.DataFrame(out, columns=COLUMNS)
    if len(res):
        res["_o"] = res["only_in"].map({"": 0, "base": 1, "new": 2})
        res = res.sort_values(["_o", "benchmark", "backend", "world", "dtype", "variant", "placement", "params",
                               "stage", "nbytes"], kind="stable").drop(columns="_o").reset_index(drop=True)
    res.attrs["host"] = host_moved.header_lines(host, one_each, thr)
    return res


def regressions(df):
    """The matched points that got slower."""
    return df[df["verdict"] == "slower"]


def split_only(df):
    """(matched, only_in_one_run) parts of a compare_runs frame."""
    only = df["only_in"].astype(str) != ""
    return df[~only], df[only]


def check_failed(df):
    """The points (matched or on one side only) whose data check failed on either side."""
    return df[df["check_failed"].astype(str) != ""] if "check_failed" in df.columns else df.iloc[:0]


def exit_status(df, fail_on_regression: bool, runs_check_failed=(), allow_inconclusive: bool = False) -> int:
    """The CLI's exit status. Without fail_on_regression: 0 (compare reports). With it (the
    gate): 1 when a point is judged slower, failed its data check on either side, or a run's
    meta.json says check_failed (runs_check_failed: code that computes wrong results fails
    however fast it is); else 3 (inconclusive) when a matched point could not be judged,
    0 with allow_inconclusive; else 0. (2, nothing compared, is compare_paths' UsageError.)"""
    if not fail_on_regression:
        return 0
    if len(regressions(df)) or len(check_failed(df)) or len(runs_check_failed):
        return 1
    inconclusive = bool((split_only(df)[0]["verdict"] == "cannot judge").any())
    return 3 if inconclusive and not allow_inconclusive else 0


def summary(df) -> dict:
    """Verdict counts; "one run per side": matched points judged without a run-to-run spread."""
    matched, only = split_only(df)
    counts = {v: int((matched["verdict"] == v).sum()) for v in VERDICTS}
    counts["only in base"] = int((only["only_in"] == "base").sum())
    counts["only in new"] = int((only["only_in"] == "new").sum())
    counts["check failed"] = int(matched["verdict"].astype(str).str.startswith("check failed").sum())
    counts["one run per side"] = int(((matched["base_runs"] == 1) & (matched["new_runs"] == 1)).sum())
    return counts


def nothing_in_common(base_df, new_df) -> str:
    """Why two sides share no point: a side without rows, or the first key whose values the
    sides do not share (mpi against gloo runs: backend)."""
    for name, df in (("base", base_df), ("new", new_df)):
        if df is None or df.empty:
            return f"the {name} side has no rows"
    for k in KEYS:
        if k not in base_df.columns or k not in new_df.columns:
            continue
        a = {params_key(v) if k == "params" else _blank(v) for v in base_df[k]}
        b = {params_key(v) if k == "params" else _blank(v) for v in new_df[k]}
        if not a & b:
            return f"no point in common ({k} {', '.join(sorted(a))} vs {', '.join(sorted(b))})"
    return f"no point in common ({len(base_df)} base rows, {len(new_df)} new rows)"


