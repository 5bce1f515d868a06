"""Holding a CUDA stream while the host enqueues a batch (timing.time_held), and the
host-side meeting of the ranks before the release.

Two holds, best first:

- FlagHolds: a one-thread kernel (compiled by cupy) spinning on a flag in host-mapped
  memory, released when the host sets the flag. It cannot end early: it spins until the
  flag is set, up to a cap of HOLD_CAP_S, and says (a second mapped word) when the cap ran
  out, which is the only way it can fail to cover its batch.
- SleepHolds: torch.cuda._sleep(cycles), a fixed spin, when cupy is not installed. It can
  end before the host has enqueued the batch; an event recorded after it tells, when the
  host releases, whether it had already ended, and the batch is then flagged. Its length is
  set from the host's measured enqueue time with a wide margin.

Everything here touches a GPU; the logic that decides what a sample is lives in timing.py
and is tested on the CPU with a simulated stream.
"""
from __future__ import annotations

import ctypes

from .timing import Hold

# The longest a hold spins: a rank whose host never releases (a peer that died before the
# meeting) must not hang its GPU for ever; the watchdog ends the run long before.
HOLD_CAP_S = 30.0
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


def clock_hz(torch) -> float:
    """The GPU's SM clock, for turning seconds into the cycles clock64() counts."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    khz = getattr(props, "clock_rate", 0) or 1_500_000  # kHz; 1.5 GHz if torch does not say
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

    def __init__(self, torch):
        import cupy

        self.torch, self.cupy = torch, cupy
        self.kernel = cupy.RawKernel(_KERNEL, "commbench_hold")
        self.cap = int(HOLD_CAP_S * clock_hz(torch))
        self._slabs: list = []
        self._next = self.SLAB

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

    def __init__(self, torch):
        self.torch = torch
        self.hz = clock_hz(torch)

    def __call__(self, expected_s: float = 0.0) -> Hold:
        torch = self.torch
        spin_s = max(MIN_SLEEP_S, SLEEP_MARGIN * expected_s)
        torch.cuda._sleep(int(spin_s * self.hz))
        end = torch.cuda.Event()
        end.record()
        return _SleepHold(end)

    def close(self) -> None:
        pass


def make_holds(torch):
    """(factory, method name): the flag-released hold where cupy can compile it, else the
    fixed sleep."""
    try:
        return FlagHolds(torch), "flag"
    except Exception:  # noqa: BLE001 (no cupy, or it cannot compile here: fall back, and rows say so)
        return SleepHolds(torch), "sleep"
