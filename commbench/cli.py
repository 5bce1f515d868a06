"""commbench command line: run, list, report."""
from __future__ import annotations

import argparse
import sys

from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2, not a usage block
        raise UsageError(f"{self.prog}: {message}")


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise UsageError(f"expected a comma list of integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="commbench", description="Collective-communication microbenchmarks for MoE-era clusters.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run a suite (joins mpirun/srun/torchrun, or starts --np local ranks)")
    r.add_argument("suite", nargs="?", help="suite name from suites/ or a .toml path")
    r.add_argument("-b", "--benchmarks", type=_csv, help="comma list; overrides the suite's")
    r.add_argument("--backend", help="mpi, gloo or nccl (default: nccl with a GPU, else mpi)")
    r.add_argument("--device", choices=("cpu", "cuda"), help="buffer device (default: the backend's)")
    r.add_argument("--sizes", help="MIN:MAX[:FACTOR] or A,B,C with K/M/G binary suffixes")
    r.add_argument("--dtypes", type=_csv, help="float32, bfloat16, float16, int32")
    r.add_argument("--worlds", type=_int_list, help="rank counts to sweep inside the launch")
    r.add_argument("--iters", type=int, help="fixed timed iterations (0: calibrate)")
    r.add_argument("--warmup", type=int)
    r.add_argument("--min-time-ms", type=float, help="calibration target per point")
    r.add_argument("--max-iters", type=int)
    r.add_argument("--check", action=argparse.BooleanOptionalAction, default=None, help="validate every point")
    r.add_argument("--param", action="append", default=[], metavar="[BENCH.]KEY=V[,V...]",
                   help="set a benchmark parameter; several values make a sweep axis")
    r.add_argument("--np", type=int, help="start this many local ranks")
    r.add_argument("--out", help="result directory (default results/<timestamp>-<suite>)")
    r.add_argument("--ranks-per-node", type=int, help="override hostname grouping (two tiers on one host)")

    sub.add_parser("list", help="benchmarks, backends (and whether they work here), suites")

    rep = sub.add_parser("report", help="print the tables of one or more result directories")
    rep.add_argument("runs", nargs="+")
    return p


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_params(items: list[str], benchmarks: tuple) -> dict:
    """--param tokens=128,4096 (every benchmark that has it) or --param moe.tokens=128."""
    from .benchmarks import get

    out: dict[str, dict] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--param {item!r}: use [BENCH.]KEY=VALUE")
        key, val = item.split("=", 1)
        values = [_value(v) for v in _csv(val)]
        if not values:
            raise UsageError(f"--param {item!r}: no value")
        value = values if len(values) > 1 else values[0]
        if "." in key:
            bench, key = key.split(".", 1)
            targets = [bench]
        else:
            targets = [b for b in benchmarks if key in get(b).params]
            if not targets:
                raise UsageError(f"--param {key}: no benchmark of this run has that parameter")
        for b in targets:
            out.setdefault(b, {})[key] = value
    return out


def cmd_run(args, argv: list[str]) -> int:
    from . import backends, launch, runner, suite as suite_mod
    from .results import new_run_dir
    from .units import parse_sizes_arg

    raw = suite_mod.read_suite(args.suite)
    overrides = {
        "benchmarks": args.benchmarks, "dtypes": args.dtypes, "worlds": args.worlds, "iters": args.iters,
        "warmup": args.warmup, "min_time_ms": args.min_time_ms, "max_iters": args.max_iters,
        "check": args.check, "backend": args.backend,
        "sizes": parse_sizes_arg(args.sizes) if args.sizes else None,
    }
    cfg = suite_mod.build_config(raw, overrides)
    if args.param:
        cfg = suite_mod.build_config(raw, {**overrides, "params": parse_params(args.param, cfg.benchmarks)})
    backend = backends.check_name(cfg.backend or backends.default_backend())
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise UsageError(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    from .benchmarks import get

    if backend == "nccl" or args.device == "cuda":
        gpu_less = [b for b in cfg.benchmarks if get(b).cpu_only]
        if gpu_less:
            raise UsageError(f"{gpu_less[0]} packs rows on the host and runs on CPU backends (mpi, gloo) only")
    info = launch.detect()
    if args.np is not None:
        if args.np < 1:
            raise UsageError(f"--np must be >= 1, got {args.np}")
        if info.world > 1:
            raise UsageError(f"--np {args.np} given inside a launch of {info.world} ranks: drop --np")
        # Validate the whole sweep here, before any rank starts or a directory appears.
        suite_mod.expand(cfg, args.np, backends.BACKEND_DTYPES[backend])
        ok, why = backends.availability(backend)
        if not ok:
            raise UsageError(f"backend {backend} is not available here: {why}")
        out = args.out or str(new_run_dir(cfg.name))
        child = _strip_np(argv) + ["--out", out] if not args.out else _strip_np(argv)
        if not args.backend:
            child += ["--backend", backend]
        return launch.spawn_local(args.np, backend, child)
    # Under an external launcher every rank names a directory, but only rank 0 writes one.
    out = args.out or str(new_run_dir(cfg.name))
    return runner.run(cfg, backend, args.device, out, argv, args.ranks_per_node)


def _strip_np(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--np":
            skip = True
            continue
        if a.startswith("--np="):
            continue
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
    default = backends.default_backend()
    for name in backends.BACKENDS:
        ok, why = backends.availability(name)
        mark = "yes" if ok else "no "
        print(f"  {name:6s} {mark} {why}{'  (default)' if name == default else ''}"
              f"  dtypes: {', '.join(backends.BACKEND_DTYPES[name])}")
    print("suites:")
    for s in list_suites():
        print(f"  {s}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.cmd == "run":
            return cmd_run(args, argv)
        if args.cmd == "list":
            return cmd_list()
        if args.cmd == "report":
            from .report import report_runs

            report_runs(args.runs)
            return 0
    except UsageError as e:
        from .launch import detect

        if detect().rank == 0:
            print(f"commbench: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    except KeyboardInterrupt:
        print("commbench: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
