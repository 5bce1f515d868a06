"""A benchmark with its own terminal table, figure and report section, through the
presentation hooks alone: `commbench report` and report.html show them with no edit
anywhere else."""
from commbench.benchmarks.base import register
from commbench.benchmarks.collectives import AllReduce
from commbench.report.viewkit import FigureInfo, Section, fmt, new_figure, save_figure, table

TITLE = "echo: p50 by world (view plugin)"
CAPTION = "drawn by the view plugin's own hooks"


@register
class Echo(AllReduce):
    name = "view_echo"
    collective_rows = False  # its rows are not a size sweep: no generic table, fit or figure

    def tables(self, rows, plain):
        t = table(TITLE, CAPTION, plain)
        for c in ("world", "p50 (us)", "echo"):
            t.add_column(c)
        for r in rows:
            t.add_row(str(r["world"]), fmt(r["time_us_p50"]), str(r.get("echo")))
        return [t]

    def figures(self, rows, out_dir):
        fig, axes = new_figure()
        s = rows.sort_values("world")
        axes[0][0].plot(s["world"].astype(float), s["time_us_p50"].astype(float), marker="o", label="p50")
        axes[0][0].set_title(TITLE)
        name = f"{self.name}_p50"
        return [FigureInfo(name, save_figure(fig, out_dir, name), "echo p50 by world", CAPTION, ["p50"])]

    def report_sections(self, rows, figures):
        body = [[str(r["world"]), fmt(r["time_us_p50"]), str(r.get("echo"))] for r in rows.to_dict("records")]
        return [Section("Echo (view plugin)", CAPTION, ["world", "p50 (us)", "echo"], body, figures)]
