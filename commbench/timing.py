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
                    info: dict | None = None) -> np.ndarray:
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
    per-operation estimate (seconds)."""
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
    times = time_with_events(lambda: replay(graph), iters, event_factory, synchronize,
                             between=between, elapsed=elapsed)
    return times / n
