"""Continuing a run: what a --resume may not change, what it would still run, and how a
launch that would join a run as another variant differs from it. A run's rows are one
sweep measured one way; a launch that would add rows measured another way is refused."""
from __future__ import annotations

import json
from dataclasses import asdict

from . import launch, plan, suite
from commbench.backends import BACKEND_DTYPES
from commbench.store.results import RunDir
from commbench.core.schema import point_key

# What a run measures and how: with --resume, the run's own values hold, and a flag that
# would change them is refused rather than ignored (rows of one run measured two ways).
RESUME_FIXED = ("suite", "benchmarks", "sizes", "dtypes", "worlds", "param", "out", "profile", "iters", "warmup",
                "min_time_ms", "min_iters", "max_iters", "check", "timing", "cuda_graph", "in_place",
                "per_op_events", "variants", "list_variants", "nic_gbps", "scaleup_GBps", "domain_gpus")
# --check/--no-check and the like: None when not given, so False is a value given too.
NEGATABLE = ("check", "cuda_graph", "in_place", "per_op_events")


def resume_conflicts(args, meta: dict) -> list[str]:
    """The flags (as typed) of a --resume command line that would change how the run
    measures; the backend, device and ranks per node only when they differ from the run's."""
    def flag(name: str) -> str:
        value = getattr(args, name)
        if name == "suite":
            return "the suite name"
        dashed = "--" + name.replace("_", "-")
        return dashed.replace("--", "--no-", 1) if value is False and name in NEGATABLE else dashed

    def given(name: str) -> bool:  # 0 is a value given (--warmup 0); False is one only from --no-X
        value = getattr(args, name, None)
        return value is not None and not (isinstance(value, list) and not value) and \
            (value is not False or name in NEGATABLE)

    out = [flag(f) for f in RESUME_FIXED if given(f)]
    for f, key in (("backend", "backend"), ("device", "device"), ("ranks_per_node", "ranks_per_node")):
        if getattr(args, f, None) is not None and getattr(args, f) != meta.get(key):
            out.append(f"--{f.replace('_', '-')} (the run's is {meta.get(key)})")
    return out


def print_resume_plan(cfg, meta: dict, variants: list[str], world: int, run_dir) -> int:
    """--resume --dry-run: the points the resume would run, and nothing run or written."""
    points, _ = suite.expand(cfg, world, BACKEND_DTYPES[meta["backend"]])
    # A point's placement needs a communicator to ask; within one run a point and its
    # variant name it once, so the key without it says whether it was measured.

    def bare(variant, p):
        return point_key(p.benchmark, p.world, p.nbytes, p.dtype, p.params, variant)
    done = {point_key(r["benchmark"], r["world"], r["nbytes"], r["dtype"], r["params"], r["variant"])
            for r in RunDir(run_dir).rows()}
    todo = [p for v in variants for p in points if bare(v, p) not in done]
    total = len(points) * max(1, len(variants))
    if launch.detect().rank == 0:
        print(f"resume (dry run, nothing runs): {total - len(todo)} of {total} points already in {run_dir}, "
              f"{len(todo)} to run" + (f" (variants {', '.join(variants)})" if variants != ["default"] else ""))
        if todo:
            plan.print_plan(cfg, plan.plan(cfg, todo, world, meta.get("device") or "cpu",
                                           check_counts=meta["backend"] == "mpi"), world, meta["backend"])
    return 0


# Settings a variant may differ in from the run it joins: the watchdog's bound, the words.
JOIN_FREE = ("timeout_s", "description", "backend")  # the backend in use is compared itself


def sweep_differences(meta: dict, cfg, backend: str, device: str, world: int) -> list[str]:
    """How a launch that would join the run in meta differs from it: 'sizes 8,16 vs 32', ...
    (empty: the same sweep, measured the same way). A run whose meta has no config yet (a
    variant recorded as skipped first) is compared on what it has."""
    out = []
    for key, mine in (("backend", backend), ("device", device), ("world", world)):
        if meta.get(key) is not None and meta[key] != mine:
            out.append(f"{key} {meta[key]} vs {mine}")
    theirs = meta.get("config") or {}
    mine = json.loads(json.dumps(asdict(cfg), default=str))
    for key in mine:
        if key in theirs and key not in JOIN_FREE and theirs[key] != mine[key]:
            out.append(f"{key} {_setting(theirs[key])} vs {_setting(mine[key])}")
    return out


def _setting(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else json.dumps(v, sort_keys=True) if isinstance(v, dict) \
        else str(v)
