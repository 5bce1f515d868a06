"""The GPU path's refusals, before any rank starts (no GPU needed): one GPU per NCCL rank,
CUDA buffers only on a CUDA-aware MPI, the inswitch baseline per backend."""
from __future__ import annotations

import pytest

from commbench import cli
from commbench.backends import gpus
from commbench.core.errors import UsageError
from conftest import needs_mpi, run_cli


def test_visible_gpus_follows_cuda_visible_devices(tmp_path, monkeypatch):
    proc = tmp_path / "gpus"
    proc.mkdir()
    for i in range(4):
        (proc / f"0000:0{i}:00.0").mkdir()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.visible_gpus(str(proc)) == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert gpus.visible_gpus(str(proc)) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,-1,2")  # CUDA stops at the first invalid id
    assert gpus.visible_gpus(str(proc)) == 1
    for off in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", off)
        assert gpus.visible_gpus(str(proc)) == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus.visible_gpus(str(tmp_path / "none")) == 0


def test_more_nccl_ranks_than_gpus_is_refused_naming_both():
    gpus.check_ranks_per_gpu(8, 8, "nccl")
    gpus.check_ranks_per_gpu(4, 1, "gloo")  # CPU ranks need no GPU
    with pytest.raises(UsageError, match="2 ranks on this host, 1 visible GPU"):
        gpus.check_ranks_per_gpu(2, 1, "nccl")


def test_cli_refuses_two_nccl_ranks_on_one_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "visible_gpus", lambda *a: 1)
    rc = cli.main(["run", "quick", "--backend", "nccl", "--np", "2", "--sizes", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "one GPU per rank: 2 ranks on this host, 1 visible GPU(s)" in err[0]


def test_cuda_aware_answer(monkeypatch, tmp_path):
    def fake(name, text):
        p = tmp_path / name
        p.write_text(f"#!/bin/sh\necho '{text}'\n")
        p.chmod(0o755)
    fake("ompi_info", "mca:opal:base:param:opal_built_with_cuda_support:value:true")
    assert gpus.mpi_cuda_support(str(tmp_path)) == (True, "ompi_info: built_with_cuda_support true")
    assert gpus.check_cuda_aware_mpi(False, str(tmp_path)).startswith("ompi_info")
    fake("ompi_info", "mca:opal:base:param:opal_built_with_cuda_support:value:false")
    with pytest.raises(UsageError, match="not CUDA-aware|and this one is not"):
        gpus.check_cuda_aware_mpi(False, str(tmp_path))
    (tmp_path / "ompi_info").unlink()
    fake("mpichversion", "MPICH Version: 4.2\nMPICH Configure: --prefix=/x --with-cuda=/usr/local/cuda")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.mpi_cuda_support(str(tmp_path))[0] is True
    monkeypatch.setenv("MPIR_CVAR_ENABLE_GPU", "0")
    assert gpus.mpi_cuda_support(str(tmp_path))[0] is False
    (tmp_path / "mpichversion").unlink()
    assert gpus.mpi_cuda_support(str(tmp_path))[0] is None
    with pytest.raises(UsageError, match="cannot be asked.*--cuda-aware-mpi"):
        gpus.check_cuda_aware_mpi(False, str(tmp_path))
    assert gpus.check_cuda_aware_mpi(True, str(tmp_path)) == "--cuda-aware-mpi"


@needs_mpi
def test_cuda_buffers_on_the_open_mpi_wheel_are_refused_in_one_line(tmp_path):
    """The Open MPI wheel is built without CUDA: --device cuda must not reach MPI_Allreduce."""
    r = run_cli("run", "quick", "--backend", "mpi", "--device", "cuda", "--np", "2", "--sizes", "8",
                "--out", tmp_path / "run")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA-aware MPI" in lines[0] and "built_with_cuda_support false" in lines[0]
    assert not (tmp_path / "run").exists()


def test_inswitch_baseline_is_chosen_per_backend():
    from commbench.run import suite
    from commbench.run.variants import plan

    cfg = suite.build_config(suite.read_suite("inswitch"))
    caps = {"nvls": True, "collnet": True, "symm_mem": True}
    assert plan(cfg, "nccl", "cuda", None, "", caps).baseline == "nccl-ring"
    assert plan(cfg, "mpi", "cpu", None, "Open MPI", None).baseline == "ompi-ring"


def _fake_cupy_nccl(monkeypatch, calls, with_bf16=True):
    import sys
    import types

    nccl = types.SimpleNamespace(NCCL_FLOAT32=7, NCCL_FLOAT16=6, NCCL_INT32=2, NCCL_SUM=0,
                                 get_unique_id=lambda: "uid")
    if with_bf16:
        nccl.NCCL_BFLOAT16 = 9

    class Comm:
        def __init__(self, size, uid, rank):
            calls.append(("init", size, uid, rank))

        def allReduce(self, s, r, n, dt, op, stream):
            calls.append(("allReduce", s, r, n, dt, op, stream))
    nccl.NcclCommunicator = Comm
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = nccl
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)


def test_out_of_place_all_reduce_on_nccl_goes_through_cupy(monkeypatch):
    """torch.distributed has no out-of-place all_reduce: on CUDA the default (out-of-place)
    all_reduce drives the same NCCL through cupy, on torch's current stream, read at each
    call (a CUDA-graph capture changes it); the in-place one stays torch's."""
    import types

    pytest.importorskip("torch")
    from commbench.backends.torch_dist import TorchComm
    from commbench.benchmarks import Point, get

    calls: list = []
    _fake_cupy_nccl(monkeypatch, calls)
    streams = iter([101, 202])
    comm = TorchComm.__new__(TorchComm)
    comm.rank, comm.size, comm.device, comm.symm_mem, comm.in_place, comm._nccl = 0, 1, "cuda", False, False, None
    comm.group = None
    import torch
    comm._dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    comm._names = {t: n for n, t in comm._dtypes.items()}
    comm.allgather_obj = lambda obj: [obj]
    comm.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda: types.SimpleNamespace(cuda_stream=next(streams))))
    reduced = []
    comm.dist = types.SimpleNamespace(all_reduce=lambda t, group=None: reduced.append(t))
    send, recv = torch.zeros(16), torch.zeros(16)
    ar = get("all_reduce")
    assert ar.placement(comm, Point("all_reduce", 1, "float32", 64)) == "out-of-place"
    op = comm.all_reduce(send, recv)
    op()
    op()
    assert calls[0] == ("init", 1, "uid", 0)
    assert calls[1] == ("allReduce", send.data_ptr(), recv.data_ptr(), 16, 7, 0, 101)
    assert calls[2][-1] == 202 and not reduced
    comm.all_reduce(send, recv, in_place=True)()
    assert reduced == [recv]
    comm.in_place = True
    assert ar.placement(comm, Point("all_reduce", 1, "float32", 64)) == "in-place"
    comm.in_place = False
    monkeypatch.setenv("COMMBENCH_CUPY_NCCL", "0")
    assert ar.placement(comm, Point("all_reduce", 1, "float32", 64)) == "in-place"
    monkeypatch.delenv("COMMBENCH_CUPY_NCCL")
    _fake_cupy_nccl(monkeypatch, calls, with_bf16=False)  # a cupy without bf16 NCCL: in place
    assert ar.placement(comm, Point("all_reduce", 1, "bfloat16", 64)) == "in-place"
    comm.device = "cpu"  # gloo: torch only, in place
    assert ar.placement(comm, Point("all_reduce", 1, "float32", 64)) == "in-place"


@needs_mpi
@pytest.mark.parametrize("backend,flag,placement", [("mpi", [], "out-of-place"), ("mpi", ["--in-place"], "in-place"),
                                                    ("gloo", [], "in-place")])
def test_rows_say_their_placement_and_check_exactly(tmp_path, backend, flag, placement):
    """MPI reduces out of place by default and with MPI_IN_PLACE when asked; torch's gloo
    all_reduce works in place only, and its rows say so."""
    import json

    if backend == "gloo":
        pytest.importorskip("torch")
    out = tmp_path / "run"
    r = run_cli("run", "quick", "--backend", backend, "--np", "2", "-b", "all_reduce,broadcast", "--sizes", "64,4K",
                "--check", "--iters", "5", "--warmup", "1", "--out", out, *flag)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    ar = [x for x in rows if x["benchmark"] == "all_reduce"]
    assert {x["placement"] for x in ar} == {placement} and {x["check"] for x in rows} == {"ok"}
    assert all(x["point_key"].endswith("|" + x["placement"]) for x in rows)
    assert {x["placement"] for x in rows if x["benchmark"] == "broadcast"} == {"in-place"}


def test_report_shows_the_device_time_and_the_host_cost_beside_it(tmp_path):
    """A GPU row's p50 is device time (held batches); its host cost per operation is a
    column of its own, labelled, and an in-place row says so."""
    from commbench.store.results import RunDir, Status

    rd = RunDir(tmp_path / "gpu").open({"status": "running"})
    for place, p50 in (("in-place", 0.02), ("out-of-place", 1.1)):
        rd.append({"schema": 3, "benchmark": "all_reduce", "backend": "nccl", "device": "cuda", "world": 1,
                   "nbytes": 8, "dtype": "float32", "variant": "default", "placement": place, "params": {},
                   "stage": "", "iters": 50, "warmup": 5, "timing": "back_to_back", "clock": "cuda_event_held",
                   "time_us_min": p50, "time_us_p50": p50, "time_us_mean": p50, "time_us_p90": p50,
                   "time_us_p99": p50, "time_us_max": p50, "time_us_std": 0.0, "algbw_gbps": 0.0, "busbw_gbps": 0.0,
                   "busbw_factor": 0.0, "check": "ok", "ops_per_sample": 200, "host_us_per_op": 22.4,
                   "sample": "mean of 200 operations between one event pair, stream held while enqueued; "
                             "percentiles over batches", "held": True})
    rd.finish(Status.COMPLETE)
    r = run_cli("report", tmp_path / "gpu")
    assert r.returncode == 0, r.stderr
    assert "host (us/op)" in r.stdout and "22.40" in r.stdout and "placement" in r.stdout
    assert "sample = mean of 200 operations" in r.stdout and "in-place" in r.stdout
