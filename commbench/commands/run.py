"""`commbench run`'s flow: the run's spec first (built here from the command line, or read
from its run directory by a resume and by a rank its `run --np` launcher started), the sweep
expanded once in each process, then a dry run, the launcher that starts the ranks (`--np`),
or, under an external launcher, one rank of the launch (rank_run.run). cli.py only parses and
dispatches here."""
from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from commbench import backends
from commbench.analyse.ceilings import resolve_profile_spec
from commbench.backends.gpus import apply_rank_hostid, check_gpu_path, visible_gpus
from commbench.core import hoststate
from commbench.core.errors import UsageError
from commbench.core.units import parse_sizes_arg
from commbench.core.whoami import detect
from commbench.run import contract, launcher, pairs_plan, plant, rank_run
from commbench.run import plan as plan_mod
from commbench.run import spec as spec_mod
from commbench.run import suite as suite_mod
from commbench.run.launcher_variants import capabilities, record_skip, run_variants
from commbench.run.resume import resume_run, sweep_differences
from commbench.run.spec import RunSpec
from commbench.run.traces import keep_traces
from commbench.run.variants import plan as plan_variants
from commbench.store.disk import check_free_space, check_out_dir
from commbench.store.lock import RunLock
from commbench.store.record import RunRecord
from commbench.store.results import load_meta, new_run_dir


def run_command(args, argv: list[str], overrides_p: dict) -> int:
    """`commbench run`: args as cli parsed them, argv the command line (passed on to the
    ranks), overrides_p the profile flags."""
    check_launch_flags(args)
    apply_rank_hostid()  # a rank sharing a GPU by the opt-in: its own NCCL_HOSTID before NCCL starts
    if args.resume:
        return resume_run(args, argv, strip_np)
    if args.np is None and args.out and os.environ.get(contract.LAUNCHER_PID_ENV):  # `run --np`'s rank: its spec
        spec = spec_mod.from_saved(args.out)
        return as_rank(spec, args, argv, *expand_once(spec), join=True)
    spec = from_command_line(args, argv, overrides_p)
    rank0 = detect().rank == 0
    if args.list_variants:
        if rank0:
            print("\n".join(spec.vplan().names))
        return 0
    if spec.np is None and args.variant is not None and spec.vplan().skipped:
        return skip_variant(spec, args, rank0)
    join = joins_run(spec, args)
    points, notes = expand_once(spec)
    nodes = spec_mod.launch_nodes(spec.np, spec.world, spec.ranks_per_node)
    spec_mod.check_nodes(points, nodes)  # pairs mode=node on one host: refused before any rank starts
    plan = plan_mod.plan(spec.config, points, spec.world, spec.device, check_counts=spec.backend == "mpi")
    plant.setting()  # a planted slowdown that cannot be is refused before any rank starts
    if args.dry_run:
        if rank0:
            if spec.np_note:
                print(spec.np_note, flush=True)
            plan_mod.print_plan(spec.config, pairs_plan.with_pairs_times(plan, nodes), spec.world, spec.backend,
                                spec.source)
            for line in pairs_plan.dry_run_lines(points, nodes):
                print(line)
        return 0
    check_out_dir(spec.out)  # before any rank starts: a rank cannot say it alone
    check_free_space(spec.out, len(points))
    if spec.np is not None:
        rc = start_ranks(spec, args, argv, points)
    else:
        rc = as_rank(spec, args, argv, points, notes, join)
    if args.fail_on_outlier and (spec.np is not None or rank0):  # the launcher, or rank 0 of an external one
        return pairs_plan.fail_on_outlier(rc, spec.out)
    return rc


def check_launch_flags(args) -> None:
    """--np against this host, the launcher a rank watches, and --master-addr."""
    if args.np is not None:
        launcher.check_local_ranks(args.np)
    else:  # one rank of a launch: the launcher it watches must be its own
        contract.check_launcher_pid()
    if args.master_addr is not None:
        if not args.master_addr.strip() or any(c.isspace() for c in args.master_addr):
            raise UsageError(f"--master-addr must be a host name or address, got {args.master_addr!r}")
        os.environ["MASTER_ADDR"] = args.master_addr  # read where the torch rendezvous is prepared


def expand_once(spec: RunSpec) -> tuple[list, list[str]]:
    """The sweep's points and the notes on sizes dropped or rounded: once in a process."""
    return suite_mod.expand(spec.config, spec.world, backends.BACKEND_DTYPES[spec.backend])


def skip_variant(spec: RunSpec, args, rank0: bool) -> int:
    """A variant that cannot run here, asked for under an external launcher: said, and kept
    in the run's record, rather than dropped silently."""
    why = spec.vplan().skipped[args.variant]
    if rank0:
        print(f"variant {args.variant}: skipped: {why}", flush=True)
        if args.out:
            record_skip(args.out, args.variant, why, spec.config)
    return 0


def joins_run(spec: RunSpec, args) -> bool:
    """Whether --out holds a run this launch adds to (another variant of the same sweep:
    external launchers run one variant per launch); a directory a run is writing now, or a
    run of anything else, is refused."""
    if not args.out:
        return False
    if Path(args.out).is_dir() and not contract.held_by_my_launcher(args.out):
        holder = RunLock(args.out).busy()
        if holder:
            raise UsageError(f"--out {args.out}: a run is writing there now ({holder}): wait for it, or choose "
                             f"another directory")
    if not (Path(args.out) / "rows.jsonl").exists():
        return False
    meta = load_meta(args.out)
    if not (args.variant is not None and meta.get("suite") == spec.suite
            and args.variant not in (meta.get("variants") or {})):
        raise UsageError(f"--out {args.out} already holds a run: continue it with --resume {args.out}, or choose "
                         f"another directory")
    differ = sweep_differences(meta, spec.config, spec.backend, spec.device, spec.world)
    if differ:  # rows measured another way would sit in one run as if alike
        raise UsageError(f"--out {args.out} holds a run of suite {spec.suite} with other settings ({differ[0]}): "
                         f"a variant joins only a run of the same sweep; choose another directory")
    return True


def start_ranks(spec: RunSpec, args, argv: list[str], points: list) -> int:
    """`run --np N`: the spec written where the ranks read it (meta.json), then the ranks
    started, one launch for each variant and repeat."""
    info = detect()
    if info.world > 1:
        raise UsageError(f"--np {spec.np} given inside a launch of {info.world} ranks ({info.source}): drop "
                         f"--np, or unset those variables if no launcher started this")
    # The sweep was validated (expand, plan) before any rank starts or a directory appears.
    ok, why = backends.availability(spec.backend)
    if not ok:
        raise UsageError(f"backend {spec.backend} is not available here: {why}")
    if spec.np_note:
        print(spec.np_note, flush=True)
    plan_mod.say_start(spec.config, points, spec.np, spec.backend, spec.source)
    child = strip_np(argv) + ([] if args.out else ["--out", spec.out]) + ([] if args.backend else
                                                                          ["--backend", spec.backend])
    lock = contract.hold_for_launch(spec.out)  # noqa: F841 -- one writer: held until this launcher exits
    spec = keep_traces(spec)  # the ranks read the run's own copy of a routing trace
    RunRecord(spec.out).write_spec(spec.to_dict())
    vplan = spec.vplan()
    if spec.variant is None and vplan.names == ["default"] and spec.repeat <= 1:
        return launcher.spawn_local(spec.np, spec.backend, child, out_dir=spec.out, timeout_s=spec.config.timeout_s,
                                  variant="default")
    # Repeats, like variants, each in a launch of their own (run_variants): see there why.
    return run_variants(vplan, spec.np, spec.backend, child, spec.out, spec.config, spec.repeat)


def as_rank(spec: RunSpec, args, argv: list[str], points: list, notes: list[str], join: bool) -> int:
    """This process is one rank of the launch: the launch's one variant, into the spec's
    run directory (rank 0's, under an external launcher: every rank names one)."""
    names = [args.variant] if args.variant is not None else spec.vplan().names
    if len(names) > 1:
        raise UsageError(f"suite {spec.suite} has {len(names)} variants and NCCL/MPI read their settings once "
                         f"per process: run one per launch with --variant NAME (`make inswitch` loops over them)")
    if detect().rank == 0 and not os.environ.get(contract.LAUNCHER_PID_ENV):  # `run --np`'s launcher said it
        plan_mod.say_start(spec.config, points, spec.world, spec.backend, spec.source)
    return rank_run.run(spec, points, notes, argv, variant=names[0], join=join or names[0] != "default")


def from_command_line(args, argv: list[str], overrides_p: dict) -> RunSpec:
    """The spec of `commbench run` as cli parsed it (args; argv the command line), the
    profile flags in overrides_p: every refusal a spec can meet, said before any rank
    starts or a directory appears."""
    if args.suite is None and not args.benchmarks:
        raise UsageError("run needs a suite (a name `commbench list` shows, or a .toml path), or -b BENCH[,BENCH...] "
                         "to run benchmarks without one")
    if args.repeat is None or args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    raw = suite_mod.read_suite(args.suite)
    # A flag that overrides a suite key stores its value under the key's field name.
    overrides = {f.name: getattr(args, f.name) for f in fields(suite_mod.SuiteConfig)
                 if f.name not in ("name", "sizes", "params") and hasattr(args, f.name)}
    if args.style == "nccl-tests" and args.placement is None and args.in_place is None \
            and not {"placement", "in_place"} & set(raw):
        overrides["placement"] = "both"  # nccl-tests' two columns, unless told otherwise
    overrides["sizes"] = parse_sizes_arg(args.sizes) if args.sizes is not None else None
    # --partners K and --pairs-mode M: the pairs benchmark's params, as --param would set them.
    shorthand = [f"pairs.{k}={v}" for k, v in (("partners", args.partners), ("mode", args.pairs_mode))
                 if v is not None]
    if shorthand and "pairs" not in (args.benchmarks or raw.get("benchmarks") or []):
        raise UsageError("--partners and --pairs-mode set the pairs benchmark's params, and this run does not "
                         "run it (`commbench run pairs`, or -b pairs)")
    cfg = spec_mod.checked_config(raw, overrides, [*args.param, *shorthand])
    backend = cfg.backend or backends.default_backend()
    if backend is None:
        raise UsageError(f"no backend works here: {backends.INSTALL_HINT}")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise UsageError(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    device = args.device or ("cuda" if backend == "nccl" else "cpu")
    np_, np_note = args.np, ""
    if np_ is None and not args.list_variants:
        np_, np_note = default_local_ranks(detect().launcher, device)
        if np_ is not None:
            launcher.check_local_ranks(np_)
    spec_mod.check_backend(cfg, backend, device)
    check_gpu_path(backend, device, np_, args.cuda_aware_mpi)
    profile = resolve_profile_spec(cfg.profile, overrides_p)
    external = np_ is None  # under mpirun/srun/torchrun: this process is one rank of the launch
    # The MPI flavour and the GPU's capabilities are asked only when a variant may need them.
    asks = not args.list_variants and (args.variant is not None
                                       or (not external and list(cfg.variants) != ["default"]))
    vplan = plan_variants(cfg, backend, device, args.variant,
                          *(capabilities(backend, device, probe=not external) if asks else ("", None)))
    world = np_ if np_ is not None else detect().world
    if args.ranks_per_node is not None and args.ranks_per_node > world and not args.list_variants:
        # rank // N puts every rank on node 0: the grouping the flag asks for cannot be. A
        # last node with fewer ranks (N not dividing the world) is modelled, as on real hosts.
        raise UsageError(f"--ranks-per-node {args.ranks_per_node} is more than the {world} rank(s) of this launch: "
                         f"every rank would be on one node (node = rank // N); give 1 to {world}")
    source = suite_mod.suite_source(args.suite) if args.suite else None
    return RunSpec(config=cfg, suite_file=str(source[0]) if source else None,
                   shadows=str(source[1]) if source and source[1] else None, backend=backend, device=device,
                   np=np_, np_note=np_note, world=world, ranks_per_node=args.ranks_per_node, repeat=args.repeat,
                   variant=args.variant, variant_plan=tuple((v.name, why) for v, why in vplan.entries),
                   baseline=vplan.baseline, plan_note=vplan.note, profile=profile,
                   profile_overrides=dict(overrides_p or {}), out=args.out or str(new_run_dir(cfg.name)))


def default_local_ranks(launched_by: str, device: str, cores: int | None = None, gpus: int | None = None,
                        most: int | None = None) -> tuple[int | None, str]:
    """`run` without --np: (None, '') under a launcher (this process is one of its ranks);
    else the ranks to start here and the line that says so. One rank alone measures nothing
    crossing a link (a broadcast "busbw" of 100,000 GB/s), so: one per core, at least 2, on
    CPU, as the make targets do; one per visible GPU on a GPU host (a one-GPU host runs world
    1 and says so). cores, gpus, most (this host's local-rank limit): asked when not given."""
    if launched_by != "none":
        return None, ""
    said = "no --np and no launcher:"
    if device == "cuda":
        n = max(1, visible_gpus() if gpus is None else gpus)
        if n == 1:
            return 1, f"{said} one visible GPU, so world 1: nothing crosses a link (busbw is the formula's, unjudged)"
        return n, f"{said} starting {n} local ranks, one per visible GPU"
    cores = hoststate.cores() if cores is None else cores
    most = launcher.local_rank_limit()[0] if most is None else most
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
