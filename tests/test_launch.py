from commbench.launch import detect, mpirun_command


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
    stay silent and linger, so mpirun cannot cut the printer off by their exit."""
    import time

    from commbench.launch import job_key, say_once

    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    job = {"PMIX_NAMESPACE": f"prterun-test-{time.time_ns()}", "OMPI_COMM_WORLD_SIZE": "2"}
    assert job_key(job) and job_key({}) is None
    say_once("commbench: error: x", dict(job, OMPI_COMM_WORLD_RANK="1"))  # rank 1 first
    t0 = time.monotonic()
    say_once("commbench: error: x", dict(job, OMPI_COMM_WORLD_RANK="0"))
    assert time.monotonic() - t0 >= 0.9  # the late one lingers
    assert capsys.readouterr().err == "commbench: error: x\n"
    say_once("commbench: error: y", dict(job, OMPI_COMM_WORLD_RANK="0"))  # another line: said again
    assert capsys.readouterr().err == "commbench: error: y\n"


def _busy(n):
    import subprocess
    import sys

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


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
