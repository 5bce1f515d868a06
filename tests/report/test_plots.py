"""commbench.report.plots + commbench.report.html: figures, report.md and a self-contained report.html."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from commbench.store.importers import import_file, write_imported_run
from commbench.store.load import load
from commbench.store.results import RunDir, Status
from conftest import FIXTURES, make_row, run_cli, starts_processes

pytest.importorskip("matplotlib")

from commbench.commands.report import write_report  # noqa: E402
from commbench.report import plots  # noqa: E402
from commbench.report.sections import chosen_env  # noqa: E402

FIX = FIXTURES
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
@starts_processes
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = []
    for name in ("base", "new"):
        p = run_cli("run", "quick", "--np", "2", "--sizes", "8,64K,1M", "--out", root / name)
        assert p.returncode == 0, p.stderr
        out.append(root / name)
    rows, meta = import_file(FIX / "nccl_all_reduce_8gpu.txt")
    out.append(write_imported_run(rows, meta, root / "h100"))
    return out


def _png_ok(path: Path):
    data = Path(path).read_bytes()
    assert data[:8] == PNG and len(data) > 8 * 1024, (path, len(data))


@pytest.mark.multirank
def test_report_from_a_real_run(runs, tmp_path):
    res = write_report([runs[0]], tmp_path / "rep")
    figs = res["figures"]
    assert {"busbw_all_reduce", "latency_all_reduce", "busbw_all_to_all"} <= set(figs)
    for name in ("moe_tokens", "moe_skew", "scaling", "inswitch_speedup", "overlap"):
        assert name not in figs  # no data, no figure
    for p in figs.values():
        _png_ok(p)
        assert p.parent == tmp_path / "rep" / "figures"
    md = res["markdown"].read_text()
    assert "busbw" in md and "| 64K |" in md and "## all_reduce" in md and "## Alpha-beta fits" in md
    assert "](figures/busbw_all_reduce.png)" in md
    html = res["html"].read_text()
    assert html.count("data:image/png;base64,") == len(figs)
    assert "<table>" in html and "64K" in html and "<h3>base</h3>" in html and "hosts" in html
    assert "figures/" not in html  # self-contained
    # The loopback ceiling the run measured is drawn as a line.
    assert any("line rate" in s for s in res["series"]["busbw_all_reduce"])


def test_two_runs_overlay(runs, tmp_path):
    res = write_report(runs, tmp_path / "rep")
    labels = res["series"]["busbw_all_reduce"]
    for run in ("base", "new", "h100"):
        assert any(s.startswith(run) for s in labels), labels
    assert any(s.startswith("base") for s in res["series"]["latency_all_gather"])
    md = res["markdown"].read_text()
    assert "### h100" in md and "nccl-tests stdout" in md and "dgx-h100-01 x8" in md
    assert "| h100 | 8 |" in md  # the run column appears with several runs
    html = res["html"].read_text()
    assert "NVIDIA H100 80GB HBM3" in html and "nccl 2.28.3" in html


def test_profile_ceilings_on_an_imported_run(runs, tmp_path):
    res = write_report([runs[2]], tmp_path / "rep", profile="h100-hgx")
    labels = res["series"]["busbw_all_reduce"]
    assert "line rate 450 GB/s (NVLink 4)" in labels and "typical achieved 370 GB/s (NVLink 4)" in labels
    md = res["markdown"].read_text()
    assert "% of ceiling" in md and "| 360.580 | 450.0 | 80.1 |" in md


def test_env_header_drops_launcher_variables():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_ARGV": "x", "NCCL_ALGO": "Ring", "OMPI_MCA_btl": "self,vader",
           "UCX_TLS": "rc"}
    assert chosen_env(env) == {"NCCL_ALGO": "Ring", "OMPI_MCA_btl": "self,vader", "UCX_TLS": "rc"}


# ------------------------------------------------------------------ figures from synthetic rows

def _base_row(**kw):
    """An nccl row of 8 GPUs at 1 MiB with fixed statistics; kw sets any field."""
    fields = {"backend": "nccl", "device": "cuda", "world": 8, "nbytes": 1 << 20, "warmup": 5, "clock": "cuda_event",
              "time_us_min": 10.0, "time_us_p50": 10.0, "time_us_mean": 10.5, "time_us_p90": 11.0,
              "time_us_p99": 12.0, "time_us_max": 20.0, "time_us_std": 1.0, "algbw_gbps": 1.0, "busbw_gbps": 1.75,
              "busbw_factor": 1.75, "run": "syn", **kw}
    return make_row(p50=fields["time_us_p50"], **fields)


def _moe_rows():
    rows = []
    for run in ("syn", "syn2"):
        for tokens in (128, 512, 2048):
            for stage, t in (("dispatch", 50.0), ("combine", 80.0)):
                p = {"tokens": tokens, "hidden": 7168, "experts": 256, "topk": 8, "routing": "uniform", "alpha": 1.0,
                     "ratio": 2.0, "max_groups": 4, "copies": "rank"}
                rows.append(_base_row(benchmark="moe", stage=stage, params=p, time_us_p50=t * tokens / 128,
                                      remote_gbps=tokens / 10, load_max_over_mean=1.01, hottest_rank=3, run=run))
        for alpha in (0.5, 1.0, 1.5):
            for stage in ("dispatch", "combine"):
                p = {"tokens": 512, "hidden": 7168, "experts": 256, "topk": 8, "routing": "zipf", "alpha": alpha,
                     "ratio": 2.0, "max_groups": 4, "copies": "rank"}
                rows.append(_base_row(benchmark="moe", stage=stage, params=p, time_us_p50=100 * (1 + alpha),
                                      remote_gbps=40 / (1 + alpha), load_max_over_mean=1 + alpha, hottest_rank=0,
                                      run=run))
    return rows


def test_moe_figures_vs_tokens_and_skew(tmp_path):
    figs = plots.make_figures(pd.DataFrame(_moe_rows()), tmp_path)
    assert set(figs) == {"moe_tokens", "moe_skew"}  # one world: no scaling figure
    for f in figs.values():
        _png_ok(f.path)
    assert any(s.startswith("syn2") and s.endswith("combine") for s in figs["moe_tokens"].series)
    assert any(s.startswith("syn ") and s.endswith("dispatch") for s in figs["moe_skew"].series)


def test_inswitch_speedup_figure(tmp_path):
    rows = []
    for nbytes in (1 << 16, 1 << 20, 1 << 24):
        rows.append(_base_row(nbytes=nbytes, variant="default", time_us_p50=19.0 + nbytes / 2e5, inswitch=False))
        rows.append(_base_row(nbytes=nbytes, variant="nccl-ring", time_us_p50=20.0 + nbytes / 2e5, inswitch=False))
        rows.append(_base_row(nbytes=nbytes, variant="nccl-nvls", time_us_p50=15.0 + nbytes / 3e5, inswitch=True))
        # In-switch by the row's flag, not its name (symmetric memory).
        rows.append(_base_row(nbytes=nbytes, variant="symm-mem", time_us_p50=12.0 + nbytes / 3e5, inswitch=True))
    figs = plots.make_figures(pd.DataFrame(rows), tmp_path)
    f = figs["inswitch_speedup"]
    _png_ok(f.path)
    assert f.series == ["n=8 all_reduce nccl-nvls vs nccl-ring", "n=8 all_reduce symm-mem vs nccl-ring"]
    # The library default is the baseline when no ring ran.
    no_ring = [r for r in rows if r["variant"] != "nccl-ring"]
    f = plots.make_figures(pd.DataFrame(no_ring), tmp_path / "b")["inswitch_speedup"]
    assert f.series == ["n=8 all_reduce nccl-nvls vs default", "n=8 all_reduce symm-mem vs default"]
    # Without a ring or default baseline there is nothing to divide by: no figure.
    only = [r for r in rows if r["inswitch"]]
    assert "inswitch_speedup" not in plots.make_figures(pd.DataFrame(only), tmp_path / "c")


def test_overlap_figure_from_osu_and_native_rows(tmp_path):
    rows, meta = import_file(FIX / "osu_iallreduce.txt", world=8)
    d = write_imported_run(rows, meta, tmp_path / "osu")
    df = load(d)
    native = [_base_row(benchmark="overlap", nbytes=b, mode="sequence", params={"mode": "sequence", "buckets": 8},
                        overlap_osu_pct=50.0 + i * 10, overlap_imb_pct=45.0 + i * 10, compute_slowdown=1.0 + i / 10,
                        exposed_us=5.0, run="native") for i, b in enumerate((1 << 20, 1 << 22, 1 << 24))]
    both = pd.concat([df, pd.DataFrame(native)], ignore_index=True)
    figs = plots.make_figures(both, tmp_path / "f")
    f = figs["overlap"]
    _png_ok(f.path)
    assert any(s.startswith("osu") and "(OSU)" in s for s in f.series)
    assert any(s.startswith("native") and "(IMB)" in s for s in f.series)
    res = write_report([d], tmp_path / "rep")
    assert "overlap" in res["figures"] and "## Overlap" in res["markdown"].read_text()


def test_report_of_a_run_without_matplotlib_figures_still_has_tables(tmp_path, monkeypatch):
    w = RunDir(tmp_path / "run").open({"schema": 2, "status": "running", "hosts": ["h"] * 8})
    for r in [_base_row(nbytes=n, run=None) for n in (1024, 65536)]:
        r.pop("run")
        w.append(r)
    w.finish(Status.COMPLETE)
    monkeypatch.setattr(plots, "have_matplotlib", lambda: False)
    res = write_report([tmp_path / "run"], tmp_path / "rep")
    assert res["figures"] == {} and res["notes"]
    md = res["markdown"].read_text()
    assert "matplotlib is not installed" in md and "| 64K |" in md
    assert json.loads(json.dumps(res["series"])) == {}
