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
- cupy's RawKernel compiles on its first launch, and that compile can fail.

Everything runs on simulated clocks (seconds): Device.host is the host's time, which is
what a stall shows up in.
"""
from __future__ import annotations

import contextlib
import ctypes
import types

import torch as _real_torch

from commbench.backends import timing


class Device:
    def __init__(self, launch_s: float = 25e-6, cap_s: float = 1.0, first_launch_drains: bool = False):
        self.host = 0.0
        self.launch_s, self.cap_s = launch_s, cap_s
        self.first_launch_drains = first_launch_drains
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
            self.host += self.launch_s
            self.queue.append(("op", self.host, device_s))
            self.log.append(name)
        return run

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
        cuda_stream = 7

        def synchronize(self):
            dev.drain()

        def wait_stream(self, other):
            pass

    def sleep(cycles):
        dev.host += dev.launch_s
        dev.queue.append(("op", dev.host, cycles / (sm_khz * 1e3)))
        dev.log.append("sleep")

    cuda = types.SimpleNamespace(
        Event=lambda enable_timing=False: dev.event(), synchronize=dev.drain, current_stream=lambda: Stream(),
        Stream=Stream, stream=lambda s: contextlib.nullcontext(), current_device=lambda: 0,
        get_device_properties=lambda i: types.SimpleNamespace(clock_rate=sm_khz), _sleep=sleep)
    return _Torch(cuda=cuda)


def fake_dist(dev: Device):
    """torch.distributed as ProcessGroupNCCL behaves at world 1: collectives are kernels on
    the current stream; barrier's work synchronizes the stream in wait(), so the host waits
    for the device."""
    def all_reduce(t, op=None, group=None, async_op=False):
        dev.kernel("all_reduce", 1e-6)()

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
        self.cuda = types.SimpleNamespace(runtime=runtime, ExternalStream=lambda ptr: ("stream", ptr))
