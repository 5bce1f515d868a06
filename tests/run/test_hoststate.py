"""The host's state with every run and point: run-queue wait, steal, load, ranks per core;
a disturbed point is flagged, an oversubscribed run says so at the start and on every row."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from commbench.core import hoststate
from conftest import needs_mpi, run_cli, run_meta, run_rows


def test_tick_shares_and_thresholds():
    a = (100, 0, 50, 800, 10, 0, 0, 40)
    b = (200, 0, 100, 1600, 30, 0, 0, 70)  # +1000 ticks: 30 steal, 20 iowait
    sh = hoststate.tick_shares(a, b)
    assert sh["steal_pct"] == pytest.approx(3.0) and sh["iowait_pct"] == pytest.approx(2.0) and sh["ticks"] == 1000
    assert hoststate.is_disturbed(5.0, 3.0, 30) == ""
    assert "waited for a CPU 40 %" in hoststate.is_disturbed(40.0, 0.0, 0)
    assert "> 10 %" in hoststate.is_disturbed(40.0, 0.0, 0)
    assert "steal 25 %" in hoststate.is_disturbed(0.0, 25.0, 5)
    # One tick of steal in a short point is below the counter's resolution.
    assert hoststate.is_disturbed(0.0, 25.0, 1) == ""


def test_ranks_per_core_and_the_start_line():
    rpc = hoststate.ranks_per_core(["a"] * 4 + ["b"] * 2, [2] * 4 + [8] * 2)
    assert rpc == {"a": 2.0, "b": 0.25}
    line = hoststate.oversubscription_line(rpc, ["a"] * 4 + ["b"] * 2, [2] * 4 + [8] * 2)
    assert line.startswith("oversubscribed: 4 ranks on 2 cores of a") and "cannot be judged" in line
    assert hoststate.oversubscription_line({"a": 1.0}, ["a", "a"], [2, 2]) == ""


class _OneRank:
    def max_over_ranks(self, v):
        return np.asarray(v)


@pytest.mark.multirank
def test_a_point_that_waits_for_its_core_is_disturbed():
    """This process and as many burners as there are cores, all pinned to one CPU: the
    watched interval waits for that CPU most of the time."""
    import os

    cpu = sorted(os.sched_getaffinity(0))[0]
    burners = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile 1: pass"])
               for _ in range(2)]
    old = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
        w = hoststate.PointWatch()
        w.start()
        t_end = __import__("time").monotonic() + 0.5
        while __import__("time").monotonic() < t_end:
            pass
        st = w.finish(_OneRank(), 1.0)
    finally:
        os.sched_setaffinity(0, old)
        for p in burners:
            p.kill()
            p.wait()
    assert st["disturbed"] and st["host_wait_pct"] > 30, st
    assert "waited for a CPU" in st["_disturbed_why"]


@needs_mpi
@pytest.mark.multirank
def test_a_point_run_while_other_processes_burn_every_core_is_flagged(tmp_path):
    burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2 * hoststate.cores())]
    try:
        out = tmp_path / "busy"
        p = run_cli("run", "quick", "--np", 2, "--worlds", 2, "-b", "all_reduce", "--sizes", "8,64K",
                    "--min-time-ms", 100, "--out", out, timeout=240)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert p.returncode == 0, p.stderr[-2000:]
    rows = run_rows(out)
    assert rows and all(r["disturbed"] and "disturbed: a rank waited for a CPU" in r["warning"] for r in rows)
    assert all(r["host_wait_pct"] > hoststate.WAIT_PCT for r in rows)
    meta = run_meta(out)
    hs = meta["host_state"]
    assert hs["disturbed_points"] == len(rows) and hs["thresholds"]["wait_pct"] == hoststate.WAIT_PCT
    assert hs["gpu"]["skipped"].startswith("CPU ranks") and len(hs["run"]["load_avg_end"]) == 3


@needs_mpi
@pytest.mark.multirank
def test_four_ranks_on_two_cores_say_so_at_start_and_on_every_row(tmp_path):
    if hoststate.cores() > 2:
        pytest.skip(f"{hoststate.cores()} cores: 4 ranks do not oversubscribe this host")
    out = tmp_path / "over"
    p = run_cli("run", "quick", "--np", 4, "-b", "all_reduce,broadcast", "--sizes", "8,1K", "--iters", 20,
                "--out", out, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning: oversubscribed: 4 ranks on 2 cores" in p.stderr and "cannot be judged" in p.stderr, p.stderr
    rows = run_rows(out)
    w4 = [r for r in rows if r["world"] == 4]
    assert w4 and all(r["oversubscribed"] and r["ranks_per_core"] == 2.0 for r in w4)
    assert all(not r["oversubscribed"] and r["ranks_per_core"] == 1.0 for r in rows if r["world"] == 2)
    assert run_meta(out)["host_state"]["oversubscribed"] is True
    # The report: the run line says it, and no verdict rests on the 4-rank rows.
    rep = run_cli("report", out, "--out", tmp_path / "rep", timeout=240)
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "2 ranks/core (OVERSUBSCRIBED)" in md
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    scaling = [ln for ln in summary.splitlines() if "weak scaling" in ln]
    assert scaling and all("cannot judge: n=4 oversubscribed (2 ranks per core)" in ln for ln in scaling), scaling
    latency = [ln for ln in summary.splitlines() if "small-message latency" in ln]
    assert latency and all("oversubscribed" in ln for ln in latency), latency


def test_make_targets_default_to_one_rank_per_core():
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make not installed")
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    want = max(2, hoststate.cores())
    for target in ("quick", "scaling", "moe"):
        p = subprocess.run(["make", "-n", "-o", ".venv/.installed", target], cwd=root, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert f"--np {want} " in p.stdout + " ", (target, p.stdout)
    p = subprocess.run(["make", "-n", "-o", ".venv/.installed", "quick", "NP=4"], cwd=root, capture_output=True,
                       text=True)
    assert "--np 4 " in p.stdout + " "


@needs_mpi
@pytest.mark.multirank
def test_repeat_measures_each_point_n_times_interleaved_and_compare_judges_between_repeats(tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        p = run_cli("run", "quick", "--np", 2, "--worlds", 2, "-b", "all_reduce", "--sizes", "8,1K", "--iters", 20,
                    "--repeat", 3, "--out", out, timeout=240)
        assert p.returncode == 0, p.stderr[-2000:]
        # Each repeat in fresh processes: what a process keeps for its life is not shared.
        assert all(f"repeat {k} of 3: a launch of its own" in p.stdout for k in (1, 2, 3)), p.stdout[-2000:]
        outs.append(out)
    meta = run_meta(outs[0])
    assert meta["status"] == "complete" and "reason" not in meta["variants"]["default"]
    rows = run_rows(outs[0])
    # Every point once, then every point again: 8 1K 8 1K 8 1K.
    assert [(r["nbytes"], r["repeat"]) for r in rows] == [(8, 1), (1024, 1), (8, 2), (1024, 2), (8, 3), (1024, 3)]
    assert len({r["point_key"] for r in rows}) == 6
    csv = tmp_path / "cmp.csv"
    p = run_cli("compare", "--csv", csv, outs[0], outs[1], timeout=240)
    assert p.returncode == 0, p.stderr
    import pandas as pd

    got = pd.read_csv(csv)
    assert sorted(got["nbytes"]) == [8, 1024] and set(got["base_runs"]) == {3} and set(got["new_runs"]) == {3}
    assert got["basis"].str.contains("3 vs 3 runs").all()
    bad = run_cli("run", "quick", "--np", 2, "-b", "all_reduce", "--repeat", 0, "--out", tmp_path / "bad")
    assert bad.returncode == 2 and "repeat" in bad.stderr and "Traceback" not in bad.stderr
