"""commbench command line: run, list, report, compare, import, ceilings, model."""
from __future__ import annotations

import argparse
import os
import sys

from .backends import BACKENDS
from .errors import RunFailed, UsageError
from .suite import TIMING_METHODS, key_help


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2, not a usage block
        # main prints "commbench: error: " before it: name the subcommand only, not the program again.
        sub = self.prog.partition(" ")[2]
        raise UsageError(f"{sub}: {message}" if sub else message)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _pct(text: str) -> float:
    """5, 5% or 0.5%: a threshold in per cent."""
    try:
        v = float(text.strip().rstrip("%"))
    except ValueError:
        raise UsageError(f"--threshold must be a percentage like 5 or 5%, got {text!r}") from None
    if v < 0:
        raise UsageError(f"--threshold must not be negative, got {text!r}")
    return v


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise UsageError(f"expected a comma list of integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="commbench", description="Collective-communication microbenchmarks for MoE-era clusters.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run a suite (joins mpirun/srun/torchrun, or starts --np local ranks)")
    r.add_argument("suite", nargs="?", help="suite name (`commbench list` shows them) or a .toml path")
    r.add_argument("-b", "--benchmarks", type=_csv, help="comma list; overrides the suite's")
    r.add_argument("--backend", choices=tuple(BACKENDS), help=_kh("backend"))
    r.add_argument("--device", choices=("cpu", "cuda"), help="buffer device (default: the backend's)")
    r.add_argument("--sizes", help="MIN:MAX[:FACTOR] or A,B,C with K/M/G binary suffixes")
    r.add_argument("--dtypes", type=_csv, help="float32, bfloat16, float16, int32")
    r.add_argument("--worlds", type=_int_list, help="rank counts to sweep inside the launch")
    r.add_argument("--iters", type=int, help=_kh("iters"))
    r.add_argument("--warmup", type=int, help=_kh("warmup"))
    r.add_argument("--min-time-ms", type=float, help=_kh("min_time_ms"))
    r.add_argument("--min-iters", type=int, help=_kh("min_iters"))
    r.add_argument("--max-iters", type=int, help=_kh("max_iters"))
    r.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="measure each point N times, interleaved (every point once, then again), so compare can "
                        "judge on the spread between repeats (default 1)")
    r.add_argument("--check", action=argparse.BooleanOptionalAction, default=None, help=_kh("check"))
    r.add_argument("--timing", choices=TIMING_METHODS, help=_kh("timing"))
    r.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None, help=_kh("cuda_graph"))
    r.add_argument("--in-place", action=argparse.BooleanOptionalAction, default=None, help=_kh("in_place"))
    r.add_argument("--per-op-events", action=argparse.BooleanOptionalAction, default=None,
                   help=_kh("per_op_events"))
    r.add_argument("--cuda-aware-mpi", action="store_true",
                   help="backend mpi with device cuda: the MPI takes CUDA buffers (when the library cannot be asked)")
    r.add_argument("--param", action="append", default=[], metavar="[BENCH.]KEY=V[,V...]",
                   help="set a benchmark parameter; several values make a sweep axis")
    r.add_argument("--np", type=int, help="start this many local ranks")
    r.add_argument("--out", help="result directory (default results/<timestamp>-<suite>)")
    r.add_argument("--ranks-per-node", type=int, help="override hostname grouping (two tiers on one host)")
    r.add_argument("--master-addr", metavar="ADDR", help="gloo/nccl: the rendezvous address, one of rank 0's host "
                   "that every host reaches (default under mpirun/srun: found by trying rank 0's addresses; "
                   "overrides MASTER_ADDR)")
    r.add_argument("--timeout", type=float, dest="timeout_s", metavar="SECONDS", help=_kh("timeout_s"))
    r.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted or failed run: skip its finished points")
    r.add_argument("--variants", type=_csv, help="algorithm variants to run, each as its own launch "
                   "(overrides the suite's; `commbench list` shows the built-in ones and where each runs)")
    r.add_argument("--variant", help="run one variant in this launch (under mpirun/srun/torchrun); with --out of "
                   "an existing run of the suite, its rows join that run")
    r.add_argument("--list-variants", action="store_true", help="print the suite's variant names and exit")
    r.add_argument("--dry-run", action="store_true",
                   help="list the points, memory per rank and a rough time, without communicating")
    r.add_argument("--wide", action="store_true", help="tables with every column (default: a compact set that "
                   "fits the terminal; the caption names what it leaves out)")
    _profile_args(r)

    sub.add_parser("list", help="benchmarks, backends (and whether they work here), suites")

    rep = sub.add_parser("report", help="print the tables of one or more result directories; --out writes "
                         "report.md and report.html with figures")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR",
                     help="result directories (or their rows.jsonl) of `commbench run` or `commbench import`")
    rep.add_argument("--out", metavar="DIR", help="also write DIR/report.md, a self-contained DIR/report.html and "
                     "DIR/figures/*.png (figures need matplotlib: pip install 'commbench[plot]')")
    rep.add_argument("--wide", action="store_true", help="tables with every column, the scaling table at every "
                     "size (default: a compact set that fits the terminal)")
    _profile_args(rep)

    cmp_ = sub.add_parser(
        "compare", help="compare runs point by point: faster, slower or not significant",
        description="Forms: compare BASE NEW; compare A1 A2 A3 -- B1 B2 B3 (options before the --); compare --base "
                    "A1 A2 A3 --new B1 B2 B3. With repeated runs a side, each point is judged on how much it moves "
                    "between runs; with one run a side, a verdict cannot separate noise from change.")
    # Every run as one positional list: argparse cannot split two variable-length positional
    # lists, so the `--` between the sides is found by compare.split_sides.
    cmp_.add_argument("runs", nargs="*", metavar="RUN",
                      help="result directories: BASE NEW, or the base runs, --, the new runs")
    cmp_.add_argument("--base", nargs="+", metavar="RUN", help="result directories of the baseline runs")
    cmp_.add_argument("--new", nargs="+", metavar="RUN", help="result directories of the runs to judge")
    cmp_.add_argument("--threshold", type=_pct, default=5.0, metavar="PCT",
                      help="smallest change of p50 that counts, in per cent (default 5); the change's ~95%% "
                           "interval must exclude 0 too (one run a side: the runs' intervals must not overlap)")
    cmp_.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any point is slower")
    cmp_.add_argument("--all", action="store_true", help="list every matched point (default: only faster and slower)")
    cmp_.add_argument("--csv", metavar="FILE", help="also write the whole comparison as CSV")
    cmp_.add_argument("--wide", action="store_true", help="every column, the busbw of both sides too (default: a "
                      "compact set that fits the terminal)")

    im = sub.add_parser("import", help="turn nccl-tests (stdout or -J JSON) or OSU output into a result directory")
    im.add_argument("files", nargs="+", help="one or more output files; all go into one result directory")
    im.add_argument("--format", choices=("nccl-tests", "nccl-tests-json", "osu"), help="default: detected from content")
    im.add_argument("--world", type=int, help="rank count (required for OSU, which does not print it)")
    im.add_argument("--benchmark", help="the collective, when neither the file nor its name says")
    im.add_argument("--no-in-place", action="store_true",
                    help="nccl-tests: keep only the out-of-place half, not the in-place rows")
    im.add_argument("--out", metavar="DIR", help="result directory (default results/<timestamp>-import-<file>)")

    c = sub.add_parser("ceilings", help="print the hardware profiles (link line and achieved rates)")
    _profile_args(c, many=True)

    m = sub.add_parser("model", help="what-if: project times from a profile's alpha-beta cost models")
    m.add_argument("--kind", default="moe", choices=("moe", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
                   help="what to project (default moe: DeepSeek-V3 dispatch and combine)")
    _profile_args(m, many=True, default="gb300-nvl72,h100-hgx")
    m.add_argument("--worlds", type=_int_list, help="rank counts (default 8,16,...,1024)")
    m.add_argument("--sizes", help="message sizes for collectives (default 1M,64M,1G)")
    m.add_argument("--algos", type=_csv, help="all_reduce: ring, recursive_doubling, rabenseifner, inswitch, hierarchical")
    m.add_argument("--rate", choices=("achieved", "line"), default="achieved",
                   help="build the fabric from the typical achieved rates (default) or the line rates (a lower bound)")
    m.add_argument("--calibrate", metavar="RUN_DIR",
                   help="take the scale-up alpha and B from an alpha-beta fit of a measured run's all_to_all")
    for k, d in (("tokens", 4096), ("hidden", 7168), ("experts", 256), ("topk", 8), ("max-groups", 4)):
        m.add_argument(f"--{k}", type=int, help=f"moe shape (default {d}, DeepSeek-V3)")
    return p


def _kh(key: str) -> str:
    """A suite key's flag help: what it sets, and that the suite's value applies unless given."""
    from dataclasses import fields

    from .suite import SuiteConfig

    default = {f.name: f.default for f in fields(SuiteConfig)}[key]
    shown = {None: "the first backend that works here", "": "none"}.get(default, default) if key == "backend" \
        else default
    return f"{key_help(key)} (suite key {key}; default: the suite's value, else {shown})"


def _profile_args(p, many: bool = False, default: str | None = None) -> None:
    p.add_argument("--profile", help=("comma list of " if many else "") + "hardware profiles (built-in names or "
                   ".toml paths; `commbench ceilings` lists them)" + (f"; default {default}" if default else ""))
    p.add_argument("--nic-gbps", type=float, help="scale-out NIC rate in Gb/s (gigaBITS) per direction, as NICs are "
                   "sold: 800 = 100 GB/s")
    p.add_argument("--scaleup-GBps", dest="scaleup_GBps", type=float,
                   help="scale-up link rate in GB/s (gigaBYTES) per direction: NVLink 5 = 900, not 1800")
    p.add_argument("--domain-gpus", type=int, help="GPUs in one scale-up domain (NVL72: 72, HGX: 8)")


def profile_overrides(args) -> dict:
    return {k: getattr(args, k) for k in ("nic_gbps", "scaleup_GBps", "domain_gpus") if getattr(args, k) is not None}


def resolve_profile_spec(name: str | None, overrides: dict):
    """Load and check a profile before any rank starts (exit 2 on a bad file or flag)."""
    from . import ceilings

    if name is None:
        if overrides:
            raise UsageError("--nic-gbps/--scaleup-GBps/--domain-gpus need --profile")
        return None
    return ceilings.apply_overrides(ceilings.load_profile(name), overrides)


def _resume_config(args):
    """The suite, backend and launch shape of the run to continue, from its meta.json."""
    from dataclasses import fields
    from pathlib import Path

    from . import suite as suite_mod
    from .results import RunLock, held_by_my_launcher, load_meta

    d = Path(args.resume)
    meta = load_meta(d) if d.is_dir() else {}
    holder = RunLock(d).busy() if d.is_dir() and not held_by_my_launcher(d) else None
    if holder:
        raise UsageError(f"--resume {d}: the run is still running ({holder}); a run has one writer at a time")
    if not meta or not (d / "rows.jsonl").is_file():
        raise UsageError(f"--resume {d}: not a commbench run directory (no meta.json and rows.jsonl)")
    if meta.get("status") in ("complete", "check_failed"):
        raise UsageError(f"--resume {d}: the run is {meta['status']}; a finished run is never overwritten "
                         f"(start a new one)")
    given = [f for f in ("suite", "benchmarks", "sizes", "dtypes", "worlds", "param", "out", "profile")
             if getattr(args, f, None) not in (None, [], False)]
    if args.backend not in (None, meta.get("backend")):
        given.append("backend")
    if given:
        raise UsageError(f"--resume takes the run's own settings; drop --{given[0]}")
    raw = dict(meta.get("config") or {})
    known = {f.name for f in fields(suite_mod.SuiteConfig)}
    raw = {k: (tuple(v) if isinstance(v, list) and k != "sizes" else v) for k, v in raw.items() if k in known}
    if args.timeout_s is not None:
        raw["timeout_s"] = args.timeout_s
    cfg = suite_mod.SuiteConfig(**raw)
    return cfg, meta


def _resume(args, argv: list[str]) -> int:
    from . import launch, runner
    from .launch_variants import resume_variants
    from .variants import plan as plan_variants

    cfg, meta = _resume_config(args)
    backend, device = meta["backend"], meta.get("device")
    info = launch.detect()
    world = args.np if args.np is not None else info.world
    if world != meta.get("world"):
        raise UsageError(f"--resume {args.resume}: the run had {meta.get('world')} ranks, this launch has {world}")
    # A run of several variants resumes each unfinished one in its own launch.
    done = {n for n, v in (meta.get("variants") or {}).items() if v.get("status") in ("complete", "skipped")}
    if args.variant is not None:
        todo = [args.variant]
    else:
        todo = [n for n in plan_variants(cfg, backend, device or "cpu").names if n not in done]
    if args.np is not None:
        launch.check_local_ranks(args.np)
        from .results import hold_for_launch

        lock = hold_for_launch(args.resume)  # noqa: F841 -- held until this launcher exits
        return resume_variants(cfg, todo, args.np, backend, _strip_np(argv) + ["--backend", backend], args.resume,
                               one_named=args.variant is not None)
    if len(todo) > 1:
        raise UsageError(f"--resume {args.resume}: {len(todo)} variants are unfinished ({', '.join(todo)}): "
                         f"resume one per launch with --variant NAME")
    return runner.run(cfg, backend, device, args.resume, argv, meta.get("ranks_per_node"),
                      meta.get("profile_overrides") or {}, resume=True, variant=todo[0] if todo else "default",
                      repeat=int(meta.get("repeat") or 1))


def cmd_run(args, argv: list[str]) -> int:
    from dataclasses import fields
    from pathlib import Path

    from . import backends, launch, plan as plan_mod, runner, suite as suite_mod
    from .launch_variants import capabilities
    from .results import new_run_dir
    from .units import parse_sizes_arg
    from .variants import plan as plan_variants

    if args.np is not None:
        launch.check_local_ranks(args.np)
    if args.master_addr is not None:
        if not args.master_addr.strip() or any(c.isspace() for c in args.master_addr):
            raise UsageError(f"--master-addr must be a host name or address, got {args.master_addr!r}")
        os.environ["MASTER_ADDR"] = args.master_addr  # read where the torch rendezvous is prepared
    if args.resume:
        return _resume(args, argv)

    if args.suite is None and not args.benchmarks:
        raise UsageError("run needs a suite (a name `commbench list` shows, or a .toml path), or -b BENCH[,BENCH...] "
                         "to run benchmarks without one")
    if args.repeat is None or args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    raw = suite_mod.read_suite(args.suite)
    # A flag that overrides a suite key stores its value under the key's field name.
    overrides = {f.name: getattr(args, f.name) for f in fields(suite_mod.SuiteConfig)
                 if f.name not in ("name", "sizes", "params") and hasattr(args, f.name)}
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
    suite_mod.check_backend(cfg, backend, device)
    from .backends.gpus import check_gpu_path

    check_gpu_path(backend, device, args.np, args.cuda_aware_mpi)
    overrides_p = profile_overrides(args)
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
            from .launch_variants import record_skip

            print(f"variant {args.variant}: skipped: {why}", flush=True)
            if args.out:
                record_skip(args.out, args.variant, why, cfg)
        return 0
    join = False
    if args.out:
        from .results import RunLock, held_by_my_launcher

        holder = RunLock(args.out).busy() if Path(args.out).is_dir() and not held_by_my_launcher(args.out) else None
        if holder:
            raise UsageError(f"--out {args.out}: a run is writing there now ({holder}): wait for it, or choose "
                             f"another directory")
    if args.out and (Path(args.out) / "rows.jsonl").exists():
        from .results import load_meta

        meta = load_meta(args.out)
        # Another variant of the same suite joins the run (external launchers run one
        # variant per launch); anything else would overwrite it.
        join = (args.variant is not None and meta.get("suite") == cfg.name
                and args.variant not in (meta.get("variants") or {}))
        if not join:
            raise UsageError(f"--out {args.out} already holds a run: continue it with --resume {args.out}, or choose "
                             f"another directory")
    info = launch.detect()
    world = args.np if args.np is not None else info.world
    points, _ = suite_mod.expand(cfg, world, backends.BACKEND_DTYPES[backend])
    plan = plan_mod.plan(cfg, points, world, device, check_counts=backend == "mpi")
    if args.dry_run:
        if info.rank == 0:
            plan_mod.print_plan(cfg, plan, world, backend)
        return 0
    from .results import check_free_space, check_out_dir

    check_out_dir(args.out or "results")  # before any rank starts: a rank cannot say it alone
    check_free_space(args.out or "results", len(points))
    if not external:
        if info.world > 1:
            raise UsageError(f"--np {args.np} given inside a launch of {info.world} ranks: drop --np")
        # The sweep was validated above (expand, plan), before any rank starts or a directory appears.
        ok, why = backends.availability(backend)
        if not ok:
            raise UsageError(f"backend {backend} is not available here: {why}")
        out = args.out or str(new_run_dir(cfg.name))
        child = _strip_np(argv) + ["--out", out] if not args.out else _strip_np(argv)
        if not args.backend:
            child += ["--backend", backend]
        from .results import hold_for_launch

        lock = hold_for_launch(out)  # noqa: F841 -- one writer: held until this launcher exits
        if args.variant is None and vplan.names == ["default"]:
            return launch.spawn_local(args.np, backend, child, out_dir=out)
        from .launch_variants import run_variants

        return run_variants(vplan, args.np, backend, child, out, cfg)
    if len(vplan.entries) > 1:
        raise UsageError(f"suite {cfg.name} has {len(vplan.entries)} variants and NCCL/MPI read their settings once "
                         f"per process: run one per launch with --variant NAME (`make inswitch` loops over them)")
    # Under an external launcher every rank names a directory, but only rank 0 writes one.
    out = args.out or str(new_run_dir(cfg.name))
    name = vplan.names[0]
    return runner.run(cfg, backend, args.device, out, argv, args.ranks_per_node, overrides_p,
                      variant=name, join=join or name != "default", repeat=args.repeat)


def _strip_np(argv: list[str]) -> list[str]:
    """argv without --np N or --np=N: the ranks it starts must not start ranks again."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--np":
            next(it, None)
        elif not a.startswith("--np="):
            out.append(a)
    return out


def cmd_list() -> int:
    from . import backends
    from .benchmarks import registry
    from .suite import list_suites

    print("benchmarks:")
    for name, b in sorted(registry().items()):
        params = ", ".join(f"{k}={v.default}" for k, v in b.params.items())
        doc = (type(b).__doc__ or "").strip().splitlines()[0] if type(b).__doc__ else ""
        print(f"  {name:16s} {params or doc}")
    print("backends:")
    default = backends.default_backend()  # never one that does not work here
    for name in backends.BACKENDS:
        ok, why = backends.availability(name)
        mark = "yes" if ok else "no "
        print(f"  {name:6s} {mark} {why}{'  (default)' if name == default else ''}"
              f"  dtypes: {', '.join(backends.BACKEND_DTYPES[name])}")
    if default is None:
        print(f"  no backend works here: {backends.INSTALL_HINT}")
    print("suites:")
    for s in list_suites():
        print(f"  {s}")
    from .variants import BUILTIN

    print("variants (--variants, or a suite's `variants`; each runs as its own launch):")
    for v in BUILTIN.values():
        where = f"{v.backend or 'any backend'}" + (f", needs {'+'.join(v.requires)}" if v.requires else "")
        print(f"  {v.name:26s} {v.description} [{where}]")
    return 0


def _profiles(args, default: list[str]):
    from . import ceilings

    names = _csv(args.profile) if args.profile else default
    return [ceilings.apply_overrides(ceilings.load_profile(n), profile_overrides(args)) for n in names]


def cmd_ceilings(args) -> int:
    from rich import box
    from rich.table import Table

    from . import ceilings
    from .report import _console, stdout_is_tty

    rows = ceilings.profiles_table_rows(_profiles(args, ceilings.list_profiles()))
    t = Table(title="hardware profiles", box=box.ASCII if not stdout_is_tty() else box.SIMPLE_HEAD,
              caption="GB/s = 1e9 bytes/s PER DIRECTION (busbw compares with one direction; NVIDIA's 900 GB/s and "
                      "1.8 TB/s NVLink figures are both directions summed); NIC Gb/s = gigabits per direction "
                      "(800 Gb/s = 100 GB/s); HBM is total. line = physical rate, achieved = what a tuned stack "
                      "typically reaches. loopback is measured at the start of each run (meta.json 'ceilings').")
    for c in rows[0]:
        t.add_column(c, justify="left" if c in ("profile", "scale-up link", "domain", "NIC") else "right")
    for r in rows:
        t.add_row(*r.values())
    _console().print(t)
    return 0


def cmd_model(args) -> int:
    from rich import box
    from rich.table import Table

    from . import model as M
    from .analysis import fit_table
    from .report import _console, stdout_is_tty
    from .results import load, load_meta
    from .units import fmt_size, parse_size

    console = _console()
    plain = not stdout_is_tty()
    worlds = args.worlds or [8, 16, 32, 64, 128, 256, 512, 1024]
    if any(w < 1 for w in worlds):
        raise UsageError(f"--worlds must be positive, got {worlds}")
    sizes = [parse_size(x) for x in _csv(args.sizes or "1M,64M,1G")]
    fabrics = []
    if args.calibrate:
        from . import ceilings

        meta = load_meta(args.calibrate)
        fields = ((meta.get("ceilings") or {}).get("fields")) or {}
        if not fields:
            raise UsageError(f"{args.calibrate}: meta.json has no measured profile to calibrate")
        prof = ceilings.Profile(**{k: v for k, v in fields.items() if k in ceilings.Profile.__dataclass_fields__})
        base = _fabric(M, prof, args.rate)
        fabrics.append((f"{prof.name} calibrated from {args.calibrate}", M.calibrate_fabric(fit_table(load(args.calibrate)), base)))
    else:
        for prof in _profiles(args, ["gb300-nvl72", "h100-hgx"]):
            if prof.measured and prof.scaleup_line_gbps is None:
                raise UsageError(f"profile {prof.name} is measured at run time: use --calibrate RUN_DIR")
            fabrics.append((prof.name, _fabric(M, prof, args.rate)))
    shape = {k: getattr(args, k.replace("-", "_")) for k in ("tokens", "hidden", "experts", "topk")
             if getattr(args, k) is not None}
    if args.max_groups is not None:
        shape["M"] = args.max_groups
    if "hidden" in shape:
        from .moe import accounting

        try:
            shape["token_nbytes"] = accounting.token_bytes(shape["hidden"], "fp8")
        except ValueError as e:
            raise UsageError(str(e)) from None
    console.print("assumptions:\n" + "\n".join(f"  - {a}" for a in M.ASSUMPTIONS))
    for name, fab in fabrics:
        up, out = fab.scaleup, fab.scaleout
        desc = (f"{name} ({args.rate} rates): scale-up {up.bandwidth_gbps:.4g} GB/s/dir alpha {up.alpha_us:.3g} us, "
                f"G={fab.domain_gpus or 'one host'}" + (f"; scale-out {out.bandwidth_gbps:.4g} GB/s/dir alpha "
                                                        f"{out.alpha_us:.3g} us" if out else "; no scale-out tier"))
        skipped: list = []
        rows = M.project(args.kind, worlds, fab, sizes_nbytes=sizes, moe_shape=shape, algos=args.algos,
                         skipped=skipped)
        t = Table(title=desc, box=box.ASCII if plain else box.SIMPLE_HEAD)
        # placement: how the world sits on the domains (2 x 64/72: two racks, 64 of 72 GPUs each).
        if args.kind == "moe":
            cols = ("world", "placement", "case", "NIC copies/token", "NVLink copies/token", "dispatch (us)",
                    "combine (us)", "bottleneck")
            for c in cols:
                t.add_column(c, justify="left" if c in ("case", "bottleneck", "placement") else "right")
            for r in rows:
                t.add_row(str(r["world"]), str(r.get("placement", "")), r["case"], f"{r['nic_copies_per_token']:.3f}",
                          f"{r['nvl_copies_per_token']:.3f}", f"{r['dispatch_us']:.1f}", f"{r['combine_us']:.1f}",
                          r["dispatch_bottleneck"])
        else:
            for c in ("world", "placement", "size", "algorithm", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
                t.add_column(c, justify="left" if c in ("algorithm", "placement") else "right")
            for r in rows:
                t.add_row(str(r["world"]), str(r.get("placement", "")), fmt_size(r["nbytes"]), r["algo"],
                          f"{r['time_us']:.2f}", f"{r['algbw_gbps']:.2f}", f"{r['busbw_gbps']:.2f}")
        console.print(t)
        said = set()
        for sk in skipped:  # every case left out, with the model's reason, never silently
            line = f"left out: world {sk['world']} {sk.get('case') or ''}: {sk['reason']}".replace("  ", " ")
            if line not in said:
                said.add(line)
                console.print(line)
    return 0


def _fabric(M, prof, rate: str):
    up = prof.scaleup_achieved_gbps if rate == "achieved" else prof.scaleup_line_gbps
    out = prof.scaleout_achieved_gbps if rate == "achieved" else prof.scaleout_line_gbps
    return M.fabric_from_rates(up, prof.scaleup_latency_us or 0.0, prof.scaleup_domain_gpus,
                               out, prof.scaleout_latency_us if out else None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "wide", False):
            from .report import set_wide

            set_wide(True)
        if args.cmd == "run":
            return cmd_run(args, argv)
        if args.cmd == "list":
            return cmd_list()
        if args.cmd == "report":
            from .report import report_runs

            names = _csv(args.profile) if args.profile else []
            if len(names) > 1:
                raise UsageError("report takes one --profile")
            profile = resolve_profile_spec(names[0] if names else None, profile_overrides(args))
            report_runs(args.runs, profile)
            if args.out:
                from .htmlreport import write_report

                res = write_report(args.runs, args.out, profile)
                print(f"report: {res['markdown']} and {res['html']} ({len(res['figures'])} figures)")
                for note in res["notes"]:
                    print(f"note: {note}")
            return 0
        if args.cmd == "compare":
            from .compare import compare_paths, split_sides

            base, new = split_sides(args.runs, args.base, args.new, argv)
            return compare_paths(base, new, args.threshold, args.fail_on_regression,
                                 all_points=args.all, csv_out=args.csv)
        if args.cmd == "import":
            from .importers import import_to_run

            out, rows, meta = import_to_run(args.files, args.out, args.format, args.world, args.benchmark,
                                            in_place=not args.no_in_place)
            print(f"imported {len(rows)} rows ({', '.join(sorted({r['benchmark'] for r in rows}))}, "
                  f"world {meta['world']}) from {meta['source']}: {out}")
            for note in meta.get("import_notes") or []:
                print(f"note: {note}")
            return 0
        if args.cmd == "ceilings":
            return cmd_ceilings(args)
        if args.cmd == "model":
            return cmd_model(args)
    except UsageError as e:
        from .launch import say_once

        say_once(f"commbench: error: {e}")
        return e.exit_status
    except RunFailed as e:  # already said in one line by the rank that failed
        if os.environ.get("COMMBENCH_DEBUG"):
            import traceback

            traceback.print_exception(e.__cause__ or e)
        return e.exit_status
    except KeyboardInterrupt:
        print("commbench: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
