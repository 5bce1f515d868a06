"""The overlap benchmark's measurement core: the schedule (where starts and polls fall
between compute chunks), the progress thread, and one overlapped run of compute beside
non-blocking all_reduces (OverlapCore). The benchmark (overlap.py) owns the formulas,
the params and the rows."""
from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass

from commbench.backends.compute import Compute
from commbench.core.errors import UsageError

# While a progress thread runs, the interpreter hands the GIL over every 50 us instead of
# every 5 ms, so the compute thread is not held at a chunk boundary for up to 5 ms by a
# poller that drops and retakes the GIL around each test() (restored afterwards).
POLLER_SWITCH_INTERVAL_S = 50e-6


# --- the schedule: where starts and polls fall between compute chunks ------------------

@dataclass(frozen=True)
class Schedule:
    """The compute runs in `nchunks` row blocks. Bucket i starts after chunk start_after[i]
    (-1: before the compute); a poll (test() of every outstanding handle) follows each
    chunk in poll_after."""

    nchunks: int
    start_after: tuple
    poll_after: frozenset

    @property
    def buckets(self) -> int:
        return len(self.start_after)


def make_schedule(mode: str, buckets: int, polls: int) -> Schedule:
    """single: one bucket started before the compute, which runs in polls + 1 chunks with a
    poll after each but the last. sequence: `buckets` segments of `per` chunks each, bucket i
    started after segment i; per is the least that leaves room for the polls, which are
    spread evenly over the chunk boundaries from the first start to the last chunk (a poll
    before any bucket started, or after the compute, would test nothing useful)."""
    if mode == "single":
        return Schedule(polls + 1, (-1,), frozenset(range(polls)))
    if buckets < 2:
        raise UsageError("overlap: sequence mode needs buckets >= 2 (a single bucket starts after the whole "
                         "compute: nothing overlaps it)")
    per = max(1, -(-polls // (buckets - 1)))
    n = buckets * per
    starts = tuple((i + 1) * per - 1 for i in range(buckets))
    first, room = starts[0], n - 1 - starts[0]
    polls_at = frozenset(first + (j * room) // polls for j in range(polls)) if polls else frozenset()
    return Schedule(n, starts, polls_at)


def nchunks_for(params: dict) -> int:
    mode = params["mode"]
    return make_schedule(mode, params["buckets"] if mode == "sequence" else 1, params["polls"]).nchunks


# --- the measurement core -----------------------------------------------------------------

class _Poller:
    """A persistent progress thread: armed for one overlapped run, it calls test() on every
    outstanding handle, over and over, until the compute is over and all have completed.
    `tests` is the number of test() calls of the last run."""

    def __init__(self):
        self._go = threading.Event()
        self._done = threading.Event()
        self._stop = False
        self._error: BaseException | None = None
        self.handles: list = []
        self.compute_over = False
        self.tests = 0
        self._thread = threading.Thread(target=self._loop, name="overlap-progress", daemon=True)
        self._thread.start()

    def arm(self, handles: list) -> None:
        self.handles = handles  # the main thread appends to this list as buckets start
        self.compute_over = False
        self._done.clear()
        self._go.set()

    def finish(self) -> None:
        self.compute_over = True
        self._done.wait()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        self._stop = True
        self._go.set()
        self._thread.join()

    def _loop(self):
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            try:
                self.tests = self._poll()
            except BaseException as e:  # noqa: BLE001 - handed to the main thread in finish()
                self._error = e
            self._done.set()

    def _poll(self) -> int:
        done: list = []
        tests = 0
        while True:
            over = self.compute_over  # read first: every handle was appended before it turned true
            hs = self.handles
            if len(done) < len(hs):
                done.extend([False] * (len(hs) - len(done)))
            pending = False
            for i in range(len(hs)):
                if not done[i]:
                    tests += 1
                    if hs[i].test():
                        done[i] = True
                    else:
                        pending = True
            if over and not pending:
                return tests


class OverlapCore:
    """One point's measurement, independent of the harness: `comm` starts the buckets'
    all_reduces (comm.iall_reduce(send, recv) -> Handle with wait()/test()), `compute` is
    a Compute. Each method runs one iteration and returns seconds."""

    def __init__(self, comm, compute: Compute, sends: list, recvs: list, schedule: Schedule, progress: str = "none"):
        if len(sends) != schedule.buckets or len(recvs) != schedule.buckets:
            raise ValueError("one send and one receive buffer per bucket")
        if len(compute.chunks) != schedule.nchunks:
            raise ValueError(f"compute has {len(compute.chunks)} chunks, the schedule {schedule.nchunks}")
        self.comm, self.compute, self.schedule, self.progress = comm, compute, schedule, progress
        self.starts = [functools.partial(comm.iall_reduce, s, r) for s, r in zip(sends, recvs)]
        self._poller = _Poller() if progress == "thread" else None
        self.thread_tests = 0  # test() calls the progress thread made in the last overlapped run
        # start_at[k]: buckets to start after chunk k (k = -1: before the compute)
        self._start_at: dict[int, list] = {}
        for i, k in enumerate(schedule.start_after):
            self._start_at.setdefault(k, []).append(self.starts[i])

    def close(self) -> None:
        if self._poller is not None:
            self._poller.close()
            self._poller = None

    def set_compute(self, compute: Compute) -> None:
        if len(compute.chunks) != self.schedule.nchunks:
            raise ValueError("compute chunks do not match the schedule")
        self.compute = compute

    # One iteration each, as the sampling loop's step: step(lap) (Comm.time_steps).
    def comm_once(self, lap=None) -> None:
        """Each bucket's all_reduce alone, start then wait, one after another."""
        for start in self.starts:
            start().wait()

    def compute_once(self, lap=None) -> None:
        self.compute.run()

    OVERLAPPED_LAPS = ("started", "compute")

    def overlapped_once(self, lap=lambda: None) -> None:
        """Start, compute with the schedule's starts and polls (or the progress thread), wait
        for every bucket. lap() after the first buckets started and after the compute: the
        second lap is the compute's own time inside the overlapped run."""
        sched, poller = self.schedule, self._poller
        start_at, polls = self._start_at, sched.poll_after
        handles: list = []
        for start in start_at.get(-1, ()):
            handles.append(start())
        if poller is not None:
            switch = sys.getswitchinterval()
            sys.setswitchinterval(POLLER_SWITCH_INTERVAL_S)
            poller.arm(handles)
        try:
            lap()
            for k, chunk in enumerate(self.compute.chunks):
                chunk()
                if k in start_at:
                    for start in start_at[k]:
                        handles.append(start())
                if k in polls:
                    for h in handles:
                        h.test()
            lap()
        finally:
            if poller is not None:
                poller.finish()
                sys.setswitchinterval(switch)
                self.thread_tests = poller.tests
        for h in handles:
            h.wait()
