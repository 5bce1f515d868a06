"""The plan of a sweep, before anything runs: memory per rank and a rough time per point
(--dry-run), and the refusals that need them: a sweep that does not fit this host's
memory, a call whose count overflows an MPI int."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

from commbench.benchmarks import get
from commbench.core.errors import UsageError
from commbench.core.units import INT_MAX, fmt_size
from commbench.core.whoami import local_ranks

from . import plant

# A rough rate for the time estimate of --dry-run: the order of a shared-memory copy; a real
# fabric is faster, so the estimate errs long. The latency is the order of an MPI call.
PLAN_GBPS = 5.0
PLAN_ALPHA_S = 2e-6
PLAN_SETUP_S = 0.01


def _mem_available_nbytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fmt_mem(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"



@functools.lru_cache(maxsize=1)
def mpi_large_count() -> bool:
    """Does the MPI library speak MPI-4 (large-count calls, which mpi4py then uses)? Asked
    in a child process: importing mpi4py here would initialise MPI in the launcher."""
    import subprocess
    import sys

    code = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_version()[0])"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        return int(out.strip() or 0) >= 4
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False


def point_seconds(cfg, p) -> float:
    """A rough time for one point (PLAN_GBPS, PLAN_ALPHA_S): the --dry-run total, and the
    weight of each point in the progress bar's estimate of the time left."""

    bench = get(p.benchmark)
    op_s = PLAN_ALPHA_S + bench.plan_nbytes(p) / (PLAN_GBPS * 1e9)
    if cfg.iters:
        t = (cfg.iters + cfg.warmup) * op_s
    else:
        t = cfg.warmup * op_s + min(max(cfg.min_time_ms / 1e3, cfg.min_iters * op_s), cfg.max_iters * op_s)
    return t * bench.stages + PLAN_SETUP_S


def plan(cfg, points: list, world: int, device: str, check_counts: bool = False) -> list[dict]:
    """Per point: buffer bytes per rank (the benchmark's own estimate) and a rough time.
    Refuses, before any rank starts, a sweep whose largest point does not fit this host's
    available memory with every local rank holding its buffers, and (check_counts: the
    mpi backend) a call whose count overflows a C int."""

    out = []
    for p in points:
        bench = get(p.benchmark)
        if check_counts and bench.max_count(p) > INT_MAX and not mpi_large_count():
            raise UsageError(
                f"{p.benchmark} {fmt_size(p.nbytes)} {p.dtype} at world {p.world} passes {bench.max_count(p)} "
                f"elements in one call, over the 2^31-1 an MPI count holds without MPI-4 large-count calls, "
                f"which this MPI library lacks: use a wider dtype or a smaller size")
        mem = int(bench.memory_nbytes(p))
        out.append({"point": p, "mem_nbytes": mem, "est_s": point_seconds(cfg, p)})
    if device == "cpu" and out:
        avail = _mem_available_nbytes()
        local = local_ranks(world)
        # A point holds buffers on its own ranks only: a 2-rank point of a 4-rank launch, 2.
        here = {id(r): min(local, world, r["point"].world) for r in out}
        big = max(out, key=lambda r: r["mem_nbytes"] * here[id(r)])
        n = here[id(big)]
        if avail is not None and big["mem_nbytes"] * n > avail:
            p = big["point"]
            what = (f"{p.benchmark} {fmt_size(p.nbytes)}" if get(p.benchmark).sized else
                    f"{p.benchmark} {' '.join(f'{k}={v}' for k, v in p.params.items() if k in _SHAPE_KEYS)}")
            raise UsageError(
                f"{what} at world {p.world} needs about {fmt_mem(big['mem_nbytes'])} per rank, "
                f"{fmt_mem(big['mem_nbytes'] * n)} for {n} ranks on this host, which has {fmt_mem(avail)} "
                f"available: {_lower_hint(get(p.benchmark), p.benchmark)} or the ranks per host")
    return out


# The params that set an unsized benchmark's buffers, named in a refusal.
_SHAPE_KEYS = ("tokens", "hidden", "experts", "topk", "copies", "mode", "capacity")


def _lower_hint(bench, name: str) -> str:
    """What shrinks a point's buffers: the sizes, or for a benchmark without sizes its
    token count (the MoE knob, `make moe MOE_TOKENS=`)."""
    if bench.sized:
        return "lower the sizes"
    if "tokens" in bench.params:
        make = " (make MOE_TOKENS=N)" if name == "moe" else ""
        return f"lower the tokens per rank with --param {name}.tokens=N{make}"
    return "lower its params"


def headline(cfg, n_points: int, world: int, backend: str, source=None) -> str:
    """A run's first line: the suite, its size, and the suite file it came from
    (source: suite.suite_source's (file, the shipped suite it hides))."""
    return (f"suite {cfg.name}: {n_points} points on {world} ranks, backend {backend}"
            + (f"; suite file {source[0]}" if source else ""))


def say_warnings(cfg, points: list, source=None) -> None:
    """What a run must not keep quiet about before it starts: a local suite file that hides
    the shipped suite of its name, and the regression gate's planted slowdown left on."""
    if source and source[1]:
        print(f"note: suite {cfg.name} is {source[0]}, which shadows the shipped {source[1]} (COMMBENCH_SUITES "
              f"and ./suites come first)", flush=True)
    warn = plant.warning_line(points)
    if warn:
        print(warn, file=sys.stderr, flush=True)


def say_start(cfg, points: list, world: int, backend: str, source=None) -> None:
    """The start of a real run, said once by whoever starts the ranks."""
    print(headline(cfg, len(points), world, backend, source), flush=True)
    say_warnings(cfg, points, source)


def print_plan(cfg, plan_rows: list[dict], world: int, backend: str, source=None) -> None:
    """--dry-run: the points, memory per rank and a rough time, without communicating."""

    print(headline(cfg, len(plan_rows), world, backend, source))
    say_warnings(cfg, [r["point"] for r in plan_rows], source)
    print(f"{'benchmark':16s} {'world':>5s} {'size':>8s} {'dtype':9s} {'mem/rank':>10s} {'~time':>8s}  params")
    for r in plan_rows:
        p = r["point"]
        params = " ".join(f"{k}={v}" for k, v in p.params.items())
        sized = get(p.benchmark).sized  # moe has no size or dtype of its own: its params say its point
        size, dtype = (fmt_size(p.nbytes), p.dtype) if sized else ("-", "-")
        print(f"{p.benchmark:16s} {p.world:5d} {size:>8s} {dtype:9s} "
              f"{fmt_mem(r['mem_nbytes']):>10s} {r['est_s']:7.2f}s  {params}")
    total = sum(r["est_s"] for r in plan_rows)
    peak = max((r["mem_nbytes"] for r in plan_rows), default=0)
    print(f"total: about {total:.0f} s (rough: {PLAN_GBPS:g} GB/s and {PLAN_ALPHA_S * 1e6:g} us an operation, "
          f"plus set-up), peak buffers {fmt_mem(peak)} per rank")
