"""The GPU path's refusals, before any rank starts (no GPU needed): one GPU per NCCL rank,
CUDA buffers only on a CUDA-aware MPI, the inswitch baseline per backend."""
from __future__ import annotations

import pytest

from commbench import cli
from commbench.backends import gpus
from commbench.core.errors import UsageError
from conftest import make_row, needs_mpi, run_cli, run_rows


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
@pytest.mark.multirank
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
@pytest.mark.multirank
def test_rows_say_their_placement_and_check_exactly(tmp_path, backend, flag, placement):
    """MPI reduces out of place by default and with MPI_IN_PLACE when asked; torch's gloo
    all_reduce works in place only, and its rows say so."""
    if backend == "gloo":
        pytest.importorskip("torch")
    out = tmp_path / "run"
    r = run_cli("run", "quick", "--backend", backend, "--np", "2", "-b", "all_reduce,broadcast", "--sizes", "64,4K",
                "--check", "--iters", "5", "--warmup", "1", "--out", out, *flag)
    assert r.returncode == 0, r.stderr
    rows = run_rows(out)
    ar = [x for x in rows if x["benchmark"] == "all_reduce"]
    assert {x["placement"] for x in ar} == {placement} and {x["check"] for x in rows} == {"ok"}
    assert all(x["point_key"].endswith("|" + x["placement"]) for x in rows)
    assert {x["placement"] for x in rows if x["benchmark"] == "broadcast"} == {"in-place"}


@pytest.mark.multirank
def test_report_shows_the_device_time_and_the_host_cost_beside_it(tmp_path):
    """A GPU row's p50 is device time (held batches); its host cost per operation is a
    column of its own, labelled, and an in-place row says so."""
    from commbench.store.results import RunDir, Status

    rd = RunDir(tmp_path / "gpu").open({"status": "running"})
    for place, p50 in (("in-place", 0.02), ("out-of-place", 1.1)):
        rd.append(make_row("all_reduce", 1, 8, p50, backend="nccl", device="cuda", placement=place, iters=50,
                           warmup=5, clock="cuda_event_held", algbw_gbps=0.0, busbw_gbps=0.0, busbw_factor=0.0,
                           ops_per_sample=200, host_us_per_op=22.4,
                           sample="mean of 200 operations between one event pair, stream held while enqueued; "
                                  "percentiles over batches", held=True))
    rd.finish(Status.COMPLETE)
    r = run_cli("report", tmp_path / "gpu")
    assert r.returncode == 0, r.stderr
    assert "host (us/op)" in r.stdout and "22.40" in r.stdout and "placement" in r.stdout
    assert "sample = mean of 200 operations" in r.stdout and "in-place" in r.stdout


# --- tools/gpu_check.py: runs on the GPU machine as it is, judges what it should ----------
def _gpu_check():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parents[2] / "tools"
                                                  / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _figures(f, place="out-of-place", held=True):
    return {"all_reduce": {n: (f(n, r), None, None, place, held) for n, r in _gpu_check().REF_ALL_REDUCE.items()}}


def test_out_of_place_targets_need_out_of_place_rows():
    """An all_reduce that fell back to in place (no cupy) is nccl-tests' in-place column:
    fast, and no evidence for the out-of-place targets."""
    gc = _gpu_check()
    fast = _figures(lambda n, r: 0.3, place="in-place")  # what an in-place fallback reads
    data = {"nccl-held": fast, "nccl-graph": fast}
    got = {t[0]: t[3] for t in gc.targets(data, {"cupy_ok": False, "cupy": "cupy is not importable", "cuda": "13.0"})}
    for name in ("out-of-place all_reduce 8 B-256 KiB, held", "--cuda-graph out-of-place all_reduce",
                 "out-of-place all_reduce 64 MiB, held"):
        assert got[name].startswith("SKIP (rows are in-place: cupy is not importable"), got[name]
        assert "cupy-cuda13x" in got[name]
    got = {t[0]: t[3] for t in gc.targets(data, {"cupy_ok": True})}
    assert got["out-of-place all_reduce 8 B-256 KiB, held"].startswith("MISS (rows are in-place")


def test_large_message_agreement_is_judged_at_64_mib_not_at_the_l2_edge():
    """16 MiB of source and destination fit the H200's L2: a device copy there beats
    nccl-tests' eager figure for reasons that are not the collective's."""
    gc = _gpu_check()
    ref = gc.REF_ALL_REDUCE
    data = {"nccl-held": _figures(lambda n, r: r[0] * (0.7 if n == 16 << 20 else 1.02))}
    got = {t[0]: t for t in gc.targets(data)}
    assert got["out-of-place all_reduce 64 MiB, held"][3] == "PASS"
    assert got["out-of-place all_reduce 16 MiB, held"][3].startswith("INFO")
    assert "+2.0%" in got["out-of-place all_reduce 64 MiB, held"][1] and str(ref[64 << 20][0]) in \
        got["out-of-place all_reduce 64 MiB, held"][2]


def test_unheld_rows_and_moe_rows_are_judged():
    gc = _gpu_check()
    data = {"nccl-held": _figures(lambda n, r: 1.0, held=False),
            "moe": [{"stage": "dispatch", "check": "ok", "held": True, "params": {"copies": "rank"}, "time_us_p50": 900},
                    {"stage": "combine", "check": "ok", "held": False, "params": {"copies": "rank"},
                     "time_us_p50": 800}]}
    got = {t[0]: t for t in gc.targets(data)}
    assert got["held rows covered by their hold"][3] == "MISS"
    assert got["moe on nccl, normal, DeepSeek-V3 shape, checks on"][3] == "MISS (1 row(s) not held)"
    assert got["moe on nccl, low-latency, T=128, checks on"][3] == "SKIP (moe did not run)"
    text = gc.table([("moe", "FAIL", "exit 1: boom"), ("hbm", "PASS", "ok")], gc.targets(data))
    lines = text.splitlines()
    assert lines[0].split() == ["target", "measured", "reference", "verdict"]
    assert any(ln.startswith("step moe") and ln.rstrip().endswith("FAIL (exit 1: boom)") for ln in lines)
    assert not any(ln.startswith("step hbm") for ln in lines)


def test_every_step_is_time_boxed_and_the_budget_skips_what_it_cannot_fit(tmp_path):
    gc = _gpu_check()
    now = [0.0]
    chk = gc.Check(tmp_path, budget_s=100.0, clock=lambda: now[0])

    def slow():
        now[0] += 96.0
        return "done"

    def late():
        return f"{chk.timeout:.0f} s left"
    res = gc.run_steps([("moe", slow), ("hbm", late), ("list", late)], chk)
    assert [r[1] for r in res] == ["PASS", "SKIP", "SKIP"]
    assert "budget is spent" in res[1][2]
    now[0] = 0.0
    chk = gc.Check(tmp_path, budget_s=100.0, clock=lambda: now[0])
    res = gc.run_steps([("hbm", late), ("moe", late)], chk)
    box = gc.STEP_LIMIT_S  # each step's own box
    assert res[0][2].startswith(f"{box['hbm']} s left") and res[1][2].startswith(f"{box['moe']} s left")
    chk = gc.Check(tmp_path, step_timeout=10.0, budget_s=100.0, clock=lambda: now[0])
    assert gc.run_steps([("moe", late)], chk)[0][2].startswith("10 s left")
    chk.start_step("moe")
    now[0] += 9.5
    with pytest.raises(gc.Failed, match="time box ran out"):
        chk.timeout
    # the real command is killed at its time box, and the step reads FAIL
    with pytest.raises(gc.Failed, match="timed out after 1 s"):
        gc.run_cmd(["sleep", "30"], tmp_path / "sleep.log", 1.0)


@pytest.mark.multirank
def test_run_cmd_runs_the_checkout_in_place(tmp_path):
    import sys

    gc = _gpu_check()
    cp = gc.run_cmd([sys.executable, "-c", "import commbench, os; print(commbench.__file__)"], tmp_path / "l.log", 30)
    assert cp.stdout.strip().startswith(str(gc.ROOT / "commbench"))


def test_gpu_check_says_in_one_line_what_is_missing(monkeypatch):
    gc = _gpu_check()
    monkeypatch.setattr(gc.gpu_preflight, "visible_gpus", lambda: 0)
    rc, line, _ = gc.preflight()
    assert rc == 3 and line.startswith("no CUDA device: nothing to check (") and "\n" not in line
    monkeypatch.setattr(gc.gpu_preflight, "visible_gpus", lambda: 1)
    import importlib.util

    orig = importlib.util.find_spec
    with monkeypatch.context() as m:
        m.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("pandas", "rich") else orig(name, *a))
        rc, line, _ = gc.preflight()
    assert rc == 4 and "lacks pandas, rich" in line and "GPU_PY=" in line and "\n" not in line
    pytest.importorskip("torch")
    import torch

    if torch.version.cuda is None:  # this machine's CPU torch: said, not a traceback
        rc, line, env = gc.preflight()
        assert rc == 3 and "is a CPU build" in line and "GPU_PY=" in line


def test_gpu_check_only_reruns_named_steps_and_keeps_the_others(tmp_path, monkeypatch, capsys):
    gc = _gpu_check()
    env = {"torch": "2.11.0+cu130", "cuda": "13.0", "gpus": 1, "cupy_ok": True, "cupy": "cupy 14.2 (CUDA 13)"}
    monkeypatch.setattr(gc, "preflight", lambda: (0, "", env))
    ran = []
    for name in gc.STEP_LIMIT_S:
        def step(self, name=name):
            ran.append(name)
            if name == "hbm":
                self.data["hbm"] = {"copy_gbps": 2000.0, "h200_hbm_gbps": 4800.0}
            if name == "moe":
                raise gc.Failed("exit 1: boom")
            return "fine"
        monkeypatch.setattr(gc.Check, "step_" + name.replace("-", "_"), step)
    assert gc.main(["--out", str(tmp_path)]) == 1
    assert ran == list(gc.STEP_LIMIT_S)
    ran.clear()
    capsys.readouterr()
    assert gc.main(["--out", str(tmp_path), "--only", "moe"]) == 1
    assert ran == ["moe"]
    out = capsys.readouterr().out
    assert "step moe" in out and "HBM copy (read + write)" in out  # the earlier hbm figure is kept
    assert gc.main(["--only", "moe,nope"]) == 2
    assert "unknown step(s) nope" in capsys.readouterr().err


@pytest.mark.multirank
def test_make_gpu_check_makes_no_venv_and_runs_no_pip():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cp = subprocess.run(["make", "-n", "gpu-check", "GPU_PY=/opt/py/bin/python3"], cwd=root, capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "/opt/py/bin/python3 tools/gpu_check.py" in cp.stdout and "PYTHONPATH=" in cp.stdout
    assert "pip" not in cp.stdout and "venv" not in cp.stdout
