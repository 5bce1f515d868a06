"""`commbench report --out DIR`: report.md (tables + relative PNG links) and a
self-contained report.html (the same tables as HTML, the PNGs embedded as base64 data
URIs) from the rows and meta.json of one or more runs, measured or imported (read once by
commands/report.py).
"""
from __future__ import annotations

import base64
import html
import re
import time
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import write_atomic
from commbench.report import plots, shootout_view
from commbench.report.document import Section
from commbench.report.sections import (
    benchmark_sections,
    check_findings,
    fit_section,
    run_header,
    run_line,
    scaling_section,
    summary_section,
    variant_sections,
)
from commbench.report.terminal import skipped_variants
from commbench.report.warnings_view import warnings_section

# ---------------------------------------------------------------------------------------
# rendering

# What makes Markdown out of plain text: code, emphasis, links and images, strikethrough, a
# table's column, an escape; "_" only where it can open or close emphasis (not in all_reduce).
_MD_SPECIAL = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def _md_text(s) -> str:
    """Text from data (a run's or a benchmark's name, an imported header, a command line) as
    Markdown shows it: <, > and & as entities (a Markdown renderer passes raw HTML through,
    as report.html does not), the characters that make Markdown backslash-escaped, and one
    line (a newline would end a table row or a list item)."""
    text = html.escape(str(s), quote=False).replace("\r", " ").replace("\n", " ")
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def _md_cell(s) -> str:
    return _md_text(s)


def _md_table(headers, rows) -> str:
    if not headers:
        return ""
    out = ["| " + " | ".join(map(_md_cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _html_table(headers, rows, cls: str = "") -> str:
    if not headers:
        return ""
    num = [all(_numeric(r[i]) for r in rows if i < len(r) and r[i] not in ("", "-")) for i in range(len(headers))]
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if num[i] else ''}>{html.escape(str(c))}</td>"
                                    for i, c in enumerate(r)) + "</tr>\n" for r in rows)
    # A table wider than the page scrolls on its own; the page (and its summary) does not.
    return (f"<div class=scroll><table{' class=' + cls if cls else ''}>\n<thead><tr>{h}</tr></thead>\n<tbody>\n{body}"
            f"</tbody>\n</table></div>\n")


def _numeric(s) -> bool:
    t = str(s).rstrip("%KMGx")
    try:
        float(t)
        return True
    except ValueError:
        return False


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.86em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.note{color:#555;font-size:.9em}div.scroll{overflow-x:auto}ul.runs{font-size:.9em;color:#333;padding-left:1.2em}
details{margin:.4em 0 1em}details>summary{cursor:pointer;color:#245;font-size:.9em}
table.summary{font-size:.92em}table.summary td:first-child{font-weight:600;white-space:nowrap}
table.summary td:nth-child(2){white-space:nowrap}
dl.run{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;
font-size:.9em}dl.run dt{font-weight:600}dl.run dd{margin:0;word-break:break-word}
"""


def _md_fold(s: Section) -> list[str]:
    if not s.headers:
        return []
    table = _md_table(s.headers, s.rows)
    if not s.fold:
        return [table]
    # GitHub-flavoured markdown renders a table inside <details> when blank lines surround it.
    return [f"<details><summary>{html.escape(s.title)}: {len(s.rows)} rows</summary>", "", table, "</details>", ""]


def _render_md(title, lines, runs, sections, fig_rel) -> str:
    t = _md_text  # every text below may come from data; the markup around it is this function's
    out = [f"# {t(title)}", ""]
    out.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by commbench.")
    out.append("")
    out += [f"- {t(x)}" for x in lines]
    for s in sections:
        out += ["", "#" * s.level + f" {t(s.title)}", ""]
        if s.note:
            out += [f"_{t(s.note)}_", ""]
        if s.bullets:
            out += [f"- {t(b)}" for b in s.bullets] + [""]
        for f in s.figures:
            out += [f"![{t(f.title)}]({fig_rel[f.name]})", ""] + ([f"_{t(f.caption)}_", ""] if f.caption else [])
        out += _md_fold(s)
    out += ["", "## Runs"]
    for name, pairs in runs:
        out += ["", f"### {t(name)}", ""]
        out += [f"- **{t(k)}**: {t(v)}" for k, v in pairs]
    return "\n".join(out).rstrip() + "\n"


def _render_html(title, lines, runs, sections) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>",
           f"<title>{e(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           f"<p class=note>Generated {e(time.strftime('%Y-%m-%d %H:%M:%S'))} by commbench.</p>"]
    out.append("<ul class=runs>" + "".join(f"<li>{e(x)}</li>" for x in lines) + "</ul>")
    for s in sections:
        out.append(f"<h{s.level}>{e(s.title)}</h{s.level}>")
        if s.note:
            out.append(f"<p class=note>{e(s.note)}</p>")
        if s.bullets:
            out.append("<ul>" + "".join(f"<li>{e(b)}</li>" for b in s.bullets) + "</ul>")
        for f in s.figures:
            data = base64.b64encode(Path(f.path).read_bytes()).decode("ascii")
            out.append(f"<figure><img alt=\"{e(f.title)}\" src=\"data:image/png;base64,{data}\">"
                       f"<figcaption>{e(f.caption)}</figcaption></figure>")
        if s.headers:
            table = _html_table(s.headers, s.rows, "summary" if not s.fold else "")
            out.append(table if not s.fold else
                       f"<details><summary>{e(s.title)}: {len(s.rows)} rows</summary>\n{table}</details>")
    out.append("<h2>Runs</h2>")
    for name, pairs in runs:
        out.append(f"<details><summary>{e(name)}</summary><h3>{e(name)}</h3><dl class=run>")
        out += [f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in pairs]
        out.append("</dl></details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _floors(metas: dict, profile) -> dict:
    """run -> the latency floor (us) its rows are judged against: the profile given, else
    the one the run recorded (a measured loopback floor included)."""
    if profile is not None:
        return {run: getattr(profile, "scaleup_latency_us", None) for run in metas}
    return {run: (((m or {}).get("ceilings") or {}).get("fields") or {}).get("scaleup_latency_us")
            for run, m in metas.items()}


def render_report(df, metas: dict, out_dir, profile=None, title: str = "commbench report") -> dict:
    """Draw the figures (when matplotlib is installed), write out_dir/report.md,
    out_dir/report.html and out_dir/figures/*.png from rows already read (df: a run column
    names each run) and each run's meta.json (metas: run name -> meta).

    The report opens with the answer: one line per run, then a summary (each benchmark's
    findings with one line of judgement: peak busbw against the ceiling, small-message
    latency, each benchmark's own findings, scaling efficiency, variant verdicts); then each
    section's figures with its raw table folded; the run details last.

    profile: the ceilings.Profile every row was judged against (its latency floor judges
    the latencies; the report says so); None: each row's own ceiling fields.

    Returns {"markdown": Path, "html": Path, "figures": {name: Path}, "series": {name:
    [legend labels]}, "notes": [str], "drawn": {name: document.FigureInfo (with .figure,
    the matplotlib Figure)}, "findings": [document.Finding]}.
    """
    notes = []
    out = Path(out_dir)
    fig_dir = out / "figures"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"report --out {out}: {e.strerror or e}") from None

    figures = {}
    if plots.have_matplotlib():
        figures = plots.make_figures(df, fig_dir, profile)
    else:
        notes.append("matplotlib is not installed: no figures (pip install 'commbench[plot]')")
    # The dispatcher shoot-out answers its run's question: ahead of the tables it rests on.
    sections = shootout_view.sections(df, metas, fig_dir if plots.have_matplotlib() else None)
    figures.update({f.name: f for s in sections for f in s.figures})
    sections += benchmark_sections(df, figures, _floors(metas, profile))
    for s in (scaling_section(df, figures), fit_section(df)):
        if s is not None:
            sections.append(s)
    # In-switch speedup has no table of its own: its figure goes with the sections.
    if "inswitch_speedup" in figures:
        sections.append(Section("In-switch vs ring", "", figures=[figures["inswitch_speedup"]]))
    sections += variant_sections(df, skipped_variants(metas.values()))
    warned = warnings_section(df)
    if warned is not None:  # each flagged row with its warning in full: the terminal tallies them
        sections.append(warned)
    if notes:
        sections.insert(0, Section("Notes", "; ".join(notes)))
    summary = summary_section(sections, check_findings(df))
    sections.insert(0, summary)
    lines = [run_line(name, meta or {}) for name, meta in metas.items()]
    runs = [(name, run_header(name, meta or {})) for name, meta in metas.items()]
    if profile is not None:
        lines.append(f"every row judged against profile {profile.name}")
        runs.append(("ceilings", [("profile", f"{profile.name}: every row judged against it")]))
    fig_rel = {n: f"figures/{Path(f.path).name}" for n, f in figures.items()}
    md = out / "report.md"
    write_atomic(md, _render_md(title, lines, runs, sections, fig_rel))
    hp = out / "report.html"
    write_atomic(hp, _render_html(title, lines, runs, sections))
    return {"markdown": md, "html": hp, "figures": {n: Path(f.path) for n, f in figures.items()},
            "series": {n: list(f.series) for n, f in figures.items()}, "notes": notes, "drawn": figures,
            "findings": [f for t in dict.fromkeys(f.topic for f in summary.findings)
                         for f in summary.findings if f.topic == t]}
