"""Held batches against a simulated device stream: the host pays a launch cost per call,
the device runs what was enqueued in order, events are stamped when the device reaches
them, and a hold keeps the device from starting until it is released. This is the model
in which per-operation events on an idle stream read the host's cost, and held batches
read the device's."""
from __future__ import annotations

import numpy as np
import pytest

from commbench.backends import timing


class Stream:
    """One device stream and the host that feeds it, on simulated clocks (seconds)."""

    def __init__(self, launch_s: float):
        self.host = 0.0
        self.launch_s = launch_s
        self.items: list = []   # (kind, host time enqueued, payload)
        self.log: list = []

    def op(self, device_s: float):
        def run():
            self.host += self.launch_s
            self.items.append(("op", self.host, device_s))
            self.log.append("op")
        return run

    def event(self):
        stream = self

        class Ev:
            t = None

            def record(self):
                stream.items.append(("event", stream.host, self))

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3
        return Ev()

    def hold(self, expected_s: float = 0.0, cap_s: float = 1.0):
        stream = self

        class H(timing.Hold):
            released = None

            def release(self):
                self.released = stream.host
                stream.log.append("release")

            def covered(self):
                return self.expired is False

        h = H()
        h.expired = None
        self.items.append(("hold", self.host, (h, cap_s)))
        self.log.append("hold")
        return h

    def synchronize(self):
        """Run the device over everything enqueued."""
        t = 0.0
        for kind, at, payload in self.items:
            t = max(t, at)
            if kind == "op":
                t += payload
            elif kind == "event":
                payload.t = t
            else:
                h, cap = payload
                end = t + cap
                h.expired = h.released is None or h.released > end
                t = min(end, h.released) if h.released is not None else end
        self.items.clear()
        self.log.append("sync")


def test_idle_stream_events_read_the_host_cost():
    s = Stream(launch_s=25e-6)
    t = timing.time_with_events(s.op(1e-6), 5, s.event, s.synchronize)
    np.testing.assert_allclose(t, 25e-6, rtol=0.05)  # host time, not the 1 us of device work


def test_held_batch_reads_device_time_and_host_cost_beside_it():
    s = Stream(launch_s=25e-6)
    meets = []
    r = timing.time_held(s.op(1e-6), 4, 50, s.hold, s.event, s.synchronize, meet=lambda: meets.append(1),
                         elapsed=lambda a, b: a.elapsed_time(b), clock=lambda: s.host)
    np.testing.assert_allclose(r.samples_s, 1e-6, rtol=1e-6)
    np.testing.assert_allclose(r.host_s_per_op, 25e-6, rtol=1e-6)
    assert r.held.all() and len(meets) == 4 and r.ops_per_batch == 50
    info = r.info()
    assert info["held"] and info["unheld_samples"] == 0 and info["ops_per_sample"] == 50
    assert info["host_us_per_op"] == pytest.approx(25.0)
    assert "mean of 50 operations" in info["sample"]
    # each batch: hold, its ops, then release (after the meet), one sync at the end
    assert s.log[:52] == ["hold"] + ["op"] * 50 + ["release"] and s.log[-1] == "sync"


def test_a_hold_that_expires_is_flagged_not_hidden():
    s = Stream(launch_s=25e-6)
    # The cap (100 us) runs out while the host still enqueues 50 ops (1.25 ms): the batch's
    # first operations start before the last are enqueued, so its time holds host cost.
    r = timing.time_held(s.op(1e-6), 3, 50, lambda e: s.hold(e, cap_s=1e-4), s.event, s.synchronize,
                         clock=lambda: s.host)
    assert not r.held.any()
    info = r.info()
    assert info["held"] is False and info["unheld_samples"] == 3
    assert r.samples_s.mean() > 10e-6  # the host's pace shows: that is why it is flagged


def test_per_op_pairs_cost_is_in_each_sample_and_samples_are_per_op():
    s = Stream(launch_s=25e-6)
    r = timing.time_held(s.op(2e-6), 2, 10, s.hold, s.event, s.synchronize, per_op=True, clock=lambda: s.host)
    assert r.samples_s.shape == (20,) and r.held.shape == (20,)
    np.testing.assert_allclose(r.samples_s, 2e-6, rtol=1e-6)
    assert r.info()["ops_per_sample"] == 1


def test_batch_sizing():
    assert timing.choose_ops_per_batch(1e-6) == 200        # capped
    assert timing.choose_ops_per_batch(1e-5) == 20         # 200 us of work
    assert timing.choose_ops_per_batch(1e-3) == 1          # one long operation
    assert timing.choose_ops_per_batch(float("nan")) == 200
    with pytest.raises(ValueError):
        timing.time_held(lambda: None, 1, 0, timing.NoHold, object, lambda: None)


# --- the real stack's behaviour, simulated (tests/fake_cuda.py) ----------------------------
# Each test below models one way a held stream stalls on a GPU, and fails on the timing that
# does not avoid it: the host's simulated clock then shows the stall (a hold's cap).

needs_torch = pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch")


def _harness(**over):
    from commbench.run import suite
    from commbench.run.point_harness import Harness

    cfg = suite.build_config(suite.read_suite("quick"), {"iters": 4, "warmup": 1, **over})
    return Harness(cfg)


@needs_torch
def test_nccl_barrier_never_waits_behind_a_hold():
    """ProcessGroupNCCL's barrier synchronizes the stream in wait(): enqueued behind a hold,
    the host waits for a device that waits for the host, until the cap, every batch."""
    from fake_cuda import Device, cuda_comm

    dev = Device(cap_s=1.0)
    comm = cuda_comm(dev)
    t = comm.time_ops(comm.barrier_op(), 5)
    assert dev.expired() == 0 and dev.host < 0.01, f"host stalled {dev.host:.3f} s behind a hold"
    assert "hold" not in dev.log and t.shape == (5,)
    assert comm.last_timing["held"] is False and comm.last_timing["clock"] == "cuda_event"
    assert "waits for the device on the host" in comm.last_timing["unheld_reason"]
    assert comm.last_timing["hold_method"] == "none"  # by design, so the row does not warn


@needs_torch
def test_an_op_runs_once_unheld_and_drained_before_its_first_held_batch():
    """A first launch may block the host until the device drains (lazy module loading,
    NCCL's connection set-up): behind a hold that is a stall until the cap."""
    from fake_cuda import Device, cuda_comm

    dev = Device(cap_s=1.0, first_launch_drains=True)
    comm = cuda_comm(dev)
    op = dev.kernel("k", 2e-6)
    t = comm.time_ops(op, 3)
    assert dev.expired() == 0 and dev.host < 0.05, f"host stalled {dev.host:.3f} s behind a hold"
    assert dev.log[:3] == ["first:k", "sync", "k"] and dev.log[3] == "sync" and dev.log[4] == "hold"
    np.testing.assert_allclose(t, 2e-6, rtol=1e-6)
    assert comm.last_timing["held"] is True and comm.last_timing["clock"] == "cuda_event_held"
    n = len(dev.log)
    comm.time_ops(op, 2)  # once per op: no second unheld run
    assert dev.log[n] == "hold"


@needs_torch
def test_a_step_runs_once_unheld_before_its_first_held_step():
    from fake_cuda import Device, cuda_comm

    dev = Device(cap_s=1.0, first_launch_drains=True)
    comm = cuda_comm(dev)
    a, b = dev.kernel("gemm", 30e-6), dev.kernel("a2a", 10e-6)

    def step(lap):
        a()
        lap()
        b()
    t, laps = comm.time_steps(step, 3, 1, hold=True)
    assert dev.expired() == 0 and dev.host < 0.05, f"host stalled {dev.host:.3f} s behind a hold"
    np.testing.assert_allclose(t, 40e-6, rtol=1e-6)
    np.testing.assert_allclose(laps[:, 0], 30e-6, rtol=1e-6)
    assert dev.log.index("hold") > dev.log.index("a2a")  # the whole step ran before any hold


@needs_torch
def test_held_steps_carry_the_coverage_fields_and_warn_like_held_ops():
    """A held step whose hold ran out says so on its row, as a held op does."""
    from commbench.benchmarks.base import Point, Traffic
    from fake_cuda import Device, cuda_comm

    dev = Device(cap_s=1e-4)  # the cap runs out while the host enqueues 50 launches (1.25 ms)
    comm = cuda_comm(dev)
    ops = [dev.kernel(f"k{i}", 1e-6) for i in range(50)]

    def step(lap):
        for op in ops:
            op()
        lap()
    t, _ = comm.time_steps(step, 3, 1, hold=True)
    lt = comm.last_timing
    assert lt["clock"] == "cuda_event_held" and lt["hold_method"] == "flag" and lt["ops_per_sample"] == 1
    assert lt["held"] is False and lt["unheld_samples"] == 3
    assert lt["host_us_per_op"] > 0
    # through the harness, the row warns; the hold ran out in the warm-up, so the timed loop
    # is not held at all, and the row says why
    h = _harness()
    frag, _ = h.time_steps(comm, Point("overlap", 1, "float32", 8), step, Traffic(8, 1.0), laps=("all",), hold=True)
    assert frag["held"] is False and frag["unheld_samples"] == frag["iters"] and frag["hold_method"] == "flag"
    assert "not covered by the stream hold" in frag["warning"] and "ran out once" in frag["warning"]

    dev2 = Device(cap_s=1.0)
    comm2 = cuda_comm(dev2)
    ops = [dev2.kernel(f"k{i}", 1e-6) for i in range(50)]
    frag, _ = h.time_steps(comm2, Point("overlap", 1, "float32", 8), step, Traffic(8, 1.0), laps=("all",), hold=True)
    assert frag["held"] is True and frag["unheld_samples"] == 0 and "warning" not in frag
    assert frag["clock"] == "cuda_event_held" and frag["time_us_p50"] == pytest.approx(50.0, rel=1e-6)


@needs_torch
def test_an_op_whose_hold_ran_out_is_timed_unheld_for_the_rest_of_the_point():
    from commbench.benchmarks.base import Point, Traffic
    from fake_cuda import Device, cuda_comm

    dev = Device(cap_s=1e-4)  # any batch of more than 4 launches outlives the cap
    comm = cuda_comm(dev)
    op = dev.kernel("k", 1e-6)
    frag = _harness().time_op(comm, Point("all_reduce", 1, "float32", 8), op, Traffic(8, 1.0))
    # one cap for the sizing batch; after it, no hold at all
    assert dev.expired() == 1 and len(dev.holds) == 1
    assert frag["held"] is False and frag["clock"] == "cuda_event"
    assert "ran out once" in frag["unheld_reason"] and "COMMBENCH_HOLD_CAP_S" in frag["unheld_reason"]
    assert "ran out once" in frag["warning"]
    dev.cap_s = 1.0
    comm.time_ops(dev.kernel("k2", 1e-6), 2)  # another op (the next point's) is held again
    assert comm.last_timing["held"] is True and comm.last_timing["clock"] == "cuda_event_held"


def test_hold_cap_from_the_environment():
    from commbench.backends.gpuhold import DEFAULT_HOLD_CAP_S, hold_cap_s
    from commbench.core.errors import UsageError

    assert hold_cap_s({}) == DEFAULT_HOLD_CAP_S
    assert hold_cap_s({"COMMBENCH_HOLD_CAP_S": " 0.25 "}) == 0.25
    for bad in ("abc", "0", "-1", "nan", "1e9"):
        with pytest.raises(UsageError, match="COMMBENCH_HOLD_CAP_S"):
            hold_cap_s({"COMMBENCH_HOLD_CAP_S": bad})


def test_a_bad_hold_cap_is_refused_in_one_line(monkeypatch, capsys):
    from commbench import cli
    from commbench.backends import gpus

    monkeypatch.setattr(gpus, "visible_gpus", lambda *a: 1)
    monkeypatch.setenv("COMMBENCH_HOLD_CAP_S", "soon")
    rc = cli.main(["run", "quick", "--backend", "nccl", "--np", "1", "--sizes", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "COMMBENCH_HOLD_CAP_S='soon'" in err[0]


@needs_torch
def test_flag_hold_compiles_when_made_and_a_failed_compile_falls_back_with_its_reason(monkeypatch):
    """cupy.RawKernel compiles on its first launch: made lazily, a compile failure would
    surface inside the first timed batch."""
    import sys

    from commbench.backends import gpuhold
    from fake_cuda import Device, FakeCupy, cuda_comm, fake_torch

    dev = Device()
    cupy = FakeCupy(dev)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    factory, method, why = gpuhold.make_holds(fake_torch(dev), cap_s=0.5)
    assert method == "flag" and why is None
    assert len(cupy.launches) == 1 and dev.log[-1] == "sync"  # launched (compiled) and drained when made
    assert cupy.launches[0][2] == int(0.5 * 1e9)  # the cap in cycles of the 1 GHz fake clock
    h = factory()
    h.release()
    assert len(cupy.launches) == 2

    dev = Device()
    monkeypatch.setitem(sys.modules, "cupy", FakeCupy(dev, compile_error="nvrtc: error: identifier undefined\nmore"))
    made = gpuhold.make_holds(fake_torch(dev))
    assert made[1] == "sleep", "a hold kernel that cannot compile was taken"
    factory, method, why = made
    assert "nvrtc: error: identifier undefined" in why and "more" not in why
    # and the rows say which hold ran and why
    comm = cuda_comm(dev)
    comm._hold_factory = None
    comm.time_ops(dev.kernel("k", 1e-6), 2)
    assert comm.last_timing["hold_method"] == "sleep"
    assert "nvrtc: error" in comm.last_timing["hold_fallback"]


def test_steps_with_a_host_wait_are_held_around_it():
    """moe's normal dispatch reads split sizes on the host (.tolist()) in its sync stage:
    the hold is let go before it and put up again after, so every other stage reads the
    device's time, and the host never waits behind a hold."""
    from fake_cuda import Device

    dev = Device(cap_s=1.0)
    layout, counts, pack, a2a = (dev.kernel(n, s) for n, s in (("layout", 3e-6), ("counts", 2e-6),
                                                             ("pack", 4e-6), ("a2a", 5e-6)))
    sync = dev.host_wait("sync", 1e-6)

    def step(lap):
        for stage in (layout, counts, sync, pack, a2a):
            stage()
            lap()
    info: dict = {}
    meets = []
    t, laps = timing.time_steps_with_events(step, 3, 5, dev.event, dev.drain, hold=dev.hold,
                                            meet=lambda: meets.append(1), host_waits=(2,), info=info,
                                            clock=lambda: dev.host)
    assert dev.expired() == 0 and dev.host < 0.01
    assert info["held"] is True and info["unheld_samples"] == 0 and len(meets) == 6
    np.testing.assert_allclose(laps[:, 0], 3e-6, rtol=1e-6)   # device time, not the 25 us launch
    np.testing.assert_allclose(laps[:, 3], 4e-6, rtol=1e-6)
    np.testing.assert_allclose(laps[:, 4], 5e-6, rtol=1e-6)
    i = dev.log.index("sync")
    assert dev.log[:i] == ["hold", "layout", "counts", "release", "sync"][:i]


@needs_torch
def test_moe_normal_and_hierarchical_stages_are_held_around_their_host_syncs():
    from commbench.benchmarks.moe.device import DevicePath
    from commbench.benchmarks.moe.hierarchical import HierarchicalPath
    from commbench.benchmarks.moe.low_latency import LowLatencyPath

    for path in (DevicePath, HierarchicalPath, LowLatencyPath):
        assert path.hold is True
        for stage, names in path.host_waits.items():
            assert set(names) <= set(getattr(path, f"{stage}_stages"))
    assert DevicePath.host_waits == {"dispatch": ("sync",)}
    assert HierarchicalPath.host_waits == {"dispatch": ("sync", "forward")}
    assert LowLatencyPath.host_waits == {}


@needs_torch
def test_harness_passes_the_host_waits_as_lap_indices():
    from commbench.benchmarks.base import Point, Traffic

    seen = {}

    class Comm:
        size, last_timing, timing_method = 1, {}, "cuda_event"

        def barrier(self):
            pass

        def max_over_ranks(self, v):
            return np.asarray(v, dtype=np.float64)

        def time_steps(self, step, n, nlaps, barrier_each, **kw):
            seen.update(kw)
            return np.full(n, 1e-5), np.full((n, nlaps), 1e-6)
    _harness().time_steps(Comm(), Point("moe", 1, "float32", 8), lambda lap: None, Traffic(8, 1.0),
                          laps=("layout", "counts", "sync", "pack"), hold=True, host_waits=("sync",))
    assert seen == {"hold": True, "host_waits": (2,)}


@needs_torch
def test_ranks_agree_to_time_unheld_when_any_ranks_hold_ran_out():
    """A held batch meets the other ranks on the host and an unheld one does not: one rank
    going unheld alone would leave the others waiting at the meeting."""
    from fake_cuda import Device, cuda_comm

    dev = Device(cap_s=1.0)  # this rank's holds never run out
    comm = cuda_comm(dev)
    comm.size, comm._meet = 2, lambda: None
    comm.max_over_ranks = lambda v: np.asarray(v, dtype=np.float64) + np.array([0.0, 1.0])[:len(v)]  # the peer's ran out
    op = dev.kernel("k", 1e-6)
    comm.time_ops(op, 2)
    assert dev.expired() == 0
    assert comm.last_timing["clock"] == "cuda_event" and "ran out once" in comm.last_timing["unheld_reason"]


def test_consecutive_host_waits_and_a_first_stage_that_waits():
    from fake_cuda import Device

    dev = Device(cap_s=1.0)
    a, b = dev.host_wait("a", 1e-6), dev.host_wait("b", 1e-6)
    c = dev.kernel("c", 7e-6)

    def step(lap):
        for stage in (a, b, c):
            stage()
            lap()
    info: dict = {}
    t, laps = timing.time_steps_with_events(step, 2, 3, dev.event, dev.drain, hold=dev.hold, meet=lambda: None,
                                            host_waits=(0, 1), info=info, clock=lambda: dev.host)
    assert dev.expired() == 0 and info["held"] is True
    np.testing.assert_allclose(laps[:, 2], 7e-6, rtol=1e-6)
    assert dev.log[:6] == ["a", "sync", "b", "sync", "hold", "c"]


def test_the_hold_cap_in_cycles_reads_the_devices_clock_attribute(monkeypatch):
    """CUDA 13 dropped cudaDeviceProp::clockRate (torch's props.clock_rate): the cap read
    1.5 GHz whatever the GPU. The clock now comes from cudaDeviceGetAttribute(
    cudaDevAttrClockRate = 13, kHz), through cupy.cuda.runtime.deviceGetAttribute; torch's
    property where the attribute cannot be read; 1.5 GHz where neither says."""
    import sys
    import types

    from commbench.backends import gpuhold
    from fake_cuda import Device, FakeCupy, fake_torch

    dev = Device()
    cupy = FakeCupy(dev)
    asked = []
    cupy.cuda.runtime.deviceGetAttribute = lambda attr, d: asked.append((attr, d)) or 1_980_000
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    torch13 = fake_torch(dev)
    torch13.cuda.get_device_properties = lambda i: types.SimpleNamespace()  # no clock_rate (CUDA 13)
    assert gpuhold.clock_hz(torch13, cupy) == 1.98e9 and asked == [(gpuhold.CUDA_DEV_ATTR_CLOCK_RATE, 0)]
    factory, method, _ = gpuhold.make_holds(torch13, cap_s=0.5)
    assert method == "flag" and cupy.launches[0][2] == int(0.5 * 1.98e9)
    # The attribute refused: torch's property (CUDA 12), then the 1.5 GHz fallback.
    def refuse(attr, d):
        raise RuntimeError("cudaErrorInvalidValue")
    cupy.cuda.runtime.deviceGetAttribute = refuse
    assert gpuhold.clock_hz(fake_torch(dev, sm_khz=1_755_000), cupy) == 1.755e9
    assert gpuhold.clock_hz(torch13, cupy) == gpuhold.FALLBACK_CLOCK_KHZ * 1e3
