"""Figure helpers the views draw with: a new figure, saving it (no write through a link,
texts drawn as written, legends beside the axes given room), size and rank-count axes, and
legend labels naming only what varies. Figures are drawn on matplotlib.figure.Figure with
the Agg canvas, never through pyplot, so nothing global (the user's backend, open figures)
is touched; matplotlib is imported inside the functions that draw."""
from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

from commbench.core.safe_write import file_name, write_atomic
from commbench.core.units import fmt_size
from commbench.report.order import varying_params

DPI = 110


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
