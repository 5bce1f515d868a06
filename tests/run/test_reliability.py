"""Failures a cluster run meets, on the real multi-rank program over the loopback: a hung
rank, a lost rank, Ctrl-C, resuming, and the exit status, message, rows and time each gives."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import commbench
from conftest import ROOT, needs_mpi, needs_torch, run_cli, run_meta, run_rows

# Every test here starts processes (conftest: the multirank guard).
pytestmark = pytest.mark.multirank

SIZES = "8,1K,1M,2M"  # the fault strikes at 1M: 8 and 1K must survive
FAULT_AT = 1 << 20


def _env(fault: str) -> dict:
    return {"COMMBENCH_FAULT": fault, "COMMBENCH_PLUGINS": "fault_plugin"}


def _meta(out):
    return run_meta(out)


def _finished_rows_intact(out):
    rows = run_rows(out)
    assert [r["nbytes"] for r in rows] == [8, 1024]
    assert len(commbench.load(out)) == 2


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", pytest.param("gloo", marks=needs_torch)])
@pytest.mark.parametrize("kind", ["hang_setup", "hang_op"])
def test_hang_ends_every_rank_with_the_point_named(tmp_path, backend, kind):
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = run_cli("run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                "--timeout", "3", "--no-check", "--out", out, env=_env(f"{kind}:1:{FAULT_AT}"), timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert elapsed < 40, elapsed
    assert "timeout: no progress for 3 s at all_reduce_fault 1M float32 world 2 variant default" in r.stderr
    meta = _meta(out)
    assert meta["status"] == "failed" and "timeout" in meta["reason"]
    if kind == "hang_setup":  # rank 1 never reached the collective the others wait in
        assert "ranks not arrived: 1" in meta["reason"]
    _finished_rows_intact(out)


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", pytest.param("gloo", marks=needs_torch)])
def test_lost_rank_others_exit_and_rows_survive(tmp_path, backend):
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = run_cli("run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                "--timeout", "5", "--no-check", "--out", out, env=_env(f"kill:1:{FAULT_AT}"), timeout=120)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 40
    meta = _meta(out)
    assert meta["status"] == "failed" and meta["reason"]
    _finished_rows_intact(out)


def _launch(args, env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "plugins"), os.environ.get("PYTHONPATH", "")]),
             **env)
    e.pop("COMMBENCH_TTY", None)
    # SIGINT back to its default in the child: a test run started in the background (where
    # the shell ignores SIGINT, and children inherit that) must still see the launcher's own.
    return subprocess.Popen([sys.executable, "-m", "commbench", *map(str, args)], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_rows(out, n, proc, limit_s=60):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        f = out / "rows.jsonl"
        if f.is_file() and len(f.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("rows never came")


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", pytest.param("gloo", marks=needs_torch)])
def test_sigint_to_launcher_marks_interrupted_then_resume_finishes(tmp_path, backend):
    out = tmp_path / "run"
    # The hang at 1M holds the run still, so the interrupt lands mid-sweep deterministically.
    p = _launch(["run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                 "--no-check", "--out", out], _env(f"hang_op:1:{FAULT_AT}"))
    _wait_rows(out, 2, p)
    time.sleep(1.0)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 20
    assert p.returncode == 130, err
    meta = _meta(out)
    assert meta["status"] == "interrupted", meta
    _finished_rows_intact(out)

    # Resume: no fault this time; the two finished points are skipped, the rest appended.
    r = run_cli("run", "--resume", out, "--np", "2", env={"COMMBENCH_PLUGINS": "fault_plugin"})
    assert r.returncode == 0, r.stderr
    assert "resume: 2 of 4 points already" in r.stdout
    rows = run_rows(out)
    assert [x["nbytes"] for x in rows] == [8, 1024, 1 << 20, 2 << 20]
    meta = _meta(out)
    assert meta["status"] == "complete" and meta["resumed"][0]["previous_status"] == "interrupted"

    # A completed run is never overwritten.
    r = run_cli("run", "--resume", out, "--np", "2", env={"COMMBENCH_PLUGINS": "fault_plugin"})
    assert r.returncode == 2 and "never overwritten" in r.stderr
    r = run_cli("run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", "8", "--out", out)
    assert r.returncode == 2 and "--resume" in r.stderr


@needs_mpi
@pytest.mark.slow  # 2 x 2 GiB buffers a rank and 40 s on 2 cores; no shorter form: the case is the size
def test_over_2gib_message_on_mpi(tmp_path):
    """One all_reduce just over 2 GiB (float32 count 2^29 + 1024) at 2 ranks, checked."""
    out = tmp_path / "big"
    size = (2 << 30) + 4096
    r = run_cli("run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", str(size), "--iters", "2",
                "--warmup", "1", "--check", "--out", out, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    row = commbench.load(out).iloc[0]
    assert row["nbytes"] == size and row["check"] == "ok"


def test_dry_run_lists_points_memory_and_time_without_ranks(tmp_path):
    t0 = time.monotonic()
    r = run_cli("run", "quick", "--np", "4", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 10
    assert "suite quick: 239 points on 4 ranks" in r.stdout
    assert "mem/rank" in r.stdout and "total: about" in r.stdout
    assert "all_reduce" in r.stdout and "8.0 MiB" in r.stdout  # 4 MiB all_reduce: send + receive
    assert not (tmp_path / "results").exists()
    r = run_cli("run", "moe", "--np", "4", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and "copies=expert" in r.stdout and "GiB" in r.stdout


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", pytest.param("gloo", marks=needs_torch)])
def test_an_exception_on_one_rank_ends_every_rank_at_once_with_its_cause(tmp_path, backend):
    """Rank 1 raises in setup while rank 0 waits in the next collective: with the default
    300 s watchdog, every rank must still end within seconds, and meta.json must name the
    failed rank and its cause."""
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = run_cli("run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                "--no-check", "--out", out, env=_env(f"raise:1:{FAULT_AT}"), timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert elapsed < 30, elapsed
    meta = _meta(out)
    assert meta["status"] == "failed", meta
    assert "rank 1" in meta["reason"] and "injected fault on this rank" in meta["reason"], meta["reason"]
    _finished_rows_intact(out)


@needs_mpi
# The gloo form (26 s on 2 cores) under `make test-slow`: the resume path is the backend's
# same code after the ranks start, and the mpi form stays in `make test`.
@pytest.mark.parametrize("backend", ["mpi", pytest.param("gloo", marks=[needs_torch, pytest.mark.slow])])
def test_resume_of_a_failed_run_runs_longer_than_its_timeout_to_the_end(tmp_path, backend):
    """A run with --timeout 8 loses a rank mid-sweep (failed, rows kept); its resume then
    measures longer than the launcher's drain bound, max(GRACE_S, timeout): it must not be
    taken for already marked (meta.json still says `failed` from the first launch until
    rank 0 reopens it) and stopped, but run every remaining point, each exactly once."""
    from commbench.run.launcher import GRACE_S

    out = tmp_path / "run"
    sizes = SIZES + ",4M,8M,16M,32M"
    r = run_cli("run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", sizes,
                "--timeout", "8", "--no-check", "--iters", "2", "--warmup", "1", "--out", out,
                env=_env(f"kill:1:{FAULT_AT}"), timeout=120)
    assert r.returncode != 0
    assert _meta(out)["status"] == "failed"
    _finished_rows_intact(out)

    # Per point, well under the 8 s watchdog (which a busy host's table printing at the end
    # must also fit); the 6 points left take 15 s, more than the drain bound.
    slow_s = 2.5
    assert 6 * slow_s > max(GRACE_S, 8.0)
    t0 = time.monotonic()
    r = run_cli("run", "--resume", out, "--np", "2",
                env={"COMMBENCH_PLUGINS": "fault_plugin", "COMMBENCH_SLOW_SETUP_S": str(slow_s)}, timeout=180)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert elapsed > 6 * slow_s
    assert "resume: 2 of 8 points already" in r.stdout
    assert "after the run was marked" not in r.stderr
    rows = run_rows(out)
    assert [x["nbytes"] for x in rows] == [8, 1024] + [(1 << 20) << i for i in range(6)]  # each once
    meta = _meta(out)
    assert meta["status"] == "complete", meta
    assert "teardown" not in meta
    assert meta["resumed"][0]["previous_status"] == "failed"


@needs_mpi
@pytest.mark.parametrize("backend", ["mpi", pytest.param("gloo", marks=needs_torch)])
def test_slow_tables_at_the_end_do_not_fail_a_finished_run(tmp_path, backend):
    """Rank 0 prints the tables after it has marked the run complete, while the other ranks
    wait for it in the last agreement: printing longer than --timeout (a busy host) is not a
    hang and must leave the run complete with exit 0."""
    out = tmp_path / "run"
    r = run_cli("run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce", "--sizes", "8,1K",
                "--iters", "2", "--timeout", "2", "--out", out, timeout=120,
                env={"COMMBENCH_PLUGINS": "slow_tables_plugin", "COMMBENCH_SLOW_TABLES_S": "5"})
    assert r.returncode == 0, r.stderr[-3000:]
    meta = _meta(out)
    assert meta["status"] == "complete" and "teardown" not in meta, meta
