"""Continuing a run: what a --resume may not change, what it would still run, and how a
launch that would join a run as another variant differs from it. A run's rows are one
sweep measured one way; a launch that would add rows measured another way is refused."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from commbench.backends import BACKEND_DTYPES
from commbench.core.errors import UsageError
from commbench.core.schema import point_key
from commbench.core.whoami import detect
from commbench.run import contract, launcher, plan, plant, rank_run, suite
from commbench.run.launcher_variants import resume_variants
from commbench.run.point_harness import repeat_suffix
from commbench.run.spec import RunSpec, from_saved
from commbench.run.variants import plan as plan_variants
from commbench.store.disk import check_out_dir
from commbench.store.lock import RunLock
from commbench.store.results import RunDir, load_meta

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


def print_resume_plan(spec: RunSpec, points: list, variants: list[str], run_dir) -> int:
    """--resume --dry-run: the points the resume would run, and nothing run or written. In a
    `--repeat N` run each repeat of a point is a point of its own (as the resume counts
    them): one measured in repeat 1 alone is still to run in the others."""
    cfg, world, repeat = spec.config, spec.world, spec.repeat
    # A point's placement needs a communicator to ask; within one run a point and its
    # variant name it once, so the key without it says whether it was measured.

    def bare(variant, p, rep):
        return point_key(p.benchmark, p.world, p.nbytes, p.dtype, p.params, variant), rep
    done = {(point_key(r["benchmark"], r["world"], r["nbytes"], r["dtype"], r["params"], r["variant"]),
             int(r.get("repeat") or 1)) for r in RunDir(run_dir).rows()}
    # Points skipped as unable to run here are done too (the resume would not ask again).
    skipped = {s.get("point_key") for s in load_meta(run_dir).get("skipped_points") or [] if isinstance(s, dict)}
    todo = [(p, rep) for v in variants for rep in range(1, repeat + 1) for p in points
            if bare(v, p, rep) not in done and bare(v, p, rep)[0] + repeat_suffix(rep) not in skipped]
    total = len(points) * max(1, len(variants)) * repeat
    missing = sorted({rep for _, rep in todo})
    if detect().rank == 0:
        print(f"resume (dry run, nothing runs): {total - len(todo)} of {total} points already in {run_dir}, "
              f"{len(todo)} to run" + (f" (variants {', '.join(variants)})" if variants != ["default"] else "")
              + (f" (repeat{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of {repeat})"
                 if repeat > 1 and missing else ""))
        if todo:
            plan.print_plan(cfg, plan.plan(cfg, [p for p, _ in todo], world, spec.device,
                                           check_counts=spec.backend == "mpi"), world, spec.backend)
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


def spec_of_run(args) -> tuple[RunSpec, dict]:
    """The spec of the run to continue (from its meta.json), and its record."""
    d = Path(args.resume)
    meta = load_meta(d) if d.is_dir() else {}
    if meta.get("imported_from") or meta.get("source_format"):
        raise UsageError(f"--resume {d}: an imported run (from {meta.get('source') or meta.get('source_format')}), "
                         f"not one commbench measured: nothing to resume")
    holder = RunLock(d).busy() if d.is_dir() and not contract.held_by_my_launcher(d) else None
    if holder:
        raise UsageError(f"--resume {d}: the run is still running ({holder}); a run has one writer at a time")
    if not meta or not (d / "rows.jsonl").is_file():
        raise UsageError(f"--resume {d}: not a commbench run directory (no meta.json and rows.jsonl)")
    if meta.get("status") in ("complete", "check_failed"):
        raise UsageError(f"--resume {d}: the run is {meta['status']}; a finished run is never overwritten "
                         f"(start a new one)")
    check_out_dir(d, "--resume")  # its lock and rows are written: a read-only place is refused here
    given = resume_conflicts(args, meta)
    if given:
        raise UsageError(f"--resume {d} continues the run with its own settings: drop {given[0]}, or start a "
                         f"new run to measure with it")
    try:
        spec = from_saved(d, args.timeout_s)
    except UsageError as e:
        raise UsageError(f"--resume {d}: {e}") from None
    return spec, meta


def resume_run(args, argv: list[str], strip_np) -> int:
    """`run --resume DIR`: the unfinished variants of the run, each in its own launch under
    `--np`, or this launch's one under an external launcher."""
    spec, meta = spec_of_run(args)
    world = args.np if args.np is not None else detect().world
    if world != spec.world:
        raise UsageError(f"--resume {args.resume}: the run had {spec.world} ranks, this launch has {world}")
    plant.setting()  # a planted slowdown that cannot be is refused before any rank starts
    # A run of several variants resumes each unfinished one in its own launch.
    done = {n for n, v in (meta.get("variants") or {}).items() if v.get("status") in ("complete", "skipped")}
    planned = plan_variants(spec.config, spec.backend, spec.device).names
    if args.variant is not None:
        has = list(dict.fromkeys(planned + list(meta.get("variants") or {})))
        if args.variant not in has:  # it would run that variant and leave the missing points missing
            raise UsageError(f"--resume {args.resume}: the run has no variant {args.variant!r} (it has: "
                             f"{', '.join(has)})")
        todo = [args.variant]
    else:
        todo = [n for n in planned if n not in done]
    if args.np is None and len(todo) > 1 and not args.dry_run:
        raise UsageError(f"--resume {args.resume}: {len(todo)} variants are unfinished ({', '.join(todo)}): "
                         f"resume one per launch with --variant NAME")
    points, notes = suite.expand(spec.config, world, BACKEND_DTYPES[spec.backend])  # once in this process
    if args.dry_run:
        return print_resume_plan(spec, points, todo, args.resume)
    if args.np is not None:
        launcher.check_local_ranks(args.np)
        plan.say_warnings(spec.config, points)  # a planted slowdown
        lock = contract.hold_for_launch(args.resume)  # noqa: F841 -- held until this launcher exits
        return resume_variants(spec.config, todo, args.np, spec.backend,
                               strip_np(argv) + ["--backend", spec.backend], args.resume,
                               one_named=args.variant is not None)
    return rank_run.run(spec, points, notes, argv, variant=todo[0] if todo else "default", resume=True)
