"""commbench command line: run, list, report, compare, ab, import, ceilings, model, routing."""
from __future__ import annotations

import argparse
import os
import sys

from commbench.commands.ceilings import ceilings_command
from commbench.commands.model import model_command
from commbench.commands.run import run_command
from commbench.core.errors import RunFailed, UsageError
from commbench.moe.shape import DEEPSEEK_V3
from commbench.report import viewsettings
from commbench.report.styles import STYLES
from commbench.run.suite import TIMING_METHODS, key_help

from .backends import BACKENDS

_STYLE_HELP = ("table: commbench's tables; nccl-tests: one line per size, out-of-place and in-place side by side, "
               "and the Avg bus bandwidth footer; osu: size, avg, min, max latency and iterations (the same rows: "
               "only the layout changes)")


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
                        "judge on the spread between repeats; with --np each repeat is a launch of its own "
                        "(default 1)")
    r.add_argument("--check", action=argparse.BooleanOptionalAction, default=None, help=_kh("check"))
    r.add_argument("--timing", choices=TIMING_METHODS, help=_kh("timing"))
    r.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None, help=_kh("cuda_graph"))
    r.add_argument("--in-place", action=argparse.BooleanOptionalAction, default=None,
                   help=_kh("in_place") + "; shorthand for --placement in-place")
    r.add_argument("--placement", choices=("out-of-place", "in-place", "both"), help=_kh("placement"))
    r.add_argument("--per-op-events", action=argparse.BooleanOptionalAction, default=None,
                   help=_kh("per_op_events"))
    r.add_argument("--cuda-aware-mpi", action="store_true",
                   help="backend mpi with device cuda: the MPI takes CUDA buffers (when the library cannot be asked)")
    r.add_argument("--param", action="append", default=[], metavar="[BENCH.]KEY=V[,V...]",
                   help="set a benchmark parameter; several values make a sweep axis")
    r.add_argument("--partners", type=int, metavar="K", help="pairs: K seeded partners per member instead of "
                   "every pair (--param pairs.partners=K)")
    r.add_argument("--pairs-mode", choices=("node", "rank", "rail"), help="pairs: who measures (--param pairs.mode)")
    r.add_argument("--fail-on-outlier", action="store_true", help="pairs: exit 1 when the verdict names a slow node "
                   "or link (for health-check scripts)")
    r.add_argument("--np", type=int, help="start this many local ranks (default without a launcher: one per core, "
                   "at least 2; one per visible GPU on a GPU host)")
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
    r.add_argument("--verbose", action="store_true", help="every warning on a line of its own (default: one "
                   "tally line of the rows that carry warnings)")
    r.add_argument("--style", choices=STYLES, default="table", help=_STYLE_HELP + "; nccl-tests measures both "
                   "placements unless --placement or --in-place says otherwise")
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
    rep.add_argument("--verbose", action="store_true", help="every row's warning on a line of its own (default: "
                     "one tally line; report.md lists them too)")
    rep.add_argument("--style", choices=STYLES, default="table", help=_STYLE_HELP)
    _profile_args(rep)

    cmp_ = sub.add_parser(
        "compare", help="compare runs point by point: faster, slower or not significant",
        description="Forms: compare BASE NEW; compare A1 A2 A3 -- B1 B2 B3 (options before the --); compare --base "
                    "A1 A2 A3 --new B1 B2 B3. With repeated runs a side, each point is judged on how much it moves "
                    "between runs; a change within what the host's state can explain (runs in blocks or one run a "
                    "side: 2x; the sides' control measurements apart; disturbed rows) is 'cannot judge'. Exit "
                    "status: 0, also when points were slower, unless --fail-on-regression; 2 when nothing was "
                    "compared.")
    # Every run as one positional list: argparse cannot split two variable-length positional
    # lists, so the `--` between the sides is found by compare.split_sides.
    cmp_.add_argument("runs", nargs="*", metavar="RUN",
                      help="result directories: BASE NEW, or the base runs, --, the new runs")
    cmp_.add_argument("--base", nargs="+", metavar="RUN", help="result directories of the baseline runs")
    cmp_.add_argument("--new", nargs="+", metavar="RUN", help="result directories of the runs to judge")
    cmp_.add_argument("--threshold", type=_pct, default=5.0, metavar="PCT",
                      help="smallest change of p50 that counts, in per cent (default 5); the change's ~95%% "
                           "interval must exclude 0 too (one run a side: the runs' intervals must not overlap)")
    cmp_.add_argument("--fail-on-regression", action="store_true",
                      help="the gate: exit 1 when a point is judged slower or a data check failed on either side, "
                           "3 (inconclusive) when points could not be judged and none is slower, 0 otherwise")
    cmp_.add_argument("--allow-inconclusive", action="store_true",
                      help="with --fail-on-regression: exit 0 instead of 3 when points could not be judged")
    cmp_.add_argument("--all", action="store_true", help="list every matched point (default: only faster and slower)")
    cmp_.add_argument("--csv", metavar="FILE", help="also write the whole comparison as CSV")
    cmp_.add_argument("--wide", action="store_true", help="every column, the busbw of both sides too (default: a "
                      "compact set that fits the terminal)")

    ab = sub.add_parser(
        "ab", help="run A and B alternately in fresh launches (A1 B1 A2 B2 ...), then compare them",
        description="commbench ab --rounds N [--a-env K=V ...] [--b-env K=V ...] [--a-python PATH] [--b-python PATH] "
                    "[--out DIR] [compare options] -- RUN-ARGS: runs `commbench run RUN-ARGS --out DIR/A1`, then B1, "
                    "A2, B2, ..., each side with its own environment and interpreter, then compares A1..AN -- B1..BN.")
    ab.add_argument("--rounds", type=int, required=True, metavar="N", help="runs a side (at least 2)")
    for side in ("a", "b"):
        ab.add_argument(f"--{side}-env", action="append", default=[], metavar="K=V",
                        help=f"a variable set for side {side.upper()}'s runs, on top of the current environment "
                             "(repeat for more); recorded in each run's meta.json")
        ab.add_argument(f"--{side}-python", metavar="PATH", help=f"the interpreter side {side.upper()} runs "
                        "`PATH -m commbench run` with (default: this one)")
    ab.add_argument("--out", metavar="DIR", help="where the runs go, DIR/A1, DIR/B1, ... (default results/<timestamp>-ab)")
    ab.add_argument("--threshold", type=_pct, default=5.0, metavar="PCT", help="as compare's (default 5)")
    ab.add_argument("--fail-on-regression", action="store_true", help="as compare's: the gate's exit status")
    ab.add_argument("--allow-inconclusive", action="store_true", help="as compare's")
    ab.add_argument("--csv", metavar="FILE", help="also write the comparison as CSV")
    ab.add_argument("run_args", nargs="*", metavar="RUN-ARGS", help="after --: the arguments of `commbench run`")

    im = sub.add_parser("import", help="turn nccl-tests (stdout or -J JSON) or OSU output into a result directory")
    im.add_argument("files", nargs="+", help="one or more output files; all go into one result directory")
    im.add_argument("--format", choices=("nccl-tests", "nccl-tests-json", "osu"), help="default: detected from content")
    im.add_argument("--world", type=int, help="rank count (required for OSU, which does not print it)")
    im.add_argument("--benchmark", help="the collective, when neither the file nor its name says")
    im.add_argument("--no-in-place", action="store_true",
                    help="nccl-tests: keep only the out-of-place half, not the in-place rows")
    im.add_argument("--out", metavar="DIR", help="result directory (default results/<timestamp>-import-<file>)")

    rt = sub.add_parser("routing", help="a captured MoE routing trace's statistics (load per rank and expert, "
                        "locality, per step) without running anything")
    rt.add_argument("file", help="the trace: .npy, .npz, .jsonl or .csv (docs/moe.md)")
    rt.add_argument("--world", type=int, help="the EP size to read it at (default: the one it was recorded at, else 8)")
    rt.add_argument("--per-step", action="store_true", help="a line for each step too")

    c = sub.add_parser("ceilings", help="print the hardware profiles (link line and achieved rates)")
    _profile_args(c, many=True)

    m = sub.add_parser("model", help="what-if: project times from a profile's alpha-beta cost models")
    m.add_argument("--kind", default="moe", choices=("moe", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
                   help="what to project (default moe: DeepSeek-V3 dispatch and combine)")
    _profile_args(m, many=True, default="gb300-nvl72,h100-hgx")
    m.add_argument("--worlds", type=_int_list, help="rank counts (default 8,16,...,1024)")
    m.add_argument("--sizes", help="message sizes for collectives: MIN:MAX[:FACTOR] or A,B,C with K/M/G binary "
                   "suffixes, as run --sizes (default 1M,64M,1G)")
    m.add_argument("--algos", type=_csv, help="all_reduce: ring, tree, recursive_doubling, rabenseifner, inswitch, hierarchical")
    m.add_argument("--rate", choices=("achieved", "line"), default="achieved",
                   help="build the fabric from the typical achieved rates (default) or the line rates (a lower bound)")
    m.add_argument("--calibrate", metavar="RUN_DIR",
                   help="take the scale-up alpha and B from an alpha-beta fit of a measured run's all_to_all")
    for k, d in (("tokens", DEEPSEEK_V3.tokens), ("hidden", DEEPSEEK_V3.hidden), ("experts", DEEPSEEK_V3.experts),
                 ("topk", DEEPSEEK_V3.topk), ("max-groups", DEEPSEEK_V3.max_groups)):
        m.add_argument(f"--{k}", type=int, help=f"moe shape (default {d}, DeepSeek-V3)")
    m.add_argument("--workload", metavar="NAME",
                   help="moe: beside each uniform row, one with the most loaded rank's bytes under this routing "
                        "workload (docs/model.md#skewed-routing)")
    m.add_argument("--param", action="append", default=[], metavar="moe.KNOB=V",
                   help="moe: a knob of --workload (its own, seed, steps), as run --param")
    m.add_argument("--trace", metavar="FILE", help="moe: the skew of a recorded routing trace (sets experts, top-k)")
    m.add_argument("--dispatchers", type=_csv,
                   help="moe: alltoall, hierarchical, deepep-normal, low-latency (default the first three)")
    m.add_argument("--stack", metavar="NAME",
                   help="moe: the kernel stack whose terms replace the profiles' (deepep, deepep-ll, deepep-v2, "
                        "hybrid-ep, uccl-ep, uccl-ep-ll, or an alias; docs/model.md#kernel-stacks)")
    m.add_argument("--against", nargs="?", const="", metavar="FILE",
                   help="hold the model against a table of published figures (default: the shipped "
                        "commbench/data/published.toml) and print published, projected and their ratio")
    return p


def _kh(key: str) -> str:
    """A suite key's flag help: what it sets, and that the suite's value applies unless given."""
    from dataclasses import fields

    from commbench.run.suite import SuiteConfig

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


def cmd_list() -> int:
    from commbench.run.suite import suite_origins

    from . import backends
    from .benchmarks import registry

    print("benchmarks:")
    for name, b in sorted(registry().items()):
        params = ", ".join(f"{k}={v.default}" for k, v in b.params.items())
        doc = (type(b).__doc__ or "").strip().splitlines()[0] if type(b).__doc__ else ""
        print(f"  {name:16s} {params or doc}")
    from .benchmarks.moe import ROUTING_KNOBS, MoE
    from .moe import ROUTING_HELP

    print("moe routings (workloads: --param moe.routing=NAME; their knobs are moe params, defaults shown):")
    for name, line in ROUTING_HELP.items():
        knobs = ", ".join(f"{k}={MoE.params[k].default!r}" if isinstance(MoE.params[k].default, str)
                          else f"{k}={MoE.params[k].default}" for k in ROUTING_KNOBS.get(name, ()))
        print(f"  {name:14s} {line}" + (f"  [{knobs}]" if knobs else ""))
    from .benchmarks.moe.dispatchers import DISPATCHERS

    print("moe dispatchers (--param moe.dispatcher=NAME; where one cannot run, its points are skipped with why):")
    for name, d in DISPATCHERS.items():
        print(f"  {name:14s} {d.description}  [{', '.join(d.serves)}]")
    print("backends:")
    default = backends.default_backend()  # never one that does not work here
    for name in backends.BACKENDS:
        ok, why = backends.availability(name)
        mark = "yes" if ok else "no "
        print(f"  {name:6s} {mark} {why}{'  (default)' if name == default else ''}"
              f"  dtypes: {', '.join(backends.BACKEND_DTYPES[name])}")
    if default is None:
        print(f"  no backend works here: {backends.INSTALL_HINT}")
    print("suites:")  # the first file of a name wins: COMMBENCH_SUITES, ./suites, then the shipped ones
    for s, (path, hides) in suite_origins().items():
        print(f"  {s:16s} {path}" + (f"  (shadows the shipped {hides})" if hides else ""))
    from commbench.run.variants import BUILTIN

    print("variants (--variants, or a suite's `variants`; each runs as its own launch):")
    for v in BUILTIN.values():
        where = f"{v.backend or 'any backend'}" + (f", needs {'+'.join(v.requires)}" if v.requires else "")
        print(f"  {v.name:26s} {v.description} [{where}]")
    return 0


def _profiles(args, default: list[str], nic_keeps_ratio: bool = False):
    from commbench.analyse import ceilings

    names = _csv(args.profile) if args.profile else default
    return [ceilings.apply_overrides(ceilings.load_profile(n), profile_overrides(args), nic_keeps_ratio)
            for n in names]


class _DroppingStdout:
    """sys.stdout that survives its reader: a closed stdout (`>&-`) or a pipe whose reader
    left (`| head -1`) drops what would be printed from then on, and the command (a run's
    rows, a gate's exit status) goes on. The file descriptor is pointed at /dev/null, so
    what Python still holds in its buffer is flushed there at exit, not into an error."""

    def __init__(self, f):
        self._f = f
        self.dropped = False

    def _drop(self) -> None:
        self.dropped = True
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._f.fileno())
            os.close(fd)
        except (OSError, ValueError):
            pass

    def write(self, text):
        try:
            return self._f.write(text)
        except (BrokenPipeError, ValueError) as e:  # ValueError: a file closed under us
            self._drop()
            return len(text) if not isinstance(e, ValueError) else 0
        except OSError:
            self._drop()
            return len(text)

    def writelines(self, lines):
        # Through write: the file's own writelines (a long table's rows, report/tables.py) would
        # raise the reader's leaving past this wrapper.
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            self._f.flush()
        except (OSError, ValueError):
            self._drop()
            try:
                self._f.flush()
            except (OSError, ValueError):
                pass

    def __getattr__(self, name):
        return getattr(self._f, name)


def _guard_stdout():
    """Wrap sys.stdout for this command; returns what to put back when it is done."""
    before = sys.stdout
    if sys.stdout is None:  # started with fd 1 closed: give it /dev/null, for us and the ranks we start
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
        sys.stdout = open(1, "w", closefd=False)
    if not isinstance(sys.stdout, _DroppingStdout):
        sys.stdout = _DroppingStdout(sys.stdout)
    return before if before is not None else sys.stdout._f


def _os_error_line(e: OSError) -> str:
    return f"{e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stdout = _guard_stdout()
    # Only `run` is one rank of a launch; any other command says its refusal whatever the
    # launch variables in the environment say.
    everywhere = next((a for a in argv if not a.startswith("-")), None) != "run"
    try:
        args = build_parser().parse_args(argv)
        # How tables and warnings are shown, passed to what prints them (a rank of `run`
        # reads the same flags from its argv: viewsettings.from_argv).
        view = viewsettings.from_flags(args)
        if args.cmd == "run":
            return run_command(args, argv, profile_overrides(args))
        if args.cmd == "list":
            return cmd_list()
        if args.cmd == "report":
            from commbench.commands.report import report_command

            return report_command(args.runs, _csv(args.profile) if args.profile else [], profile_overrides(args),
                                  args.out, view)
        if args.cmd == "compare":
            from commbench.commands.compare import compare_command

            return compare_command(args, argv, view)
        if args.cmd == "ab":
            from commbench.commands.compare import compare_paths
            from commbench.run.ab import ab_command

            return ab_command(args, argv, lambda words: build_parser().parse_args(["run", *words]), compare_paths)
        if args.cmd == "import":
            from commbench.store.importers import import_to_run

            try:
                out, meta = import_to_run(args.files, args.out, args.format, args.world, args.benchmark,
                                          in_place=not args.no_in_place)
            except OSError as e:  # a full disk or a read-only place: the files read, the result not written
                raise UsageError(f"import: cannot write the result directory: {_os_error_line(e)}") from e
            print(f"imported {meta['points']} rows ({', '.join(meta['benchmarks'])}, "
                  f"world {meta['world']}) from {meta['source']}: {out}")
            for note in meta.get("import_notes") or []:
                print(f"note: {note}")
            return 0
        if args.cmd == "routing":
            from commbench.commands.routing import routing_command

            return routing_command(args.file, args.world, args.per_step)
        if args.cmd == "ceilings":
            return ceilings_command(lambda default: _profiles(args, default))
        if args.cmd == "model":
            return model_command(args, lambda default: _profiles(args, default, nic_keeps_ratio=True))
    except UsageError as e:
        from commbench.run.contract import say_once

        _debug_trace(e)
        say_once(f"commbench: error: {e}", everywhere=everywhere)
        return e.exit_status
    except OSError as e:  # a file the user named or a place the user chose: one line naming it
        from commbench.run.contract import say_once

        _debug_trace(e)
        say_once(f"commbench: error: {_os_error_line(e)}", everywhere=everywhere)
        return 2
    except RunFailed as e:  # already said in one line by the rank that failed
        _debug_trace(e.__cause__ or e)
        return e.exit_status
    except KeyboardInterrupt:
        print("commbench: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout.flush()  # here, where a reader that left is dropped quietly, not at exit
        sys.stdout = stdout
    return 0


def _debug_trace(e: BaseException) -> None:
    if os.environ.get("COMMBENCH_DEBUG"):
        import traceback

        traceback.print_exception(e)


if __name__ == "__main__":
    sys.exit(main())
