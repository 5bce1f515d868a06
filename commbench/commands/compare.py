"""`commbench compare`: load both sides (a run directory or a list of repeated runs each),
judge them (analyse.compare), print (report.compare_view), write the CSV, and the exit
status a gate reads. The command line's three forms of the two sides are split here too."""
from __future__ import annotations

import os
from pathlib import Path

from rich.markup import escape

from commbench.analyse.compare import compare_runs, exit_status, nothing_in_common, split_only, summary
from commbench.analyse.host_moved import host_context
from commbench.core.errors import UsageError
from commbench.report import terminal
from commbench.report.compare_view import check_line, print_compare
from commbench.store.load import load_side, names_for, refuse_duplicates
from commbench.store.results import load_meta


def compare_paths(base, new, threshold_pct: float = 5.0, fail_on_regression: bool = False, console=None,
                  all_points: bool = True, csv_out=None, wide: bool | None = None,
                  allow_inconclusive: bool = False) -> int:
    """`commbench compare`: load both sides (a run directory or a list of repeated runs
    each), print, optionally write the frame as CSV; returns the exit status (exit_status:
    with fail_on_regression 0, 1 slower or a failed check, 3 inconclusive unless
    allow_inconclusive). No point matched on both sides (a side without rows, mpi against
    gloo): UsageError (exit 2). The runs' meta.json tell when they ran and their controls
    (host_moved.host_context)."""
    base = [base] if isinstance(base, (str, bytes)) or not hasattr(base, "__iter__") else list(base)
    new = [new] if isinstance(new, (str, bytes)) or not hasattr(new, "__iter__") else list(new)
    sides = [load_side(base, "base"), load_side(new, "new")]
    for side in sides:
        refuse_duplicates(side)
    metas = {str(p): meta_of(p) for p in base + new}  # each run's meta.json, read once
    df = compare_runs(*sides, threshold_pct, host=host_context(side_metas(base, metas), side_metas(new, metas)))
    matched, _ = split_only(df)
    if matched.empty:  # a gate that compared nothing must not pass
        raise UsageError(f"nothing was compared: {nothing_in_common(*sides)}")
    failed_runs = runs_with_failed_checks(base + new, metas)
    line = check_line(df, failed_runs, fail_on_regression)
    console = console or terminal.make_console()
    if line:  # first: a gate that fails on wrong results says so before any table
        console.print(escape(line), soft_wrap=True, highlight=False)
    print_compare(df, console=console, threshold_pct=threshold_pct, all_points=all_points, wide=wide)
    if csv_out:
        df.to_csv(csv_out, index=False)
    status = exit_status(df, fail_on_regression, failed_runs, allow_inconclusive)
    if status == 3:
        console.print(f"inconclusive: {summary(df)['cannot judge']} point(s) could not be judged and none is "
                      f"slower: exit 3 (--allow-inconclusive passes the gate on this)", highlight=False)
    return status


def meta_of(path) -> dict:
    """meta.json of a run given as its directory or its rows.jsonl."""
    return load_meta(Path(path).parent if Path(path).name == "rows.jsonl" else path)


def side_metas(paths, metas: dict | None = None) -> dict:
    """{run name: meta.json} of one side's paths, each named as store.load.load_side names its
    rows (the directory's name; the path as given where two of the side share it). metas:
    meta.json by path as given, already read; read here when None."""
    names = [names_for([p])[0] for p in paths]
    return {(str(p) if names.count(x) > 1 else x): (metas[str(p)] if metas is not None else meta_of(p))
            for p, x in zip(paths, names)}


def runs_with_failed_checks(paths, metas: dict | None = None) -> list[str]:
    """The runs (as given) whose meta.json says check_failed, for the run or any variant.
    metas: meta.json by path as given, already read; read here when None."""
    out = []
    for p in paths:
        meta = metas[str(p)] if metas is not None else meta_of(p)
        variants = meta.get("variants") if isinstance(meta.get("variants"), dict) else {}
        states = [meta.get("status")] + [v.get("status") for v in variants.values() if isinstance(v, dict)]
        if "check_failed" in states:
            out.append(str(p))
    return out


def split_sides(runs, base=None, new=None, argv=()) -> tuple[list[str], list[str]]:
    """The base and new runs of a `commbench compare` command line.

    Three forms: `BASE NEW`; `A1 A2 ... -- B1 B2 ...`; `--base A1 A2 ... --new B1 B2 ...`.
    argparse drops the `--` from the positionals (and, by Python version, one or all of
    them), so the new side is read from argv: every word after the first `--` (argv is
    the command line argparse parsed, runs its positionals)."""
    forms = "give BASE NEW, A1 A2 ... -- B1 B2 ..., or --base A1 A2 ... --new B1 B2 ..."
    runs = list(runs or [])
    if base or new:
        if runs:
            raise UsageError(f"runs given both as positionals and with --base/--new: {forms}")
        if not (base and new):
            raise UsageError(f"{'--new' if base else '--base'} is missing: {forms}")
        return list(base), list(new)
    argv = list(argv)
    if "--" in argv:
        after = argv[argv.index("--") + 1:]
        for a in after:
            if a.startswith("-"):
                raise UsageError(f"{a} after --: every word after -- is a run of the new side; put options before --")
        before = runs[:len(runs) - len(after)] if len(after) <= len(runs) else []
        if before and before[-1] == "--":
            before.pop()  # a Python whose argparse keeps the `--` among the positionals
        if not after:
            raise UsageError(f"no run after --: {forms}")
        if not before:
            raise UsageError(f"no run before --: {forms}")
        return before, after
    if len(runs) != 2:
        raise UsageError(f"{len(runs)} run(s) without --: {forms}")
    return [runs[0]], [runs[1]]


def compare_command(args, argv, view) -> int:
    """The command: its sides from the command line (split_sides), the comparison, the
    exit status; a CSV that cannot be written is exit 2, never 1 (a gate reads 1 as
    "slower")."""
    base, new = split_sides(args.runs, args.base, args.new, argv)
    if args.csv is not None and os.path.isdir(args.csv):
        raise UsageError(f"--csv {args.csv}: is a directory (give a file name)")
    try:
        return compare_paths(base, new, args.threshold, args.fail_on_regression, all_points=args.all,
                             csv_out=args.csv, wide=view.wide, allow_inconclusive=args.allow_inconclusive)
    except OSError as e:
        if args.csv is not None and e.filename in (None, args.csv):
            raise UsageError(f"--csv {args.csv}: cannot write: {e.strerror or e}") from e
        raise
