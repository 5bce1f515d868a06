"""What tables, report sections and figures are built with: the generic report, the html
report and the plots, and every benchmark's own presentation hooks (Benchmark.tables,
.report_sections, .figures). Nothing here knows a benchmark: it never imports the
registry, so a benchmark's view module can import it without a cycle.

rich and matplotlib are imported inside the functions that draw, as everywhere else.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .results import params_dict
from .units import fmt_size

DPI = 110


# ---------------------------------------------------------------------------------------
# cells

def text(v) -> str:
    """A cell's text: "" for a missing value (None, NaN)."""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def has(v) -> bool:
    """Is there a value (not None, NaN or "")?"""
    try:
        return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) != ""
    except TypeError:
        return True


def fmt(v, digits: int = 2) -> str:
    """A number with `digits` decimals; "-" for a missing or non-finite one."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    return f"{x:.{digits}f}" if math.isfinite(x) else "-"


def table(title: str, caption: str, plain: bool):
    """A rich Table in the report's style; plain: ASCII borders (a file or a pipe). Title
    and caption are plain text: rich would take "[mpi/cpu]" for markup and drop it."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    return Table(title=escape(title), caption=escape(caption) if caption else None,
                 box=box.ASCII if plain else box.SIMPLE_HEAD)


class Section:
    """One part of report.md / report.html: a heading, a note, a table, its figures."""

    def __init__(self, title: str, note: str = "", headers=None, rows=None, figures=(), level: int = 2):
        self.title, self.note, self.headers, self.rows = title, note, headers or [], rows or []
        self.figures, self.level = list(figures), level


def varying_params(values) -> list[str]:
    """The parameter names that take two or more values across a column of params (dicts
    or canonical JSON); a name some rows lack but that is constant where present does not
    count."""
    dicts = [params_dict(v) for v in values]
    names = sorted({k for p in dicts for k in p})
    return [k for k in names if len({json.dumps(p[k], sort_keys=True) for p in dicts if k in p}) > 1]


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


def new_figure(nrows=1, ncols=1, w=8.0, h=4.8, sharex=False):
    """(figure, axes[row][col])."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    return fig, axes


def save_figure(fig, out_dir: Path, name: str) -> Path:
    """Write out_dir/<name>.png."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = Path(out_dir) / f"{name}.png"
    fig.savefig(path, format="png", dpi=DPI)
    return path


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
