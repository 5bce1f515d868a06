"""What the figures and the terminal say about rows that are not evidence: flagged rows drawn
hollow (off the line) in the figures of quick, inswitch, overlap and moe, every legend beside
the data and inside the PNG; one tally line for warnings (each in full with --verbose); the
overlap and MoE tables keep the columns that tell their rows apart at 100 columns; a run of
one rank count says why it has no scaling table. Built from rows (make_row), no launches."""
from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

from conftest import make_row

pytest.importorskip("matplotlib")

from commbench.report import plots, terminal  # noqa: E402

DISTURBED = ("disturbed: a rank waited for a CPU 56 % of the point's time (> 10 %: another process, or more ranks "
             "than cores, held its core)")
CALIBRATION = ("calibration missed: t_compute 1966 us = 0.33x its target t_comm 5970 us (allowed 0.5-2x): OSU and IMB "
               "% not comparable")
SIZES = [8 << (2 * i) for i in range(8)]  # 8 B .. 128 KiB


def _quick_rows(flag_at=512):
    rows = []
    for bench in ("all_reduce", "all_gather"):
        for s in SIZES:
            extra = {"disturbed": True, "warning": DISTURBED} if s == flag_at else {"disturbed": False}
            rows.append(make_row(bench, 2, s, 5.0 + s / 1e3, run="quick", ceiling_gbps=2.5,
                                 ceiling_achieved_gbps=2.5, bottleneck="shared memory (memcpy)", tier="scaleup",
                                 **extra))
    return rows


def _overlap_rows():
    """The 74 % peak of the overlap figure is the row whose calibration missed."""
    rows = []
    for i, b in enumerate((1 << 20, 4 << 20, 25 << 20)):
        for polls, prog in ((0, "none"), (8, "none"), (0, "thread")):
            pct = 74.0 if (b == 4 << 20 and polls == 8) else 10.0 + i
            rows.append(make_row("overlap", 2, b, 900.0 + i, placement=None, run="ov", mode="single", polls=polls,
                                 progress=prog, buckets=8, gemm_n=512,
                                 params={"mode": "single", "polls": polls, "progress": prog},
                                 overlap_osu_pct=pct, overlap_imb_pct=pct - 5, compute_slowdown=1.1,
                                 exposed_us=100.0, t_comm_us=5970.0, t_compute_us=5966.0, t_overall_us=7000.0,
                                 compute_backend="numpy",
                                 **({"warning": CALIBRATION} if pct == 74.0 else {})))
    return rows


def _moe_rows(tokens=(128, 512, 2048), disturbed_tokens=512):
    rows = []
    for copies in ("rank", "expert"):
        for t in tokens:
            for stage, dt in (("dispatch", "fp8"), ("combine", "bf16")):
                p = {"tokens": t, "hidden": 7168, "experts": 256, "topk": 8, "copies": copies,
                     "routing": "uniform", "alpha": 1.0}
                bad = t == disturbed_tokens and copies == "rank"
                # As a loaded 2-core host measures them: p50 in the tens of thousands of us.
                k = (3.4 if copies == "expert" else 1.0) * (4.1 if stage == "combine" else 1.0)
                p50 = 1234.5 * k * t / 128
                rows.append(make_row("moe", 2, 0, p50, stage=stage, dtype=dt, params=p, placement=None,
                                     run="moe", logical_gbps=t / 50 / k, remote_gbps=t / 100 / k,
                                     scaleup_gbps=t / 100 / k, scaleout_gbps=0.0, load_max_over_mean=1.01,
                                     hottest_rank=1, pct_of_ceiling=20.0 / k, stage_us_layout=5.0,
                                     stage_us_a2a=p50 * 0.6, stage_us_unpack=2.0,
                                     disturbed=bad, **({"warning": DISTURBED} if bad else {})))
    return rows


# ---------------------------------------------------------------------------------------
# figures: what the matplotlib objects show

def _legends(fig) -> list:
    return [ax.get_legend() for ax in fig.get_axes() if ax.get_legend() is not None] + list(fig.legends)


def _assert_legends_outside(fig, name):
    """Every legend lies inside the PNG and off every axes' data area."""
    fig.canvas.draw()
    legends = _legends(fig)
    assert legends, name
    box_fig = fig.bbox
    for leg in legends:
        box = leg.get_window_extent()
        assert box.x0 >= box_fig.x0 - 1 and box.x1 <= box_fig.x1 + 1, (name, box, box_fig)
        assert box.y0 >= box_fig.y0 - 1 and box.y1 <= box_fig.y1 + 1, (name, box, box_fig)
        for ax in fig.get_axes():
            assert not box.overlaps(ax.get_window_extent()), (name, box, ax.get_window_extent())


def _hollow_at(ax, x: float, y: float) -> bool:
    """A hollow marker is drawn at (x, y), and no filled line passes through that point."""
    hollow = filled = False
    for ln in ax.get_lines():
        xs, ys = list(map(float, ln.get_xdata())), list(map(float, ln.get_ydata()))
        at = any(abs(a - x) < 1e-9 * max(1, abs(x)) and abs(b - y) < 1e-9 * max(1, abs(y)) for a, b in zip(xs, ys))
        if not at:
            continue
        if str(ln.get_markerfacecolor()) == "none":
            hollow = True
        else:
            filled = True
    return hollow and not filled


def _legend_says_hollow(fig) -> bool:
    return any("hollow: not evidence" in t.get_text() for leg in _legends(fig) for t in leg.get_texts())


def test_quick_figures_draw_the_disturbed_row_hollow_and_legends_outside(tmp_path):
    rows = _quick_rows()
    figs = plots.make_figures(pd.DataFrame(rows), tmp_path)
    for name in ("busbw_all_reduce", "latency_all_reduce", "busbw_all_gather"):
        fig = figs[name].figure
        ax = fig.get_axes()[0]
        bad = next(r for r in rows if r["benchmark"] == name.split("_", 1)[1] and r.get("disturbed"))
        y = bad["busbw_gbps"] if name.startswith("busbw") else bad["time_us_p50"]
        assert _hollow_at(ax, float(bad["nbytes"]), float(y)), name
        clean = next(r for r in rows if r["benchmark"] == bad["benchmark"] and not r.get("disturbed"))
        yc = clean["busbw_gbps"] if name.startswith("busbw") else clean["time_us_p50"]
        assert not _hollow_at(ax, float(clean["nbytes"]), float(yc)), name
        assert _legend_says_hollow(fig), name
        assert "hollow markers" in figs[name].caption
        _assert_legends_outside(fig, name)


def test_a_long_legend_wraps_and_stays_inside_the_png(tmp_path):
    """Many series with long labels (a run of variants) beside a busbw curve: the figure
    grows to hold the legend, which never covers a line."""
    rows = []
    for v in ("default", "ompi-ring", "ompi-recursive-doubling", "ompi-rabenseifner", "a-custom-variant-name-x" * 3):
        rows += [make_row("all_reduce", 2, s, 5.0 + s / 1e3, variant=v, run="ins") for s in SIZES]
    figs = plots.make_figures(pd.DataFrame(rows), tmp_path)
    _assert_legends_outside(figs["busbw_all_reduce"].figure, "busbw")
    _assert_legends_outside(figs["latency_all_reduce"].figure, "latency")


def test_inswitch_speedup_point_resting_on_a_disturbed_row_is_hollow(tmp_path):
    rows = []
    for s in (1 << 16, 1 << 20, 1 << 24):
        rows.append(make_row("all_reduce", 8, s, 20.0 + s / 2e5, variant="nccl-ring", inswitch=False, run="ins"))
        bad = s == 1 << 20
        rows.append(make_row("all_reduce", 8, s, 15.0 + s / 3e5, variant="nccl-nvls", inswitch=True, run="ins",
                             disturbed=bad, **({"warning": DISTURBED} if bad else {})))
    figs = plots.make_figures(pd.DataFrame(rows), tmp_path)
    f = figs["inswitch_speedup"]
    ax = f.figure.get_axes()[0]
    s = 1 << 20
    assert _hollow_at(ax, float(s), (20.0 + s / 2e5) / (15.0 + s / 3e5))
    assert not _hollow_at(ax, float(1 << 16), (20.0 + (1 << 16) / 2e5) / (15.0 + (1 << 16) / 3e5))
    assert _legend_says_hollow(f.figure)
    for name in ("inswitch_speedup", "busbw_all_reduce", "latency_all_reduce"):
        _assert_legends_outside(figs[name].figure, name)


def test_overlap_peak_with_a_warning_is_hollow_not_the_line(tmp_path):
    rows = _overlap_rows()
    figs = plots.make_figures(pd.DataFrame(rows), tmp_path)
    fig = figs["overlap"].figure
    top = fig.get_axes()[0]
    assert _hollow_at(top, float(4 << 20), 74.0)
    # The line of that series runs through the other sizes only: its peak is not 74.
    labelled = [ln for ln in top.get_lines() if not ln.get_label().startswith("_")]
    assert max(max(map(float, ln.get_ydata()), default=0) for ln in labelled) < 74.0
    assert any("1 with a warning" in t.get_text() for leg in _legends(fig) for t in leg.get_texts())
    _assert_legends_outside(fig, "overlap")


def test_moe_figures_draw_disturbed_rows_hollow(tmp_path):
    figs = plots.make_figures(pd.DataFrame(_moe_rows()), tmp_path)
    fig = figs["moe_tokens"].figure
    p50_ax = next(ax for ax in fig.get_axes() if "p50" in ax.get_ylabel())
    assert _hollow_at(p50_ax, 512.0, 1234.5 * 512 / 128)
    assert not _hollow_at(p50_ax, 128.0, 1234.5)
    assert _legend_says_hollow(fig)
    _assert_legends_outside(fig, "moe_tokens")
    # The stage bars of a disturbed row are hollow: outlined, not filled.
    stages = figs["moe_stages"].figure
    bars = [p for ax in stages.get_axes() for p in ax.patches]
    hollow = [p for p in bars if p.get_facecolor()[3] == 0]
    assert hollow and len(hollow) < len(bars)
    assert _legend_says_hollow(stages)
    _assert_legends_outside(stages, "moe_stages")


def test_flag_entry_counts_by_reason():
    from commbench.report.figflags import flag_entry

    rows = pd.DataFrame([make_row(disturbed=True), make_row(oversubscribed=True, ranks_per_core=2.0),
                         make_row(warning="something odd"), make_row()])
    (_, label), = flag_entry(rows)
    assert label == "hollow: not evidence (1 disturbed, 1 oversubscribed, 1 with a warning)"
    assert flag_entry(pd.DataFrame([make_row()])) == []


# ---------------------------------------------------------------------------------------
# terminal: one tally line, tables at 100 columns, the scaling reason

def _flagged_rows():
    rows = [make_row(nbytes=8 << i, disturbed=True, warning=DISTURBED) for i in range(80)]
    rows += [make_row(nbytes=8 << i, world=4, oversubscribed=True, ranks_per_core=2.0) for i in range(16)]
    rows += [make_row(nbytes=8 << i, world=8) for i in range(4)]
    return rows


def test_warnings_tally_is_one_line_by_kind():
    from commbench.report.warnings_view import warning_lines, warnings_tally

    rows = _flagged_rows()
    assert warnings_tally(rows) == ("warning: 96 of 100 rows carry warnings: 80 disturbed (a rank waited for a CPU), "
                                    "16 oversubscribed; `--verbose` or the report lists them")
    lines = warning_lines(rows)
    assert len(lines) == 96 and lines[0].startswith("warning: all_reduce 8 float32 world 2: disturbed: a rank waited")
    assert any("oversubscribed" in ln for ln in lines)
    assert warnings_tally([make_row()]) is None
    over = warnings_tally(_overlap_rows() + [make_row(disturbed=True, warning=DISTURBED + "; " + CALIBRATION)])
    assert "2 with a missed calibration (OSU and IMB % not comparable), 1 disturbed (a rank waited" in over
    assert "(a row may carry several)" in over


def test_report_prints_the_tally_and_verbose_every_warning(tmp_path, capsys):
    from commbench.store.results import RunDir, Status

    rd = RunDir(tmp_path / "run").open({"schema": 3, "status": "running", "suite": "quick", "backend": "mpi",
                                        "device": "cpu", "world": 2, "hosts": ["h", "h"]})
    for r in _flagged_rows():
        rd.append({k: v for k, v in r.items() if k != "run"})
    rd.finish(Status.COMPLETE)
    from commbench.commands.report import report_runs

    report_runs([tmp_path / "run"])
    out = capsys.readouterr()
    said = [ln for ln in (out.out + out.err).splitlines() if ln.startswith("warning:")]
    assert len(said) == 1 and said[0].startswith("warning: 96 of 100 rows carry warnings: 80 disturbed")
    from commbench.report.viewsettings import View

    report_runs([tmp_path / "run"], view=View(verbose=True))
    out = capsys.readouterr()
    assert len([ln for ln in (out.out + out.err).splitlines() if ln.startswith("warning:")]) == 97


def test_verbose_is_a_flag_of_run_and_report():
    from commbench.cli import build_parser

    assert build_parser().parse_args(["run", "quick", "--verbose"]).verbose
    assert build_parser().parse_args(["report", "results/x", "--verbose"]).verbose


def _at_100(rows, monkeypatch) -> str:
    monkeypatch.setenv("COMMBENCH_TTY", "1")  # a terminal's box and width, as a user sees it
    console = Console(file=io.StringIO(), width=100, color_system=None)
    terminal.print_tables(rows, console=console, wide=False)
    return console.file.getvalue()


def test_overlap_table_at_100_columns_keeps_the_progress_column(monkeypatch):
    out = _at_100(_overlap_rows(), monkeypatch)
    assert max(len(ln) for ln in out.splitlines()) <= 100
    body = [ln for ln in out.splitlines() if "single" in ln]
    assert len(body) == 9
    # What tells the rows of one size apart: polls 0, polls 8, the progress thread.
    assert sum("polls 0" in ln for ln in body) == 3 and sum("polls 8" in ln for ln in body) == 3
    assert sum("thread" in ln for ln in body) == 3
    # The warning's kind in the table, not its paragraph.
    assert "calibration missed" in out and "OSU and IMB % not comparable" not in out.split("p50 us,")[0]


def test_moe_table_at_100_columns_keeps_the_shape_one_row_a_line(monkeypatch):
    rows = _moe_rows(tokens=(512,), disturbed_tokens=None)
    out = _at_100(rows, monkeypatch)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 100
    body = [ln for ln in lines if "dispatch" in ln or "combine" in ln]
    body = [ln for ln in body if ln.split()[0] in ("rank", "expert")]
    # One line a row, each with what tells it apart (the copies) and its stage.
    assert len(body) == 4
    assert sorted(ln.split()[0] for ln in body) == ["expert", "expert", "rank", "rank"]
    joined = " ".join(out.split())
    assert "T=512 H=7168 E=256 K=8 uniform" in joined  # the shape's common part, once, in the caption


def test_a_run_of_one_rank_count_says_why_there_is_no_scaling_table():
    one = pd.DataFrame([make_row(world=2, nbytes=s) for s in SIZES])
    assert terminal.no_scaling_reason(one, cores=2) == (
        "no scaling table: the run has one rank count (2); weak scaling needs at least two worlds: --np 4 on a host "
        "with 4 cores (this one has 2), or a cluster")
    two = pd.DataFrame([make_row(world=w, nbytes=s) for w in (2, 4) for s in SIZES])
    assert terminal.no_scaling_reason(two, cores=2) is None
    console = Console(file=io.StringIO(), width=200, color_system=None)
    terminal.analysis_tables(one, console=console, say_no_scaling=True)
    assert "no scaling table: the run has one rank count (2)" in console.file.getvalue()
    console = Console(file=io.StringIO(), width=200, color_system=None)
    terminal.analysis_tables(one, console=console)  # worlds named by the user: nothing to explain
    assert "no scaling table" not in console.file.getvalue()


def test_a_prose_column_keeps_its_words_when_the_table_is_too_wide():
    """A verdict or a warning is a sentence: the words every cell shares stay in each cell.
    Factored out, "cannot judge (not interleaved: ...)" read "(not interleaves); disturbed: b3
    ..." in the cell and "verdict cannot judge interleaved: every base ..." in the caption."""
    from commbench.report.tables import add_column, print_table, table

    why = ("not interleaved: every base run ran before every new run; within 2x that is the host's drift as much as "
           "a change (commbench ab interleaves)")
    verdicts = [f"cannot judge ({why})",
                f"cannot judge ({why}); disturbed: b3 waited for CPU 22 % of the point's time (up to 1.3x)",
                f"cannot judge (faster? {why})"]
    t = table("compare", "threshold 5 %", plain=True)
    add_column(t, "size (B)")
    add_column(t, "params", left=True, wrap=True, words=True)
    add_column(t, "verdict", left=True, wrap=True)
    for i, v in enumerate(verdicts):
        t.add_row(str(8 << i), f"T=512 H=7168 routing=uniform copies={'rank' if i else 'expert'}", v)
    console = Console(file=io.StringIO(), width=100, color_system=None)
    print_table(console, t)
    out = console.file.getvalue()
    flat = " ".join(out.replace("|", " ").split())
    for v in verdicts:  # each sentence whole, in order, its words wrapped but none left out
        words = v.split()
        at = 0
        for w in words:
            at = flat.find(w, at)
            assert at >= 0, (w, v)
    assert "verdict cannot judge" not in flat
    # A list of words may still share its common ones through the caption.
    assert "params T=512 H=7168 routing=uniform (the column gives the rest)" in flat
