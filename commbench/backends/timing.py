"""Device timing helpers: CUDA events around each operation, and CUDA-graph replays.

Everything a GPU provides is passed in (event factory, synchronize, graph capture and
replay), so the arithmetic here -- milliseconds to seconds, the division by operations
per replay, where a barrier goes, how often the host waits -- runs and is tested on a CPU
with fakes. torch.cuda and cupy.cuda both fit:

- torch: ``event_factory=lambda: torch.cuda.Event(enable_timing=True)``, the default
  ``elapsed`` (``start.elapsed_time(end)``, milliseconds), ``synchronize=torch.cuda.synchronize``;
- cupy: ``event_factory=cupy.cuda.Event``, ``elapsed=cupy.cuda.get_elapsed_time``,
  ``synchronize=cupy.cuda.get_current_stream().synchronize``.

An event is timestamped when the GPU reaches it in its stream, not when the host records
it. Operations enqueued back to back keep the host ahead of the GPU, so each pair of events
brackets the device work of one operation; when the host is slower than the GPU (tiny
messages, a launch costing more than the kernel) the GPU waits between the events and the
launch cost is in the sample. That is what graph replay removes: one launch for many
operations.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, ContextManager

import numpy as np

Op = Callable[[], None]

# A replay should last long enough that its launch (a few us on the host) stays ahead of
# the GPU and the events' resolution (about 0.5 us) is small beside it.
GRAPH_REPLAY_TARGET_S = 2e-4
GRAPH_MAX_OPS_PER_REPLAY = 100


def _default_elapsed(start, end) -> float:
    return start.elapsed_time(end)


def time_with_events(op: Op, iters: int, event_factory: Callable[[], object], synchronize: Callable[[], None],
                     between: Callable[[], None] | None = None,
                     elapsed: Callable[[object, object], float] | None = None) -> np.ndarray:
    """Seconds per iteration, from a start and an end event recorded on the current stream
    around each call of `op`. `between()` (a barrier) runs after the end event, outside
    the timed window. The host waits for the device once, after the loop; then each
    pair's elapsed time (milliseconds, as CUDA reports it) becomes seconds.

    Events are created before the loop so the loop holds only record, op, record."""
    iters = int(iters)
    if iters <= 0:
        return np.empty(0, dtype=np.float64)
    elapsed = elapsed or _default_elapsed
    starts = [event_factory() for _ in range(iters)]
    ends = [event_factory() for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        op()
        ends[i].record()
        if between is not None:
            between()
    synchronize()
    return np.array([elapsed(s, e) for s, e in zip(starts, ends)], dtype=np.float64) * 1e-3


def time_steps_with_events(step: Callable[[Callable[[], None]], None], iters: int, nlaps: int,
                           event_factory: Callable[[], object], synchronize: Callable[[], None],
                           between: Callable[[], None] | None = None,
                           elapsed: Callable[[object, object], float] | None = None,
                           hold: Callable[[float], "Hold"] | None = None,
                           meet: Callable[[], None] | None = None, host_waits: tuple = (),
                           info: dict | None = None,
                           clock: Callable[[], float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Comm.time_steps on the device's stream: an event before each step, one at each of its
    nlaps lap() calls and one after it; the host waits once, after the loop. Returns
    per-iteration seconds and each stage's seconds (iters, nlaps). hold: each step enqueued
    behind a hold (timing.time_held's discipline), released after meet().

    host_waits: indices of the stages that wait for the device on the host (moe's split
    sizes read by .tolist()). A hold still up then would stall the host until its cap, so
    the hold is released (after meet()) when the stage before ends, and a new one goes up
    when the waiting stage ends: every other stage is enqueued behind a hold.

    info, if given, receives what time_held's rows carry: whether every hold covered its
    step ("held", "unheld_samples"), the host's enqueue time per step ("host_us_per_op")."""
    import time as _time

    iters = int(iters)
    elapsed = elapsed or _default_elapsed
    clock = clock or _time.perf_counter
    waits = frozenset(int(k) for k in host_waits)
    events = [[event_factory() for _ in range(nlaps + 2)] for _ in range(iters)]
    # After a waiting stage the new hold goes up, then a restart event: the next stage is
    # timed from there, so the hold's own wait is in no stage.
    restarts: list[dict] = [{} for _ in range(iters)]
    covered_by: list[list[Hold]] = []
    host = np.empty(iters, dtype=np.float64)
    last_host_s = 0.0  # the host's time for the step before: how long a fixed-length hold must spin
    for i, row in enumerate(events):
        mine: list[Hold] = []
        up: list = [None]  # the hold now on the stream, if any

        def put_up(mine=mine, up=up):
            if hold is not None:
                up[0] = hold(last_host_s)
                mine.append(up[0])

        def let_go(up=up):
            if up[0] is not None:
                if meet is not None:
                    meet()
                up[0].release()
                up[0] = None
        if 0 not in waits:
            put_up()
        t0 = clock()
        j = [1]

        def lap(row=row, j=j, restart=restarts[i]):
            row[j[0]].record()
            done = j[0] - 1  # the stage that just ended
            j[0] += 1
            if done + 1 in waits:
                let_go()
            elif done in waits:
                put_up()
                restart[done + 1] = event_factory()
                restart[done + 1].record()
        row[0].record()
        step(lap)
        row[-1].record()
        if j[0] != nlaps + 1:
            raise RuntimeError(f"a timed step called lap() {j[0] - 1} times, expected {nlaps}")
        last_host_s = host[i] = clock() - t0
        let_go()
        covered_by.append(mine)
        if between is not None:
            between()
    synchronize()
    seg = np.array([[elapsed(rs.get(k, row[k]), row[k + 1]) for k in range(nlaps + 1)]
                    for row, rs in zip(events, restarts)], dtype=np.float64).reshape(iters, nlaps + 1) * 1e-3
    if info is not None:
        held = np.array([bool(hs) and all(h.covered() for h in hs) for hs in covered_by], dtype=bool)
        info.update(held=bool(held.all()), unheld_samples=int((~held).sum()),
                    host_us_per_op=float(np.median(host)) * 1e6 if iters else None)
    return seg.sum(axis=1), seg[:, :nlaps]


def choose_ops_per_replay(op_s: float, target_s: float = GRAPH_REPLAY_TARGET_S,
                          cap: int = GRAPH_MAX_OPS_PER_REPLAY) -> int:
    """Operations to capture in one graph so that a replay lasts about `target_s`, from an
    estimate of one operation's time (eager, so an over-estimate for small messages: the
    count errs low, never high). 1 for operations already longer than the target."""
    if math.isnan(op_s) or op_s <= 0:  # no estimate, or a free operation: amortize fully
        return cap
    return int(min(cap, max(1, math.ceil(round(target_s / op_s, 6)))))  # round: 2e-4 / 4e-6 is 50.000...01


def time_with_graph(op: Op, iters: int, ops_per_replay: int | None, capture: Callable[[Op], object],
                    replay: Callable[[object], None], event_factory: Callable[[], object],
                    synchronize: Callable[[], None], *, between: Callable[[], None] | None = None,
                    elapsed: Callable[[object, object], float] | None = None, warmup_iters: int = 3,
                    side_stream: Callable[[], ContextManager] | None = None,
                    info: dict | None = None,
                    time_replays: Callable[[Op, int], np.ndarray] | None = None) -> np.ndarray:
    """nccl-tests' small-message technique: `ops_per_replay` calls of `op` captured in ONE
    CUDA graph, then `iters` replays, each bracketed by events on the current stream.

    Sample i is replay i's time divided by `ops_per_replay`: a per-operation MEAN over one
    replay, not one operation's time. Percentiles of these samples (p50, p99) are over
    replays; a single slow operation inside a replay is averaged with its neighbours.

    Steps: `warmup_iters` eager calls inside `side_stream()` (a context that makes a
    non-default stream current: torch.cuda.graph requires warm-up off the default stream
    before capture), timed with events; `ops_per_replay=None` chooses the count from the
    warm-up's median (choose_ops_per_replay). Then `capture(body)` once, where body() calls
    `op` ops_per_replay times and capture returns a graph; one untimed replay (the first
    one uploads the graph); the timed replays, `between()` after each outside its events;
    one synchronize at the end. `info`, if given, receives ops_per_replay and the warm-up's
    per-operation estimate (seconds). time_replays(replay, iters) -> seconds per replay, if
    given, times the replays instead (held replays: timing.time_held)."""
    iters = int(iters)
    if iters <= 0:
        return np.empty(0, dtype=np.float64)
    side_stream = side_stream or contextlib.nullcontext
    est = float("nan")
    if warmup_iters > 0:
        with side_stream():
            warm = time_with_events(op, warmup_iters, event_factory, synchronize, elapsed=elapsed)
        # The first eager call may pay one-off setup: leave it out when there are others.
        est = float(np.median(warm[1:] if warm.size > 1 else warm))
    if ops_per_replay is None:
        ops_per_replay = choose_ops_per_replay(est)
    n = int(ops_per_replay)
    if n < 1:
        raise ValueError(f"ops_per_replay must be >= 1, got {ops_per_replay}")
    if info is not None:
        info["ops_per_replay"] = n
        info["warmup_op_s"] = est

    def body():
        for _ in range(n):
            op()

    graph = capture(body)
    replay(graph)  # untimed: the first launch uploads the graph
    if time_replays is not None:
        return time_replays(lambda: replay(graph), iters) / n
    times = time_with_events(lambda: replay(graph), iters, event_factory, synchronize,
                             between=between, elapsed=elapsed)
    return times / n


# --- held batches: device time only ---------------------------------------------------
#
# An event recorded on an idle stream is stamped at once, while the operation after it
# reaches the GPU only when the host has spent its launch cost (20-30 us a call through
# torch.distributed): a pair around each eager operation brackets host time. Holding the
# stream with a spinning kernel until the host has enqueued a whole batch (NVIDIA's nvbench
# calls it a blocking kernel) makes the pair bracket device work only; with several ranks
# each rank holds, the ranks meet on the host, then all release, so the batch starts
# together on every rank and the time holds the collective's own synchronisation, not the
# host's enqueue skew.

# A batch lasts at least this long on the device, so one event pair (1-2 us at the
# smallest sizes) is about 1 % of it; at most this many operations, so the host enqueues
# a batch in a few ms (25 us a torch.distributed call: 5 ms for 200).
BATCH_TARGET_S = 2e-4
BATCH_MAX_OPS = 200


def choose_ops_per_batch(op_s: float, target_s: float = BATCH_TARGET_S, cap: int = BATCH_MAX_OPS) -> int:
    """Operations in one held batch, from an estimate of one operation's device time."""
    return choose_ops_per_replay(op_s, target_s, cap)


class Hold:
    """A spinning kernel enqueued on the current stream. release() lets it end; covered()
    (after the device is synchronized) says whether it was still holding when released --
    a batch whose hold ended early had its first operations start while the host was still
    enqueueing, so its time may hold host cost, and the row says so."""

    def release(self) -> None:
        raise NotImplementedError

    def covered(self) -> bool:
        raise NotImplementedError


class NoHold(Hold):
    """Where a stream cannot be held (a step that waits for the device on the host)."""

    def __init__(self, expected_s: float = 0.0):
        pass

    def release(self) -> None:
        pass

    def covered(self) -> bool:
        return False


@dataclass
class HeldTimes:
    """What time_held measured."""

    samples_s: np.ndarray        # per-operation seconds: a batch's mean, or each op's (per_op)
    host_s_per_op: np.ndarray    # host time to enqueue one operation, each batch
    held: np.ndarray             # per sample: the hold covered its batch
    ops_per_batch: int
    per_op: bool

    def info(self) -> dict:
        """Row fields: how samples were taken and what the host paid."""
        unheld = int((~self.held).sum())
        return {"ops_per_sample": 1 if self.per_op else self.ops_per_batch,
                "sample": (f"one operation (an event pair each) in held batches of {self.ops_per_batch}"
                           if self.per_op else f"mean of {self.ops_per_batch} operations between one event pair, "
                                               f"stream held while enqueued; percentiles over batches"),
                "host_us_per_op": float(np.median(self.host_s_per_op)) * 1e6 if self.host_s_per_op.size else None,
                "held": unheld == 0, "unheld_samples": unheld}


def time_held(op: Op, batches: int, ops_per_batch: int, hold: Callable[[float], Hold],
              event_factory: Callable[[], object], synchronize: Callable[[], None], *,
              meet: Callable[[], None] | None = None, elapsed: Callable[[object, object], float] | None = None,
              per_op: bool = False, clock: Callable[[], float] | None = None) -> HeldTimes:
    """`batches` batches of `ops_per_batch` calls of `op`. Per batch: hold(expected_s) (the
    host's enqueue time of the batch before, for a hold of fixed length), a start event,
    the calls (the host's enqueue time around them, by `clock`), an end event, meet() (the
    ranks' host-side barrier), release. per_op: an event pair around each call instead of
    one around the batch (for tail studies; each pair costs 1-2 us of device time at the
    smallest sizes, which is then in every sample). One synchronize at the end."""
    import time as _time

    clock = clock or _time.perf_counter
    elapsed = elapsed or _default_elapsed
    n, batches = int(ops_per_batch), int(batches)
    if n < 1:
        raise ValueError(f"ops_per_batch must be >= 1, got {ops_per_batch}")
    pairs: list = []
    holds: list = []
    host = np.empty(batches, dtype=np.float64)
    for b in range(batches):
        h = hold(host[b - 1] * n if b else 0.0)
        if per_op:
            evs = [(event_factory(), event_factory()) for _ in range(n)]
            t0 = clock()
            for s, e in evs:
                s.record()
                op()
                e.record()
            t1 = clock()
            pairs.extend(evs)
        else:
            s, e = event_factory(), event_factory()
            s.record()
            t0 = clock()
            for _ in range(n):
                op()
            t1 = clock()
            e.record()
            pairs.append((s, e))
        host[b] = (t1 - t0) / n
        if meet is not None:
            meet()
        h.release()
        holds.append(h)
    synchronize()
    covered = np.array([h.covered() for h in holds], dtype=bool)
    times = np.array([elapsed(s, e) for s, e in pairs], dtype=np.float64) * 1e-3
    if per_op:
        return HeldTimes(times, host, np.repeat(covered, n), n, True)
    return HeldTimes(times / n, host, covered, n, False)


def clock_name(cuda_graph: bool, comm, op) -> str:
    """How a row's samples were clocked: the loop in C (mpi_timeloop) reads the same
    monotonic clock per iteration as the Python loop, and the row says which loop ran."""
    if cuda_graph:
        return "cuda_graph"
    if getattr(op, "compiled_loop", None) is not None:
        return "host_clock_compiled_loop"
    return comm.timing_method
