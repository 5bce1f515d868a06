"""A run's life cycle before any rank starts: the flags and the suite into one checked
config, the backend, device, GPU path and profile checked, the variants planned, the
run directory chosen, locked and checked for room, then either this process starts the
ranks (`--np`) or, under an external launcher, it is one of them (runner.run). A resume
takes the same path through run/resume.py. cli.py only parses and dispatches here."""
from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from commbench import backends
from commbench.analyse.ceilings import resolve_profile_spec
from commbench.backends.gpus import check_gpu_path, visible_gpus
from commbench.core import hoststate
from commbench.core.errors import UsageError
from commbench.core.units import parse_sizes_arg
from commbench.run import launch, plant, runner
from commbench.run import plan as plan_mod
from commbench.run import suite as suite_mod
from commbench.run.launch_variants import capabilities, record_skip, run_variants
from commbench.run.resume import resume_run, sweep_differences
from commbench.run.variants import plan as plan_variants
from commbench.store.results import (
    RunLock,
    check_free_space,
    check_out_dir,
    held_by_my_launcher,
    hold_for_launch,
    load_meta,
    new_run_dir,
)


def run_command(args, argv: list[str], overrides_p: dict) -> int:
    """`commbench run`: args as cli parsed them, argv the command line (passed on to the
    ranks), overrides_p the profile flags."""
    if args.np is not None:
        launch.check_local_ranks(args.np)
    else:  # one rank of a launch: the launcher it watches must be its own
        launch.check_launcher_pid()
    if args.master_addr is not None:
        if not args.master_addr.strip() or any(c.isspace() for c in args.master_addr):
            raise UsageError(f"--master-addr must be a host name or address, got {args.master_addr!r}")
        os.environ["MASTER_ADDR"] = args.master_addr  # read where the torch rendezvous is prepared
    if args.resume:
        return resume_run(args, argv, strip_np)

    if args.suite is None and not args.benchmarks:
        raise UsageError("run needs a suite (a name `commbench list` shows, or a .toml path), or -b BENCH[,BENCH...] "
                         "to run benchmarks without one")
    if args.repeat is None or args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    suite_name = args.suite_file or args.suite  # a rank of `run --np`: the file its launcher resolved
    raw = suite_mod.read_suite(suite_name)
    # A flag that overrides a suite key stores its value under the key's field name.
    overrides = {f.name: getattr(args, f.name) for f in fields(suite_mod.SuiteConfig)
                 if f.name not in ("name", "sizes", "params") and hasattr(args, f.name)}
    if args.style == "nccl-tests" and args.placement is None and args.in_place is None \
            and not {"placement", "in_place"} & set(raw):
        overrides["placement"] = "both"  # nccl-tests' two columns, unless told otherwise
    if args.sizes is not None and not args.sizes.strip():
        raise UsageError("--sizes is empty: give MIN:MAX[:FACTOR] or A,B,C")
    overrides["sizes"] = parse_sizes_arg(args.sizes) if args.sizes else None
    cfg = suite_mod.build_config(raw, overrides)
    if args.param:
        cfg = suite_mod.build_config(raw, {**overrides, "params": suite_mod.parse_params(args.param, cfg.benchmarks)})
    backend = cfg.backend or backends.default_backend()
    if backend is None:
        raise UsageError(f"no backend works here: {backends.INSTALL_HINT}")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise UsageError(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    device = args.device or ("cuda" if backend == "nccl" else "cpu")
    auto_np = ""  # said first when no --np and no launcher chose the local ranks
    if args.np is None and not args.list_variants:
        np_, auto_np = default_local_ranks(launch.detect().launcher, device)
        if np_ is not None:
            args.np = np_
            launch.check_local_ranks(args.np)
    suite_mod.check_backend(cfg, backend, device)
    check_gpu_path(backend, device, args.np, args.cuda_aware_mpi)
    resolve_profile_spec(cfg.profile, overrides_p)
    if args.list_variants:
        if launch.detect().rank == 0:
            print("\n".join(plan_variants(cfg, backend, device).names))
        return 0
    external = args.np is None  # under mpirun/srun/torchrun: this process is one rank of the launch
    # The MPI flavour and the GPU's capabilities are asked only when a variant may need them.
    asks = args.variant is not None or (not external and list(cfg.variants) != ["default"])
    vplan = plan_variants(cfg, backend, device, args.variant,
                          *(capabilities(backend, device, probe=not external) if asks else ("", None)))
    if external and args.variant is not None and vplan.skipped:
        why = vplan.skipped[args.variant]
        if launch.detect().rank == 0:  # say so, and keep it in the run's record, rather than drop it silently
            print(f"variant {args.variant}: skipped: {why}", flush=True)
            if args.out:
                record_skip(args.out, args.variant, why, cfg)
        return 0
    join = False
    if args.out:
        holder = RunLock(args.out).busy() if Path(args.out).is_dir() and not held_by_my_launcher(args.out) else None
        if holder:
            raise UsageError(f"--out {args.out}: a run is writing there now ({holder}): wait for it, or choose "
                             f"another directory")
    if args.out and (Path(args.out) / "rows.jsonl").exists():
        meta = load_meta(args.out)
        # Another variant of the same suite joins the run (external launchers run one
        # variant per launch); anything else would overwrite it.
        join = (args.variant is not None and meta.get("suite") == cfg.name
                and args.variant not in (meta.get("variants") or {}))
        # Or this launcher's own next repeat of a variant (variants alternating repeat by
        # repeat): the variant's earlier repeats are there, marked unfinished.
        join = join or (bool(os.environ.get(launch.REPEAT_UPTO_ENV)) and args.variant is not None
                        and meta.get("suite") == cfg.name and int(meta.get("repeat") or 1) == args.repeat
                        and (meta.get("variants") or {}).get(args.variant, {}).get("status") == "interrupted")
        if not join:
            raise UsageError(f"--out {args.out} already holds a run: continue it with --resume {args.out}, or choose "
                             f"another directory")
    info = launch.detect()
    world = args.np if args.np is not None else info.world
    if args.ranks_per_node is not None and args.ranks_per_node > world:
        # rank // N puts every rank on node 0: the grouping the flag asks for cannot be. A
        # last node with fewer ranks (N not dividing the world) is modelled, as on real hosts.
        raise UsageError(f"--ranks-per-node {args.ranks_per_node} is more than the {world} rank(s) of this launch: "
                         f"every rank would be on one node (node = rank // N); give 1 to {world}")
    if join:
        differ = sweep_differences(meta, cfg, backend, device, world)
        if differ:  # rows measured another way would sit in one run as if alike
            raise UsageError(f"--out {args.out} holds a run of suite {cfg.name} with other settings ({differ[0]}): "
                             f"a variant joins only a run of the same sweep; choose another directory")
    points, _ = suite_mod.expand(cfg, world, backends.BACKEND_DTYPES[backend])
    plan = plan_mod.plan(cfg, points, world, device, check_counts=backend == "mpi")
    plant.setting()  # a planted slowdown that cannot be is refused before any rank starts
    source = suite_mod.suite_source(suite_name) if suite_name else None
    if args.dry_run:
        if info.rank == 0:
            if auto_np:
                print(auto_np, flush=True)
            plan_mod.print_plan(cfg, plan, world, backend, source)
        return 0
    check_out_dir(args.out or "results")  # before any rank starts: a rank cannot say it alone
    check_free_space(args.out or "results", len(points))
    if not external:
        if info.world > 1:
            raise UsageError(f"--np {args.np} given inside a launch of {info.world} ranks ({info.source}): drop "
                             f"--np, or unset those variables if no launcher started this")
        # The sweep was validated above (expand, plan), before any rank starts or a directory appears.
        ok, why = backends.availability(backend)
        if not ok:
            raise UsageError(f"backend {backend} is not available here: {why}")
        if auto_np:
            print(auto_np, flush=True)
        plan_mod.say_start(cfg, points, args.np, backend, source)
        out = args.out or str(new_run_dir(cfg.name))
        child = strip_np(argv) + ["--out", out] if not args.out else strip_np(argv)
        if not args.backend:
            child += ["--backend", backend]
        if source:
            child += ["--suite-file", os.path.abspath(source[0])]
        lock = hold_for_launch(out)  # noqa: F841 -- one writer: held until this launcher exits
        if args.variant is None and vplan.names == ["default"] and args.repeat <= 1:
            return launch.spawn_local(args.np, backend, child, out_dir=out, timeout_s=cfg.timeout_s, variant="default")
        # Repeats, like variants, each in a launch of their own (run_variants): see there why.
        return run_variants(vplan, args.np, backend, child, out, cfg, args.repeat)
    if len(vplan.entries) > 1:
        raise UsageError(f"suite {cfg.name} has {len(vplan.entries)} variants and NCCL/MPI read their settings once "
                         f"per process: run one per launch with --variant NAME (`make inswitch` loops over them)")
    if info.rank == 0 and not os.environ.get("COMMBENCH_LAUNCHER_PID"):  # `run --np`'s launcher said it
        plan_mod.say_start(cfg, points, world, backend, source)
    # Under an external launcher every rank names a directory, but only rank 0 writes one.
    out = args.out or str(new_run_dir(cfg.name))
    name = vplan.names[0]
    return runner.run(cfg, backend, args.device, out, argv, args.ranks_per_node, overrides_p,
                      variant=name, join=join or name != "default", repeat=args.repeat)


def default_local_ranks(launcher: str, device: str, cores: int | None = None, gpus: int | None = None,
                        most: int | None = None) -> tuple[int | None, str]:
    """`run` without --np: (None, '') under a launcher (this process is one of its ranks);
    else the ranks to start here and the line that says so. One rank alone measures nothing
    crossing a link (a broadcast "busbw" of 100,000 GB/s), so: one per core, at least 2, on
    CPU, as the make targets do; one per visible GPU on a GPU host (a one-GPU host runs world
    1 and says so). cores, gpus, most (this host's local-rank limit): asked when not given."""
    if launcher != "none":
        return None, ""
    said = "no --np and no launcher:"
    if device == "cuda":
        n = max(1, visible_gpus() if gpus is None else gpus)
        if n == 1:
            return 1, f"{said} one visible GPU, so world 1: nothing crosses a link (busbw is the formula's, unjudged)"
        return n, f"{said} starting {n} local ranks, one per visible GPU"
    cores = hoststate.cores() if cores is None else cores
    most = launch.local_rank_limit()[0] if most is None else most
    n = max(2, min(cores, most))
    return n, f"{said} starting {n} local ranks, one per core" + (" (at least 2)" if cores < 2 else "")


def strip_np(argv: list[str]) -> list[str]:
    """argv without --np N or --np=N: the ranks it starts must not start ranks again."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--np":
            next(it, None)
        elif not a.startswith("--np="):
            out.append(a)
    return out
