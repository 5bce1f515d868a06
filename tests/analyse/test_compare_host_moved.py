"""compare judges a change only beyond what the host's state can explain (analyse/host_moved.py):
runs made in blocks, the sides' control measurements apart, disturbed rows; and its exit
statuses as a gate (0 judged and nothing slower, 1 slower or a failed check, 3 inconclusive).
Runs are built from rows and hand-made meta.json: no launches."""
from __future__ import annotations

import io
import json
import math
import sys
import time

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from commbench.analyse.compare import compare_runs, exit_status, summary
from commbench.analyse.host_moved import control_moved, host_context, row_reason, run_span, runs_order
from commbench.commands.compare import compare_paths
from commbench.report.compare_view import print_compare
from conftest import ROOT, make_row, run_cli

SIZES = [8 << i for i in range(14)]  # 8 B .. 64 KiB: `run quick --sizes 8:64K`
T0 = 1_800_000_000.0
NOT_INTERLEAVED = ("not interleaved: every base run ran before every new run; within 2x that is the host's drift "
                   "as much as a change (commbench ab interleaves)")


def _rows(run, scale=1.0, drift=1.0, benches=("all_reduce", "all_gather"), sizes=SIZES, **extra):
    """One run's rows: every point at its true time x scale x drift, a tight interval inside."""
    return [make_row(b, 2, s, (0.7 + s / 3000) * scale * drift, spread_pct=1.0, iters=2000, run=run, **extra)
            for b in benches for s in sizes]


def _meta(start_s, cpu_loop_us=None, pingpong_us=None, dur_s=2.5, **extra):
    """A run's meta.json: started/finished (whole seconds) and, given a figure, the controls at
    the start and the end of its one launch."""
    fmt = "%Y-%m-%dT%H:%M:%S%z"
    meta = {"schema": 3, "status": "complete", "started": time.strftime(fmt, time.localtime(start_s)),
            "finished": time.strftime(fmt, time.localtime(start_s + dur_s)), **extra}
    if cpu_loop_us is not None:
        meta["controls"] = [{"launch": f"l{start_s:.0f}", "variant": "default", "repeat": 1, "when": w,
                             "unix_s": start_s + (dur_s if w == "end" else 0.0), "cpu_loop_us": cpu_loop_us,
                             "pingpong_us": pingpong_us, "method": "test: hand-made"} for w in ("start", "end")]
    return meta


# Run-to-run drift within a side: a few per cent, as on a quiet moment of the host.
DRIFT = (1.0, 1.03, 0.98)
BLOCKS = {"a": (0, 1, 2), "b": (3, 4, 5)}       # a1 a2 a3 b1 b2 b3
INTERLEAVED = {"a": (0, 2, 4), "b": (1, 3, 5)}  # a1 b1 a2 b2 a3 b3


def _sides(new_scale, order, cpu=(None, None), **new_extra):
    """(base frame, new frame, host context) of three runs a side, run in the order given."""
    frames, metas = [], []
    for side, scale, c in (("a", 1.0, cpu[0]), ("b", new_scale, cpu[1])):
        rows, m = [], {}
        for i, slot in enumerate(order[side]):
            name = f"{side}{i + 1}"
            rows += _rows(name, scale, DRIFT[i], **(new_extra if side == "b" else {}))
            m[name] = _meta(T0 + 3 * slot, c)
        frames.append(pd.DataFrame(rows))
        metas.append(m)
    return frames[0], frames[1], host_context(*metas)


def _printed(df, **kw) -> str:
    buf = io.StringIO()
    print_compare(df, console=Console(file=buf, width=250, no_color=True), threshold_pct=5, **kw)
    return buf.getvalue()


def _write(path, rows, meta):
    path.mkdir(parents=True)
    (path / "rows.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "run"}) + "\n"
                                             for r in rows))
    (path / "meta.json").write_text(json.dumps(meta))
    return str(path)


def _quiet():
    return Console(file=io.StringIO(), width=250)


def test_blocks_of_the_same_code_30pct_apart_are_not_interleaved_and_interleaved_is_judged():
    """Case: a1 a2 a3 then b1 b2 b3 of the same code, the host 30 % faster for the second block:
    26 of 28 points "faster" with intervals that exclude zero, and exit 0 only because the drift
    favoured the new side. In blocks a change within 2x is "cannot judge (not interleaved)", in
    either direction; interleaved, the same numbers are a change the host cannot explain."""
    base, new, host = _sides(0.7, BLOCKS)
    assert set(compare_runs(base, new)["verdict"]) == {"faster"}  # the statistics alone call it
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"cannot judge"} and len(df) == 28
    assert df["caveat"].str.startswith("faster? " + NOT_INTERLEAVED).all(), df["caveat"].iloc[0]
    assert set(df["explained_by"]) == {"not interleaved 2x"} and set(df["explained_factor"]) == {2.0}
    assert exit_status(df, True) == 3 and exit_status(df, True, allow_inconclusive=True) == 0
    out = _printed(df, all_points=False)
    assert "0 slower, 0 faster, 0 not significant, 28 cannot judge (not interleaved)" in out.splitlines()[0], out
    assert f"host: {NOT_INTERLEAVED}" in out and "no point changed" not in out
    # The same drift the other way no longer fails the gate: nothing was judged slower.
    base, new, host = _sides(1.3, BLOCKS)
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"cannot judge"} and exit_status(df, True) == 3
    # Blocks of code that did not move stay "not significant": the gate passes them (exit 0).
    base, new, host = _sides(1.0, BLOCKS)
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"not significant"} and exit_status(df, True) == 0
    # Interleaved: judged, and nothing said about the runs' order.
    base, new, host = _sides(0.7, INTERLEAVED)
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"faster"} and set(df["explained_by"]) == {""} and exit_status(df, True) == 0
    assert "host: not interleaved" not in _printed(df)
    # Beyond what blocks can explain (3x slower): slower, and the caveat says what it rests on.
    base, new, host = _sides(3.0, BLOCKS)
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"slower"} and exit_status(df, True) == 1
    assert df["caveat"].str.startswith("beyond the 2x the host's state can explain: not interleaved").all()


def test_one_or_two_runs_a_side_judge_only_beyond_2x():
    """compare BASE NEW: one run each is two blocks of one, "cannot judge: one run each" within
    2x; two runs a side, even interleaved, are fewer than the 3 a judgement needs."""
    a, b = pd.DataFrame(_rows("a")), pd.DataFrame(_rows("b", 1.3))
    df = compare_runs(a, b, host=host_context({"a": _meta(T0)}, {"b": _meta(T0 + 5)}))
    assert set(df["verdict"]) == {"cannot judge"}
    assert df["caveat"].str.startswith("slower? one run each (commbench ab --rounds 3 to judge)").all()
    assert "host: one run each: a change within 2x is not judged" in _printed(df)
    df = compare_runs(a, pd.DataFrame(_rows("b", 2.5)), host=host_context({"a": _meta(T0)}, {"b": _meta(T0 + 5)}))
    assert set(df["verdict"]) == {"slower"}
    two = {"a": (0, 2), "b": (1, 3)}
    base, new, host = _sides(0.7, {"a": two["a"], "b": two["b"]})
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"cannot judge"}
    assert df["caveat"].str.contains("2 run(s) on the base side: faster/slower needs 3 a side, interleaved",
                                     regex=False).all()


@pytest.mark.multirank
def test_the_host_moved_control_40pct_slower_cannot_judge_30pct_exit_3(tmp_path):
    """Interleaved runs whose new side's launches ran beside a CPU hog: its control CPU loop
    40 % slower, its points 30 % slower. "cannot judge (the host moved: control cpu loop +40 %
    on the new side)"; the gate is inconclusive (exit 3), 0 with --allow-inconclusive."""
    base, new, host = _sides(1.3, INTERLEAVED, cpu=(100.0, 140.0))
    df = compare_runs(base, new, host=host)
    assert set(df["verdict"]) == {"cannot judge"}
    assert df["caveat"].str.startswith("slower? the host moved: control cpu loop +40 % on the new side").all()
    # A change larger than the control's: judged, interleaved or not.
    base2, new2, host2 = _sides(1.8, INTERLEAVED, cpu=(100.0, 140.0))
    assert set(compare_runs(base2, new2, host=host2)["verdict"]) == {"slower"}
    # Steady controls: the same 30 % is slower.
    base3, new3, host3 = _sides(1.3, INTERLEAVED, cpu=(100.0, 101.0))
    df3 = compare_runs(base3, new3, host=host3)
    assert set(df3["verdict"]) == {"slower"} and "host: control steady: cpu loop +1 % on the new side" in _printed(df3)
    # Through the command, from run directories.
    dirs = {}
    for side, frame, c in (("a", base, 100.0), ("b", new, 140.0)):
        for i, slot in enumerate(INTERLEAVED[side]):
            name = f"{side}{i + 1}"
            dirs.setdefault(side, []).append(_write(tmp_path / name, frame[frame["run"] == name].to_dict("records"),
                                                    _meta(T0 + 3 * slot, c)))
    con = _quiet()
    assert compare_paths(dirs["a"], dirs["b"], fail_on_regression=True, console=con) == 3
    assert compare_paths(dirs["a"], dirs["b"], fail_on_regression=True, allow_inconclusive=True, console=con) == 0
    assert compare_paths(dirs["a"], dirs["b"], console=con) == 0
    out = con.file.getvalue()
    assert "28 cannot judge (the host moved (control))" in out, out
    assert "host: the host moved: control cpu loop +40 % on the new side: a change within 1.4x is not judged" in out
    assert "inconclusive: 28 point(s) could not be judged and none is slower: exit 3" in out
    p = run_cli("compare", "--fail-on-regression", "--allow-inconclusive", *dirs["a"], "--", *dirs["b"])
    assert p.returncode == 0, p.stderr
    p = run_cli("compare", "--help")
    assert "--allow-inconclusive" in p.stdout and "3 (inconclusive)" in p.stdout


def test_a_10x_slower_build_on_a_loaded_machine_is_slower_and_says_the_rows_were_disturbed(tmp_path):
    """Case: every row of the new side 10x slower and marked disturbed (a slow build measured
    on a loaded CI machine) gave "0 slower ... 6 cannot judge", exit 0. A rank that waited 60 %
    of the time explains at most 2.5x (x2 for one run each): 10x is slower, exit 1."""
    sizes = SIZES[:6]
    a = _rows("a", benches=("all_reduce",), sizes=sizes)
    b = _rows("b", 10.0, benches=("all_reduce",), sizes=sizes, disturbed=True, host_wait_pct=60.0,
              warning="disturbed: a rank waited for a CPU 60 % of the point's time (> 10 %: another process)")
    da, db = _write(tmp_path / "a", a, _meta(T0)), _write(tmp_path / "b", b, _meta(T0 + 5))
    con = _quiet()
    csv = tmp_path / "c.csv"
    assert compare_paths(da, db, fail_on_regression=True, console=con, csv_out=csv) == 1
    got = pd.read_csv(csv)
    assert set(got["verdict"]) == {"slower"} and set(got["explained_factor"]) == {5.0}
    assert got["caveat"].str.startswith("beyond the 5x the host's state can explain: disturbed: run b waited "
                                        "for a CPU 60 % of the point's time (up to 2.5x); one run each").all()
    assert "6 slower" in con.file.getvalue()
    # 2x slower on those rows is within what they explain: cannot judge, counted as disturbed.
    b2 = _rows("b", 2.0, benches=("all_reduce",), sizes=sizes, disturbed=True, host_wait_pct=60.0)
    df = compare_runs(pd.DataFrame(a), pd.DataFrame(b2), host=host_context({"a": _meta(T0)}, {"b": _meta(T0 + 5)}))
    assert set(df["verdict"]) == {"cannot judge"} and "6 cannot judge (disturbed)" in _printed(df)
    # An oversubscribed row is never evidence, however large the change.
    b3 = _rows("b", 10.0, benches=("all_reduce",), sizes=sizes, oversubscribed=True, ranks_per_core=2.0)
    df = compare_runs(pd.DataFrame(a), pd.DataFrame(b3), host=host_context({"a": _meta(T0)}, {"b": _meta(T0 + 5)}))
    assert set(df["verdict"]) == {"cannot judge"} and df["caveat"].str.contains("oversubscribed (2 ranks per core)",
                                                                               regex=False).all()


def test_every_row_disturbed_with_a_point_at_minus_82pct_is_not_no_change():
    """Case: runs whose every row is disturbed said "no point changed by more than the
    threshold and its interval" while one point read -82 % with an interval that excluded
    zero. On disturbed rows no point is "not significant": each is "cannot judge", counted
    in the header, and the gate is inconclusive."""
    def side(name, seed, hit=None):
        rng = np.random.default_rng(seed)
        rows = []
        for i in range(3):
            for j, s in enumerate(SIZES):
                f = math.exp(rng.normal(0, 0.45)) * (0.18 if j == hit else 1.0)
                rows.append(make_row("all_reduce", 2, s, (0.7 + s / 3000) * f, spread_pct=1.0, iters=2000,
                                     run=f"{name}{i + 1}", disturbed=True, host_wait_pct=85.0,
                                     warning="disturbed: a rank waited for a CPU 85 % of the point's time"))
        return pd.DataFrame(rows)

    host = host_context({f"a{i}": _meta(T0 + 6 * i) for i in (1, 2, 3)},
                        {f"b{i}": _meta(T0 + 6 * i + 3) for i in (1, 2, 3)})
    df = compare_runs(side("a", 52), side("b", 1052, hit=6), host=host)
    point = df[df["nbytes"] == SIZES[6]].iloc[0]
    assert -83 < point["change_pct"] < -81 and point["change_hi_pct"] < 0  # the case's point
    assert set(df["verdict"]) == {"cannot judge"}
    assert point["caveat"].startswith("disturbed: run ") and "85 % of the point's time (up to 6.7x)" in point["caveat"]
    out = _printed(df, all_points=False)
    assert "no point changed" not in out and "14 cannot judge (disturbed)" in out.splitlines()[0], out
    assert summary(df)["cannot judge"] == 14 and exit_status(df, True) == 3


def test_runs_without_controls_or_times_still_compare(tmp_path):
    """Imports and older runs: no controls; an import's `started` is when it was imported.
    They compare; the runs' order is "not recorded" and taken as apart, and the header says so;
    runs with only started/finished are ordered by those."""
    base, new, _ = _sides(3.0, INTERLEAVED)
    imp = {"imported_from": "/x/nccl.txt", "source": "nccl-tests"}
    a = [_write(tmp_path / f"a{i}", base[base["run"] == f"a{i}"].to_dict("records"), _meta(T0 + i, **imp))
         for i in (1, 2, 3)]
    b = [_write(tmp_path / f"b{i}", new[new["run"] == f"b{i}"].to_dict("records"), _meta(T0 + i, **imp))
         for i in (1, 2, 3)]
    con = _quiet()
    csv = tmp_path / "c.csv"
    assert compare_paths(a, b, fail_on_regression=True, console=con, csv_out=csv) == 1  # 3x: beyond 2x
    out = con.file.getvalue()
    assert "host: not interleaved: when the runs ran is not recorded (a1, a2, a3 and 3 more)" in out, out
    assert "the host moved" not in out and "host: control" not in out
    assert set(pd.read_csv(csv)["verdict"]) == {"slower"}
    # Older runs: started/finished only, interleaved: judged on the statistics alone.
    base, new, _ = _sides(1.3, INTERLEAVED)
    a = [_write(tmp_path / f"o{i}", base[base["run"] == f"a{i}"].to_dict("records"), _meta(T0 + 6 * i))
         for i in (1, 2, 3)]
    b = [_write(tmp_path / f"p{i}", new[new["run"] == f"b{i}"].to_dict("records"), _meta(T0 + 6 * i + 3))
         for i in (1, 2, 3)]
    assert compare_paths(a, b, fail_on_regression=True, console=con, csv_out=csv) == 1
    assert set(pd.read_csv(csv)["verdict"]) == {"slower"}
    # No meta.json at all: compares, as runs whose order is not recorded.
    for d in a + b:
        (tmp_path / d / "meta.json").unlink()
    assert compare_paths(a, b, fail_on_regression=True, console=con, csv_out=csv) == 3


def test_the_pieces_of_the_rule():
    # When a run ran: its controls' timestamps, else started/finished; an import: not recorded.
    assert run_span(_meta(T0, 100.0, dur_s=2.0)) == (T0, T0 + 2.0)
    assert run_span(_meta(T0, dur_s=3.0)) == (T0, T0 + 3.0)
    assert run_span({"started": "yesterday"}) is None and run_span(_meta(T0, imported_from="f")) is None
    m = {f"r{i}": _meta(T0 + 3 * i) for i in range(4)}
    assert runs_order({"r0": m["r0"], "r1": m["r1"]}, {"r2": m["r2"], "r3": m["r3"]})[0] == "apart"
    assert runs_order({"r2": m["r2"], "r3": m["r3"]}, {"r0": m["r0"], "r1": m["r1"]})[1].startswith(
        "not interleaved: every new run ran before every base run")
    assert runs_order({"r0": m["r0"], "r2": m["r2"]}, {"r1": m["r1"], "r3": m["r3"]})[0] == "interleaved"
    assert runs_order({"r0": m["r0"]}, {"r1": {}})[0] == "not recorded"
    # The control: geometric mean over runs and both ends; the larger of the two ratios, named.
    assert control_moved({"a": _meta(T0, 100.0, 10.0)}, {"b": _meta(T0, 101.0, 7.0)}) == \
        pytest.approx((10 / 7, "the host moved: control ping-pong +43 % on the base side"))
    assert control_moved({"a": _meta(T0)}, {"b": _meta(T0, 100.0)}) == (1.0, "")
    assert "recorded on the new side only" in host_context({"a": _meta(T0)}, {"b": _meta(T0, 100.0)})["control_note"]
    # A disturbed row: 1 / (1 - wait), steal alike, capped; no counters: the cap.
    assert row_reason("r", {"disturbed": True, "host_wait_pct": 60.0})[:2] == ("disturbed", pytest.approx(2.5))
    assert row_reason("r", {"disturbed": True, "host_wait_pct": 5.0, "host_steal_pct": 20.0})[1] == \
        pytest.approx(1.25)
    assert row_reason("r", {"disturbed": True, "host_wait_pct": 99.0})[1] == 10.0
    assert row_reason("r", {"disturbed": True})[1] == 10.0 and row_reason("r", {"disturbed": False}) is None
    assert row_reason("r", {"disturbed": True, "host_wait_pct": 50.0,
                            "warning": "1 of 9 samples were not covered; disturbed: x"})[1] == math.inf


def test_exit_statuses_of_the_gate():
    """0 judged and nothing slower; 1 slower or a failed check on either side, also beside
    points that could not be judged; 3 inconclusive; without --fail-on-regression 0."""
    base, new, host = _sides(1.3, BLOCKS)
    df = compare_runs(base, new, host=host)  # every point cannot judge
    assert [exit_status(df, f) for f in (True, False)] == [3, 0]
    assert exit_status(df, True, runs_check_failed=["b1"]) == 1
    assert exit_status(df, True, runs_check_failed=["b1"], allow_inconclusive=True) == 1
    df.loc[0, "verdict"] = "slower"
    assert exit_status(df, True) == 1 and exit_status(df, False) == 0


def test_the_gate_counts_an_inconclusive_same_code_round_as_right():
    sys.path.insert(0, str(ROOT / "tools"))
    from ab_gate import tally

    def rec(same, planted):
        return {"same_exit": same, "planted_exit": planted, "planted_found": ["p"], "planted_others": []}

    lines, ok = tally([rec(0, 1)] * 17 + [rec(3, 1)] * 3, 1, 20.0)
    assert ok and lines[0].startswith("same code: nothing slower (compare exit 0 or 3) in 20 of 20 rounds")
    assert "3 of them inconclusive" in lines[0]
    lines, ok = tally([rec(0, 1)] * 18 + [rec(1, 1)] * 2, 1, 20.0)
    assert not ok and "in 18 of 20 rounds" in lines[0]
