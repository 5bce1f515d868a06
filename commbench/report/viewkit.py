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


class _Column:
    def __init__(self, header: str, justify: str):
        self.header, self.justify, self._cells = header, justify, []


class LongTable:
    """A table of more than FAST_ROWS rows: the part of rich's Table that the report uses
    (add_column, add_row, columns, title, caption), its cells kept as text and laid out by
    print_table without rich (rich measures and renders every cell several times:
    milliseconds a row, hours for a run of 300k imported rows)."""

    def __init__(self, title: str, caption: str, plain: bool):
        self.title, self.caption, self.ascii = title, caption, plain
        self.columns: list[_Column] = []
        self.levels: dict = {}
        self.row_count = 0

    def add_column(self, header: str, justify: str = "left", no_wrap: bool = True) -> None:
        self.columns.append(_Column(header, justify))

    def add_row(self, *cells) -> None:
        for c, x in zip(self.columns, cells):
            c._cells.append(x)
        self.row_count += 1


def records(df) -> list[dict]:
    """df.to_dict("records"), column by column: each column's values come out as Python's
    own (Series.tolist), not boxed one value at a time (seconds for 300k rows)."""
    names = list(df.columns)
    cols = [df[c].tolist() for c in names]
    return [dict(zip(names, vals)) for vals in zip(*cols)]


def table(title: str, caption: str, plain: bool, nrows: int = 0):
    """A rich Table in the report's style; plain: ASCII borders (a file or a pipe). Title
    and caption are plain text: rich would take "[mpi/cpu]" for markup and drop it.
    Columns added with add_column carry a level that print_table reads. nrows: the rows it
    will hold; above FAST_ROWS, a LongTable."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if nrows > FAST_ROWS:
        return LongTable(title, caption, plain)
    t = Table(title=escape(title), caption=escape(caption) if caption else None,
              box=box.ASCII if plain else box.SIMPLE_HEAD)
    t.levels = {}
    return t


# Column levels of a terminal table: ALWAYS columns are the point's identity and its headline
# figures; COMPACT ones are shown by default while the table fits the console; WIDE ones
# only with --wide (their values are in the caption, constant, or secondary).
ALWAYS, COMPACT, WIDE = 0, 1, 2


def add_column(t, header: str, left: bool = False, level: int = ALWAYS, wrap: bool = False,
               in_caption: bool = False) -> None:
    """A column of t. Only text made of words (a shape, a list of stages) may wrap: a
    number or a header is never wrapped, and print_table never lets rich cut one.
    in_caption: the caption already gives its one value (a dtype that never changes), so
    leaving it out goes unsaid."""
    t.add_column(header, justify="left" if left else "right", no_wrap=not wrap)
    if not hasattr(t, "levels"):
        t.levels = {}
    t.levels[header] = level
    if in_caption:
        t.said = getattr(t, "said", set()) | {header}


def _drop_column(t, header: str) -> None:
    t.columns[:] = [c for c in t.columns if c.header != header]
    if not isinstance(t, LongTable):
        for i, c in enumerate(t.columns):
            c._index = i


def _cuts(t, width: int) -> bool:
    """Would rich cut a cell of t (an ellipsis) on a console `width` wide? Rendered, not
    estimated: rich's own layout decides which columns it squeezes."""
    import io

    from rich.console import Console

    c = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, legacy_windows=False)
    c.print(t)
    return "\u2026" in c.file.getvalue()


def print_table(console, t, wide: bool = False) -> list[str]:
    """Print t on console without cutting a number or a header. wide: every column. Else
    the WIDE columns are left out, then COMPACT ones from the last while rich would still
    cut a cell at the console's width; the caption names what was left out. A table that
    still does not fit is printed at its natural width (the terminal folds the long lines:
    nothing is lost). Returns the headers left out."""
    from rich.measure import Measurement
    from rich.segment import Segments

    if isinstance(t, LongTable):
        return _print_long_table(console, t, wide)
    levels = getattr(t, "levels", {})
    hidden = []
    if not wide:
        for h, lv in levels.items():
            if lv >= WIDE:
                _drop_column(t, h)
                hidden.append(h)
        for h in reversed([h for h, lv in levels.items() if lv == COMPACT]):
            if not _cuts(t, console.width):
                break
            _drop_column(t, h)
            hidden.append(h)
    _say_hidden(t, hidden)
    natural = Measurement.get(console, console.options.update_width(100_000), t).maximum
    fits = not _cuts(t, console.width)
    width = min(natural, console.width) if fits else natural
    # rich wraps a title or caption to the table's width: over a narrow table, a few words a
    # line. One longer than the table goes above / below it at the console's width.
    title = caption = None
    if t.title and len(str(t.title)) > width:
        title, t.title = t.title, None
    if t.caption and len(str(t.caption)) > width:
        caption, t.caption = t.caption, None
    if title:
        console.print(title, style="table.title")
    if fits:
        console.print(t)
    else:
        console.print(Segments(console.render(t, console.options.update_width(natural))), crop=False)
    if caption:
        console.print(caption, style="table.caption")
    return hidden


def _say_hidden(t, hidden: list[str]) -> None:
    levels, said = getattr(t, "levels", {}), getattr(t, "said", set())
    if any(h not in said for h in hidden):
        shown = [h for h in levels if h in hidden and h not in said]
        t.caption = (f"{t.caption}; " if t.caption else "") + f"not shown: {', '.join(shown)} (--wide shows them)"


# Above this many rows a table is laid out here, not by rich: rich measures and renders every
# cell several times (milliseconds a row), so a run of 300k imported rows would take hours.
# The layout is rich's for tables whose cells do not wrap: each column as wide as its widest
# cell, the same borders, the same columns left out, nothing cut.
FAST_ROWS = 200


def _print_long_table(console, t: LongTable, wide: bool) -> list[str]:
    levels = getattr(t, "levels", {})
    widths = {c.header: max([len(str(c.header))] + [len(str(x)) for x in c._cells]) for c in t.columns}
    ascii_box = t.ascii

    def total() -> int:
        return sum(widths[c.header] + 2 for c in t.columns) + (len(t.columns) + 1 if ascii_box else 0)

    hidden = []
    if not wide:
        for h, lv in levels.items():
            if lv >= WIDE and h in widths:
                _drop_column(t, h)
                hidden.append(h)
        for h in reversed([h for h, lv in levels.items() if lv == COMPACT and h in widths]):
            if total() <= console.width:
                break
            _drop_column(t, h)
            hidden.append(h)
    _say_hidden(t, hidden)
    cols = list(t.columns)
    ws = [widths[c.header] for c in cols]

    spec = [("{:<%d}" if c.justify == "left" else "{:>%d}") % w for c, w in zip(cols, ws)]
    row_format = ("| " + " | ".join(spec) + " |\n") if ascii_box else (" " + "  ".join(spec) + " \n")

    def line(cells) -> str:
        return row_format.format(*map(str, cells))[:-1]

    width = total()
    out = []
    if t.title:
        s = t.title
        out.append(s.center(width).rstrip() if len(s) <= width else s)
    out.append(("+" + "-" * (width - 2) + "+") if ascii_box else "")
    out.append(line([c.header for c in cols]))
    out.append(("|" + "+".join("-" * (w + 2) for w in ws) + "|") if ascii_box else " " + "─" * (width - 2))
    f = console.file
    f.write("\n".join(x for x in out if x) + "\n")
    f.writelines(row_format.format(*cells) for cells in zip(*(c._cells for c in cols)))
    tail = [("+" + "-" * (width - 2) + "+")] if ascii_box else []
    if t.caption:
        s = t.caption
        tail.append(s.center(width).rstrip() if len(s) <= width else textwrap.fill(s, max(console.width, width)))
    f.write("\n".join(tail) + ("\n" if tail else ""))
    f.flush()
    return hidden


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

def judge_ceiling(pct) -> str:
    """A rate as a share of its link's line rate, in words."""
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


def legend_beside(ax, fontsize: int = 8) -> None:
    """The legend right of the plotting area, so it never hides a line (the constrained
    layout narrows the axes to make room)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


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
