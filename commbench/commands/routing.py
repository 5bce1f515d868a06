"""`commbench routing FILE`: a captured routing trace's statistics, read from the file alone
(nothing is run): its shape, and the load it puts on the ranks and experts at an EP size."""
from __future__ import annotations

from commbench.core.errors import UsageError
from commbench.moe.trace import DEFAULT_STATS_WORLD, load_trace, trace_stats


def _line(label: str, st: dict) -> str:
    return (f"{label:<8} rank load max/mean {st['rank_load_max_over_mean']:.3f} (hottest rank "
            f"{st['hottest_rank']})  expert load max/mean {st['expert_load_max_over_mean']:.3f} (hottest expert "
            f"{st['hottest_expert']})  local share {100 * st['local_pick_share']:.1f}%")


def routing_command(path: str, world: int | None = None, per_step: bool = False) -> int:
    """Print the trace at path read at `world` ranks (default: the EP size it was recorded
    at, else DEFAULT_STATS_WORLD); bad files and worlds are one UsageError line."""
    try:
        trace = load_trace(path)
        if world is None:
            world = trace.recorded_world or DEFAULT_STATS_WORLD
        trace.check_world(world)
        stats = trace_stats(trace, world)
    except ValueError as e:
        raise UsageError(str(e)) from None
    rec = f"EP {trace.recorded_world}" if trace.recorded_world else "not recorded"
    print(f"trace {trace.label}: {trace.steps} step(s), {trace.tokens} tokens a step, E={trace.num_experts} "
          f"K={trace.top_k}, weights {'given' if trace.weights is not None else 'equal (1/K)'}, recorded EP size: "
          f"{rec}")
    print(f"at world {world}: {trace.tokens // world} tokens per rank, {trace.num_experts // world} experts per "
          f"rank (tokens split in order; local share: picks whose expert is on the token's own rank)")
    note = trace.reshard_note(world)
    if note:
        print(f"note: {note}")
    print(_line("all", stats["all"]))
    if per_step:
        for s, st in enumerate(stats["per_step"]):
            print(_line(f"step {s}", st))
    return 0
