"""commbench compare with repeated runs a side: verdicts rest on the spread between runs,
and one run a side says that it cannot separate noise from change."""
from __future__ import annotations

import io
import math
import re

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from commbench.analyse.compare import ONE_RUN_CAVEAT, between_runs, compare_runs, summary
from commbench.commands.compare import compare_paths, split_sides
from commbench.core.errors import UsageError
from commbench.core.stats import t_quantile
from commbench.report.compare_view import _pct_text, print_compare
from commbench.store.results import RunDir, Status
from conftest import make_row, needs_mpi, run_cli

SIZES = [8 << i for i in range(14)]  # 8 .. 64K, as `run quick --sizes 8:64K`


def _row(nbytes, p50, run, bench="all_reduce"):
    """A commbench row whose own interval is tight (p90 1 % above p50 over 2000
    iterations), as on a quiet moment of a run: far narrower than the run-to-run drift."""
    return make_row(bench, 2, nbytes, p50, spread_pct=1.0, placement="in-place", iters=2000, busbw_factor=1.0,
                    run=run)


def _true_us(nbytes):
    return 0.7 + nbytes / 3000.0


def _side(factors, name, scale=1.0, sizes=SIZES):
    """One frame of len(factors) runs: run i has every point at true time x scale x factors[i][j]
    (factors[i] a number: the same drift at every size)."""
    rows = []
    for i, f in enumerate(factors):
        fs = f if hasattr(f, "__len__") else [f] * len(sizes)
        rows += [_row(s, _true_us(s) * scale * x, f"{name}{i + 1}") for s, x in zip(sizes, fs)]
    return pd.DataFrame(rows)


# Run-to-run drift of a noisy machine: each run a few to 30 % off, differently on each side.
BASE_DRIFT = [1.0, 1.25, 0.85]
NEW_DRIFT = [1.3, 0.9, 1.1]


def test_t_quantile_matches_the_tables():
    # Student's t, two-sided 95 %: the textbook values; fractional df in between.
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042), (1e6, 1.960)):
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)
    stats = pytest.importorskip("scipy.stats")
    for df in (1.3, 2.7, 4.4, 7.9):
        assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)


def test_drift_between_runs_with_no_change_is_not_called():
    base, new = _side(BASE_DRIFT, "a"), _side(NEW_DRIFT, "b")
    df = compare_runs(base, new)
    # The geometric means differ by 6.6 %, past the threshold: only the interval stops it.
    assert df["change_pct"].tolist() == pytest.approx([6.6] * len(SIZES), abs=0.1)
    assert set(df["verdict"]) == {"not significant"}
    assert ((df["change_lo_pct"] < 0) & (df["change_hi_pct"] > 0)).all()
    assert set(df["base_runs"]) == {3} and set(df["new_runs"]) == {3} and (df["caveat"] == "").all()
    # The same data one run a side, as compare judged them before: every pair calls a change
    # at most sizes, on intervals that only see the spread inside a run.
    called = [(compare_runs(base[base.run == f"a{i}"], new[new.run == f"b{j}"])["verdict"] != "not significant").sum()
              for i in (1, 2, 3) for j in (1, 2, 3)]
    assert sum(called) > len(called) * len(SIZES) / 2


@pytest.mark.parametrize("scale,verdict", [(2.0, "slower"), (0.5, "faster")])
def test_a_real_twofold_change_is_found_through_the_drift(scale, verdict):
    df = compare_runs(_side(BASE_DRIFT, "a"), _side(NEW_DRIFT, "b", scale))
    assert set(df["verdict"]) == {verdict}
    assert df["ratio"].tolist() == pytest.approx([scale * 1.066] * len(SIZES), rel=1e-3)
    inside = (df["change_lo_pct"] < (df["ratio"] - 1) * 100) & ((df["ratio"] - 1) * 100 < df["change_hi_pct"])
    assert inside.all()
    assert all(b.startswith("between runs: t on log p50, 3 vs 3 runs, spread pooled over neighbouring sizes")
               and "(BH, one-sided)" in b for b in df["basis"])


def test_between_run_interval_is_welch_on_log_p50():
    b, n = [1.0, 1.25, 0.85], [2.6, 1.8, 2.2]
    r = between_runs(b, n)
    lb, ln = np.log(b), np.log(n)
    vb, vn = lb.var(ddof=1) / 3, ln.var(ddof=1) / 3
    df = (vb + vn) ** 2 / (vb ** 2 / 2 + vn ** 2 / 2)
    d = ln.mean() - lb.mean()
    h = t_quantile(0.975, df) * math.sqrt(vb + vn)
    assert r["df"] == pytest.approx(df) and 2 <= r["df"] <= 4
    assert (r["ratio"], r["lo"], r["hi"]) == pytest.approx((math.exp(d), math.exp(d - h), math.exp(d + h)))
    # Runs that all agree give no spread to judge by; a p50 of 0 has no log.
    assert between_runs([1.0, 1.0], [2.0, 2.0]) is None and between_runs([0.0, 1.0], [1.0, 2.0]) is None


def test_false_calls_stay_near_the_test_level_and_real_changes_are_found():
    """Many points, lognormal drift of 15 % between runs, 3 runs a side: with no change a
    point is called at about the 95 % interval's 5 % (bound: 5 % plus 2.7 binomial standard
    deviations over 400 points), one run a side calls most; a 2x change is found at nearly
    every point (1.5x at only about 60 %: three runs a side buy little power, and the
    interval says so rather than guess)."""
    rng = np.random.default_rng(17)
    pts = 400
    sizes = list(range(8, 8 + pts))

    def side(scale):
        return [list(np.exp(rng.normal(0, 0.15, pts)) * scale) for _ in range(3)]

    def called(df):
        return (df["verdict"] != "not significant").mean()

    same = compare_runs(_side(side(1.0), "a", sizes=sizes), _side(side(1.0), "b", sizes=sizes))
    one = compare_runs(_side(side(1.0)[:1], "a", sizes=sizes), _side(side(1.0)[:1], "b", sizes=sizes))
    moved = compare_runs(_side(side(1.0), "a", sizes=sizes), _side(side(2.0), "b", sizes=sizes))
    assert called(same) < 0.05 + 2.7 * math.sqrt(0.05 * 0.95 / pts)
    assert called(one) > 0.5
    assert (moved["verdict"] == "slower").mean() > 0.9


def test_each_point_counts_its_own_runs_and_runs_that_agree_fall_back_to_the_threshold():
    new = _side(NEW_DRIFT, "b", 2.0)
    new = new[~((new.run == "b3") & (new.nbytes == SIZES[-1]))]  # b3 stopped before its last size
    df = compare_runs(_side(BASE_DRIFT, "a"), new)
    last = df[df.nbytes == SIZES[-1]].iloc[0]
    assert (last["base_runs"], last["new_runs"]) == (3, 2) and "3 vs 2 runs," in last["basis"]
    assert set(df[df.nbytes != SIZES[-1]]["new_runs"]) == {3}
    # Every run of both sides alike: no spread to judge by, so the threshold alone decides.
    df = compare_runs(_side([1.0, 1.0], "a"), _side([1.04, 1.04], "b"))
    assert set(df["verdict"]) == {"not significant"} and df["change_lo_pct"].isna().all()
    df = compare_runs(_side([1.0, 1.0], "a"), _side([1.5, 1.5], "b"))
    assert set(df["verdict"]) == {"slower"} and set(df["basis"]) == {"threshold only (no spread between runs)"}


def test_one_run_a_side_says_it_cannot_separate_noise_from_change():
    df = compare_runs(_side([1.0], "a"), _side([1.3], "b"))
    assert set(df["verdict"]) == {"slower"} and set(df["caveat"]) == {ONE_RUN_CAVEAT}
    assert summary(df)["one run per side"] == len(SIZES)
    assert df["change_lo_pct"].isna().all()
    buf = io.StringIO()
    print_compare(df, console=Console(file=buf, width=250, no_color=True), threshold_pct=5, wide=True)
    out = buf.getvalue()
    lines = [ln for ln in out.splitlines() if "all_reduce" in ln]
    assert len(lines) == len(SIZES) and all("noise or change?" in ln for ln in lines)
    assert "cannot separate noise from change" in out.splitlines()[0]
    assert "A1 A2 A3 -- B1 B2 B3" in out
    # Nothing changed: the one line that says so carries the caveat and the way out too.
    buf = io.StringIO()
    print_compare(compare_runs(_side([1.0], "a"), _side([1.0], "b")), console=Console(file=buf, width=250),
                  all_points=False)
    out = buf.getvalue()
    assert "0 slower" in out and "cannot separate noise from change" in out and "-- B1 B2 B3" in out


def test_repeated_runs_print_the_interval_and_the_runs_range():
    df = compare_runs(_side(BASE_DRIFT, "a"), _side(NEW_DRIFT, "b", 2.0))
    buf = io.StringIO()
    print_compare(df, console=Console(file=buf, width=250, no_color=True), threshold_pct=5, wide=True)
    out = buf.getvalue()
    assert "compare over 3 base vs 3 new runs" in out and f"{len(SIZES)} slower" in out
    assert "noise or change" not in out and "95% interval" in out
    lo, hi = df.iloc[0]["change_lo_pct"], df.iloc[0]["change_hi_pct"]
    assert f"{_pct_text(lo)}..{_pct_text(hi)}%" in out
    first = f"{_true_us(8) * 0.85:.2f}..{_true_us(8) * 1.25:.2f}"
    assert first in out  # the base runs' lowest..highest p50 of the first point


def test_split_sides_forms_and_mistakes():
    assert split_sides(["a", "b"]) == (["a"], ["b"])
    argv = ["compare", "--all", "a1", "a2", "a3", "--", "b1", "b2"]
    assert split_sides(["a1", "a2", "a3", "b1", "b2"], argv=argv) == (["a1", "a2", "a3"], ["b1", "b2"])
    assert split_sides(["a1", "a2", "--", "b1"], argv=["compare", "a1", "a2", "--", "b1"]) == (["a1", "a2"], ["b1"])
    assert split_sides([], ["a1", "a2"], ["b1"]) == (["a1", "a2"], ["b1"])
    for runs, base, new, argv, words in (
            (["a", "b", "c"], None, None, [], "3 run(s) without --"),
            (["a"], None, None, ["compare", "a", "--"], "no run after --"),
            (["b"], None, None, ["compare", "--", "b"], "no run before --"),
            (["a", "b", "--all"], None, None, ["compare", "a", "--", "b", "--all"], "put options before --"),
            ([], ["a"], None, [], "--new is missing"),
            (["x"], ["a"], ["b"], [], "both as positionals and with --base/--new")):
        with pytest.raises(UsageError, match=re.escape(words)):
            split_sides(runs, base, new, argv)


def _write(tmp_path, name, df):
    w = RunDir(tmp_path / name).open({"schema": 3, "status": "running"})
    for r in df.drop(columns="run").to_dict("records"):
        w.append(r)
    w.finish(Status.COMPLETE)
    return str(tmp_path / name)


def test_compare_paths_takes_repeated_runs_and_refuses_one_twice(tmp_path):
    base = _side(BASE_DRIFT, "a")
    new = _side(NEW_DRIFT, "b", 2.0)
    a = [_write(tmp_path, r, g) for r, g in base.groupby("run")]
    # Two runs of one side whose directories share a name stay two runs.
    for d in "xyz":
        (tmp_path / d).mkdir()
    b = [_write(tmp_path, f"{d}/quick", g) for d, (_, g) in zip("xyz", new.groupby("run"))]
    con = Console(file=io.StringIO(), width=250)
    csv = tmp_path / "cmp.csv"
    assert compare_paths(a, b, fail_on_regression=True, console=con, csv_out=csv) == 1
    got = pd.read_csv(csv)
    assert set(got["verdict"]) == {"slower"} and set(got["base_runs"]) == {3} and set(got["new_runs"]) == {3}
    assert set(got["new_run"]) == {",".join(b)}
    with pytest.raises(UsageError, match="given twice"):
        compare_paths([a[0], a[0] + "/rows.jsonl"], b, console=con)


@pytest.mark.multirank
def test_cli_sides_and_one_error_prefix(tmp_path):
    base, new = _side(BASE_DRIFT, "a"), _side(NEW_DRIFT, "b")
    a = [_write(tmp_path, r, g) for r, g in base.groupby("run")]
    b = [_write(tmp_path, r, g) for r, g in new.groupby("run")]
    for args in ([*a, "--", *b], ["--base", *a, "--new", *b], ["--all", *a, "--", *b]):
        p = run_cli("compare", *args)
        assert p.returncode == 0, p.stderr
        assert "compare over 3 base vs 3 new runs: 0 slower, 0 faster" in p.stdout, p.stdout
    p = run_cli("compare", a[0], b[0], "--all")
    assert p.returncode == 0 and "cannot separate noise from change" in p.stdout and "slower" in p.stdout
    for args, words in (([*a, *b], "6 run(s) without --"), ([a[0], b[0], "--bogus"], "unrecognized arguments"),
                        ([a[0], b[0], "--threshold"], "expected one argument"),
                        ([*a, "--", b[0], "--all"], "put options before --")):
        p = run_cli("compare", *args)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr
        assert lines[0].startswith("commbench: error: ") and lines[0].count("commbench") == 1, lines[0]


# serial: its verdicts are about the host's quiet. Beside the parallel phase's launches the
# base runs' 8 B point measured 12x the new run's, past what their controls explained.
@needs_mpi
@pytest.mark.multirank
@pytest.mark.serial
def test_end_to_end_repeated_loopback_runs(tmp_path):
    runs = []
    for name in ("a1", "a2", "b1"):  # two runs against one: the base side's spread judges
        out = tmp_path / name
        p = run_cli("run", "quick", "--np", 2, "-b", "all_reduce", "--sizes", "8,1K", "--iters", 5, "--warmup", 1,
                    "--out", out, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(str(out))
    csv = tmp_path / "cmp.csv"
    p = run_cli("compare", "--all", "--csv", csv, runs[0], runs[1], "--", runs[2])
    assert p.returncode == 0, p.stderr
    assert "compare over 2 base vs 1 new runs" in p.stdout
    got = pd.read_csv(csv)
    assert sorted(got["nbytes"]) == [8, 1024] and set(got["base_runs"]) == {2} and set(got["new_runs"]) == {1}
    # No caveat but the host's (a row of this loaded host that ran disturbed: cannot judge).
    assert got["change_lo_pct"].notna().all()
    assert (got["caveat"].isna() | (got["caveat"] == "") | (got["verdict"] == "cannot judge")).all()


def _sweep(rng, pts, runs, sigma, scale):
    """runs x pts lognormal run-to-run factors (sigma per point), times scale (an array)."""
    return [list(np.exp(rng.normal(0, sigma, pts)) * scale) for _ in range(runs)]


# 200 sweeps (about 35 s on 2 cores) under `make test-slow`; 20 in `make test`, where the
# binomial slack of the false-alarm bounds is wider by the same rule.
@pytest.mark.parametrize("sweeps", [20, pytest.param(200, marks=pytest.mark.slow)])
def test_family_wise_false_alarms_and_power_for_a_20pct_slowdown_at_3_runs_a_side(sweeps):
    """Simulation of the regression gate: 100 points in 4 series (a benchmark's sizes),
    run-to-run scatter lognormal 4 % (per point; a quiet loopback's middle sizes), 3 runs a
    side. Identical code: a sweep calls anything slower in at most 5 % of the sweeps (plus
    binomial slack over the sweeps), and anything at all, slower or faster (two one-sided
    families), in at most 10 %. A 20 % slowdown planted on 10 points: at least 90 % of
    the sweeps flag it somewhere (the gate fails), the planted points are found at >= 80 %,
    and others are called at most ~1 per sweep. Judging each point on its own at 95 % (the
    per-point rule compare used before) calls something in most identical sweeps."""
    rng = np.random.default_rng(2026)
    pts = 100
    sizes = [8 << (i % 25) for i in range(pts)]
    benches = [f"all_reduce{i // 25}" for i in range(pts)]
    planted = np.zeros(pts, dtype=bool)
    planted[[5, 9, 14, 20, 30, 41, 55, 63, 77, 90]] = True

    def frame(factors, name):
        rows = []
        for i, f in enumerate(factors):
            rows += [_row(s, _true_us(s) * x, f"{name}{i + 1}", bench=b) for s, x, b in zip(sizes, f, benches)]
        return pd.DataFrame(rows)

    any_same = slower_same = found = other = gate = 0
    per_point_any = 0
    for _ in range(sweeps):
        same = compare_runs(frame(_sweep(rng, pts, 3, 0.04, 1.0), "a"), frame(_sweep(rng, pts, 3, 0.04, 1.0), "b"))
        any_same += (same["verdict"] != "not significant").any()
        slower_same += (same["verdict"] == "slower").any()
        # The per-point rule: each point's own ~95 % interval excludes no change.
        per_point_any += ((same["change_lo_pct"].abs() > 0) & (np.sign(same["change_lo_pct"])
                                                                 == np.sign(same["change_hi_pct"]))).any()
        slow = np.where(planted, 1.2, 1.0)
        df = compare_runs(frame(_sweep(rng, pts, 3, 0.04, 1.0), "a"), frame(_sweep(rng, pts, 3, 0.04, slow), "p"))
        key = df["benchmark"] + "/" + df["nbytes"].astype(str)
        want = set(f"{b}/{s}" for b, s, p in zip(benches, sizes, planted) if p)
        called = df["verdict"] == "slower"
        found += int(called[key.isin(want)].sum())
        other += int((df["verdict"] != "not significant")[~key.isin(want)].sum())
        gate += bool(called.any())
    assert slower_same / sweeps <= 0.05 + 2.0 * math.sqrt(0.05 * 0.95 / sweeps)
    assert any_same / sweeps <= 0.10 + 2.0 * math.sqrt(0.10 * 0.90 / sweeps)
    assert gate / sweeps >= 0.9
    assert found / (10 * sweeps) >= 0.8
    assert other / sweeps <= 1.0
    assert per_point_any / sweeps > 0.5


def test_a_point_noisier_than_its_neighbours_is_judged_on_their_pooled_spread():
    """pooled_spread: the median of up to 5 neighbours' variances (made a variance again by the
    chi-square median share), worth 65 % of their degrees of freedom; the ends of a series pool
    fewer; a series never borrows from another; a neighbour 7x noisier than the rest moves no
    other point's variance, and keeps its own (the larger)."""
    from commbench.core.stats import bh_adjust, pooled_spread

    var, df = pooled_spread(["a"] * 6 + ["b"], [1, 1, 1, 1, 1, 7, 2], [4] * 7, window=2)
    assert df.tolist() == pytest.approx([0.65 * x for x in (12, 16, 20, 20, 16, 12, 4)])
    share = (1 - 2 / 36) ** 3  # median of chi-square(4) / 4
    assert var[:5] == pytest.approx([0.25 / share] * 5)  # the 7 at index 5 is in windows 3 and 4: no effect
    assert var[5] == pytest.approx(7 / 4) and var[6] == pytest.approx(0.5 / share)
    # Benjamini-Hochberg: the textbook example (sorted p * m / rank, made monotone from the top).
    q = bh_adjust([0.01, 0.04, 0.03, 0.005, np.nan])
    assert q[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02]) and np.isnan(q[4])


def test_a_change_on_a_disturbed_or_oversubscribed_row_cannot_be_judged():
    base, new = _side([1.0, 1.01, 0.99], "a"), _side([2.0, 2.02, 1.98], "b")
    new.loc[new.nbytes == SIZES[3], "disturbed"] = True
    new.loc[new.nbytes == SIZES[3], "warning"] = "disturbed: a rank waited for a CPU 80 % of the point's time"
    base.loc[base.nbytes == SIZES[5], "oversubscribed"] = True
    base.loc[base.nbytes == SIZES[5], "ranks_per_core"] = 2.0
    df = compare_runs(base, new)
    by = dict(zip(df["nbytes"], df["verdict"]))
    assert by[SIZES[3]] == "cannot judge" and by[SIZES[5]] == "cannot judge"
    assert {v for k, v in by.items() if k not in (SIZES[3], SIZES[5])} == {"slower"}
    cav = dict(zip(df["nbytes"], df["caveat"]))
    assert "disturbed" in cav[SIZES[3]] and "oversubscribed (2 ranks per core)" in cav[SIZES[5]]
    s = summary(df)
    assert s["cannot judge"] == 2 and s["one run per side"] == 0


def _repeated(name, runs, reps, factor, slow=None, sizes=SIZES):
    """runs x reps rows a point: run i repeat k at true time x factor, times slow[(i, k)] where given."""
    slow = slow or {}
    rows = []
    for i in range(1, runs + 1):
        for k in range(1, reps + 1):
            rows += [_row(s, _true_us(s) * factor * slow.get((i, k), 1.0) * (1 + 0.01 * ((i + k + j) % 3)),
                          f"{name}{i}") | {"repeat": k} for j, s in enumerate(sizes)]
    return pd.DataFrame(rows)


def test_runs_with_repeats_are_judged_on_each_runs_fastest_repeat():
    """Three runs a side of --repeat 3: a repeat caught in a slow stretch (2.5x) in two runs of one
    side moves nothing (each run's figure is its fastest repeat); a 50 % change is found, while
    20 % is within what those stretches spread the repeats by (+-36 % pooled over the six runs)
    and cannot be judged; a disturbed repeat is passed over when the run has a clean one."""
    from commbench.analyse.compare import fold_repeats

    stretch = {(1, 2): 2.5, (3, 1): 2.5}
    base, same = _repeated("a", 3, 3, 1.0), _repeated("b", 3, 3, 1.0, stretch)
    df = compare_runs(base, same)
    assert set(df["verdict"]) == {"not significant"}
    assert set(df["base_runs"]) == {3} and df["basis"].str.endswith("each run: the fastest of its 3 repeats").all()
    df = compare_runs(base, _repeated("p", 3, 3, 1.5, stretch))
    assert set(df["verdict"]) == {"slower"}
    df = compare_runs(base, _repeated("p", 3, 3, 1.2, stretch))
    assert set(df["verdict"]) == {"cannot judge"} and df["caveat"].str.contains(r"spread \+-36 %").all()
    # The fastest repeat of run a1 is disturbed: the fastest clean one stands for the run.
    b = base.copy()
    fast = (b["run"] == "a1") & (b["repeat"] == 1)
    b.loc[fast, "time_us_p50"] *= 0.5
    b.loc[fast, "disturbed"] = True
    fb, _, note = fold_repeats(b, same)
    assert len(fb) == 3 * len(SIZES) and not fb["disturbed"].fillna(False).astype(bool).any()
    assert note == "each run: the fastest of its 3 repeats"
    # Sides that take the fastest of different numbers of repeats say which one is favoured.
    _, _, note = fold_repeats(base, _repeated("c", 3, 1, 1.0))
    assert "3 base, 1 new: the side with more is favoured" in note


def test_a_change_within_the_spread_of_a_runs_repeats_cannot_be_judged():
    """Every run's repeats move 2.5x between two speeds (two of three slow), on both sides; the
    runs' fastest repeats differ by a steady 20 %. The t-test alone calls that slower; the
    repeats say that the host moved the point by far more than the change within each run, so
    it is "cannot judge": the gate is inconclusive (exit 3), not failed. A change larger than
    that spread is still called."""
    from commbench.analyse.compare import exit_status

    modes = {(i, k): 2.5 for i in (1, 2, 3) for k in (2, 3)}
    df = compare_runs(_repeated("a", 3, 3, 1.0, modes), _repeated("p", 3, 3, 1.2, modes))
    assert set(df["verdict"]) == {"cannot judge"}
    assert df["caveat"].str.startswith("slower? the repeats within a run spread +-").all()
    assert exit_status(df, fail_on_regression=True) == 3
    assert exit_status(df, fail_on_regression=True, allow_inconclusive=True) == 0
    df = compare_runs(_repeated("a", 3, 3, 1.0, modes), _repeated("p", 3, 3, 3.0, modes))
    assert set(df["verdict"]) == {"slower"}


def test_a_level_the_faster_sides_own_repeats_run_at_is_not_a_change():
    """A point with two speeds 1.5x apart, each repeat drawing one: every base run drew the fast
    speed once (its fastest repeat, its figure) and the slow one three times; every new run drew
    only the slow one. The runs' figures differ by a steady 1.5x, but the base side's own
    repeats ran at the new side's level in 9 of 12: "cannot judge". A new side slower than
    anything the base side's repeats reached is still called."""
    modes = {(i, k): 1.5 for i in (1, 2, 3) for k in (2, 3, 4)}
    base = _repeated("a", 3, 4, 1.0, modes)
    df = compare_runs(base, _repeated("b", 3, 4, 1.5))
    assert set(df["verdict"]) == {"cannot judge"}, df[["nbytes", "verdict", "caveat"]]
    assert df["caveat"].str.contains("9 of the base side's own 12 repeats ran at").all()
    df = compare_runs(base, _repeated("b", 3, 4, 2.5))
    assert set(df["verdict"]) == {"slower"}


def test_one_run_a_side_with_repeats_counts_each_repeat_as_a_run():
    df = compare_runs(_repeated("a", 1, 3, 1.0), _repeated("b", 1, 3, 1.0))
    assert set(df["base_runs"]) == {3} and set(df["new_runs"]) == {3}
    assert df["basis"].str.contains("each repeat counted as a run").all()


@pytest.mark.multirank
def test_the_gate_replayed_on_recorded_runs(tmp_path):
    """tools/ab_replay.py: nine runs of identical code (float16 over the gate's planted sizes
    and their neighbours, 2 repeats each, a few per cent of scatter): no draw calls identical
    code slower, every draw finds the 20 % laid on the planted points and nothing else; fewer
    than nine runs is a one-line refusal."""
    import subprocess
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "tools"))
    from ab_gate import PLANTED

    sizes = sorted({int(x.rsplit(":", 1)[1]) for x in PLANTED} | {n * 2 for x in PLANTED
                                                                   for n in [int(x.rsplit(":", 1)[1])]})
    rng = np.random.default_rng(7)
    runs = []
    for i in range(9):
        rows = [make_row("all_reduce", 2, s, _true_us(s) * float(np.exp(rng.normal(0, 0.02))), dtype="float16",
                         repeat=k) for k in (1, 2) for s in sizes]
        runs.append(_write(tmp_path, f"r{i}", pd.DataFrame(rows).assign(run=f"r{i}")))
    tool = [sys.executable, str(ROOT / "tools" / "ab_replay.py")]
    p = subprocess.run(tool + runs + ["--draws", "3"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert ("3 draws of 3 runs a side from 9 runs: identical code called slower in 0, nothing slower in 3 (0 of them "
            "inconclusive); 20 % on 10 points: exit 1 in 3, with at most 1 other point flagged in 3, every planted "
            "point flagged too in 3") in p.stdout, p.stdout
    p = subprocess.run(tool + runs[:8], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "at least 9 runs" in p.stderr and "Traceback" not in p.stderr
