"""The report's document model: sections (a heading, a note, a table, figures, the findings
they add to the summary), a finding, and a figure's record. html.py renders a list of
sections as report.md and report.html; the views build them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Finding:
    """One line of a report's summary: what was measured, where, the figure, and one line
    of judgement."""
    topic: str  # a benchmark, or an aspect across them ("scaling", "variants", "checks")
    measure: str  # "peak busbw (n=8)", "dispatch (n=16)", ...
    value: str
    verdict: str = ""


@dataclass
class FigureInfo:
    """A figure written to disk: its name, file, title, caption and legend labels."""
    name: str
    path: Path
    title: str
    caption: str = ""
    series: list = field(default_factory=list)
    benchmark: str = ""  # whose figure it is ("" for one across benchmarks): its report section
    figure: object = None  # the matplotlib Figure drawn (plots.make_figures fills it in)


class Section:
    """One part of report.md / report.html: a heading, a note, a table, its figures, and
    the findings it adds to the summary at the top. fold: the table goes in a <details>
    block (raw rows come after the answer, a click away); bullets: lines under the note."""

    def __init__(self, title: str, note: str = "", headers=None, rows=None, figures=(), level: int = 2,
                 findings=(), fold: bool = True, bullets=()):
        self.title, self.note, self.headers, self.rows = title, note, headers or [], rows or []
        self.figures, self.level, self.findings, self.fold = list(figures), level, list(findings), fold
        self.bullets = list(bullets)  # lines under the note (verdicts, skipped variants)
