"""The job as a whole, on the real multi-rank program over the loopback: a frozen rank named
as such, a rank frozen after the run was marked, the launcher's signals and death, one writer
per run directory, a disk that fills mid-run, and --np beyond what the host can run. Every
failure here must end every process of the job within JOB_END_S of its cause."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reliability import FAULT_AT, SIZES, _env, _finished_rows_intact, _launch, _meta, _wait_rows

import commbench
from conftest import ROOT, kill_pids, needs_mpi, needs_torch, run_cli, run_rows

# The bound for a failure to end the job, from the moment it is caused (a watchdog's
# own timeout is added where the failure is a silence only the watchdog can see).
JOB_END_S = 15.0
BACKENDS = ["mpi", pytest.param("gloo", marks=needs_torch)]


def _job_pids(out: Path) -> list[int]:
    """Every live process whose command line names this run directory (launcher, mpirun,
    ranks): zombies are not counted, they hold nothing."""
    r = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    pids = []
    for tok in r.stdout.split():
        try:
            stat = Path(f"/proc/{tok}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:][:1] not in ("Z", "X"):
            pids.append(int(tok))
    return pids


def _wait_job_gone(out: Path, limit_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if not _job_pids(out):
            return time.monotonic() - t0
        time.sleep(0.1)
    left = _job_pids(out)
    for pid in left:  # do not leave orphans behind a failed test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    raise AssertionError(f"job processes still alive after {limit_s} s: {left}")


@pytest.fixture(autouse=True)
def _reap(tmp_path):
    """A test that fails midway must not leave its job running (a stopped rank, a launcher
    it gave up on): whatever still names its directory is killed afterwards."""
    yield
    kill_pids(_job_pids(tmp_path))


@needs_mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.multirank
def test_a_frozen_rank_is_named_as_not_arrived(tmp_path, backend):
    """Rank 1 SIGSTOPs itself inside the operation rank 0 waits in: both at the same step, so
    only rank 1's silent heartbeat tells which rank the job waits for."""
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = run_cli("run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                "--timeout", "3", "--no-check", "--out", out, env=_env(f"stop_op:1:{FAULT_AT}"), timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert elapsed < 3 + JOB_END_S + 10, elapsed  # start-up, 3 s watchdog, then the stop
    print(f"frozen rank [{backend}]: whole run {elapsed:.1f} s")
    meta = _meta(out)
    assert meta["status"] == "failed", meta
    assert "ranks not arrived: 1 (1 reached this step but stopped responding" in meta["reason"], meta["reason"]
    _finished_rows_intact(out)
    _wait_job_gone(out, 5)


@needs_mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.multirank
def test_a_rank_frozen_after_the_run_was_marked_keeps_it_complete_and_ends(tmp_path, backend):
    """Rank 1 is stopped once it reaches "finishing" (rank 0 then marks the run complete and
    waits for rank 1 in the last agreement or the backend's teardown): the watchdog ends the
    job, and the complete run stays complete, with the teardown's failure noted beside it."""
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce", "--sizes", "8:64K",
                 "--iters", "5", "--warmup", "1", "--timeout", "3", "--out", out], {})
    prog = out / ".progress" / "rank-1"
    t_stop = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        try:
            d = json.loads(prog.read_text())
        except (OSError, ValueError):
            time.sleep(0.005)
            continue
        if d["where"] in ("finishing", "closing the backend"):
            os.kill(d["pid"], signal.SIGSTOP)
            t_stop = time.monotonic()
            break
        time.sleep(0.005)
    if t_stop is None:
        p.kill()
        pytest.fail(f"rank 1 never seen at finishing: {p.communicate()}")
    _, err = p.communicate(timeout=60)
    took = time.monotonic() - t_stop
    assert took < 3 + JOB_END_S, (took, err)
    print(f"frozen at finishing [{backend}]: job ended {took:.1f} s after the stop")
    meta = _meta(out)
    assert meta["status"] == "complete", meta
    # Rank 0's watchdog (rank 1 caught before the last agreement) or the launcher (rank 0
    # done, rank 1 frozen in the teardown) ended the job, and said so.
    assert p.returncode != 0 and "after the run was marked" in meta.get("teardown", ""), (p.returncode, meta)
    assert len(commbench.load(out)) == 14
    _wait_job_gone(out, 5)


@needs_mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.multirank
def test_sigterm_or_sighup_to_the_launcher_ends_its_job(tmp_path, backend, sig):
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                 "--no-check", "--out", out], _env(f"hang_op:1:{FAULT_AT}"))
    _wait_rows(out, 2, p)
    t0 = time.monotonic()
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    took = time.monotonic() - t0
    assert took < JOB_END_S
    assert p.returncode == 128 + sig, err
    print(f"{signal.Signals(sig).name} to launcher [{backend}]: launcher exited {took:.1f} s later")
    _wait_job_gone(out, 2)
    meta = _meta(out)
    assert meta["status"] == "interrupted", meta
    assert signal.Signals(sig).name in meta["reason"], meta["reason"]
    _finished_rows_intact(out)


@needs_mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.multirank
def test_a_killed_launcher_takes_its_job_with_it(tmp_path, backend):
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce_fault", "--sizes", SIZES,
                 "--no-check", "--out", out], _env(f"hang_op:1:{FAULT_AT}"))
    _wait_rows(out, 2, p)
    p.kill()
    p.wait()
    took = _wait_job_gone(out, JOB_END_S)
    meta = _meta(out)
    assert meta["status"] == "failed", meta
    assert "launcher" in meta["reason"] and "gone" in meta["reason"], meta["reason"]
    _finished_rows_intact(out)
    assert took < JOB_END_S
    print(f"SIGKILL to launcher [{backend}]: job gone {took:.1f} s later")


@needs_mpi
@pytest.mark.multirank
def test_one_writer_per_run_directory(tmp_path):
    """While a run holds its directory, a second run into it (--np or under mpirun) and a
    --resume of it are refused at once; once it ends, the resume finishes it, each point once."""
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "-b", "all_reduce_fault", "--sizes", SIZES, "--no-check",
                 "--out", out], _env(f"hang_op:1:{FAULT_AT}"))
    try:
        _wait_rows(out, 2, p)
        r = run_cli("run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", "8", "--out", out, timeout=60)
        assert r.returncode == 2 and "a run is writing there now (pid" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
        r = run_cli("run", "--resume", out, "--np", "2", timeout=60)
        assert r.returncode == 2 and "still running" in r.stderr, r.stderr
        from commbench.run.launcher import mpirun_command

        cmd = mpirun_command(2, ["run", "quick", "-b", "all_reduce", "--sizes", "8", "--out", str(out)])
        ext = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env={k: v for k, v in os.environ.items() if k != "COMMBENCH_RUN_LOCK"})
        assert ext.returncode != 0 and "a run is writing there now" in ext.stdout + ext.stderr
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    _finished_rows_intact(out)
    r = run_cli("run", "--resume", out, "--np", "2", env={"COMMBENCH_PLUGINS": "fault_plugin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    keys = [r["point_key"] for r in run_rows(out)]
    assert len(keys) == 4 and len(set(keys)) == 4


@pytest.mark.multirank
def test_np_beyond_the_host_is_refused_up_front(tmp_path):
    t0 = time.monotonic()
    r = run_cli("run", "quick", "--np", "100000", "--sizes", "8", "--out", tmp_path / "run", timeout=60)
    assert r.returncode == 2 and "--np 100000: this host runs at most" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and time.monotonic() - t0 < 10
    assert not (tmp_path / "run").exists()
    from commbench.run.launcher import MAX_RANKS_PER_CORE, local_rank_limit

    most, why = local_rank_limit()
    assert 1 <= most <= MAX_RANKS_PER_CORE * (os.cpu_count() or 1) and why


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills) needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path, request):
    d = tmp_path / "disk"
    _mount_tmpfs(d, getattr(request, "param", "1m"))
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.mark.parametrize("small_disk", ["256k"], indirect=True)
@pytest.mark.multirank
def test_too_little_space_for_the_planned_rows_is_refused_up_front(small_disk):
    r = run_cli("run", "collectives", "--np", "2", "--out", small_disk / "run", timeout=60)
    assert r.returncode == 2 and "free on its filesystem" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert not (small_disk / "run").exists()
    r = run_cli("run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", "8,1K", "--iters", "3", "--warmup", "1",
                "--out", small_disk / "small", timeout=120)
    assert r.returncode == 0, r.stderr  # a sweep that fits is not refused


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


@needs_mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.multirank
def test_a_disk_that_fills_mid_run_fails_the_run_cleanly_then_resume_finishes(small_disk, backend):
    out = small_disk / "run"
    sizes = "8,16,32,64,128,256,512,1K,2K,4K,8K,16K,32K,64K"
    p = _launch(["run", "quick", "--np", "2", "--backend", backend, "-b", "all_reduce", "--sizes", sizes,
                 "--min-time-ms", "250", "--max-iters", "1000000", "--warmup", "1", "--out", out], {})
    _wait_rows(out, 2, p)
    filler = _fill(small_disk)
    t0 = time.monotonic()
    _, err = p.communicate(timeout=120)
    took = time.monotonic() - t0
    _wait_job_gone(out, 5)
    from commbench.store.load import load

    # Each point takes about 250 ms (the calibration target), so 12 are still to come when the
    # disk fills after the second.
    n_rows = len(load(out, warn=lambda line: None))
    assert n_rows < 14 and p.returncode != 0, (n_rows, p.returncode, err)
    assert took < JOB_END_S, (took, err)
    print(f"disk full [{backend}]: job ended {took:.1f} s after the disk filled")
    assert "Traceback" not in err, err
    meta = _meta(out)
    assert meta["status"] == "failed" and "No space left on device" in meta["reason"], (meta["reason"], err[:3000])
    assert not list(out.glob(".meta.json.*.tmp")) and not list(out.glob("*.tmp")), sorted(out.iterdir())
    filler.unlink()
    r = run_cli("run", "--resume", out, "--np", "2", timeout=120)
    assert r.returncode == 0, r.stderr
    keys = [r["point_key"] for r in run_rows(out)]
    assert len(keys) == 14 and len(set(keys)) == 14
    assert _meta(out)["status"] == "complete"


@needs_torch
@pytest.mark.multirank
def test_ranks_waiting_outside_a_smaller_world_end_with_it(tmp_path):
    """Four gloo ranks started the torchrun way (no launcher of ours to stop them), worlds 2
    and 4: rank 1 hangs in world 2 while ranks 2 and 3 wait outside it, with no deadline of
    their own. The watchdog's timeout on rank 0 must end them too, and name rank 1 alone:
    ranks 2 and 3, idle outside the world, were not due."""
    from commbench.backends.rendezvous import free_port

    out = tmp_path / "run"
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "plugins"),
                                                       os.environ.get("PYTHONPATH", "")]),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="4", LOCAL_WORLD_SIZE="4",
               **_env(f"hang_setup:1:{FAULT_AT}"))
    env.pop("COMMBENCH_TTY", None)
    args = [sys.executable, "-m", "commbench", "run", "quick", "--backend", "gloo", "-b", "all_reduce_fault",
            "--sizes", SIZES, "--worlds", "2,4", "--timeout", "3", "--no-check", "--out", str(out)]
    procs = [subprocess.Popen(args, cwd=ROOT, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(4)]
    t0 = time.monotonic()
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode != 0 for p in procs), [p.returncode for p in procs]
    meta = _meta(out)
    assert meta["status"] == "failed" and "ranks not arrived: 1" in meta["reason"], meta["reason"]
    assert "ranks not arrived: 1," not in meta["reason"]  # ranks 2 and 3 were not due
    assert time.monotonic() - t0 < 60


def test_a_timeout_tells_every_rank_through_a_failure_file(tmp_path, monkeypatch):
    """Ranks with no deadline of their own (idle outside a smaller world, behind a partition
    that keeps mpirun from stopping them) learn of another rank's timeout only through its
    failure file: the watchdog writes one before it ends the process."""
    from commbench.run import guard as guard_mod

    ended = []
    g0 = guard_mod.Guard(0, 4, tmp_path, 3.0, launch="L")
    g0.start()
    monkeypatch.setattr(g0, "_end", lambda status, reason, code: ended.append((status, reason, code)))
    g0.members = 2
    g0.arm("all_reduce 1M (timed loop)")
    g2 = guard_mod.Guard(2, 4, tmp_path, 3.0, launch="L")
    g2.start()
    g2.idle("waiting for ranks 0-1 to finish world 2")
    try:
        g0._fatal_timeout("all_reduce 1M (timed loop)")
        assert ended and ended[0][2] == guard_mod.EXIT_TIMEOUT
        peer = g2.peer_failure()
        assert peer is not None and peer[0] == 0 and "timeout" in peer[1]
        assert "ranks not arrived: 1" in ended[0][1] and "2" not in ended[0][1].split("not arrived:")[1][:4]
    finally:
        g0.stop()
        g2.stop()


@pytest.mark.multirank
def test_the_teardown_is_bounded_even_when_the_interpreter_is_held():
    """The watchdog thread cannot run while a library call keeps the interpreter's lock
    (MPI_Finalize behind a lost link): the kernel timer around the teardown ends the process
    anyway. Here the held call is a C sleep through ctypes.pythonapi, which keeps the lock."""
    code = ("import ctypes, sys\n"
            "from commbench.run.guard import teardown_bound\n"
            "libc = ctypes.PyDLL(None)\n"  # PyDLL: the call keeps the interpreter's lock
            "with teardown_bound(1.0):\n"
            "    libc.sleep(30)\n"
            "sys.exit(0)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == -signal.SIGALRM, (p.returncode, p.stderr)
    assert took < 10, took
    ok = subprocess.run([sys.executable, "-c", "from commbench.run.guard import teardown_bound\n"
                         "with teardown_bound(5.0):\n    pass\nimport time; time.sleep(6)\n"],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr  # a teardown that returns in time cancels the timer


def test_a_rank_stopped_by_a_signal_waits_for_rank_0_to_mark_the_run(tmp_path, monkeypatch):
    """Case: SIGTERM then SIGKILL to `run --np` left meta.json "running" now and then: rank 1
    exited on the SIGTERM at once, and mpirun killed the job (rank 0 with it) while rank 0
    wrote the status. A rank other than 0 now waits, bounded, for rank 0's mark."""
    import time

    from commbench.run import guard as guard_mod
    from commbench.run.contract import LAUNCH_ID_ENV, marked_path

    monkeypatch.setenv(LAUNCH_ID_ENV, "L1")
    monkeypatch.setattr(guard_mod, "MARK_WAIT_S", 0.5)
    g1 = guard_mod.Guard(1, 2, tmp_path, 3.0, launch="L1")
    g1.start()
    try:
        t0 = time.monotonic()
        g1._await_mark()  # no mark: waits its bound, then goes
        waited = time.monotonic() - t0
        assert 0.45 <= waited
        mark = marked_path(tmp_path, "L1")
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
        t0 = time.monotonic()
        g1._await_mark()  # marked: goes at once
        assert time.monotonic() - t0 < waited
    finally:
        g1.stop()
    g0 = guard_mod.Guard(0, 2, tmp_path, 3.0, launch="L1", on_fatal=lambda *a: None)
    t0 = time.monotonic()
    g0._await_mark()  # rank 0 marks, it does not wait for itself
    assert time.monotonic() - t0 < 0.45
