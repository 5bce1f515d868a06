"""The one route from a benchmark to its presentation: registered views.

A benchmark names its view (`Benchmark.view`, "collective" by default); a view is
registered here under that name with up to three functions (its terminal tables, its
figures, its report sections). A function a view leaves out means the generic collective
one (terminal.collective_table, plots' busbw and latency figures, sections'
collective_section). The built-in views (collective, moe, overlap, pairs) are registered below;
a plug-in registers its own the same way, with register_view, in the module that
registers its benchmark. The views live in the report layer, above the benchmarks, so a
benchmark never imports its presentation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from commbench.core.errors import UsageError
from commbench.report import moe_figures, moe_view, overlap_view, pairs_view


@dataclass(frozen=True)
class RegisteredView:
    """How one kind of rows is shown. Each function takes the benchmark first:
    tables(b, rows: list[dict], plain) -> rich tables (plain: ASCII borders, a file or a
    pipe); figures(b, df, out_dir) -> [FigureInfo] written into out_dir;
    sections(b, df, figures) -> [Section] of report.md/report.html (figures: what
    figures() drew). None: the generic collective one."""

    name: str
    tables: Callable | None = None
    figures: Callable | None = None
    sections: Callable | None = None


_VIEWS: dict[str, RegisteredView] = {}


def register_view(name: str, tables: Callable | None = None, figures: Callable | None = None,
                  sections: Callable | None = None) -> RegisteredView:
    """Register the view named `name`; a name registered twice is refused."""
    if not name:
        raise ValueError("a view needs a name")
    if name in _VIEWS:
        raise ValueError(f"view {name!r} registered twice")
    _VIEWS[name] = RegisteredView(name, tables, figures, sections)
    return _VIEWS[name]


def registered() -> dict[str, RegisteredView]:
    """Every registered view, by name."""
    return dict(_VIEWS)


def view_of(b) -> RegisteredView:
    """The view that shows benchmark b's rows; a name nobody registered is refused."""
    name = getattr(b, "view", "collective")
    if name not in _VIEWS:
        raise UsageError(f"benchmark {b.name or '(unnamed)'!r} is shown by view {name!r}, which no module "
                         f"registered (known: {', '.join(sorted(_VIEWS))})")
    return _VIEWS[name]


def tables(b, rows: list[dict], plain: bool) -> list | None:
    """b's own terminal tables of `rows`, or None: the generic collective table."""
    f = view_of(b).tables
    return None if f is None else f(b, rows, plain)


def figures(b, rows, out_dir) -> list | None:
    """b's own figures of `rows` (a DataFrame), or None: the generic busbw and latency figures."""
    f = view_of(b).figures
    return None if f is None else f(b, rows, out_dir)


def report_sections(b, rows, figs: list) -> list | None:
    """b's own report sections of `rows` (a DataFrame), or None: the generic collective section."""
    f = view_of(b).sections
    return None if f is None else f(b, rows, figs)


register_view("collective")
register_view("moe", tables=lambda b, rows, plain: [moe_view.terminal_table(rows, plain)],
              figures=lambda b, rows, out_dir: moe_figures.figures(rows, out_dir, b.name),
              sections=lambda b, rows, figs: [moe_view.section(rows, figs)])
register_view("overlap", tables=lambda b, rows, plain: [overlap_view.terminal_table(rows, plain)],
              figures=lambda b, rows, out_dir: [f for f in (overlap_view.figure(rows, out_dir, b.name),)
                                                if f is not None],
              sections=lambda b, rows, figs: [overlap_view.section(rows, figs)])
register_view("pairs", tables=lambda b, rows, plain: pairs_view.terminal_tables(rows, plain),
              figures=lambda b, rows, out_dir: pairs_view.figures(rows, out_dir, b.name),
              sections=lambda b, rows, figs: pairs_view.sections(rows, figs))
