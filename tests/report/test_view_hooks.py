"""Registered views: a plug-in's own table, figure and report section reach
`commbench report` and report.html with no edit outside the plug-in (tests/plugins/
view_plugin.py); rows no registered benchmark claims get the generic collective view."""
from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

from commbench.analyse.analysis import fit_table, scaling_table
from commbench.benchmarks.base import for_rows
from commbench.report import views
from commbench.report.terminal import print_tables
from commbench.store.results import RunDir, Status
from conftest import make_row, run_cli

PNG = b"\x89PNG\r\n\x1a\n"


def _row(benchmark, world, nbytes, p50, **extra):
    return make_row(benchmark, world, nbytes, p50, placement=None, iters=50, time_us_p99=p50 * 1.1,
                    time_us_max=p50 * 2, time_us_std=0.1, **extra)


@pytest.fixture
def run(tmp_path):
    d = RunDir(tmp_path / "run").open({"schema": 2, "status": "running", "suite": "view", "backend": "mpi",
                                        "world": 4, "hosts": ["h"] * 4})
    for world, p50 in ((2, 10.0), (4, 12.5)):
        d.append(_row("view_echo", world, 4096, p50, echo=f"marker-{world}"))
    for nbytes in (1024, 1 << 20):
        d.append(_row("all_reduce", 4, nbytes, 5.0 + nbytes / 1e4))
    d.finish(Status.COMPLETE)
    return d.dir


@pytest.mark.multirank
def test_plugin_table_figure_and_section_reach_both_reports(run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "rep"
    r = run_cli("report", run, "--out", out, env={"COMMBENCH_PLUGINS": "view_plugin"})
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # a title or caption wider than its table wraps
    assert "echo: p50 by world (view plugin)" in text and "drawn by the view plugin's own view" in text
    assert "marker-2" in text and "marker-4" in text
    assert "view_echo [" not in text  # its own table replaces the generic one
    assert "all_reduce [mpi/cpu]" in text  # the others keep theirs
    png = out / "figures" / "view_echo_p50.png"
    assert png.read_bytes()[:8] == PNG
    html = (out / "report.html").read_text()
    assert "<h2>Echo (view plugin)</h2>" in html and "drawn by the view plugin&#x27;s own view" in html
    assert 'alt="echo p50 by world"' in html and "marker-4" in html
    assert html.count("data:image/png;base64,") == len(list((out / "figures").glob("*.png")))
    md = (out / "report.md").read_text()
    assert "![echo p50 by world](figures/view_echo_p50.png)" in md and "## Echo (view plugin)" in md


@pytest.mark.multirank
def test_rows_of_an_unregistered_benchmark_get_the_generic_view(run):
    r = run_cli("report", run)  # no COMMBENCH_PLUGINS: view_echo is unknown here
    assert r.returncode == 0, r.stderr
    assert "view_echo [mpi/cpu]" in " ".join(r.stdout.split()) and "echo: p50 by world" not in r.stdout


def test_generic_defaults_in_process():
    # An imported nccl-tests benchmark commbench does not have: a sized collective.
    rows = [_row("gather", 8, n, 3.0 + n / 1e4) for n in (1024, 65536, 1 << 20)]
    console = Console(file=io.StringIO(), width=250)
    print_tables(rows, console)
    assert "gather  [mpi/cpu]" in console.file.getvalue()
    assert list(fit_table(pd.DataFrame(rows))["benchmark"]) == ["gather"]
    b = for_rows("gather")
    assert b.collective_rows and b.sized and b.view == "collective" and views.tables(b, rows, True) is None
    assert not for_rows("moe").collective_rows and not for_rows("overlap").collective_rows


def test_rows_that_are_not_a_collective_get_no_fit_or_busbw_scaling():
    # overlap rows (collective_rows False, no scaling metric of their own) are left out.
    rows = [_row(bench, world, n, 3.0 + n / 1e4 * world) for bench in ("overlap", "all_reduce")
            for world in (2, 4) for n in (1024, 65536, 1 << 20)]  # a fit needs three sizes
    assert set(fit_table(pd.DataFrame(rows))["benchmark"]) == {"all_reduce"}
    assert set(scaling_table(pd.DataFrame(rows))["benchmark"]) == {"all_reduce"}
