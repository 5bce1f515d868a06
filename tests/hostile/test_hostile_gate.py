"""Hostile use of the regression gate: `compare --fail-on-regression` must not pass code whose
results are wrong. Each test names the case it covers and fails where it is not handled."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from commbench.store.results import RunDir, Status
from conftest import make_row, run_cli, run_meta

SIZES = [8 << i for i in range(6)]


def _run(tmp_path, name, *, check="ok", status=Status.COMPLETE, scale=1.0, variants=None, **extra):
    """A run directory of one all_reduce sweep (rows as the harness writes them)."""
    w = RunDir(tmp_path / name).open({"schema": 3, "status": "running", **({"variants": variants} if variants else {})})
    for s in SIZES:
        w.append(make_row("all_reduce", 2, s, (1.0 + s / 3000) * scale, spread_pct=1.0, iters=2000,
                          check=check, **extra))
    w.finish(status)
    return str(tmp_path / name)


@pytest.mark.multirank
def test_a_failed_data_check_on_either_side_fails_the_gate_and_says_so_first(tmp_path):
    """Case: the new side's rows with check = fail (meta check_failed) against a good base:
    `compare --fail-on-regression` exited 0, "not significant" at every point, and nothing in
    the table or the CSV said the new side's results were wrong."""
    good = _run(tmp_path, "good")
    bad = _run(tmp_path, "bad", check="fail", status=Status.CHECK_FAILED)
    for base, new, side in ((good, bad, "new"), (bad, good, "base")):
        csv = tmp_path / f"{side}.csv"
        p = run_cli("compare", base, new, "--fail-on-regression", "--all", "--csv", csv)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
        first = p.stdout.splitlines()[0]
        assert first.startswith("check failed:") and f"the {side} side's data check failed at 6 point(s)" in first, \
            p.stdout
        assert "the regression gate fails" in first and "says check_failed" in first, first
        assert f"check failed ({side})" in p.stdout and "6 check failed" in p.stdout, p.stdout
        got = pd.read_csv(csv)
        assert set(got["verdict"]) == {f"check failed ({side})"} and set(got["check_failed"]) == {side}
    # Without the gate the same line opens the output; the exit status stays compare's.
    p = run_cli("compare", good, bad)
    assert p.returncode == 0 and p.stdout.startswith("check failed:"), p.stdout


@pytest.mark.multirank
def test_a_run_marked_check_failed_fails_the_gate_even_where_its_rows_say_ok(tmp_path):
    """Case, the meta half: a run whose meta.json (or one of its variants) says check_failed
    fails the gate although the rows compared say ok (the failed repeat or variant elsewhere)."""
    good = _run(tmp_path, "good")
    marked = _run(tmp_path, "marked", status=Status.CHECK_FAILED,
                  variants={"default": {"status": "check_failed"}})
    meta = run_meta(tmp_path / "marked")
    assert "check_failed" in json.dumps(meta)
    p = run_cli("compare", good, marked, "--fail-on-regression")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout.splitlines()[0].startswith("check failed: meta.json of ") and marked in p.stdout.splitlines()[0]
    # A good pair still passes.
    p = run_cli("compare", good, _run(tmp_path, "good2"), "--fail-on-regression")
    assert p.returncode == 0 and not p.stdout.startswith("check failed"), p.stdout


def test_a_failed_check_in_a_repeat_the_fold_drops_still_counts():
    """Case: with `run --repeat N`, each run's figure is its fastest repeat; a repeat whose check
    failed must mark the point whether or not it is the one kept."""
    from commbench.analyse.compare import compare_runs, exit_status

    def side(name, fail):
        rows = []
        for run in (1, 2):
            for rep in (1, 2, 3):
                rows += [make_row("all_reduce", 2, s, 1.0 + rep * 0.1, spread_pct=1.0, run=f"{name}{run}", repeat=rep,
                                  check="fail" if fail and rep == 3 and run == 1 else "ok") for s in SIZES]
        return pd.DataFrame(rows)

    df = compare_runs(side("a", False), side("b", True))
    assert set(df["verdict"]) == {"check failed (new)"} and exit_status(df, True) == 1
    assert exit_status(compare_runs(side("a", False), side("b", False)), True) == 0
