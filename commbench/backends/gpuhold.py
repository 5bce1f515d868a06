"""Holding a CUDA stream while the host enqueues a batch (timing.time_held), and the
host-side meeting of the ranks before the release.

Two holds, best first:

- FlagHolds: a one-thread kernel (compiled by cupy) spinning on a flag in host-mapped
  memory, released when the host sets the flag. It cannot end early: it spins until the
  flag is set, up to a cap (hold_cap_s: COMMBENCH_HOLD_CAP_S, default DEFAULT_HOLD_CAP_S),
  and says (a second mapped word) when the cap ran out, which is the only way it can fail
  to cover its batch. The kernel is compiled and launched once when the factory is made,
  so a cupy that cannot build or run it falls back before any timing, with the reason.
- SleepHolds: torch.cuda._sleep(cycles), a fixed spin, when cupy is not installed. It can
  end before the host has enqueued the batch; an event recorded after it tells, when the
  host releases, whether it had already ended, and the batch is then flagged. Its length is
  set from the host's measured enqueue time with a wide margin.

Everything here touches a GPU; the logic that decides what a sample is lives in timing.py
and is tested on the CPU with a simulated stream.
"""
from __future__ import annotations

import ctypes
import os

from commbench.core.errors import UsageError

from .timing import Hold

# The longest a hold spins. A host that waits for the device while its stream is held (a
# call that synchronizes, a first launch that loads a module) stalls until the cap, and a
# peer that died before the meeting must not hang the GPU for ever. A held batch is
# enqueued in a few ms (200 calls at 25 us), so one second is a wide margin, and an op whose
# hold ran out once is timed unheld for the rest of its point (TorchComm), so a stall costs
# one cap, not one per batch.
DEFAULT_HOLD_CAP_S = 1.0
HOLD_CAP_ENV = "COMMBENCH_HOLD_CAP_S"
# SleepHolds spin this many times the host's last enqueue time, and at least MIN_SLEEP_S.
SLEEP_MARGIN = 4.0
MIN_SLEEP_S = 5e-3

_KERNEL = r"""
extern "C" __global__ void commbench_hold(volatile int *flag, int *expired, long long cap_cycles) {
    long long start = clock64();
    while (*flag == 0) {
        if (clock64() - start > cap_cycles) { *expired = 1; return; }
    }
}
"""


def hold_cap_s(environ=None) -> float:
    """The hold's cap in seconds: COMMBENCH_HOLD_CAP_S when set (a positive number of
    seconds, at most an hour), else DEFAULT_HOLD_CAP_S."""
    environ = os.environ if environ is None else environ
    raw = environ.get(HOLD_CAP_ENV, "").strip()
    if not raw:
        return DEFAULT_HOLD_CAP_S
    try:
        cap = float(raw)
    except ValueError:
        cap = float("nan")
    if not 0 < cap <= 3600:  # nan fails too
        raise UsageError(f"{HOLD_CAP_ENV}={raw!r}: expected seconds, a number above 0 and at most 3600")
    return cap


# cudaDeviceAttr's cudaDevAttrClockRate (cuda_runtime_api.h / driver_types.h): the SM clock
# in kHz. CUDA 13 dropped cudaDeviceProp::clockRate, which torch's props.clock_rate reads,
# but kept the attribute.
CUDA_DEV_ATTR_CLOCK_RATE = 13
FALLBACK_CLOCK_KHZ = 1_500_000


def clock_hz(torch, cupy=None) -> float:
    """The GPU's SM clock, for turning seconds into the cycles clock64() counts: the device
    attribute (through cupy, where it imports), else torch's props.clock_rate (CUDA 12 and
    older), else 1.5 GHz."""
    dev = torch.cuda.current_device()
    if cupy is None:
        try:
            import cupy
        except ImportError:
            cupy = None
    if cupy is not None:
        try:
            khz = int(cupy.cuda.runtime.deviceGetAttribute(CUDA_DEV_ATTR_CLOCK_RATE, dev))
        except Exception:  # a cupy without the call, or a runtime that refuses it: ask torch
            khz = 0
        if khz > 0:
            return float(khz) * 1e3
    props = torch.cuda.get_device_properties(dev)
    khz = getattr(props, "clock_rate", 0) or FALLBACK_CLOCK_KHZ
    return float(khz) * 1e3


class _FlagHold(Hold):
    def __init__(self, flag: ctypes.c_int, expired: ctypes.c_int):
        self.flag, self.expired = flag, expired

    def release(self) -> None:
        self.flag.value = 1

    def covered(self) -> bool:
        return self.expired.value == 0


class FlagHolds:
    """A factory of flag-released holds on torch's current stream. Each hold gets its own
    pair of mapped words (a later hold must not reset a flag an earlier kernel, still queued
    behind other work, has yet to read), from slabs of SLAB words allocated as needed."""

    SLAB = 4096

    def __init__(self, torch, cap_s: float | None = None):
        import cupy

        self.torch, self.cupy = torch, cupy
        self.cap_s = hold_cap_s() if cap_s is None else cap_s
        self.kernel = cupy.RawKernel(_KERNEL, "commbench_hold")
        self.cap = int(self.cap_s * clock_hz(torch, cupy))
        self._slabs: list = []
        self._next = self.SLAB
        # RawKernel compiles on its first launch: launch it here, released before it starts,
        # and wait, so a compile or launch failure happens now (make_holds falls back) and
        # not inside the first timed batch, and the module is loaded before any hold.
        try:
            hold = self()
            hold.release()
            torch.cuda.current_stream().synchronize()
        except BaseException:
            self.close()
            raise

    def _words(self):
        rt = self.cupy.cuda.runtime
        if self._next >= self.SLAB:
            nbytes = 2 * self.SLAB * 4
            ptr = rt.hostAlloc(nbytes, rt.hostAllocMapped)
            ctypes.memset(ptr, 0, nbytes)
            self._slabs.append(ptr)
            self._next = 0
        base = self._slabs[-1] + 8 * self._next
        self._next += 1
        return base, base + 4

    def __call__(self, expected_s: float = 0.0) -> Hold:
        flag_ptr, exp_ptr = self._words()
        flag, expired = ctypes.c_int.from_address(flag_ptr), ctypes.c_int.from_address(exp_ptr)
        flag.value, expired.value = 0, 0
        stream = self.cupy.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream)
        # With unified addressing a mapped host pointer is valid on the device as it is.
        self.kernel((1,), (1,), (flag_ptr, exp_ptr, self.cap), stream=stream)
        return _FlagHold(flag, expired)

    def close(self) -> None:
        for ptr in self._slabs:
            self.cupy.cuda.runtime.freeHost(ptr)
        self._slabs.clear()


class _SleepHold(Hold):
    def __init__(self, end_event):
        self.end_event = end_event
        self._covered = False

    def release(self) -> None:
        # Still spinning now that the host has enqueued the batch and met the others?
        self._covered = not self.end_event.query()

    def covered(self) -> bool:
        return self._covered


class SleepHolds:
    """torch.cuda._sleep holds, sized from the host's enqueue time of the last batch."""

    def __init__(self, torch, cap_s: float | None = None):
        self.torch = torch
        self.hz = clock_hz(torch)
        self.cap_s = hold_cap_s() if cap_s is None else cap_s
        # The sleep kernel's first launch (its module loaded lazily) happens here, drained,
        # not in front of the first held batch.
        torch.cuda._sleep(1)
        torch.cuda.synchronize()

    def __call__(self, expected_s: float = 0.0) -> Hold:
        torch = self.torch
        spin_s = min(self.cap_s, max(MIN_SLEEP_S, SLEEP_MARGIN * expected_s))
        torch.cuda._sleep(int(spin_s * self.hz))
        end = torch.cuda.Event()
        end.record()
        return _SleepHold(end)

    def close(self) -> None:
        pass


def make_holds(torch, cap_s: float | None = None):
    """(factory, method name, why the flag hold is not used or None): the flag-released hold
    where cupy can compile and launch it here, else the fixed sleep."""
    cap_s = hold_cap_s() if cap_s is None else cap_s
    try:
        return FlagHolds(torch, cap_s), "flag", None
    except Exception as e:  # noqa: BLE001 (no cupy, or it cannot compile here: fall back, and rows say so)
        first = (str(e).strip().splitlines() or [""])[0][:160]
        why = f"flag hold unavailable ({type(e).__name__}{': ' + first if first else ''})"
        return SleepHolds(torch, cap_s), "sleep", why
