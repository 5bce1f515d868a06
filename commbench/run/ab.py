"""`commbench ab`: two builds or settings measured the way a comparison can trust. Runs made
in blocks (yesterday's three, today's three) share whatever speed the host kept for their
hour, and no spread within a side says how far the host moved between the blocks; runs made
alternately, each a fresh launch, put both sides beside every mood of the host. So:

    commbench ab --rounds N [--a-env K=V ...] [--b-env K=V ...] [--a-python PATH]
                 [--b-python PATH] [--out DIR] [compare options] -- RUN-ARGS

runs `commbench run RUN-ARGS --out DIR/A1`, then B1, A2, B2, ... (each side's environment on
top of the current one, each side's interpreter: `PATH -m commbench`), then compares A1..AN
with B1..BN as `commbench compare` does. The environments are the user's own, given on the
command line: recorded in each run's meta.json ("ab"), with none of the limits a suite file's
variant environment has. Every refusal comes before the first run; a run that fails ends ab
with its exit status and keeps the runs already made."""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.store.disk import check_out_dir
from commbench.store.record import RunRecord
from commbench.store.results import new_run_dir

SIDES = ("A", "B")
# What RUN-ARGS may not hold: ab names each run's directory, and a run it did not make
# (a resume), a dry run or a listing makes no run to compare.
REFUSED_RUN_FLAGS = {"out": "--out (ab names each run DIR/A1, DIR/B1, ...)", "resume": "--resume",
                     "dry_run": "--dry-run (it makes no run to compare)",
                     "list_variants": "--list-variants (it makes no run to compare)"}
# How long a side's interpreter may take to import commbench before it is called broken.
PYTHON_CHECK_S = 120.0
# How long a run interrupted with ab (Ctrl-C) may take to mark itself before it is killed.
INTERRUPT_GRACE_S = 60.0
# The lines of a failed run's log repeated on the terminal.
LOG_TAIL_LINES = 5


def parse_env(pairs, flag: str) -> dict[str, str]:
    """K=V words into a dict; a word without '=' or with a key no shell could export is
    refused in one line."""
    env = {}
    for word in pairs or []:
        key, eq, value = word.partition("=")
        if not eq:
            raise UsageError(f"ab {flag} {word!r}: expected K=V (a variable and its value)")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"ab {flag} {word!r}: {key!r} is not an environment variable name")
        env[key] = value
    return env


def order(rounds: int) -> list[tuple[str, int]]:
    """(side, round) in the order the runs are made: A1 B1 A2 B2 ..."""
    return [(side, r) for r in range(1, rounds + 1) for side in SIDES]


def check_python(path: str | None, env: dict, flag: str) -> tuple[str, str]:
    """The side's interpreter (default: this one) and the commbench it imports, with the
    side's environment, from here (`-m` puts the working directory first on the path, so a
    checkout here shadows an installation: ab says which one each side runs). Refused when
    it does not run or cannot import commbench."""
    python = path or sys.executable
    code = "import commbench, os; print(os.path.dirname(commbench.__file__))"
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=PYTHON_CHECK_S,
                           env={**os.environ, **env})
    except (OSError, subprocess.SubprocessError) as e:
        why = getattr(e, "strerror", None) or type(e).__name__
        raise UsageError(f"ab {flag} {python}: does not run ({why})") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise UsageError(f"ab {flag} {python}: cannot import commbench ({last})")
    return python, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "?"


def check_run_args(run_args: list[str], parse_run_args) -> None:
    """RUN-ARGS as `commbench run` reads them (abbreviations and --out=DIR forms too): bad
    flags, and the flags ab cannot pass on, are refused before any run."""
    if not run_args:
        raise UsageError("ab needs the run's arguments after --: commbench ab --rounds N -- SUITE [RUN FLAGS]")
    try:
        parsed = parse_run_args(run_args)
    except UsageError as e:
        raise UsageError(f"ab: the run's arguments: {e}") from None
    for dest, flag in REFUSED_RUN_FLAGS.items():
        if getattr(parsed, dest, None):
            raise UsageError(f"ab: the run's arguments may not hold {flag}")


def dry_run(side: str, python: str, env: dict, run_args: list[str]) -> None:
    """`run RUN-ARGS --dry-run` with the side's interpreter and environment: what the run
    itself refuses (an unknown suite, a size that cannot split, a bad setting in the side's
    environment) is refused now, not after the first side's runs."""
    try:
        p = subprocess.run([python, "-m", "commbench", "run", *run_args, "--dry-run"], capture_output=True,
                           text=True, timeout=PYTHON_CHECK_S, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"ab: side {side}: `run --dry-run` did not finish ({type(e).__name__})") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise UsageError(f"ab: side {side}'s run refuses its arguments: {last.removeprefix('commbench: error: ')}")


def run_args_of(argv: list[str], positionals: list[str]) -> list[str]:
    """The words after the first `--` of the command line (argparse drops or keeps a `--` by
    Python version), else the positionals."""
    argv = list(argv)
    return argv[argv.index("--") + 1:] if "--" in argv else list(positionals or [])


def ab_command(args, argv: list[str], parse_run_args, compare_paths) -> int:
    """The `ab` subcommand: args as cli parsed them, argv the command line, parse_run_args a
    function that parses `commbench run` arguments (refusing bad ones), compare_paths
    `commbench compare`'s flow (commands/compare.py, a layer above this one)."""
    if args.rounds is None or args.rounds < 2:
        raise UsageError(f"ab --rounds must be at least 2 (a side's spread needs two runs), got {args.rounds}")
    envs = {"A": parse_env(args.a_env, "--a-env"), "B": parse_env(args.b_env, "--b-env")}
    run_args = run_args_of(argv, args.run_args)
    check_run_args(run_args, parse_run_args)
    if args.csv is not None and os.path.isdir(args.csv):
        raise UsageError(f"ab --csv {args.csv}: is a directory (give a file name)")
    out = Path(args.out) if args.out else new_run_dir("ab")
    check_out_dir(out, "ab --out")
    plan = order(args.rounds)
    taken = [f"{s}{r}" for s, r in plan if (out / f"{s}{r}").exists()]
    if taken:
        raise UsageError(f"ab --out {out}: {out / taken[0]} exists: choose a directory without runs A1, B1, ...")
    pythons = {"A": check_python(args.a_python, envs["A"], "--a-python"),
               "B": check_python(args.b_python, envs["B"], "--b-python")}
    for side in SIDES:
        dry_run(side, pythons[side][0], envs[side], run_args)
    out.mkdir(parents=True, exist_ok=True)
    for side in SIDES:
        python, pkg = pythons[side]
        setting = " ".join(f"{k}={v}" for k, v in envs[side].items()) or "no environment of its own"
        print(f"ab: {side}: {python} (commbench from {pkg}), {setting}", flush=True)
    print(f"ab: {args.rounds} rounds, {' '.join(f'{s}{r}' for s, r in plan)}, in fresh launches into {out}",
          flush=True)
    for side, rnd in plan:
        status = run_one(out, side, rnd, args.rounds, run_args, envs[side], pythons[side])
        if status != 0:
            print(f"commbench: error: ab: run {side}{rnd} exited with status {status}; the runs made so far are "
                  f"kept in {out} (log: {out / f'{side}{rnd}.log'})", file=sys.stderr, flush=True)
            return status
    base = [str(out / f"A{r}") for r in range(1, args.rounds + 1)]
    new = [str(out / f"B{r}") for r in range(1, args.rounds + 1)]
    print(f"ab: commbench compare {' '.join(base)} -- {' '.join(new)}", flush=True)
    return compare(base, new, args, compare_paths)


def run_one(out: Path, side: str, rnd: int, rounds: int, run_args, env: dict, python: tuple[str, str]) -> int:
    """One fresh launch of `commbench run` for one side, its output in DIR/<side><round>.log;
    its meta.json then records the side's setting. Returns the run's exit status."""
    name = f"{side}{rnd}"
    run_dir, log = out / name, out / f"{name}.log"
    cmd = [python[0], "-m", "commbench", "run", *run_args, "--out", str(run_dir)]
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            status = proc.wait()
        except KeyboardInterrupt:
            # The run got the same SIGINT (one process group): it marks itself interrupted and
            # keeps its rows if given the moment to (subprocess.run would kill it at once).
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if status < 0:  # killed by a signal: the shell's 128 + N
        status = 128 - status
    took = time.monotonic() - t0
    record(run_dir, {"side": side, "round": rnd, "rounds": rounds, "env": dict(env), "python": python[0],
                     "commbench": python[1], "command": cmd})
    print(f"ab: {name} (round {rnd} of {rounds}): exit {status} in {took:.1f} s: {run_dir}", flush=True)
    if status != 0:
        for line in log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]:
            print(f"  {line}", file=sys.stderr, flush=True)
    return status


def record(run_dir: Path, ab: dict) -> None:
    """The side's setting into the run's meta.json (its launch has ended: nobody else writes
    it now); a run that left no meta.json is left as it is."""
    RunRecord(run_dir).note_ab(ab)


def compare(base: list[str], new: list[str], args, compare_paths) -> int:
    """A1..AN against B1..BN, as `commbench compare` does, with its options."""
    kwargs = {"all_points": False, "csv_out": args.csv}
    if "allow_inconclusive" in inspect.signature(compare_paths).parameters:
        kwargs["allow_inconclusive"] = args.allow_inconclusive
    try:
        return compare_paths(base, new, args.threshold, args.fail_on_regression, **kwargs)
    except OSError as e:  # exit 2, not 1: a gate reads 1 as "slower"
        if args.csv is not None and e.filename in (None, args.csv):
            raise UsageError(f"ab --csv {args.csv}: cannot write: {e.strerror or e}") from e
        raise
