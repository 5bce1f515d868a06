"""Device timing with CPU fakes: events, graph replays, the backends' use of them, and
tools/gpu_check.py's behaviour without a GPU. One test needs a real CUDA GPU."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from commbench.backends import timing
from conftest import ROOT, needs_torch, run_cli, run_rows


# --- fakes ------------------------------------------------------------------------------
class Clock:
    """A fake device clock in seconds: operations advance it by what they cost."""

    def __init__(self):
        self.t = 0.0
        self.log: list[str] = []


class FakeEvent:
    """torch.cuda.Event's shape: record() stamps the clock, elapsed_time() is milliseconds."""

    def __init__(self, clock: Clock):
        self.clock, self.t = clock, None

    def record(self, stream=None):
        self.t = self.clock.t

    def elapsed_time(self, end) -> float:
        assert self.t is not None and end.t is not None, "elapsed_time of an event never recorded"
        return (end.t - self.t) * 1e3


class PerfEvent:
    """A host-clock event (perf_counter), for the wall-clock variant of the fakes."""

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


def fake_op(clock: Clock, seconds: float, name: str = "op"):
    def op():
        clock.log.append(name)
        clock.t += seconds
    return op


# --- time_with_events -----------------------------------------------------------------
def test_events_samples_are_seconds_and_barrier_is_outside():
    clock = Clock()
    syncs = []

    def barrier():
        clock.log.append("barrier")
        clock.t += 1.0  # a slow barrier: must not show in any sample

    def sync():
        clock.log.append("sync")
        syncs.append(1)

    t = timing.time_with_events(fake_op(clock, 0.002), 5, lambda: FakeEvent(clock), sync, between=barrier)
    assert t.shape == (5,) and t.dtype == np.float64
    np.testing.assert_allclose(t, 0.002)  # 2 ms of op -> 0.002 s, barrier excluded
    assert clock.log == ["op", "barrier"] * 5 + ["sync"]  # barrier after each op, one sync at the end
    assert len(syncs) == 1


def test_events_without_between_and_zero_iters():
    clock = Clock()
    t = timing.time_with_events(fake_op(clock, 5e-6), 3, lambda: FakeEvent(clock), lambda: None)
    np.testing.assert_allclose(t, 5e-6)
    assert timing.time_with_events(fake_op(clock, 1.0), 0, lambda: FakeEvent(clock), lambda: None).size == 0


def test_events_elapsed_callable_covers_cupy():
    """cupy has cupy.cuda.get_elapsed_time(start, end) (ms) instead of a method."""
    clock = Clock()

    class CupyEvent:
        def record(self, stream=None):
            self.t = clock.t

    def get_elapsed_time(start, end):
        return (end.t - start.t) * 1e3

    t = timing.time_with_events(fake_op(clock, 0.5e-3), 4, CupyEvent, lambda: None, elapsed=get_elapsed_time)
    np.testing.assert_allclose(t, 0.5e-3)


def test_events_with_perf_counter_fakes():
    def op():
        time.sleep(0.002)

    def barrier():
        time.sleep(0.2)

    t = timing.time_with_events(op, 3, PerfEvent, lambda: None, between=barrier)
    # The 200 ms barrier is not in a sample (loose bound: sleeps overshoot on a busy host).
    assert np.all(t >= 0.0019) and np.all(t < 0.1), t


# --- time_with_graph ------------------------------------------------------------------
class FakeGraphs:
    """capture() runs body() in capture mode: operations are recorded, not executed;
    replay() executes what was recorded, as a CUDA graph does."""

    def __init__(self, clock: Clock):
        self.clock, self.captures, self.capturing, self.on_side = clock, 0, None, False

    def op(self, seconds: float):
        def run():
            if self.capturing is not None:
                self.capturing.append(seconds)
                self.clock.log.append("captured")
                return
            self.clock.log.append("op-side" if self.on_side else "op")
            self.clock.t += seconds
        return run

    def capture(self, body):
        self.captures += 1
        self.clock.log.append("capture")
        self.capturing = []
        body()
        graph, self.capturing = self.capturing, None
        return graph

    def replay(self, graph):
        self.clock.log.append("replay")
        self.clock.t += sum(graph)

    @contextlib.contextmanager
    def side_stream(self):
        self.on_side = True
        yield
        self.on_side = False


def test_graph_divides_by_ops_per_replay_and_captures_once():
    clock = Clock()
    g = FakeGraphs(clock)
    info = {}
    t = timing.time_with_graph(g.op(3e-6), 7, 10, g.capture, g.replay, lambda: FakeEvent(clock), lambda: None,
                               side_stream=g.side_stream, info=info)
    assert t.shape == (7,)
    np.testing.assert_allclose(t, 3e-6)  # a replay of 10 ops is 30 us: 3 us per op
    assert g.captures == 1 and info["ops_per_replay"] == 10
    # warm-up (eager, on the side stream) strictly before the capture; 10 ops captured;
    # one untimed replay, then the 7 timed ones.
    first_capture = clock.log.index("capture")
    assert clock.log[:first_capture] == ["op-side"] * 3
    assert clock.log[first_capture + 1:first_capture + 11] == ["captured"] * 10
    assert clock.log[first_capture + 11:] == ["replay"] * 8


def test_graph_between_is_outside_and_calibrated_count():
    clock = Clock()
    g = FakeGraphs(clock)
    barriers = []

    def barrier():
        barriers.append(1)
        clock.t += 1.0

    info = {}
    t = timing.time_with_graph(g.op(4e-6), 5, None, g.capture, g.replay, lambda: FakeEvent(clock), lambda: None,
                               between=barrier, side_stream=g.side_stream, info=info)
    # ops_per_replay chosen from the warm-up's 4 us: ceil(200 us / 4 us) = 50
    assert info["ops_per_replay"] == timing.choose_ops_per_replay(4e-6) == 50
    assert info["warmup_op_s"] == pytest.approx(4e-6)
    np.testing.assert_allclose(t, 4e-6)
    assert len(barriers) == 5  # after each timed replay only, and outside the events


def test_graph_synchronizes_after_warmup_and_once_at_end():
    clock = Clock()
    g = FakeGraphs(clock)
    syncs = []
    timing.time_with_graph(g.op(1e-6), 4, 3, g.capture, g.replay, lambda: FakeEvent(clock),
                           lambda: syncs.append(clock.log.count("replay")), side_stream=g.side_stream)
    assert syncs == [0, 5]  # after the warm-up, before capture; then once after all replays


def test_graph_zero_iters_captures_nothing():
    clock = Clock()
    g = FakeGraphs(clock)
    t = timing.time_with_graph(g.op(1e-6), 0, 5, g.capture, g.replay, lambda: FakeEvent(clock), lambda: None)
    assert t.size == 0 and g.captures == 0


def test_choose_ops_per_replay():
    assert timing.choose_ops_per_replay(1e-6) == 100  # capped
    assert timing.choose_ops_per_replay(1e-3) == 1  # long operations: one per replay
    assert timing.choose_ops_per_replay(1e-5) == 20
    assert timing.choose_ops_per_replay(float("nan")) == 100
    assert timing.choose_ops_per_replay(0.0) == 100
    with pytest.raises(ValueError):
        clock = Clock()
        g = FakeGraphs(clock)
        timing.time_with_graph(g.op(1e-6), 2, 0, g.capture, g.replay, lambda: FakeEvent(clock), lambda: None)


# --- TorchComm ------------------------------------------------------------------------
@needs_torch
def test_torchcomm_cpu_keeps_host_clock():
    from commbench.backends.torch_dist import TorchComm

    comm = TorchComm(None, 0, 1, "gloo", "cpu")
    t = comm.time_ops(lambda: None, 4)
    assert t.shape == (4,) and np.all(t >= 0) and comm.timing_method == "host_clock"


def fake_torch(clock: Clock):
    """Enough of torch.cuda for TorchComm's CUDA paths, on the fake clock."""
    state = types.SimpleNamespace(current="default", capturing=None, modes=[], log=clock.log)

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def stream(s):
        prev, state.current = state.current, s
        yield
        state.current = prev

    class CUDAGraph:
        def __init__(self):
            self.ops = []

        def replay(self):
            clock.log.append("replay")
            clock.t += sum(self.ops)

    @contextlib.contextmanager
    def graph(g, capture_error_mode="global"):
        state.modes.append(capture_error_mode)
        clock.log.append("capture")
        prev, state.current, state.capturing = state.current, "capture", g
        yield
        state.current, state.capturing = prev, None

    cuda = types.SimpleNamespace(Event=lambda enable_timing=False: FakeEvent(clock),
                                 synchronize=lambda: clock.log.append("sync"), Stream=Stream, stream=stream,
                                 current_stream=lambda: Stream(), CUDAGraph=CUDAGraph, graph=graph)
    return types.SimpleNamespace(cuda=cuda), state


def fake_cuda_comm(clock):
    from commbench.backends.torch_dist import TorchComm

    torch, state = fake_torch(clock)
    comm = TorchComm(None, 0, 1, "nccl", "cpu")  # built on CPU, then pointed at the fake CUDA
    comm.device, comm.torch, comm.timing_method = "cuda", torch, "cuda_event"
    comm.dist = types.SimpleNamespace(barrier=lambda group=None: clock.log.append("barrier"))

    class LoggedHold(timing.Hold):
        def release(self):
            clock.log.append("release")

        def covered(self):
            return True

    def hold(expected_s):
        clock.log.append("hold")
        return LoggedHold()
    comm._hold_factory, comm._hold_method = hold, "fake"

    def collective(seconds):
        def op():
            if state.capturing is not None:
                state.capturing.ops.append(seconds)
                clock.log.append("captured")
            else:
                clock.log.append(f"op@{'side' if state.current != 'default' else 'default'}")
                clock.t += seconds
        return op
    return comm, state, collective


@needs_torch
def test_torchcomm_cuda_paths_with_fake_torch():
    clock = Clock()
    comm, state, collective = fake_cuda_comm(clock)
    # barrier_each (OSU): held batches of one operation each, the hold released after it; the
    # op's first call is unheld, the device drained after it
    t = comm.time_ops(collective(2e-3), 3, barrier_each=True)
    np.testing.assert_allclose(t, 2e-3)
    assert clock.log == ["op@default", "sync"] + ["hold", "op@default", "release"] * 3 + ["sync"]
    assert comm.last_ops_per_replay is None
    assert comm.last_timing["held"] and comm.last_timing["ops_per_sample"] == 1

    # back to back: sized from one held batch of 10 (200 us / 5 us = 40 ops a batch)
    clock.log.clear()
    op = collective(5e-6)
    t = comm.time_ops(op, 2)
    np.testing.assert_allclose(t, 5e-6)
    assert clock.log == (["op@default", "sync"] + ["hold"] + ["op@default"] * 10 + ["release", "sync"]
                         + (["hold"] + ["op@default"] * 40 + ["release"]) * 2 + ["sync"])
    assert comm.last_timing["ops_per_sample"] == 40 and "mean of 40" in comm.last_timing["sample"]
    clock.log.clear()
    comm.time_ops(op, 1)  # the same op is not sized again
    assert clock.log == ["hold"] + ["op@default"] * 40 + ["release", "sync"]

    clock.log.clear()
    t = comm.time_ops(collective(5e-6), 6, barrier_each=True, cuda_graph=True)
    np.testing.assert_allclose(t, 5e-6)
    assert comm.last_ops_per_replay == 40  # ceil(200 us / 5 us of device time, from a held batch)
    assert state.modes == ["thread_local"]
    i = clock.log.index("capture")
    # one unheld call, sized by one held batch of 10, then warm-up off the default stream, then the capture
    assert clock.log[:i] == ["op@default", "sync", "hold"] + ["op@default"] * 10 + ["release", "sync"] + ["op@side"] * 3 + ["sync"]
    assert clock.log[i + 1:i + 41] == ["captured"] * 40
    # the upload replay, then each timed replay held while it is enqueued
    assert clock.log[i + 41:] == ["replay"] + ["hold", "replay", "release"] * 6 + ["sync"]
    assert comm.last_timing["ops_per_sample"] == 40 and "CUDA-graph replay" in comm.last_timing["sample"]

    comm.graph_ops_per_replay = 8  # a fixed count overrides the calibration
    comm.time_ops(collective(5e-6), 2, cuda_graph=True)
    assert comm.last_ops_per_replay == 8


# --- MpiComm with cupy ----------------------------------------------------------------
def test_mpicomm_cupy_events():
    from commbench.backends.mpi import MpiComm

    clock = Clock()

    class CupyEvent:
        def record(self, stream=None):
            self.t = clock.t

    stream = types.SimpleNamespace(synchronize=lambda: clock.log.append("sync"))
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=CupyEvent, get_current_stream=lambda: stream,
        get_elapsed_time=lambda s, e: (e.t - s.t) * 1e3))
    comm = MpiComm.__new__(MpiComm)
    comm.rank, comm.size, comm.device, comm.xp = 0, 1, "cuda", cupy
    comm.c = types.SimpleNamespace(Barrier=lambda: clock.log.append("barrier"))
    t = comm.time_ops(fake_op(clock, 7e-6), 3, barrier_each=True)
    np.testing.assert_allclose(t, 7e-6)
    assert clock.log == ["op", "barrier"] * 3 + ["sync"]
    comm.xp = None  # numpy buffers: the host clock
    assert comm.time_ops(lambda: None, 2).shape == (2,)


# --- gpuprobe and tools/gpu_check.py ----------------------------------------------------
def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
no_gpu = pytest.mark.skipif(HAS_CUDA, reason="checks the GPU-less behaviour")


@needs_torch
@no_gpu
def test_hbm_probe_refuses_without_cuda():
    from commbench.backends.gpuprobe import hbm_copy_gbps

    with pytest.raises(RuntimeError, match="CUDA"):
        hbm_copy_gbps(1 << 20, 2)


@no_gpu
@pytest.mark.multirank
def test_gpu_check_without_cuda_exits_3_with_one_line(tmp_path):
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out", str(tmp_path / "x")],
                        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert cp.returncode == 3, cp.stderr
    assert cp.stdout.startswith("no CUDA device: nothing to check (") and cp.stdout.count("\n") == 1
    assert cp.stderr == ""
    assert not (tmp_path / "x").exists()  # nothing run, nothing written
    assert time.monotonic() - t0 < 30


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_one_failing_step_does_not_stop_the_others(capsys):
    gc = _load_gpu_check()
    ran = []

    def boom():
        ran.append("boom")
        raise ValueError("first line\nthe reason")

    def skip():
        ran.append("skip")
        raise gc.Skip("not here")

    def ok():
        ran.append("ok")
        return "fine"

    res = gc.run_steps([("a", boom), ("b", skip), ("c", ok)])
    assert ran == ["boom", "skip", "ok"]
    assert [(n, s) for n, s, _ in res] == [("a", "FAIL"), ("b", "SKIP"), ("c", "PASS")]
    assert "ValueError: the reason" in res[0][2]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[0].startswith("a") and "FAIL" in out[0]


def test_gpu_check_reads_rows(tmp_path):
    gc = _load_gpu_check()
    rows = [{"benchmark": "all_reduce", "nbytes": 8, "time_us_p50": 9.5, "algbw_gbps": 0.001, "busbw_gbps": 0.0,
             "clock": "cuda_graph", "check": "ok"},
            {"benchmark": "all_reduce", "nbytes": 64 << 20, "time_us_p50": 40.0, "algbw_gbps": 1677.7,
             "busbw_gbps": 0.0, "clock": "cuda_graph", "check": "ok"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"trunc')
    got = gc.read_rows(tmp_path)
    assert len(got) == 2
    gc.check_rows(got, "cuda_graph")
    with pytest.raises(gc.Failed, match="expected cuda_event"):
        gc.check_rows(got, "cuda_event")
    with pytest.raises(gc.Failed, match="result check"):
        gc.check_rows([{**rows[0], "check": "fail"}], None)
    fig = gc.figures(got)
    assert fig["all_reduce"][8][0] == 9.5 and fig["all_reduce"][64 << 20][1] == 1677.7


# --- on a GPU -------------------------------------------------------------------------
@needs_gpu
@pytest.mark.multirank
def test_nccl_world1_cuda_graph_beats_events_on_small_messages(tmp_path):
    rows = {}
    for name, extra in (("events", []), ("graph", ["--cuda-graph"])):
        cp = run_cli("run", "quick", "--np", "1", "--backend", "nccl", "-b", "all_reduce", "--worlds", "1",
                     "--sizes", "8,64M", "--out", tmp_path / name, *extra)
        assert cp.returncode == 0, cp.stderr
        rows[name] = {r["nbytes"]: r for r in run_rows(tmp_path / name)}
    assert {r["clock"] for r in rows["graph"].values()} == {"cuda_graph"}
    assert {r["clock"] for r in rows["events"].values()} == {"cuda_event_held"}
    assert all(r["held"] and r["host_us_per_op"] > 0 for r in rows["events"].values())
    assert all(r["check"] in ("ok", "skipped") for d in rows.values() for r in d.values())
    # Both are device time now: the graph drops the per-op launch, held batches their host cost;
    # each well below the host's launch cost per call.
    assert rows["graph"][8]["time_us_p50"] < rows["events"][8]["host_us_per_op"]
    assert rows["events"][8]["time_us_p50"] < rows["events"][8]["host_us_per_op"]


@needs_gpu
def test_hbm_probe_on_gpu():
    from commbench.backends.gpuprobe import hbm_copy_gbps

    assert hbm_copy_gbps(64 << 20, 5) > 10.0


def test_gpu_check_judges_against_the_nccl_tests_figures():
    gc = _load_gpu_check()
    ref = gc.REF_ALL_REDUCE
    fig = lambda f, place="out-of-place": {"all_reduce": {n: (f(n, r), None, None, place, True)  # noqa: E731
                                                          for n, r in ref.items()}}
    data = {"nccl-held": fig(lambda n, r: 1.5 * r[2] if n <= 256 << 10 else r[0] * 1.01),
            "nccl-in-place": fig(lambda n, r: 0.05, "in-place"),
            "nccl-graph": fig(lambda n, r: (r[2] or 30.0) * 1.1)}
    got = {t[0]: t[3] for t in gc.targets(data)}
    assert got["out-of-place all_reduce 8 B-256 KiB, held"] == "PASS"
    assert got["in-place all_reduce 8 B-64 MiB, held"] == "PASS"
    assert got["out-of-place all_reduce 64 MiB, held"] == "PASS"
    assert got["--cuda-graph out-of-place all_reduce"] == "PASS"
    assert got["held rows covered by their hold"] == "PASS"
    data["nccl-held"] = fig(lambda n, r: 3 * r[2] if n <= 256 << 10 else r[0] * 1.2)
    data["nccl-graph"] = fig(lambda n, r: (r[2] or 30.0) * 2)
    got = {t[0]: t[3] for t in gc.targets(data)}
    assert got["out-of-place all_reduce 8 B-256 KiB, held"] == "MISS" and got["out-of-place all_reduce 64 MiB, held"] == "MISS"
    assert got["--cuda-graph out-of-place all_reduce"] == "MISS"


def test_gpu_check_moe_rates_against_the_hbm_copy_rate():
    gc = _load_gpu_check()
    rows = [{"stage": "dispatch", "params": {"copies": "rank"}, "logical_nbytes": 2e8, "stage_us_layout": 10.0,
             "stage_us_pack": 50.0, "stage_us_unpack": 40.0, "stage_us_a2a": 500.0},
            {"stage": "combine", "params": {"copies": "rank"}, "logical_nbytes": 4e8, "stage_us_reduce": 400.0}]
    lines = gc.moe_rates(rows, 2120.0)
    assert "layout+pack+unpack 100.0 us for 200.0 MB: 2000 GB/s = 0.94 of the HBM copy rate 2120" in lines[0]
    assert "reduce 400.0 us for 400.0 MB: 1000 GB/s = 0.47" in lines[1]
