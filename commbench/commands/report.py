"""`commbench report`: read each run's rows and meta.json once, judge the rows against the
profile asked for (when one is), print the tables, and with --out write report.md,
report.html and the figures from the same rows. write_report is the same flow for a
program (docs/results.md)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from commbench.analyse.ceilings import load_profile, resolve_profile_spec
from commbench.analyse.rejudge import rejudge_rows
from commbench.core.errors import UsageError
from commbench.report.html import render_report
from commbench.report.terminal import print_report
from commbench.report.viewsettings import View
from commbench.store.disk import check_out_dir
from commbench.store.load import load, names_for
from commbench.store.results import load_meta


@dataclass(frozen=True)
class Runs:
    """The runs a report shows, each read once: the paths as given, the name load() gives
    each one's rows, each one's meta.json ({} where it has none), and their rows."""

    paths: list
    names: list
    metas: list
    rows: object  # a pandas DataFrame; a `run` column names each row's run

    def metas_by_name(self) -> dict:
        return dict(zip(self.names, self.metas))


def load_runs(paths) -> Runs:
    """Each run's rows and meta.json, read once (a path is a run directory or its rows.jsonl)."""
    paths = [Path(p) for p in paths]
    metas = [load_meta(p if p.is_dir() else p.parent) for p in paths]
    return Runs(paths, names_for(paths), metas, load(paths))


def judged(runs: Runs, profile):
    """The rows, judged against `profile` when one is given (each run's node map)."""
    if profile is None or runs.rows.empty:
        return runs.rows
    return rejudge_rows(runs.rows, {n: (m or {}).get("nodes") for n, m in zip(runs.names, runs.metas)}, profile)


def _no_rows(runs: Runs) -> UsageError:
    return UsageError(f"{', '.join(map(str, runs.paths))}: no rows to report")


def report_runs(paths, profile=None, view: View = View()) -> tuple[Runs, object]:
    """Print the runs' terminal report; returns what was read and the rows as judged."""
    runs = load_runs(paths)
    df = judged(runs, profile)
    print_report(df, list(zip(runs.paths, runs.metas)), view)
    return runs, df


def report_command(runs_given: list, profile_names: list, overrides: dict, out: str | None, view: View) -> int:
    """The command: tables in the terminal, and with `out` the files; the exit status."""
    if len(profile_names) > 1:
        raise UsageError("report takes one --profile")
    profile = resolve_profile_spec(profile_names[0] if profile_names else None, overrides)
    runs, df = report_runs(runs_given, profile, view)
    if out:
        check_out_dir(out, "report --out")
        if df.empty:
            raise _no_rows(runs)
        try:
            res = render_report(df, runs.metas_by_name(), out, profile)
        except OSError as e:  # a full disk: the tables above are out; the files are not
            where = f"{e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e}"
            raise UsageError(f"report --out {out}: cannot write the report: {where}") from e
        print(f"report: {res['markdown']} and {res['html']} ({len(res['figures'])} figures)")
        for note in res["notes"]:
            print(f"note: {note}")
    return 0


def write_report(paths, out_dir, profile=None, title: str = "commbench report") -> dict:
    """Read the runs once and write out_dir/report.md, out_dir/report.html and
    out_dir/figures/*.png (html.render_report says what they hold and what is returned).
    profile: a ceilings.Profile, a profile name or a .toml path to judge every row against;
    None keeps each row's own ceiling fields."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise UsageError("report needs at least one result directory")
    runs = load_runs(paths)
    if runs.rows.empty:
        raise _no_rows(runs)
    if profile is not None and not hasattr(profile, "scaleup_line_gbps"):
        profile = load_profile(profile)
    return render_report(judged(runs, profile), runs.metas_by_name(), out_dir, profile, title)
