"""A simulated CUDA stream, and the parts of torch, torch.distributed (ProcessGroupNCCL) and
cupy that commbench's GPU path touches, modelled on what the real stack does:

- the host pays a launch cost per call; the device runs what was enqueued, in order; an
  event is stamped when the device reaches it;
- a hold keeps the device from going on until the host releases it, or until its cap runs
  out (then it reports itself expired);
- a call that waits for the device on the host (ProcessGroupNCCL's barrier, whose work's
  wait() synchronizes the current stream; .tolist() of a device tensor) blocks the host
  until the device has drained: behind a hold nobody can release, until the cap;
- a kernel's first launch may block the host until the device drains (CUDA's lazy module
  loading, cuBLAS's first handle, the caching allocator's first cudaMalloc, NCCL's lazy
  connection set-up);
- cupy's RawKernel compiles on its first launch, and that compile can fail;
- an event costs device time when the device reaches it (event_s; MEASURED_EVENT_S is the
  H200's figure), so a pair around each tiny operation inflates it;
- a CUDA graph capture (torch.cuda.graph) records what is launched on the capturing stream,
  cupy's NCCL call included when it is given that stream, and refuses a launch on the legacy
  default stream; work on any other stream runs at once, outside the graph;
- ProcessGroupNCCL's Work.wait() blocks the host until the work completes when
  TORCH_NCCL_BLOCKING_WAIT is set or a timeout is passed.

Everything runs on simulated clocks (seconds): Device.host is the host's time, which is
what a stall shows up in.
"""
from __future__ import annotations

import contextlib
import ctypes
import types

import torch as _real_torch

from commbench.backends import timing

# One event's device time: an event pair cost 1-2 us at the smallest sizes on one H200
# (shared/reference/gpu-h200.md, "Where the time goes": 3.81 us an 8 B all_gather with a pair
# each, 1.76 with one pair around 200), so about 1 us an event.
MEASURED_EVENT_S = 1e-6
# The stream torch.cuda.graph captures on (its own side stream), and the legacy default
# stream, which a capture in another stream forbids: cudaErrorStreamCaptureImplicit, "the
# operation would make the legacy stream depend on a capturing blocking stream" (CUDA
# runtime API, driver_types.h, enum cudaError).
CAPTURE_STREAM, LEGACY_STREAM, TORCH_STREAM = 8, 0, 7


class Device:
    def __init__(self, launch_s: float = 25e-6, cap_s: float = 1.0, first_launch_drains: bool = False,
                 event_s: float = 0.0):
        self.host = 0.0
        self.launch_s, self.cap_s, self.event_s = launch_s, cap_s, event_s
        self.first_launch_drains = first_launch_drains
        self.capture: list | None = None  # the graph being captured: device seconds per captured launch
        self.queue: list = []   # (kind, host time enqueued, payload)
        self.dev_t = 0.0
        self.log: list = []
        self.holds: list = []
        self.launched: set = set()

    # --- the host's side -------------------------------------------------------------
    def kernel(self, name: str, device_s: float):
        """A launch: the host pays launch_s (and, on a first launch that drains, waits for the
        device first), the device runs device_s."""
        def run():
            if self.first_launch_drains and name not in self.launched:
                self.log.append(f"first:{name}")
                self.drain()
            self.launched.add(name)
            self.launch_on(self.current_stream(), name, device_s)
        return run

    def current_stream(self) -> int:
        return CAPTURE_STREAM if self.capture is not None else TORCH_STREAM

    def launch_on(self, stream: int, name: str, device_s: float) -> None:
        """A launch on an explicit stream (cupy's calls take the stream handle as given).
        While a graph is captured: on the capturing stream it joins the graph; on the legacy
        stream it is refused; on any other stream it runs now, outside the graph."""
        self.host += self.launch_s
        if self.capture is not None:
            if stream == CAPTURE_STREAM:
                self.capture.append(device_s)
                self.log.append(f"capture:{name}")
                return
            if stream == LEGACY_STREAM:
                raise RuntimeError("cudaErrorStreamCaptureImplicit: operation would make the legacy stream depend "
                                   "on a capturing blocking stream")
        self.queue.append(("op", self.host, device_s))
        self.log.append(name)

    def host_wait(self, name: str, device_s: float = 1e-6):
        """A call that enqueues device work, then waits for the device on the host."""
        k = self.kernel(name, device_s)

        def run():
            k()
            self.drain()
        return run

    def event(self):
        dev = self

        class Ev:
            t = None

            def record(self, stream=None):
                dev.queue.append(("event", dev.host, self))

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3

            def query(self):
                return self.t is not None
        return Ev()

    def hold(self, expected_s: float = 0.0):
        dev = self

        class H(timing.Hold):
            released = None
            expired = None

            def release(self):
                self.released = dev.host
                dev.log.append("release")

            def covered(self):
                return self.expired is False

        h = H()
        self.host += self.launch_s
        self.queue.append(("hold", self.host, h))
        self.holds.append(h)
        self.log.append("hold")
        return h

    def drain(self):
        """The host waits until the device has run everything enqueued. A hold the host has
        not released by now cannot be released (the host is waiting): it runs to its cap."""
        t = self.dev_t
        for kind, at, payload in self.queue:
            t = max(t, at)
            if kind == "op":
                t += payload
            elif kind == "event":
                payload.t = t
                t += self.event_s  # the event's own device time, after its stamp
            else:
                end = t + self.cap_s
                rel = payload.released
                payload.expired = rel is None or rel > end
                t = end if payload.expired else max(t, rel)
        self.queue.clear()
        self.dev_t = t
        self.host = max(self.host, t)
        self.log.append("sync")

    def expired(self) -> int:
        return sum(1 for h in self.holds if h.expired)


class _Torch(types.SimpleNamespace):
    """torch, with a simulated torch.cuda; everything else is the real torch."""

    def __getattr__(self, name):
        return getattr(_real_torch, name)


def fake_torch(dev: Device, sm_khz: int = 1_000_000):
    class Stream:
        def __init__(self, handle: int | None = None):
            self.cuda_stream = dev.current_stream() if handle is None else handle

        def synchronize(self):
            dev.drain()

        def wait_stream(self, other):
            pass

    class CUDAGraph:
        """torch.cuda.CUDAGraph: replay() is one launch that runs every captured launch."""

        def __init__(self):
            self.launches: list = []

        def replay(self):
            dev.host += dev.launch_s
            dev.queue.append(("op", dev.host, sum(self.launches)))
            dev.log.append(f"replay:{len(self.launches)}")

    @contextlib.contextmanager
    def graph(g, capture_error_mode="global", **kw):
        """torch.cuda.graph: captures on its own stream, which is current inside."""
        dev.capture = g.launches
        try:
            yield
        finally:
            dev.capture = None

    def sleep(cycles):
        dev.host += dev.launch_s
        dev.queue.append(("op", dev.host, cycles / (sm_khz * 1e3)))
        dev.log.append("sleep")

    cuda = types.SimpleNamespace(
        Event=lambda enable_timing=False: dev.event(), synchronize=dev.drain, current_stream=lambda: Stream(),
        Stream=lambda: Stream(TORCH_STREAM + 100), stream=lambda s: contextlib.nullcontext(), current_device=lambda: 0,
        CUDAGraph=CUDAGraph, graph=graph,
        get_device_properties=lambda i: types.SimpleNamespace(clock_rate=sm_khz), _sleep=sleep)
    return _Torch(cuda=cuda)


class Work:
    """ProcessGroupNCCL's WorkNCCL: wait() makes the current stream wait for the work (no host
    wait), and blocks the host until the work completes "if (blockingWait_ || timeout !=
    kNoTimeout)" (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::wait; blockingWait_
    from TORCH_NCCL_BLOCKING_WAIT in the constructor)."""

    def __init__(self, dev: Device, blocking: bool):
        self.dev, self.blocking = dev, blocking
        self.waits: list = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if self.blocking or timeout is not None:
            self.dev.drain()
        return True

    def is_completed(self):
        return not self.dev.queue


def fake_dist(dev: Device, blocking_wait: bool = False):
    """torch.distributed as ProcessGroupNCCL behaves at world 1: collectives are kernels on
    the current stream; barrier's work synchronizes the stream in wait(), so the host waits
    for the device; a synchronous call waits on its work (blocking_wait: the host then waits
    for the device, TORCH_NCCL_BLOCKING_WAIT=1)."""
    def all_reduce(t, op=None, group=None, async_op=False):
        dev.kernel("all_reduce", 1e-6)()
        work = Work(dev, blocking_wait)
        if async_op:
            return work
        work.wait()

    def barrier(group=None):
        dev.host_wait("barrier")()
    return types.SimpleNamespace(barrier=barrier, all_reduce=all_reduce, ReduceOp=_real_torch.distributed.ReduceOp,
                                 all_gather_object=lambda out, obj, group=None: out.__setitem__(0, obj))


def cuda_comm(dev: Device, hold_method: str = "flag"):
    """A TorchComm on the simulated device, its hold factory the device's flag hold."""
    from commbench.backends.torch_dist import TorchComm

    comm = TorchComm(None, 0, 1, "nccl", "cpu")  # built on CPU, then pointed at the fake CUDA
    comm.device, comm.timing_method = "cuda", "cuda_event"
    comm.torch, comm.dist = fake_torch(dev), fake_dist(dev)
    comm._hold_factory, comm._hold_method = dev.hold, hold_method
    return comm


class FakeNccl:
    """cupy.cuda.nccl: NcclCommunicator.allReduce hands the stream it is given to ncclAllReduce
    as it is, with no synchronization (cupy_backends/cuda/libs/nccl.pyx:470-477, allReduce), and
    NCCL joins a capture when that stream is capturing (nccl v2.28.9-1
    src/misc/strongstream.cc:83-99, cudaStreamGetCaptureInfo on the user's stream)."""

    NCCL_FLOAT32, NCCL_FLOAT16, NCCL_BFLOAT16, NCCL_INT32, NCCL_SUM = 7, 6, 9, 2, 0

    def __init__(self, dev: Device, device_s: float = 1e-6):
        self.inits: list = []
        nccl = self

        class NcclCommunicator:
            def __init__(self, ndev, uid, rank):
                nccl.inits.append((ndev, uid, rank))

            def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
                dev.launch_on(int(stream), "cupy_nccl_allreduce", device_s)
        self.NcclCommunicator = NcclCommunicator

    @staticmethod
    def get_unique_id():
        return (1, 2, 3)


class FakeCupy:
    """cupy's RawKernel, mapped host memory and ExternalStream. compile_error: the text a
    failing compile raises, on the first launch (cupy compiles then)."""

    def __init__(self, dev: Device, compile_error: str | None = None):
        self.dev, self.launches, self.buffers = dev, [], []
        fake = self

        class RawKernel:
            def __init__(self, source, name):
                self.compiled = False

            def __call__(self, grid, block, args, stream=None):
                if not self.compiled:
                    if compile_error:
                        raise RuntimeError(compile_error)
                    self.compiled = True
                fake.launches.append(args)
                dev.host += dev.launch_s
                dev.queue.append(("op", dev.host, 1e-6))

        def host_alloc(nbytes, flags):
            buf = ctypes.create_string_buffer(nbytes)
            self.buffers.append(buf)
            return ctypes.addressof(buf)
        runtime = types.SimpleNamespace(hostAlloc=host_alloc, hostAllocMapped=2, freeHost=lambda ptr: None)
        self.RawKernel = RawKernel
        self.cuda = types.SimpleNamespace(runtime=runtime, ExternalStream=lambda ptr: ("stream", ptr),
                                          nccl=FakeNccl(dev))

    def install(self, monkeypatch) -> None:
        """Make `import cupy` and `from cupy.cuda import nccl` find this fake."""
        import sys

        monkeypatch.setitem(sys.modules, "cupy", self)
        monkeypatch.setitem(sys.modules, "cupy.cuda", self.cuda)
        monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", self.cuda.nccl)
