from commbench.launch import detect, mpirun_command


def test_detect_each_launcher():
    assert detect({}).launcher == "none" and detect({}).world == 1
    i = detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
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
