"""Which view shows a benchmark's rows: the benchmark's own presentation hooks when it
defines them (a plug-in), else the report layer's view of its family (moe, overlap), else
None (the generic collective table and figures). The built-in views live here, above the
benchmarks, so that a benchmark never imports its presentation."""
from __future__ import annotations

from commbench.benchmarks.base import Benchmark
from commbench.benchmarks.moe import MoE
from commbench.benchmarks.overlap import Overlap
from commbench.report import moe_figures, moe_view, overlap_view


def _own(b, hook: str) -> bool:
    return getattr(type(b), hook) is not getattr(Benchmark, hook)


def tables(b, rows: list[dict], plain: bool) -> list | None:
    if _own(b, "tables"):
        return b.tables(rows, plain)
    if isinstance(b, MoE):
        return [moe_view.terminal_table(rows, plain)]
    if isinstance(b, Overlap):
        return [overlap_view.terminal_table(rows, plain)]
    return None


def figures(b, rows, out_dir) -> list | None:
    if _own(b, "figures"):
        return b.figures(rows, out_dir)
    if isinstance(b, MoE):
        return moe_figures.figures(rows, out_dir, b.name)
    if isinstance(b, Overlap):
        return [f for f in (overlap_view.figure(rows, out_dir, b.name),) if f is not None]
    return None


def report_sections(b, rows, figs: list) -> list | None:
    if _own(b, "report_sections"):
        return b.report_sections(rows, figs)
    if isinstance(b, MoE):
        return [moe_view.section(rows, figs)]
    if isinstance(b, Overlap):
        return [overlap_view.section(rows, figs)]
    return None
