"""Rows that carry a warning, ran disturbed or oversubscribed, told in one tally line at the
end of a run and of `report`, one line a row with `--verbose`, and a table in report.md.

A run on a shared host can warn on every row: 200 lines of `warning:` bury the tables above
them, so the terminal says how many rows and why, by kind, and where the rows are listed.
"""
from __future__ import annotations

import re
import sys

from commbench.core.schema import has, params_dict
from commbench.core.units import fmt_size
from commbench.report.document import Section
from commbench.report.fmt import text

# A warning clause -> its kind: (short name for a table cell, the name in the tally). The
# texts are the harness's and the benchmarks' own; a clause none of these match is named by
# its words before the first ":" without their numbers.
_KINDS = (
    (re.compile(r"^(?:disturbed: )?a rank waited for a CPU"), "disturbed", "disturbed (a rank waited for a CPU)"),
    (re.compile(r"^(?:disturbed: )?CPU steal"), "disturbed", "disturbed (CPU steal)"),
    (re.compile(r"^calibration missed"), "calibration missed", "with a missed calibration (OSU and IMB % not comparable)"),
    (re.compile(r"ran faster beside"), "compute faster beside", "with the compute faster beside the all_reduce than alone"),
    (re.compile(r"^t_overall .*< t_compute"), "overall < compute", "with t_overall below its own compute"),
    (re.compile(r"outlasted the all_reduce alone"), "wait > comm", "whose wait outlasted the all_reduce alone"),
    (re.compile(r"not covered by the stream hold"), "hold ran out", "whose stream hold ran out (host time may count)"),
)
_NUMBER = re.compile(r"\(.*?\)|[-+]?\d[\d.,]*\s*(?:us|ms|s|x|%|GB/s)?(?=\W|$)")


def _truthy(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    return has(v) and bool(v)


def row_kinds(row: dict) -> list[tuple[str, str]]:
    """[(short, tally name)] of what a row carries, in order, each kind once: oversubscribed,
    disturbed (and why), then the kinds of its warning's clauses."""
    out = []
    if _truthy(row.get("oversubscribed")):
        out.append(("oversubscribed", "oversubscribed"))
    for clause in (c.strip() for c in text(row.get("warning")).split("; ")):
        if not clause:
            continue
        kind = next(((s, n) for rx, s, n in _KINDS if rx.search(clause)), None)
        if kind is None:
            head = clause.split(":")[0]
            words = _NUMBER.sub("", head).split()
            name = " ".join(words) if len(words) >= 2 else head
            kind = (name, f"with {name}")
        out.append(kind)
    if _truthy(row.get("disturbed")) and not any(s == "disturbed" for s, _ in out):
        out.append(("disturbed", "disturbed"))
    return list(dict.fromkeys(out))


def describe_row(row: dict) -> str:
    """A row in a warning line: with its params, so rows of one size (overlap's modes, MoE's
    routings) are told apart."""
    extra = "".join(f" {k}={v}" for k, v in params_dict(row.get("params")).items())
    stage = f" {row['stage']}" if text(row.get("stage")) else ""
    return (f"{row['benchmark']}{stage} {fmt_size(int(row.get('nbytes') or 0))} {row.get('dtype')} "
            f"world {row.get('world')}{extra}")


def flagged_rows(rows) -> list[dict]:
    """The rows that carry anything row_kinds names."""
    return [r for r in _records(rows) if row_kinds(r)]


def warning_cell(row: dict) -> str:
    """A table cell: the short names of what the row carries ("disturbed; wait > comm")."""
    return "; ".join(dict.fromkeys(s for s, _ in row_kinds(row)))


def warnings_tally(rows) -> str | None:
    """One line for every flagged row: 'warning: 96 of 120 rows carry warnings: 80 disturbed
    (a rank waited for a CPU), 16 oversubscribed; `--verbose` or the report lists them'.
    None when no row is flagged."""
    rows = _records(rows)
    counts: dict[str, int] = {}
    flagged = 0
    for r in rows:
        kinds = row_kinds(r)
        flagged += bool(kinds)
        for _, name in kinds:
            counts[name] = counts.get(name, 0) + 1
    if not flagged:
        return None
    by = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    several = " (a row may carry several)" if sum(counts.values()) > flagged else ""
    return (f"warning: {flagged} of {len(rows)} rows carry warnings: {by}{several}; `--verbose` or the report "
            f"lists them")


def warning_lines(rows) -> list[str]:
    """One line a flagged row, as `--verbose` prints them: the row, then what it carries."""
    out = []
    for r in flagged_rows(rows):
        warning = text(r.get("warning"))
        # What the row's fields say and its warning text does not (an oversubscribed run
        # said so once, at its start).
        extra = [n for s, n in row_kinds(r) if s in ("oversubscribed", "disturbed") and s not in warning]
        out.append(f"warning: {describe_row(r)}: {'; '.join(extra + ([warning] if warning else []))}")
    return out


def warnings_section(df) -> Section | None:
    """report.md / report.html: every flagged row with its warning in full (folded)."""
    rows = flagged_rows(df)
    if not rows:
        return None
    multi_run = len({text(r.get("run")) for r in rows}) > 1
    heads = (["run"] if multi_run else []) + ["row", "kinds", "warning"]
    body = [([text(r.get("run"))] if multi_run else []) + [describe_row(r), warning_cell(r), text(r.get("warning"))]
            for r in rows]
    return Section("Warnings", warnings_tally(df).removeprefix("warning: ").split("; `--verbose`")[0]
                   + ": these rows are not evidence for a verdict", heads, body)


def say_warnings(rows, file=None, verbose: bool = False) -> None:
    """The rows' warnings at the end of a run or a report: verbose (`--verbose`, run and
    report) one line a flagged row; then one tally line."""
    file = file or sys.stderr
    lines = warning_lines(rows) if verbose else []
    tally = warnings_tally(rows)
    for line in lines + ([tally] if tally else []):
        print(line, file=file, flush=True)


def _records(rows) -> list[dict]:
    if hasattr(rows, "to_dict"):
        return rows.to_dict("records")
    return list(rows)
