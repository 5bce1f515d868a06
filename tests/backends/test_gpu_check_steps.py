"""tools/gpu_check.py's budget and new steps, and the two-ranks-on-one-GPU opt-in, without a
GPU: the step boxes fit the budget printed at start, the two-rank step's environment per rank
and the marking of its rows, the refusal and its opt-in, the probe on the simulated stack,
the --cuda-graph target's 16 MiB shown and not judged."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from commbench.backends import gpuprobe, gpus
from commbench.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ENV = {"torch": "2.11.0+cu130", "cuda": "13.0", "gpus": 1, "cupy_ok": True, "cupy": "cupy 14.2 (CUDA 13)"}


def test_the_step_boxes_fit_the_budget_printed_at_start(tmp_path, monkeypatch, capsys):
    gc = _gpu_check()
    assert gc.BUDGET_S <= 360 and sum(gc.STEP_LIMIT_S.values()) + gc.PREFLIGHT_S <= gc.BUDGET_S
    assert {"probe", "barrier", "two-ranks"} <= set(gc.STEP_LIMIT_S) and next(iter(gc.STEP_LIMIT_S)) == "probe"
    # the budget counts from the script's start: what the preflight spent is not given back
    now = [100.0]
    chk = gc.Check(tmp_path, budget_s=gc.BUDGET_S, clock=lambda: now[0], start=70.0)
    assert chk.left() == gc.BUDGET_S - 30.0
    monkeypatch.setattr(gc, "preflight", lambda: (0, "", ENV))
    for name in gc.STEP_LIMIT_S:
        monkeypatch.setattr(gc.Check, "step_" + name.replace("-", "_"), lambda self: "fine")
    assert gc.main(["--out", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"gpu check: budget {gc.BUDGET_S:.0f} s from start") and \
        f"step boxes {sum(gc.STEP_LIMIT_S.values())} s" in first


def test_two_nccl_ranks_on_one_gpu_need_a_distinct_nccl_hostid_each(monkeypatch, capsys):
    from commbench import cli

    with pytest.raises(UsageError, match="one GPU per rank.*COMMBENCH_SHARED_GPU_HOSTIDS"):
        gpus.check_ranks_per_gpu(2, 1, "nccl")
    gpus.check_ranks_per_gpu(2, 1, "nccl", ["a", "b"])  # the opt-in
    for bad in (["a", "a"], ["a"], ["a", ""], ["a", "b", "c"]):
        with pytest.raises(UsageError, match="expected 2 distinct, non-empty NCCL_HOSTID"):
            gpus.check_ranks_per_gpu(2, 1, "nccl", bad)
    assert gpus.shared_gpu_hostids({}) is None
    assert gpus.shared_gpu_hostids({gpus.SHARED_GPU_ENV: "x, y"}) == ["x", "y"]
    monkeypatch.setattr(gpus, "visible_gpus", lambda *a: 1)
    argv = ["run", "quick", "--backend", "nccl", "--np", "2", "--sizes", "8", "--dry-run"]
    monkeypatch.setenv(gpus.SHARED_GPU_ENV, "h0,h0")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected 2 distinct" in err[0]
    monkeypatch.setenv(gpus.SHARED_GPU_ENV, "h0,h1")
    assert cli.main(argv) == 0, capsys.readouterr().err


def test_each_rank_takes_its_own_nccl_hostid_and_marks_its_rows(monkeypatch):
    env = gpus.shared_gpu_launch_env(2)
    assert env == {gpus.SHARED_GPU_ENV: "commbench-rank0,commbench-rank1", "NCCL_SOCKET_IFNAME": "lo",
                   "NCCL_IB_DISABLE": "1", "GLOO_SOCKET_IFNAME": "lo"}
    seen = []
    for r in range(2):  # what spawn_local gives each rank, plus the launch's environment
        rank_env = {**env, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"}
        assert gpus.apply_rank_hostid(rank_env) == f"commbench-rank{r}"
        seen.append(rank_env["NCCL_HOSTID"])
    assert seen == ["commbench-rank0", "commbench-rank1"]
    launcher_env = dict(env)  # the launcher itself starts no NCCL: left alone
    assert gpus.apply_rank_hostid(launcher_env) is None and "NCCL_HOSTID" not in launcher_env
    assert gpus.apply_rank_hostid({"RANK": "0", "WORLD_SIZE": "2"}) is None  # no opt-in
    short = {**env, "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2"}  # a gloo run the list does not concern
    assert gpus.apply_rank_hostid(short) is None and "NCCL_HOSTID" not in short
    pytest.importorskip("torch")
    from fake_cuda import Device, cuda_comm

    monkeypatch.setenv(gpus.SHARED_GPU_ENV, env[gpus.SHARED_GPU_ENV])
    dev = Device()
    comm = cuda_comm(dev)
    comm.shared_gpu = True  # cuda_comm builds the comm on CPU: what a CUDA comm reads from the opt-in
    comm.time_ops(dev.kernel("k", 1e-6), 2)
    assert comm.last_timing["shared_gpu"] == gpus.SHARED_GPU_MARK
    comm.time_steps(lambda lap: lap(), 2, 1, hold=True)
    assert comm.last_timing["shared_gpu"] == gpus.SHARED_GPU_MARK
    monkeypatch.delenv(gpus.SHARED_GPU_ENV)
    from commbench.backends.torch_dist import TorchComm

    assert TorchComm(None, 0, 1, "gloo", "cpu").shared_gpu is False


def _rows(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_two_rank_step_sets_the_env_per_run_and_marks_its_output(tmp_path, monkeypatch, capsys):
    import subprocess

    gc = _gpu_check()
    mark = gpus.SHARED_GPU_MARK
    calls = []

    def fake_run(argv, log, timeout, env=None):
        calls.append((argv, env))
        out = Path(argv[argv.index("--out") + 1])
        name = out.name
        if name == "collectives":
            _rows(out, [{"benchmark": "all_reduce", "placement": "out-of-place", "check": "ok", "shared_gpu": mark},
                        {"benchmark": "barrier", "check": "skipped", "shared_gpu": mark}])
        elif name == "expired":
            _rows(out, [{"benchmark": "all_reduce", "check": "ok", "shared_gpu": mark,
                         "unheld_reason": "its hold ran out once (cap 1e-05 s)"}])
        else:
            _rows(out, [{"benchmark": "moe", "check": "ok", "shared_gpu": mark, "params": {"path": p}}
                        for p in ("flat", "hierarchical")])
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(gc, "run_cmd", fake_run)
    chk = gc.Check(tmp_path, env=ENV)
    chk.start_step("two-ranks")
    text = chk.step_two_ranks()
    assert text.startswith(mark + ": ") and "cupy's NCCL id broadcast ran" in text and "hierarchical" in text
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and all(line.startswith(f"  {mark}: ") for line in printed)
    assert [c[0][c[0].index("--np") + 1] for c in calls] == ["2", "2", "2"]
    for argv, env in calls:
        assert env[gpus.SHARED_GPU_ENV] == "commbench-rank0,commbench-rank1" and env["NCCL_SOCKET_IFNAME"] == "lo"
    assert calls[1][1]["COMMBENCH_HOLD_CAP_S"] == "0.00001" and "path=flat,hierarchical" in calls[2][0]
    # a row the opt-in did not reach, or an expired run whose rows were held, fails the step
    with pytest.raises(gc.Failed, match="not marked as two ranks sharing one GPU"):
        gc.two_rank_text("collectives", [{"benchmark": "all_reduce", "check": "ok"}], True)
    with pytest.raises(gc.Failed, match="held although no batch fits"):
        gc.two_rank_text("expired", [{"shared_gpu": mark, "unheld_reason": None}], True)
    with pytest.raises(gc.Failed, match="in-place although cupy is here"):
        gc.two_rank_text("collectives", [{"benchmark": "all_reduce", "placement": "in-place", "shared_gpu": mark}],
                         True)
    assert "in place (no cupy" in gc.two_rank_text(
        "collectives", [{"benchmark": "all_reduce", "placement": "in-place", "shared_gpu": mark}], False)
    with pytest.raises(gc.Skip, match="2 GPUs visible"):
        gc.Check(tmp_path, env={**ENV, "gpus": 2}).step_two_ranks()


def test_the_graph_targets_16_mib_is_shown_not_judged():
    gc = _gpu_check()
    ref = gc.REF_ALL_REDUCE
    fig = {n: (r[2] * (3.0 if n == 16 << 20 else 1.1) if r[2] else 30.0, None, None, "out-of-place", True)
           for n, r in ref.items()}
    got = {t[0]: t for t in gc.targets({"nccl-graph": {"all_reduce": fig}}, ENV)}
    assert got["--cuda-graph out-of-place all_reduce"][3] == "PASS"
    assert "at 16777216 B" not in got["--cuda-graph out-of-place all_reduce"][1]
    assert got["--cuda-graph out-of-place all_reduce 16 MiB"][3].startswith("INFO")


def test_the_probe_tells_calls_that_block_the_host_behind_a_hold():
    from fake_cuda import Device

    dev = Device(cap_s=1.0)

    def hold(s):  # a fixed spin, as torch.cuda._sleep
        dev.host += dev.launch_s
        dev.queue.append(("op", dev.host, s))

    def boom():
        raise RuntimeError("cudaErrorNotSupported\nmore")
    actions = [("nccl barrier", dev.host_wait("barrier"), True), ("moe: cumsum", dev.kernel("c", 1e-6), True),
               ("moe: odd", dev.host_wait("odd"), False), ("x", boom, False)]
    rows = gpuprobe.probe(actions, hold, dev.drain, hold_s=0.05, clock=lambda: dev.host)
    assert [r.get("blocks") for r in rows] == [True, False, True, None]
    assert rows[0]["host_ms"] == pytest.approx(50.0, rel=0.01) and rows[1]["host_ms"] < 0.1
    assert rows[3]["error"] == "RuntimeError: cudaErrorNotSupported"
    lines = gpuprobe.probe_lines(rows)
    assert "BLOCKS the host" in lines[0] and "does not block" in lines[1] and lines[3].startswith("x: failed")
    gc = _gpu_check()
    text = gc.probe_summary(rows, 0.05)
    assert "block the host: nccl barrier, moe: odd" in text and "unexpected (held timing would stall on it): moe: odd" \
        in text and "failed: x" in text


def test_the_barrier_point_is_judged_never_held_and_far_from_the_cap():
    gc = _gpu_check()
    ok = {"time_us_p50": 40.0, "hold_method": "none", "unheld_reason": "it waits for the device on the host"}
    assert gc.barrier_verdict(ok, 1.0).startswith("nccl barrier p50 40.00 us, never held")
    with pytest.raises(gc.Failed, match="must never be held"):
        gc.barrier_verdict({**ok, "hold_method": "flag"}, 1.0)
    with pytest.raises(gc.Failed, match="near the hold's cap"):
        gc.barrier_verdict({**ok, "time_us_p50": 999_000.0}, 1.0)
