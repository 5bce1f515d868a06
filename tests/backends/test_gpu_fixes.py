"""The GPU path's smaller fixes, against the simulated stack (tests/fake_cuda.py): rows of
COMMBENCH_NO_HOLD=1 never say a hold ran out, --per-op-events pairs each operation inside a
held batch of the usual size, an event's own device time, cupy's NCCL call captured in a
CUDA graph, torch's blocking wait refused, one GPU-visibility rule."""
from __future__ import annotations

import numpy as np
import pytest

from commbench.backends import gpus, timing
from commbench.core.errors import UsageError

needs_torch = pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch")


def _harness():
    from commbench.run import suite
    from commbench.run.point_harness import Harness

    return Harness(suite.build_config(suite.read_suite("quick"), {"iters": 4, "warmup": 1}))


@needs_torch
def test_no_hold_rows_never_say_their_hold_ran_out(monkeypatch):
    """COMMBENCH_NO_HOLD=1 sizes and times with NoHold, whose covered() reads False: that is
    no hold at all, not a hold that ran out, for ops, graph replays and steps alike."""
    from commbench.benchmarks.base import Point, Traffic
    from fake_cuda import Device, cuda_comm

    monkeypatch.setenv("COMMBENCH_NO_HOLD", "1")
    dev = Device()
    comm = cuda_comm(dev)
    comm._hold_factory = None  # chosen from the environment, as on a GPU
    op = dev.kernel("k", 1e-6)
    frag = _harness().time_op(comm, Point("all_reduce", 1, "float32", 8), op, Traffic(8, 1.0))
    assert frag["hold_method"] == "none" and frag["clock"] == "cuda_event" and "warning" not in frag
    assert "ran out" not in frag["unheld_reason"] and "COMMBENCH_NO_HOLD=1" in frag["unheld_reason"]
    assert op not in comm._expired and not dev.holds
    comm.time_ops(op, 3, cuda_graph=True)
    assert "ran out" not in comm.last_timing["unheld_reason"]
    comm.time_steps(lambda lap: (op(), lap()), 3, 1, hold=True)
    assert "ran out" not in comm.last_timing["unheld_reason"] and comm.last_timing["clock"] == "cuda_event"


@needs_torch
def test_per_op_events_pair_each_operation_inside_a_held_batch_of_the_usual_size():
    """docs/gpu-timing.md: --per-op-events puts an event pair around each operation of the
    held batch, not each operation in a batch (and hold) of its own."""
    from fake_cuda import Device, cuda_comm

    dev = Device()
    comm = cuda_comm(dev)
    op = dev.kernel("k", 1e-6)
    t = comm.time_ops(op, 50, per_op_events=True)
    n = timing.choose_ops_per_batch(1e-6)
    assert t.shape == (50,) and len(dev.holds) == 2  # the sizing batch, then one batch of n for 50 samples
    assert comm.last_timing["sample"] == f"one operation (an event pair each) in held batches of {n}"
    assert comm.last_timing["ops_per_sample"] == 1 and comm.last_timing["held"] is True
    np.testing.assert_allclose(t, 1e-6, rtol=1e-6)
    comm.time_ops(op, 300, per_op_events=True)  # more samples than a batch holds: two batches
    assert len(dev.holds) == 4 and comm.last_timing["unheld_samples"] == 0


def test_an_events_own_device_time_inflates_per_op_pairs_not_batch_means():
    """One H200 (gpu-h200.md): an 8 B all_gather read 3.81 us with a pair each, 1.76 with one
    pair around 200. The fake's events cost MEASURED_EVENT_S when the device reaches them."""
    from fake_cuda import MEASURED_EVENT_S, Device

    dev = Device(event_s=MEASURED_EVENT_S)
    op = dev.kernel("k", 1.76e-6)
    per_op = timing.time_held(op, 1, 200, dev.hold, dev.event, dev.drain, per_op=True, clock=lambda: dev.host)
    batch = timing.time_held(op, 1, 200, dev.hold, dev.event, dev.drain, clock=lambda: dev.host)
    np.testing.assert_allclose(per_op.samples_s, 1.76e-6 + MEASURED_EVENT_S, rtol=1e-6)
    np.testing.assert_allclose(batch.samples_s, 1.76e-6 + MEASURED_EVENT_S / 200, rtol=1e-6)


@needs_torch
def test_cupy_nccl_all_reduce_is_captured_on_the_capturing_stream(monkeypatch):
    """The out-of-place all_reduce (cupy's NCCL) reads torch's current stream at each call,
    so under torch.cuda.graph it is launched on the capturing stream and joins the graph; a
    call bound to the eager stream would run at once, outside the graph, and a replay would
    time nothing."""
    import torch

    from fake_cuda import LEGACY_STREAM, TORCH_STREAM, Device, FakeCupy, cuda_comm

    dev = Device()
    cupy = FakeCupy(dev)
    cupy.install(monkeypatch)
    comm = cuda_comm(dev)
    send, recv = torch.zeros(4), torch.zeros(4)
    op = comm.all_reduce(send, recv)
    t = comm.time_ops(op, 5, cuda_graph=True)
    k = comm.last_ops_per_replay
    assert cupy.cuda.nccl.inits == [(1, (1, 2, 3), 0)]
    assert dev.log.count("capture:cupy_nccl_allreduce") == k and f"replay:{k}" in dev.log
    np.testing.assert_allclose(t, 1e-6, rtol=1e-6)
    assert comm.last_timing["held"] is True and f"the {k} operations of one held CUDA-graph replay" in \
        comm.last_timing["sample"]
    # the fake's own faithfulness: a launch on another stream runs now, outside the graph;
    # one on the legacy stream is refused while a capture is on
    g = comm.torch.cuda.CUDAGraph()
    nccl_comm = cupy.cuda.nccl.NcclCommunicator(1, "uid", 0)
    with comm.torch.cuda.graph(g):
        nccl_comm.allReduce(0, 0, 4, 7, 0, TORCH_STREAM)
        with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureImplicit"):
            nccl_comm.allReduce(0, 0, 4, 7, 0, LEGACY_STREAM)
    assert g.launches == [] and dev.log[-1] == "cupy_nccl_allreduce"


@needs_torch
def test_a_blocking_wait_stalls_every_held_op_and_is_refused_in_one_line(monkeypatch, capsys):
    """ProcessGroupNCCL's WorkNCCL::wait() blocks the host when TORCH_NCCL_BLOCKING_WAIT is set
    (or a timeout is passed): a synchronous call then waits behind the hold, to its cap."""
    from commbench import cli
    from fake_cuda import Device, cuda_comm, fake_dist

    dev = Device(cap_s=0.5)
    comm = cuda_comm(dev)
    comm.dist = fake_dist(dev, blocking_wait=True)
    op = lambda: comm.dist.all_reduce(None)  # noqa: E731 - torch's synchronous call
    comm.time_ops(op, 2)
    assert dev.expired() >= 1 and dev.host >= 0.5  # stalled to the cap
    dev2 = Device(cap_s=0.5)
    comm2 = cuda_comm(dev2)
    works, start = [], comm2.dist.all_reduce
    comm2.dist.all_reduce = lambda *a, **k: works.append(start(*a, **k)) or works[-1]
    comm2.iall_reduce(None, None).wait()
    assert works[0].waits == [None]  # commbench's own waits pass no timeout (one would block the host)
    comm2.time_ops(lambda: comm2.dist.all_reduce(None), 2)
    assert dev2.expired() == 0 and dev2.host < 0.1 and comm2.last_timing["held"] is True
    for value in ("1", "True", "yes"):
        with pytest.raises(UsageError, match=f"TORCH_NCCL_BLOCKING_WAIT={value}: .*stall"):
            gpus.check_blocking_wait({"TORCH_NCCL_BLOCKING_WAIT": value})
    gpus.check_blocking_wait({"TORCH_NCCL_BLOCKING_WAIT": "0", "NCCL_BLOCKING_WAIT": "1"})  # the first name decides
    with pytest.raises(UsageError, match="NCCL_BLOCKING_WAIT=1"):
        gpus.check_blocking_wait({"NCCL_BLOCKING_WAIT": "1"})
    monkeypatch.setattr(gpus, "visible_gpus", lambda *a: 1)
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    rc = cli.main(["run", "quick", "--backend", "nccl", "--np", "1", "--sizes", "8", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "TORCH_NCCL_BLOCKING_WAIT=1" in err[0]


def test_one_gpu_visibility_rule_for_the_cli_and_gpu_checks_preflight(tmp_path, monkeypatch):
    """A container may mount /dev/nvidiaN without the driver's /proc list: the CLI refused every
    nccl run there while gpu_check's preflight went on. Both now ask gpus.visible_gpus."""
    import importlib.util
    from pathlib import Path

    from commbench import backends

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    none = str(tmp_path / "no-proc")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.driver_gpus(none, str(dev)) == 2
    assert gpus.visible_gpus(none, str(tmp_path / "empty")) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpus.visible_gpus(none, str(dev)) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    real = gpus.driver_gpus
    monkeypatch.setattr(gpus, "driver_gpus", lambda *a: real(none, str(dev)))
    spec = importlib.util.spec_from_file_location("gpu_preflight", Path(__file__).resolve().parents[2] / "tools"
                                                  / "gpu_preflight.py")
    monkeypatch.syspath_prepend(str(Path(spec.origin).parent))
    pre = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre)
    assert pre.visible_gpus() == gpus.visible_gpus() == 2 and backends.gpu_visible()
