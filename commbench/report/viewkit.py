"""What tables, report sections and figures are built with: the generic report, the html
report and the plots, and every benchmark's own presentation hooks (Benchmark.tables,
.report_sections, .figures). Nothing here knows a benchmark: it never imports the
registry, so a benchmark's view module can import it without a cycle.

rich and matplotlib are imported inside the functions that draw, as everywhere else.
"""
from __future__ import annotations

import io
import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from commbench.core.safe_write import file_name, write_atomic
from commbench.core.schema import has, params_dict  # noqa: F401 (has: the views read it from here too)
from commbench.core.units import fmt_size
from commbench.report.tables import (  # noqa: F401 (the table engine: the views import it from here)
    ALWAYS,
    COMPACT,
    FAST_ROWS,
    WIDE,
    LongTable,
    add_column,
    print_table,
    table,
)

DPI = 110


# ---------------------------------------------------------------------------------------
# cells

def text(v) -> str:
    """A cell's text: "" for a missing value (None, NaN)."""
    if type(v) is str:  # most cells: no conversion (a report may hold millions of them)
        return v
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def fmt(v, digits: int = 2) -> str:
    """A number with `digits` decimals; "-" for a missing or non-finite one."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    return f"{x:.{digits}f}" if math.isfinite(x) else "-"


def size_cells(values) -> list[str]:
    """A column of sizes (bytes) in one format: binary suffixes ("8", "1K", "4M") when every
    size of 1K or more is a whole number of its unit, else every size in plain bytes (never
    "7154K" beside "15708000")."""
    vals = [int(v) for v in values]
    if all(v < 1024 or v % 1024 == 0 for v in vals):
        return [fmt_size(v) for v in vals]
    return [str(v) for v in vals]


def num(v, sig: int = 4, most: int = 3) -> str:
    """One number format for a column whose values span decades: fixed point, `sig`
    significant digits but never more than `most` decimals, never an exponent ("11440",
    "2994", "29.94", "0.124"); "-" for a missing or non-finite value."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{min(most, max(0, sig - 1 - math.floor(math.log10(abs(x)))))}f}"


def records(df) -> list[dict]:
    """df.to_dict("records"), column by column: each column's values come out as Python's
    own (Series.tolist), not boxed one value at a time (seconds for 300k rows)."""
    names = list(df.columns)
    cols = [df[c].tolist() for c in names]
    return [dict(zip(names, vals)) for vals in zip(*cols)]


@dataclass
class Finding:
    """One line of a report's summary: what was measured, where, the figure, and one line
    of judgement."""
    topic: str  # a benchmark, or an aspect across them ("scaling", "variants", "checks")
    measure: str  # "peak busbw (n=8)", "dispatch (n=16)", ...
    value: str
    verdict: str = ""


class Section:
    """One part of report.md / report.html: a heading, a note, a table, its figures, and
    the findings it adds to the summary at the top. fold: the table goes in a <details>
    block (raw rows come after the answer, a click away); bullets: lines under the note."""

    def __init__(self, title: str, note: str = "", headers=None, rows=None, figures=(), level: int = 2,
                 findings=(), fold: bool = True, bullets=()):
        self.title, self.note, self.headers, self.rows = title, note, headers or [], rows or []
        self.figures, self.level, self.findings, self.fold = list(figures), level, list(findings), fold
        self.bullets = list(bullets)  # lines under the note (verdicts, skipped variants)


# ---------------------------------------------------------------------------------------
# judgements: one line a summary finding ends with

def judge_ceiling(pct, doubt=None) -> str:
    """A rate as a share of its link's line rate, in words; doubt: why the ceiling carries no
    verdict (a loopback probe that was disturbed or spread too far)."""
    if has(doubt):
        return f"cannot judge against the line rate: {doubt}"
    if not has(pct) or fmt(pct) == "-":
        return "no ceiling to judge against (report --profile NAME sets one)"
    p = float(pct)
    if p >= 80:
        return "at the link's rate: the link is the limit"
    if p >= 50:
        return "good: within 2x of the link's rate"
    if p >= 20:
        return "well below the link's rate"
    return "far below the link's rate: per-operation overhead decides"


def judge_efficiency(pct: float) -> str:
    """A weak-scaling efficiency, in words."""
    if pct >= 90:
        return "scales: per-rank throughput holds"
    if pct >= 70:
        return "some loss per rank as ranks are added"
    return "per-rank throughput drops as ranks are added"


def judge_latency(p50: float, floor) -> str:
    """Small-message latency against the profile's latency floor (one message between two
    ranks), in words."""
    if not has(floor) or not float(floor) > 0:
        return "no latency floor in the profile to judge against"
    x = p50 / float(floor)
    if x < 0.8:
        # The floor is one library's two-rank exchange (loopback: MPI's); another backend's
        # path can beat it.
        return f"{x:.1f}x the latency floor: below it, the floor was measured on another path"
    if x <= 2:
        return f"{x:.1f}x the latency floor: what the link allows"
    if x <= 5:
        return f"{x:.1f}x the latency floor: a few steps, or overhead per call"
    return f"{x:.0f}x the latency floor: per-call overhead dominates"


def varying_params(values) -> list[str]:
    """The parameter names that take two or more values across a column of params (dicts
    or canonical JSON); a name some rows lack but that is constant where present does not
    count."""
    dicts = [params_dict(v) for v in values]
    names = sorted({k for p in dicts for k in p})
    return [k for k in names if len({json.dumps(p[k], sort_keys=True) for p in dicts if k in p}) > 1]


def params_order(params, declared=()) -> tuple:
    """A sort key of a point's params (a dict or canonical JSON): the values of the
    `declared` names first, in that order (a benchmark's Benchmark.params: routing before
    its skew), then the rest by name; numbers by value (alpha 0.5 before 1.0 before 10),
    text by name."""
    p = params_dict(params)
    keys = [k for k in declared if k in p] + sorted(k for k in p if k not in declared)
    return tuple((0, float(p[k]), "") if isinstance(p[k], (int, float)) and not isinstance(p[k], bool)
                 else (1, 0.0, str(p[k])) for k in keys)


# ---------------------------------------------------------------------------------------
# figures: drawn on matplotlib.figure.Figure with the Agg canvas, never through pyplot, so
# nothing global (the user's backend, open figures) is touched.

@dataclass
class FigureInfo:
    name: str
    path: Path
    title: str
    caption: str = ""
    series: list = field(default_factory=list)
    benchmark: str = ""  # whose figure it is ("" for one across benchmarks): its report section
    figure: object = None  # the matplotlib Figure drawn (plots.make_figures fills it in)


def new_figure(nrows=1, ncols=1, w=8.0, h=4.8, sharex=False):
    """(figure, axes[row][col])."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    return fig, axes


# While `capturing()` is active, save_figure keeps each Figure it writes (path -> Figure),
# so the caller can hand the matplotlib objects on (plots.make_figures puts them in
# FigureInfo.figure) whatever hook drew them.
_captured: list[dict] = []


class capturing:
    """with capturing() as drawn: ... -> drawn: {path: Figure} of every figure saved inside."""

    def __enter__(self) -> dict:
        _captured.append({})
        return _captured[-1]

    def __exit__(self, *exc) -> None:
        _captured.pop()


def save_figure(fig, out_dir: Path, name: str) -> Path:
    """Write out_dir/<name>.png: name made a plain file name (a benchmark "x/../y" stays in
    out_dir), every text drawn as written, the file replaced, never written through a link."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    draw_literally(fig)
    _room_for_legends(fig)
    path = Path(out_dir) / f"{file_name(name)}.png"
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    write_atomic(path, png.getvalue())
    if _captured:
        _captured[-1][path] = fig
    return path


def draw_literally(fig) -> None:
    """Texts of fig that matplotlib would read as mathtext (a "$" pair in a run, benchmark
    or dtype name) drawn as written, not parsed ("$\\foo$" is a parse error). Tick labels a
    formatter writes at draw time (a log axis's 10^n) are not there yet: they keep theirs."""
    from matplotlib.cbook import is_math_text
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        if t.get_parse_math() and is_math_text(t.get_text()):
            t.set_parse_math(False)


def size_ticks(ax, sizes, most: int = 12) -> None:
    """Tick every plotted size (a 25M bucket is no power of two: a log2 locator skips it)
    when there are at most `most` of them; otherwise size_axis's powers of two."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    vals = sorted({float(v) for v in sizes if float(v) > 0})
    if not vals or len(vals) > most:
        return
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_size(round(x)) if x >= 1 else ""))
    ax.xaxis.set_minor_locator(NullLocator())


LEGEND_CHARS = 56  # the widest line of a legend entry beside the axes


def legend_beside(ax, fontsize: int = 8, extra=(), handles=None, labels=None, whole_figure: bool = False,
                  **kw) -> None:
    """The legend right of the plotting area, so it never hides a line: the constrained
    layout narrows the axes to make room, and save_figure widens the figure by the legend's
    width, so the axes keep theirs and the legend lies inside the PNG. extra: (handle, label)
    pairs shown only in the legend (what a hollow marker means); handles/labels: the
    entries, when not the axes' own; whole_figure: right of every axes and of what is
    written beyond them (a bar's annotation), as the figure's legend."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    handles, labels = list(handles) + [h for h, _ in extra], list(labels) + [lab for _, lab in extra]
    # A long label (a ceiling and how it was probed) wraps: the figure widens by the legend.
    labels = [textwrap.fill(str(lab), LEGEND_CHARS) for lab in labels]
    if handles and whole_figure:
        ax.figure.legend(handles, labels, fontsize=fontsize, loc="outside right upper", **kw).beside = True
    elif handles:
        leg = ax.legend(handles, labels, fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        borderaxespad=0, **kw)
        leg.beside = True


def _room_for_legends(fig) -> None:
    """Widen fig by the legends beside its axes (the widest of each column of axes), and
    make it tall enough for the tallest: measured as drawn, so a long label never runs off
    the PNG."""
    legs = [(ax, ax.get_legend()) for ax in fig.axes if getattr(ax.get_legend(), "beside", False)]
    legs += [(None, leg) for leg in fig.legends if getattr(leg, "beside", False)]
    if not legs:
        return
    renderer = fig.canvas.get_renderer()
    by_col: dict = {}
    tallest = 0.0
    for ax, leg in legs:
        box = leg.get_window_extent(renderer)
        spec = ax.get_subplotspec() if ax is not None else None
        col = spec.colspan.start if spec is not None else -1
        by_col[col] = max(by_col.get(col, 0.0), box.width / fig.dpi + 0.15)
        tallest = max(tallest, box.height / fig.dpi)
    w, h = fig.get_size_inches()
    fig.set_size_inches(w + sum(by_col.values()), max(h, tallest + 1.2))


def size_axis(ax, label="message size S (bytes, log2)"):
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=14))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_size(round(x)) if x >= 1 else ""))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label)


def int_log2_axis(ax, values, label):
    ax.set_xscale("log", base=2)
    vals = sorted({int(v) for v in values})
    ax.set_xticks(vals)
    ax.set_xticklabels([str(v) for v in vals])
    ax.minorticks_off()
    ax.set_xlabel(label)


def labeler(d, keys):
    """A label function naming only the keys that vary across d (run always when several);
    of the params (the params_key column), only those that vary and are not label columns
    themselves."""
    vary = {k: d[k].astype(str).nunique() > 1 for k in keys if k in d.columns}
    pkeys = [k for k in varying_params(d["params_key"]) if k not in keys] if "params_key" in d.columns else []

    def label(r: dict, always=()) -> str:
        parts = []
        if vary.get("run") or "run" in always:
            parts.append(str(r["run"]))
        if "world" in r:
            parts.append(f"n={int(r['world'])}")
        for k in keys:
            if k in ("run", "world") or not (vary.get(k) or k in always):
                continue
            v = r.get(k)
            if k == "params_key":
                p = json.loads(v)
                v = " ".join(f"{a}={p[a]}" for a in pkeys if a in p)
            if k == "variant" and v == "default" and not vary.get(k):
                continue
            if v:
                parts.append(str(v))
        return " ".join(parts)
    return label


def _has(v) -> bool:  # a number that is not None or NaN
    return v is not None and v == v


def fixed(v, digits: int) -> str:
    """A number with `digits` decimals, or '-' where there is none."""
    return f"{v:.{digits}f}" if _has(v) else "-"
