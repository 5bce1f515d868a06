"""A hostile environment: stale launch variables, damaged run records, unwritable places,
closed or vanished stdout, broken plug-ins, ranks or coordinators that never come. Every
case ends in a bounded time with one line that names its cause (exit 2), or, where the
user did nothing wrong (a reader of stdout that left), with the command's own result."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reliability_job import _fill, small_disk  # noqa: F401  (a 1 MiB tmpfs, and filling it)

from conftest import FIXTURES, ROOT, needs_mpi, needs_torch, run_cli, run_meta, run_rows, starts_processes


def _one_line(r, *words):
    """Exit 2, no traceback, exactly one line on stderr, naming each of words."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("commbench: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _clean_env(**extra):
    """The environment of a plain shell: no launch variables of the test's own launcher."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "PMI_", "SLURM_", "COMMBENCH_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    return {**keep, **extra}


def _run(args, env, timeout=120, **kw):
    e = _clean_env(**env)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "plugins"), e.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
@starts_processes
def imported(tmp_path_factory):
    d = tmp_path_factory.mktemp("imp")
    for name in ("a", "b"):
        r = run_cli("import", FIXTURES / "nccl_all_reduce_8gpu.txt", "--out", d / name, timeout=120)
        assert r.returncode == 0, r.stderr
    return d


def _fake_run(d: Path, status: str = "failed") -> Path:
    """A commbench run's record as `run` leaves it, without measuring anything."""
    d.mkdir(parents=True)
    meta = {"schema": 3, "status": status, "suite": "quick", "backend": "gloo", "device": "cpu", "world": 1,
            "config": {"name": "quick", "benchmarks": ["all_reduce"], "sizes": [8]}, "variants": {}}
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "rows.jsonl").write_text("")
    return d


# --- damaged or foreign run records --------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", "empty"])
@pytest.mark.parametrize("command", ["report", "resume"])
@pytest.mark.multirank
def test_damaged_meta_json_is_one_line(imported, tmp_path, damage, command):
    d = tmp_path / "run"
    if command == "resume":
        _fake_run(d)
    else:
        import shutil

        shutil.copytree(imported / "a", d)
    text = (d / "meta.json").read_text()
    (d / "meta.json").write_text(text[:20] if damage == "truncated" else "")
    args = ("report", d) if command == "report" else ("run", "--resume", d, "--np", "1")
    _one_line(_run(args, {}), "meta.json", damage if damage == "empty" else "not JSON")


@pytest.mark.parametrize("status", ["complete", "failed"])
@pytest.mark.multirank
def test_resume_of_an_imported_run_is_refused_by_name(imported, tmp_path, status):
    import shutil

    d = tmp_path / "imp"
    shutil.copytree(imported / "a", d)
    meta = run_meta(d)
    meta["status"] = status
    (d / "meta.json").write_text(json.dumps(meta))
    _one_line(_run(("run", "--resume", d, "--np", "1"), {}), "imported", "nothing to resume")


@pytest.fixture
def read_only_dir(tmp_path):
    """A run directory on a read-only bind mount."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    _fake_run(src / "run")
    ro.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    r = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {r.stderr.strip()}")
    r = subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        pytest.skip(f"cannot remount read-only here: {r.stderr.strip()}")
    yield ro / "run"
    subprocess.run(["umount", "-l", str(ro)], capture_output=True)


@pytest.mark.parametrize("launch", [("--np", "1"), ()], ids=["np", "external"])
@pytest.mark.multirank
def test_resume_on_a_read_only_mount_is_one_line(read_only_dir, launch):
    _one_line(_run(("run", "--resume", read_only_dir, *launch, "--backend", "gloo"), {}), str(read_only_dir),
              "read-only")


def test_run_lock_on_a_read_only_place_is_a_usage_error(read_only_dir):
    from commbench.core.errors import UsageError
    from commbench.store.lock import RunLock

    with pytest.raises(UsageError, match="cannot take the run's lock"):
        RunLock(read_only_dir).acquire()


# --- unwritable outputs ---------------------------------------------------------------

@pytest.mark.parametrize("target", ["dir", "/dev/full"])
@pytest.mark.multirank
def test_compare_csv_that_cannot_be_written_exits_2_not_1(imported, tmp_path, target):
    csv = tmp_path if target == "dir" else Path(target)
    if target == "/dev/full" and not Path(target).exists():
        pytest.skip("no /dev/full on this system")
    _one_line(_run(("compare", imported / "a", imported / "b", "--csv", csv), {}), "--csv", str(csv))


@pytest.mark.multirank
def test_import_onto_a_full_disk_is_one_line(small_disk):  # noqa: F811
    _fill(small_disk)
    _one_line(_run(("import", FIXTURES / "nccl_all_reduce_8gpu.txt", "--out", small_disk / "imp"), {}),
              "import", "No space left")


@pytest.mark.multirank
def test_report_out_onto_a_full_disk_is_one_line(imported, small_disk):  # noqa: F811
    _fill(small_disk)
    line = _one_line(_run(("report", imported / "a", "--out", small_disk / "rep"), {}, timeout=300),
                     "report --out", "No space left")
    assert str(small_disk / "rep") in line


# --- stdout closed, or its reader gone ------------------------------------------------

@pytest.mark.parametrize("command", ["report", "compare", "ceilings"])
@pytest.mark.multirank
def test_closed_stdout_is_no_error(imported, command):
    args = {"report": ("report", imported / "a"), "compare": ("compare", imported / "a", imported / "b"),
            "ceilings": ("ceilings",)}[command]
    r = _run(args, {}, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("backend", [pytest.param("mpi", marks=needs_mpi), pytest.param("gloo", marks=needs_torch)])
@pytest.mark.multirank
def test_a_run_with_stdout_closed_completes(tmp_path, backend):
    out = tmp_path / "run"
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8,16", "--iters", "2", "--warmup", "1", "--backend",
              backend, "--np", "2", "--out", out), {}, timeout=300, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert run_meta(out)["status"] == "complete"
    assert len(run_rows(out)) == 2


def _into_closed_pipe(args, timeout=300):
    """Run commbench with its stdout a pipe whose reader has already left (`| head -1`
    once head has its line): returns (exit status, stderr)."""
    rfd, wfd = os.pipe()
    os.close(rfd)
    e = _clean_env()
    p = subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], stdout=wfd, stderr=subprocess.PIPE,
                       text=True, timeout=timeout, env=e, cwd=ROOT)
    os.close(wfd)
    return p.returncode, p.stderr


@pytest.mark.parametrize("command", ["list", "report"])
@pytest.mark.multirank
def test_a_reader_that_left_is_no_error(imported, command):
    rc, err = _into_closed_pipe(("list",) if command == "list" else ("report", imported / "a"))
    assert rc == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.multirank
def test_compare_gate_keeps_its_status_when_the_reader_left(imported):
    rc, err = _into_closed_pipe(("compare", imported / "a", imported / "b", "--fail-on-regression"))
    assert rc == 0 and "Traceback" not in err, err  # the same rows: nothing slower


@pytest.mark.parametrize("backend", [pytest.param("mpi", marks=needs_mpi), pytest.param("gloo", marks=needs_torch)])
@pytest.mark.multirank
def test_a_run_whose_reader_left_keeps_measuring(tmp_path, backend):
    out = tmp_path / "run"
    rc, err = _into_closed_pipe(("run", "quick", "-b", "all_reduce", "--sizes", "8:1K", "--iters", "3", "--warmup",
                                 "1", "--backend", backend, "--np", "2", "--out", out))
    meta = run_meta(out)
    rows = run_rows(out)
    assert (rc, meta["status"], len(rows)) == (0, "complete", 8), (rc, meta.get("reason"), len(rows), err)
    assert "Traceback" not in err, err


# --- plug-ins ---------------------------------------------------------------------------

@pytest.mark.parametrize("body, kind", [("raise RuntimeError('boom in the plug-in')\n", "RuntimeError"),
                                        ("def broken(:\n", "SyntaxError")], ids=["raises", "syntax"])
@pytest.mark.multirank
def test_a_plugin_that_fails_to_load_is_one_line(tmp_path, body, kind):
    (tmp_path / "bad_plugin_mod.py").write_text(body)
    r = _run(("list",), {"COMMBENCH_PLUGINS": "bad_plugin_mod", "PYTHONPATH": str(tmp_path)})
    _one_line(r, "COMMBENCH_PLUGINS", "bad_plugin_mod", kind)


# --- stale launch variables -------------------------------------------------------------

@pytest.mark.parametrize("args", [("report", "/nonexistent-run"), ("run", "quick", "--sizes", "junk"),
                                  ("compare", "/nonexistent-a", "/nonexistent-b")], ids=["report", "run", "compare"])
@pytest.mark.parametrize("stale", [{"RANK": "1", "WORLD_SIZE": "2"},
                                   {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29999"}], ids=["rank", "port"])
@pytest.mark.multirank
def test_a_refusal_under_stale_rank_variables_is_said(args, stale):
    for _ in range(2):  # the second time too: no marker of the first may silence it
        _one_line(_run(args, stale))


@pytest.mark.multirank
def test_open_mpi_rank_without_its_size_is_named():
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", "mpi"), {"OMPI_COMM_WORLD_RANK": "0"})
    _one_line(r, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")


@pytest.mark.parametrize("launch", [(), ("--np", "2")], ids=["external", "np"])
@pytest.mark.multirank
def test_stale_open_mpi_variables_are_named(tmp_path, launch):
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", "gloo", "--out", tmp_path / "r",
              *launch), {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    _one_line(r, "OMPI_COMM_WORLD_RANK=1", "stale")
    assert not (tmp_path / "r").exists()


@pytest.mark.multirank
def test_a_stale_launcher_pid_is_named(tmp_path):
    # A pid that names no process: one past the highest the kernel hands out.
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1 if Path("/proc/sys/kernel/pid_max").exists() \
        else 4194305
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", "gloo", "--iters", "2", "--out",
              tmp_path / "r"), {"COMMBENCH_LAUNCHER_PID": str(gone)})
    _one_line(r, f"COMMBENCH_LAUNCHER_PID={gone}")
    assert not (tmp_path / "r").exists()


# --- every wait before the watchdog is bounded ------------------------------------------

def _free_port() -> int:
    from commbench.backends.rendezvous import free_port

    return free_port()


BOUND_S = 5
# Interpreter, torch or jax start-up on 2 busy cores, on top of the bound.
START_SLACK_S = 45


@pytest.mark.parametrize("backend", [pytest.param("gloo", marks=needs_torch), "jax"])
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.multirank
def test_a_rank_that_never_comes_ends_start_up_within_the_timeout(tmp_path, backend, rank):
    """One rank of two started by hand, the other never: the start-up waits the run's
    --timeout, not the library's 10 minutes (torch) or 5 and a C++ abort (jax)."""
    if backend == "jax":
        pytest.importorskip("jax")
    port = _free_port()
    t0 = time.monotonic()
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", backend, "--timeout", BOUND_S,
              "--out", tmp_path / "r"),
             {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
             timeout=BOUND_S + START_SLACK_S + 60)
    took = time.monotonic() - t0
    line = _one_line(r, f"{BOUND_S} s", "--timeout", str(port))
    assert took < BOUND_S + START_SLACK_S, (took, line)


@pytest.mark.multirank
def test_an_unanswering_jax_coordinator_is_bounded(tmp_path):
    pytest.importorskip("jax")
    port = _free_port()
    t0 = time.monotonic()
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", "jax", "--timeout", BOUND_S,
              "--out", tmp_path / "r"),
             {"RANK": "1", "WORLD_SIZE": "2", "COMMBENCH_JAX_COORDINATOR": f"127.0.0.1:{port}"},
             timeout=BOUND_S + START_SLACK_S + 60)
    _one_line(r, "COMMBENCH_JAX_COORDINATOR", f"{BOUND_S} s")
    assert "Check failure" not in r.stderr
    assert time.monotonic() - t0 < BOUND_S + START_SLACK_S


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("case", ["junk", "no-port", "busy"])
@pytest.mark.multirank
def test_a_bad_jax_coordinator_is_one_line(tmp_path, busy_port, case):
    pytest.importorskip("jax")
    value = {"junk": "junk", "no-port": "127.0.0.1:http", "busy": f"127.0.0.1:{busy_port}"}[case]
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", "jax", "--iters", "2",
              "--out", tmp_path / "r"), {"COMMBENCH_JAX_COORDINATOR": value})
    _one_line(r, "COMMBENCH_JAX_COORDINATOR", *(["in use"] if case == "busy" else []))


@pytest.mark.parametrize("backend", [pytest.param("gloo", marks=needs_torch), "jax"])
@pytest.mark.parametrize("case", ["99999", "busy"])
@pytest.mark.multirank
def test_a_bad_master_port_is_one_line(tmp_path, busy_port, backend, case):
    if backend == "jax":
        pytest.importorskip("jax")
    port = str(busy_port) if case == "busy" else case
    # One rank of a launch the torchrun way (RANK, WORLD_SIZE): without them `run` starts
    # its own local ranks, on a port it chooses.
    r = _run(("run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", backend, "--iters", "2",
              "--out", tmp_path / "r"), {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": "0",
                                         "WORLD_SIZE": "1"})
    _one_line(r, "MASTER_PORT", port)


# --- nothing left behind ----------------------------------------------------------------

@needs_mpi
@pytest.mark.multirank
def test_a_singleton_mpi_run_leaves_no_shared_memory_segment(tmp_path):
    """In a mount namespace of its own with an empty /dev/shm, so other runs on the host
    cannot add to what is counted."""
    if os.geteuid() != 0:
        pytest.skip("a private /dev/shm needs root (unshare -m)")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    e = _clean_env()
    script = (f"mount -t tmpfs tmpfs /dev/shm && {sys.executable} -m commbench run quick -b all_reduce --sizes 8 "
              f"--iters 2 --warmup 1 --backend mpi --out {tmp_path / 'r'} >/dev/null && ls -A /dev/shm")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=300, env=e, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert run_meta(tmp_path / "r")["status"] == "complete"
    assert r.stdout.split() == [], r.stdout


def _twohosts():
    sys.path.insert(0, str(ROOT / "tools"))
    import twohosts

    why = twohosts.TwoHosts.unavailable()
    if why:
        pytest.skip(f"two hosts cannot be made here: {why}")
    return twohosts


def _left_of(twohosts, state: Path, names: dict, wire_pid: int | None) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mounts = Path("/proc/self/mountinfo").read_text()
    return ([ns for ns in names["netns"] if ns in listed] + [u for u in names["uts"] if u in mounts]
            + [d for d in names["dirs"] if Path(d).exists()] + ([str(state)] if state.exists() else [])
            + ([f"delay line pid {wire_pid}"] if wire_pid and twohosts._alive(wire_pid) and
               Path(f"/proc/{wire_pid}").exists() and b"wire" in Path(f"/proc/{wire_pid}/cmdline").read_bytes()
               else []))


@pytest.mark.parametrize("command", [["hold", "--delay-ms", "1"],
                                     ["link", "--rate-mbit", "20", "--delay-ms", "1"]], ids=["hold", "link"])
@pytest.mark.multirank
def test_a_killed_two_hosts_owner_leaves_nothing_behind(tmp_path, command):
    """SIGKILL reaches no handler: what the set made (namespaces, UTS mounts, scratch and
    the real-time delay line) must go with its owner, not wait for the next start."""
    import signal

    twohosts = _twohosts()
    args = command + (["--out", str(tmp_path)] if command[0] == "link" else [])
    p = subprocess.Popen([sys.executable, str(ROOT / "tools" / "twohosts.py"), *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd=ROOT, env=_clean_env())
    state, deadline = None, time.monotonic() + 120
    try:
        while time.monotonic() < deadline and p.poll() is None:  # up: the delay line is running
            for d in twohosts.STATE_ROOT.glob("*") if twohosts.STATE_ROOT.is_dir() else []:
                if (d / "owner").is_file() and (d / "owner").read_text().strip() == str(p.pid) and \
                        (d / "wire.pid").is_file() and (d / "agent").is_file():
                    state = d
            if state is not None:
                break
            time.sleep(0.2)
        assert state is not None, f"the hosts did not come up (exit {p.poll()})"
        names = json.loads((state / "names.json").read_text())
        wire_pid = int((state / "wire.pid").read_text())
        assert _left_of(twohosts, state, names, wire_pid)  # made, and seen
        p.send_signal(signal.SIGKILL)
        p.wait()
        t0 = time.monotonic()
        while _left_of(twohosts, state, names, wire_pid) and time.monotonic() - t0 < 20:
            time.sleep(0.2)
        assert _left_of(twohosts, state, names, wire_pid) == []
    finally:
        if p.poll() is None:
            p.kill()
        if state is not None and state.exists():
            twohosts.teardown_dir(state)
