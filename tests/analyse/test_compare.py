"""commbench.analyse.compare: point-by-point verdicts between two runs, from summary statistics
(repeated runs a side: tests/analyse/test_compare_runs.py)."""
from __future__ import annotations

import io
import math

import pandas as pd
import pytest
from rich.console import Console

from commbench.analyse.compare import compare_runs, exit_status, point_ci, regressions
from commbench.commands.compare import compare_paths
from commbench.report.compare_view import print_compare
from commbench.store.results import RunDir, Status
from conftest import fixture_path, make_row

SIZES = [1024, 65536, 1 << 20]


def _row(nbytes, p50, *, spread_pct=1.0, iters=1000, run="r", bench="all_reduce", world=4, variant="default",
         params=None, stage="", **extra):
    """A commbench-like row: p90 sits spread_pct above p50; std in proportion."""
    return make_row(bench, world, nbytes, p50, spread_pct=spread_pct, iters=iters, variant=variant, params=params,
                    stage=stage, busbw_factor=1.5, placement=None, run=run, **extra)


def _run(scale=1.0, run="r", **kw):
    return pd.DataFrame([_row(s, (5.0 + s / 1e4) * scale, run=run, **kw) for s in SIZES])


def test_identical_runs_are_not_significant():
    base = _run(run="a")
    df = compare_runs(base, _run(run="b"))
    assert len(df) == len(SIZES)
    assert set(df["verdict"]) == {"not significant"}
    assert (df["ratio"] == 1.0).all() and (df["only_in"] == "").all()
    assert regressions(df).empty and exit_status(df, True) == 0


def test_ten_percent_slower_tight_samples():
    df = compare_runs(_run(run="a"), _run(1.10, run="b"))
    assert set(df["verdict"]) == {"slower"}
    assert df["ratio"].tolist() == pytest.approx([1.10] * 3)
    assert df["change_pct"].tolist() == pytest.approx([10.0] * 3)
    assert df["busbw_change_pct"].tolist() == pytest.approx([(1 / 1.1 - 1) * 100] * 3)
    assert (df["new_ci_lo"] > df["base_ci_hi"]).all()
    assert len(regressions(df)) == 3 and exit_status(df, True) == 1 and exit_status(df, False) == 0


def test_noisy_overlapping_intervals_are_not_significant():
    # 10 % slower, but p90 is 3x p50 over 20 iterations: the intervals overlap.
    df = compare_runs(_run(run="a", spread_pct=200, iters=20), _run(1.10, run="b", spread_pct=200, iters=20))
    assert set(df["verdict"]) == {"not significant"}
    assert (df["new_ci_lo"] < df["base_ci_hi"]).all()


def test_ten_percent_faster_tight_samples():
    df = compare_runs(_run(run="a"), _run(0.90, run="b"))
    assert set(df["verdict"]) == {"faster"}
    assert exit_status(df, True) == 0


def test_below_threshold_is_not_called():
    df = compare_runs(_run(run="a"), _run(1.04, run="b"))
    assert set(df["verdict"]) == {"not significant"}
    df = compare_runs(_run(run="a"), _run(1.04, run="b"), threshold_pct=2.0)
    assert set(df["verdict"]) == {"slower"}


def test_points_in_one_run_only_are_listed():
    base = _run(run="a")
    new = pd.concat([_run(run="b").iloc[:2], pd.DataFrame([_row(4 << 20, 90.0, run="b")])], ignore_index=True)
    df = compare_runs(base, new)
    only = df[df["only_in"] != ""]
    assert sorted(zip(only["only_in"], only["nbytes"])) == [("base", 1 << 20), ("new", 4 << 20)]
    assert set(only["verdict"]) == {"only in base", "only in new"}
    assert only["ratio"].isna().all()
    assert (df[df["only_in"] == ""]["verdict"] == "not significant").all()


def test_match_keys_separate_variants_params_stages_and_worlds():
    base = pd.DataFrame([_row(1024, 5.0, run="a", variant="ring"), _row(1024, 5.0, run="a", variant="nvls"),
                         _row(1024, 5.0, run="a", world=8), _row(1024, 5.0, run="a", bench="moe", stage="dispatch",
                                                                  params={"tokens": 128})])
    new = pd.DataFrame([_row(1024, 6.0, run="b", variant="ring"), _row(1024, 5.0, run="b", variant="nvls"),
                        _row(1024, 5.0, run="b", world=8),
                        _row(1024, 5.0, run="b", bench="moe", stage="dispatch", params='{"tokens": 128}')])
    df = compare_runs(base, new)
    assert (df["only_in"] == "").all() and len(df) == 4  # params as dict or JSON text match
    assert df[(df["variant"] == "ring") & (df["world"] == 4)]["verdict"].tolist() == ["slower"]
    assert (df["verdict"] == "slower").sum() == 1


def test_imported_rows_use_the_mean_interval_or_threshold_only():
    imp = dict(spread="std", source="nccl-tests JSON")
    lo, hi, basis = point_ci(_row(1024, 100.0, iters=20, **imp))
    assert basis == "mean (std)" and (hi - lo) / 2 == pytest.approx(1.959964 * 1.0 / math.sqrt(20))
    lo, hi, basis = point_ci(_row(1024, 100.0, spread="none"))
    assert math.isnan(lo) and basis == "no spread"
    df = compare_runs(_run(run="a", spread="none"), _run(1.10, run="b", spread="none"))
    assert set(df["verdict"]) == {"slower"} and set(df["basis"]) == {"threshold only (no spread)"}
    df = compare_runs(_run(run="a", spread="none"), _run(1.03, run="b", spread="none"))
    assert set(df["verdict"]) == {"not significant"}


def test_median_interval_is_distribution_free_and_ignores_outliers():
    # Huge max/std (one descheduled iteration) does not widen the median's interval.
    r = _row(1024, 10.0, spread_pct=2, iters=400, time_us_std=500.0, time_us_max=9000.0)
    lo, hi, basis = point_ci(r)
    assert basis.startswith("median")
    assert (hi - lo) / 2 == pytest.approx(1.959964 * 0.2 / 0.4 / (2 * 20))


def test_repeated_runs_on_one_side_are_judged_between_runs():
    # Two base runs, one new: the base side's run-to-run spread stands for both sides.
    base = pd.concat([_run(run="a1"), _run(1.01, run="a2")], ignore_index=True)
    df = compare_runs(base, _run(1.2, run="b"))
    assert len(df) == 3 and set(df["verdict"]) == {"slower"}
    assert set(df["base_run"]) == {"a1,a2"} and set(df["base_runs"]) == {2} and set(df["new_runs"]) == {1}
    assert all(b.startswith("between runs") and "base side's spread" in b for b in df["basis"])
    assert (df["caveat"] == "").all() and (df["change_lo_pct"] > 0).all()


def test_print_compare_renders():
    base = _run(run="a")
    new = pd.concat([_run(1.2, run="b").iloc[:2], pd.DataFrame([_row(4 << 20, 90.0, run="b")])], ignore_index=True)
    df = compare_runs(base, new)
    buf = io.StringIO()
    print_compare(df, console=Console(file=buf, width=200, no_color=True), threshold_pct=5)
    out = buf.getvalue()
    assert "2 slower" in out and "+20.0%" in out and "only in" in out and "4M" in out and "1M" in out
    assert "cannot separate noise from change" in out  # one run a side: the summary says so


def _write(tmp_path, name, df):
    w = RunDir(tmp_path / name).open({"schema": 2, "status": "running"})
    for r in df.drop(columns="run").to_dict("records"):
        w.append(r)
    w.finish(Status.COMPLETE)
    return tmp_path / name


def test_compare_paths_exit_status(tmp_path):
    a = _write(tmp_path, "a", _run(run="a"))
    b = _write(tmp_path, "b", _run(1.15, run="b"))
    c = _write(tmp_path, "c", _run(run="c"))
    con = Console(file=io.StringIO(), width=200)
    # One run each: 15 % is within the 2x one run a side can show (host_moved): inconclusive.
    assert compare_paths(str(a), str(b), fail_on_regression=True, console=con) == 3
    assert compare_paths(str(a), str(b), fail_on_regression=False, console=con) == 0
    assert compare_paths(str(a), str(c), fail_on_regression=True, console=con) == 0
    d = _write(tmp_path, "d", _run(2.5, run="d"))
    assert compare_paths(str(a), str(d), fail_on_regression=True, console=con) == 1
    out = tmp_path / "cmp.csv"
    compare_paths([str(a)], [str(d)], console=con, csv_out=out)
    assert set(pd.read_csv(out)["verdict"]) == {"slower"}


def test_in_place_and_out_of_place_are_never_compared_with_each_other():
    """An imported nccl-tests file holds both columns; a torch run's all_reduce is in place:
    each commbench row meets only the import's row of its own placement."""
    from commbench.store.importers import import_file

    fix = fixture_path("nccl_all_reduce_8gpu.txt")
    imported, _ = import_file(fix)
    base = pd.DataFrame(imported).assign(run="nccl-tests")
    big = 128 << 20
    ours = [{**_row(big, 700.0, world=8, run="cb"), "backend": "nccl", "placement": "in-place"}]
    res = compare_runs(base, pd.DataFrame(ours))
    got = res[(res.nbytes == big) & (res.only_in == "")]
    assert len(got) == 1 and got.iloc[0]["placement"] == "in-place"
    assert got.iloc[0]["base_p50_us"] == 649.80  # the import's in-place half, not its out-of-place 651.40
    assert set(res[(res.nbytes == big) & (res.only_in == "base")]["placement"]) == {"out-of-place"}
