"""A benchmark with its own terminal table, figure and report section, through a registered
view alone: `commbench report` and report.html show them with no edit anywhere else. The
benchmark names its view; the view is registered with the report layer's register_view,
as the built-in moe and overlap views are."""
from commbench.benchmarks.base import register
from commbench.benchmarks.collectives import AllReduce
from commbench.report.document import FigureInfo, Section
from commbench.report.fmt import fmt
from commbench.report.plotkit import new_figure, save_figure
from commbench.report.tables import table
from commbench.report.views import register_view

TITLE = "echo: p50 by world (view plugin)"
CAPTION = "drawn by the view plugin's own view"


@register
class Echo(AllReduce):
    name = "view_echo"
    view = "view_echo"
    collective_rows = False  # its rows are not a size sweep: no generic table, fit or figure


def echo_tables(b, rows, plain):
    t = table(TITLE, CAPTION, plain)
    for c in ("world", "p50 (us)", "echo"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["world"]), fmt(r["time_us_p50"]), str(r.get("echo")))
    return [t]


def echo_figures(b, rows, out_dir):
    fig, axes = new_figure()
    s = rows.sort_values("world")
    axes[0][0].plot(s["world"].astype(float), s["time_us_p50"].astype(float), marker="o", label="p50")
    axes[0][0].set_title(TITLE)
    name = f"{b.name}_p50"
    return [FigureInfo(name, save_figure(fig, out_dir, name), "echo p50 by world", CAPTION, ["p50"])]


def echo_sections(b, rows, figures):
    body = [[str(r["world"]), fmt(r["time_us_p50"]), str(r.get("echo"))] for r in rows.to_dict("records")]
    return [Section("Echo (view plugin)", CAPTION, ["world", "p50 (us)", "echo"], body, figures)]


register_view("view_echo", tables=echo_tables, figures=echo_figures, sections=echo_sections)
