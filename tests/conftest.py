"""Shared helpers: run the real CLI in a subprocess, as a user would."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, timeout=300, env=None, cwd=None):
    e = dict(os.environ)
    e.pop("COMMBENCH_TTY", None)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "plugins"), e.get("PYTHONPATH", "")])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=cwd or ROOT)


needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")


def make_row(benchmark="all_reduce", world=2, nbytes=8, p50=1.0, *, spread_pct=0.0, backend="mpi", device="cpu",
             dtype="float32", variant="default", placement="out-of-place", params=None, stage="", iters=100,
             busbw_factor=None, **extra) -> dict:
    """One row as the harness writes it, at the current schema (SCHEMA_VERSION, point_key()):
    p90 sits spread_pct above p50, p99 twice that, the mean half of it, std in proportion;
    min and max spread_pct below and 2 x spread_pct x p50 above; algbw = nbytes / p50 and
    busbw from the benchmark's own factor (1.0 for a name the registry does not know).
    Any field can be given to override what it would be."""
    from commbench.benchmarks import registry
    from commbench.core.schema import SCHEMA_VERSION, point_key

    if busbw_factor is None:
        b = registry().get(benchmark)
        busbw_factor = b.busbw_factor(world) if b is not None and b.collective_rows else 1.0
    s = spread_pct / 100
    algbw = nbytes / (p50 * 1e-6) / 1e9 if nbytes and p50 > 0 else 0.0
    row = {"schema": SCHEMA_VERSION,
           "point_key": point_key(benchmark, world, nbytes, dtype, params or {}, variant, placement),
           "benchmark": benchmark, "backend": backend, "device": device, "world": world, "nbytes": nbytes,
           "dtype": dtype, "variant": variant, "placement": placement, "params": params or {}, "stage": stage,
           "iters": iters, "warmup": 3, "timing": "back_to_back", "clock": "host_clock",
           "time_us_min": p50 * (1 - 2 * s), "time_us_p50": p50, "time_us_mean": p50 * (1 + s / 2),
           "time_us_p90": p50 * (1 + s), "time_us_p99": p50 * (1 + 2 * s), "time_us_max": p50 * (1 + 200 * s),
           "time_us_std": p50 * s, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor,
           "busbw_factor": busbw_factor, "check": "ok"}
    row.update(extra)
    return row


# What makes a test slow on 2 cores is starting processes (ranks, launchers, the CLI): a test
# whose body or fixtures do so is marked `multirank`, and `make test-fast` leaves those out.
_SPAWNS = ("run_cli(", "subprocess.", "Popen(", "mpirun", "spawn_local(", "_run_ranks(", "torchrun")


def _spawns(func, seen=None) -> bool:
    """Whether func, or a function of its module that it calls (followed down), starts processes."""
    import inspect

    seen = set() if seen is None else seen
    if func in seen or not inspect.isfunction(func):
        return False
    seen.add(func)
    try:
        src = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    if any(s in src for s in _SPAWNS):
        return True
    glb = func.__globals__
    return any(_spawns(glb[n], seen) for n in func.__code__.co_names
               if inspect.isfunction(glb.get(n)) and glb[n].__module__ in (func.__module__, "conftest"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        funcs = [getattr(item, "function", None)]
        info = getattr(item, "_fixtureinfo", None)
        for defs in (info.name2fixturedefs.values() if info else ()):
            funcs += [d.func for d in defs]
        if any(f is not None and _spawns(f) for f in funcs):
            item.add_marker(pytest.mark.multirank)
