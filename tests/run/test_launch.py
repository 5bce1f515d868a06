import pytest

from commbench.core.whoami import detect
from commbench.run.launcher import mpirun_command
from conftest import run_meta, run_rows


def test_detect_each_launcher():
    assert detect({}).launcher == "none" and detect({}).world == 1
    i = detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "PMIX_NAMESPACE": "prterun-host-1@1"})
    assert (i.rank, i.world, i.local_rank, i.launcher) == (3, 8, 1, "mpirun")
    i = detect({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2"})
    assert (i.rank, i.world, i.local_rank, i.launcher) == (2, 4, 2, "mpich")
    i = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "8"})
    assert (i.rank, i.world, i.local_rank, i.launcher) == (5, 8, 1, "srun")
    i = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (i.rank, i.world, i.local_rank, i.launcher) == (1, 2, 1, "torchrun")


@pytest.mark.multirank
def test_mpirun_command_for_root_and_oversubscription(tmp_path, monkeypatch):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.11'\n")
    fake.chmod(0o755)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cmd = mpirun_command(4, ["run", "quick"], str(fake))
    assert cmd[:3] == [str(fake), "-np", "4"]
    assert "--allow-run-as-root" in cmd and "--oversubscribe" in cmd
    assert cmd[-4:] == ["-m", "commbench", "run", "quick"]
    assert "--oversubscribe" not in mpirun_command(2, ["run"], str(fake))


def test_say_once_prints_from_the_first_rank_of_a_launch_only(tmp_path, monkeypatch, capsys):
    """Whichever rank reaches the line first prints it (rank 0 included or not); the others
    stay silent and linger, so mpirun cannot cut the printer off by their exit. The marker
    they agree through is gone afterwards: removed by the last rank of the host to arrive,
    or, where one never arrives (mpirun ended the job first), by the rank that printed."""
    import threading
    import time

    from commbench.run import contract
    from commbench.run.contract import job_key, say_once

    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    job = {"PMIX_NAMESPACE": f"prterun-test-{time.time_ns()}", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert job_key(job) and job_key({}) is None
    first = threading.Thread(target=say_once, args=("commbench: error: x", dict(job, OMPI_COMM_WORLD_RANK="1")))
    first.start()  # rank 1 first
    while not any(tmp_path.iterdir()):
        time.sleep(0.01)
    t0 = time.monotonic()
    say_once("commbench: error: x", dict(job, OMPI_COMM_WORLD_RANK="0"))
    assert time.monotonic() - t0 >= 0.9  # the late one lingers
    first.join()
    assert capsys.readouterr().err == "commbench: error: x\n"
    assert not list(tmp_path.iterdir())  # the last to arrive removed the marker
    # Rank 0 never arrives (the job was ended first): the printer removes the marker itself,
    # within its bound, rather than leave it in /tmp.
    monkeypatch.setattr(contract, "SAID_WAIT_S", 0.2)
    say_once("commbench: error: y", dict(job, OMPI_COMM_WORLD_RANK="0"))  # another line: said again
    assert capsys.readouterr().err == "commbench: error: y\n"
    assert not list(tmp_path.iterdir())


def _busy(n):
    import subprocess
    import sys

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.multirank
def test_a_refusal_under_mpirun_reaches_the_user_once_with_the_cores_busy(tmp_path):
    """Every rank refuses the same bad flag; with both cores busy, the rank that exits first
    is a matter of scheduling. The line must reach the user every time, exactly once."""
    import importlib.util
    import os
    import subprocess

    import pytest

    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py not installed")
    from conftest import ROOT

    hogs = _busy(os.cpu_count() or 2)
    try:
        for i in range(4):
            cmd = mpirun_command(2, ["run", "quick", "-b", "no_such_bench", "--out", str(tmp_path / f"r{i}")])
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
            said = (p.stdout + p.stderr).count("commbench: error: unknown benchmark")
            assert p.returncode != 0 and said == 1, (i, p.stdout, p.stderr)
    finally:
        for h in hogs:
            h.kill()


@pytest.mark.multirank
def test_the_launcher_learns_that_the_run_is_marked_from_its_own_launch_not_from_meta_json(tmp_path, monkeypatch):
    """meta.json holds the status the previous launch wrote (a resumed failed run, the variant
    launched before) until rank 0 of this one reopens it: the launcher's drain bound starts
    only when rank 0 of its own launch says the run is marked, whatever meta.json says."""
    import json
    import subprocess
    import sys
    import time

    from commbench.run import contract, launcher

    # A "rank" that lingers 30 s: with a meta.json that says failed (an earlier launch's),
    # the launcher must keep waiting; once its own rank 0 says marked, the drain bound
    # (GRACE_S, timeout 0) stops it.
    (tmp_path / "meta.json").write_text(json.dumps({"status": "failed", "config": {"timeout_s": 0.5}}))
    monkeypatch.setattr(launcher, "GRACE_S", 1.0)
    lid = contract.new_launch_id()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    t0 = time.monotonic()
    try:
        import threading

        def say():
            time.sleep(3.0)
            monkeypatch.setenv(contract.LAUNCH_ID_ENV, lid)
            contract.say_marked("marked", tmp_path)
        threading.Thread(target=say, daemon=True).start()
        status = launcher._wait_job([p], [], str(tmp_path), lid, timeout_s=0.5)
    finally:
        p.kill()
        contract.marked_path(tmp_path, lid).unlink(missing_ok=True)
    took = time.monotonic() - t0
    assert status == launcher.EXIT_TEARDOWN_HUNG
    assert took >= 3.0, "the drain bound started from meta.json's status, not from the launch's own rank 0"
    assert took < 15.0


def _srun_env(procid: int, job: str | None = None, **extra) -> dict:
    """What srun sets for one of 2 tasks, in an environment no other launcher touched (an MPI
    without PMIx support for this Slurm then sees a world of 1). A job id of its own each
    time: the ranks of one job print a refusal once per host (contract.say_once)."""
    import os
    import uuid

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "PRTE_", "MASTER_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COMMBENCH_TTY")}
    env.update(SLURM_PROCID=str(procid), SLURM_NTASKS="2", SLURM_JOB_ID=job or uuid.uuid4().hex, SLURM_STEP_ID="0",
               SLURM_LOCALID=str(procid), PYTHONPATH=str(ROOT / "tests" / "plugins"), **extra)
    return env


def _commbench(args, env, timeout=120):
    import subprocess
    import sys

    from conftest import ROOT

    return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
@pytest.mark.parametrize("procid", [0, 1])
@pytest.mark.multirank
def test_srun_with_an_mpi_that_cannot_see_the_job_is_refused_not_shrunk(tmp_path, backend, procid):
    """srun says 2 tasks, MPI sees 1: mpi would run as world 1 (recorded as an srun run of 2),
    gloo would fail inside the rendezvous. Refused in one line that says why and what to do."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None or (backend == "gloo" and importlib.util.find_spec("torch") is None):
        pytest.skip(f"mpi4py{' and torch' if backend == 'gloo' else ''} not installed")
    out = tmp_path / "run"
    p = _commbench(["run", "quick", "-b", "all_reduce", "--sizes", "8", "--backend", backend, "--out", out],
                   _srun_env(procid))
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("commbench: error: "), p.stderr
    assert "srun" in lines[0] and "2 ranks" in lines[0] and "MPI sees a world of 1" in lines[0], lines[0]
    assert "srun --mpi=pmix" in lines[0]
    if backend == "gloo":
        assert "MASTER_ADDR" in lines[0] and "MASTER_PORT" in lines[0]
    assert not (out / "rows.jsonl").exists()


@pytest.mark.multirank
def test_srun_with_master_addr_runs_gloo_as_the_whole_job(tmp_path):
    """The way out the refusal names for the torch backends: with MASTER_ADDR and MASTER_PORT
    given, the 2 tasks srun started meet without MPI and run as one world of 2."""
    import importlib.util
    import subprocess
    import sys

    from commbench.backends.rendezvous import free_port
    from conftest import ROOT

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed")
    out, port = tmp_path / "run", free_port()
    args = [sys.executable, "-m", "commbench", "run", "quick", "-b", "all_reduce", "--sizes", "8,1K", "--iters", "5",
            "--backend", "gloo", "--out", str(out)]
    procs = [subprocess.Popen(args, cwd=ROOT, env=_srun_env(r, f"job-{port}", MASTER_ADDR="127.0.0.1",
                                                            MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    res = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], res
    meta = run_meta(out)
    assert meta["world"] == 2 and meta["launcher"] == "srun" and meta["status"] == "complete"
    assert {r["world"] for r in run_rows(out)} == {2}


def test_world_mismatch_names_the_launcher_and_the_way_out():
    from commbench.core.whoami import LaunchInfo, world_mismatch

    assert world_mismatch(LaunchInfo(1, 4, 1, "srun"), 4) is None
    why = world_mismatch(LaunchInfo(1, 4, 1, "srun"), 1)
    assert "srun started 4 ranks" in why and "MPI sees a world of 1" in why and "srun --mpi=pmix" in why
    assert "MASTER_ADDR" not in why
    assert "MASTER_ADDR" in world_mismatch(LaunchInfo(0, 4, 0, "srun"), 1, torch_backend=True)
    assert "use mpirun or srun" in world_mismatch(LaunchInfo(0, 2, 0, "torchrun"), 1)


@pytest.mark.multirank
def test_a_local_open_mpi_5_job_is_limited_to_shared_memory_unless_told_otherwise(tmp_path):
    """launcher.local_mpi_env: every rank of a --np job is on this host, so Open MPI 5 gets
    OMPI_MCA_btl=self,sm (its TCP transport cost 1 s of every launch's start on the loopback
    VM); a btl the user or a variant named is kept; Open MPI 4 and MPICH are left alone."""
    from commbench.run.launcher import local_mpi_env

    def fake(banner):
        f = tmp_path / f"mpirun{abs(hash(banner))}"
        f.write_text(f"#!/bin/sh\necho '{banner}'\n")
        f.chmod(0o755)
        return str(f)
    assert local_mpi_env({"A": "1"}, fake("mpirun (Open MPI) 5.0.11")) == {"A": "1", "OMPI_MCA_btl": "self,sm"}
    assert local_mpi_env({"OMPI_MCA_btl": "tcp,self"}, fake("mpirun (Open MPI) 5.0.11")) == {"OMPI_MCA_btl": "tcp,self"}
    assert local_mpi_env({}, fake("mpirun (Open MPI) 4.1.5")) == {}
    assert local_mpi_env({}, fake("HYDRA build details:")) == {}
    assert local_mpi_env({}, str(tmp_path / "missing")) == {}


def test_a_port_the_launcher_chooses_is_below_the_ephemeral_range():
    """A port from the ephemeral range can become the local end of another connection between
    the launcher's choice and rank 0's listen ("port in use"); below it, only a listener takes it."""
    from commbench.backends.rendezvous import _ephemeral_low, free_port

    lo = _ephemeral_low()
    ports = [free_port() for _ in range(8)]
    assert all(max(1024, lo - 12000) <= p < lo for p in ports), (lo, ports)
    assert len(set(ports)) > 1  # chosen at random, not the same port for launches side by side
