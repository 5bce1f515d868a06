"""report.md / report.html from a fixture run: every figure's axes and legend checked on
its matplotlib objects, the summary first, raw tables folded, and what the terminal prints
about variants also in the report."""
from __future__ import annotations

from pathlib import Path

import pytest

from commbench.store.results import RunDir, Status

pytest.importorskip("matplotlib")

from test_report_tables import BENCHES, SIZES, WORLDS, _row  # noqa: E402

from commbench.commands.report import write_report  # noqa: E402

BUCKETS = [1 << 22, 1 << 23, 25 << 20]  # DDP's 25 MiB bucket is no power of two


def _moe_rows(tokens=(128, 512, 2048)):
    rows = []
    for world in WORLDS:
        for copies in ("rank", "expert"):
            shapes = [("uniform", "alpha", 1.0, t) for t in tokens]
            shapes += [("zipf", "alpha", a, tokens[0]) for a in (0.0, 0.5, 1.5)]
            for routing, key, v, t in shapes:
                for stage, dt in (("dispatch", "fp8"), ("combine", "bf16")):
                    p = {"tokens": t, "hidden": 7168, "experts": 256, "topk": 8, "copies": copies,
                         "routing": routing, "alpha": 1.0, key: v}
                    # A hot rank makes p50 span decades: the case a linear axis squashes.
                    p50 = 50.0 * t / 128 * (3.4 if copies == "expert" else 1) * 10 ** v
                    rows.append(_row("moe", world, 0, p50, stage=stage, dtype=dt, params=p, placement=None,
                                     logical_gbps=t / 50, remote_gbps=t / 100, scaleup_gbps=t / 100,
                                     scaleout_gbps=0.0, load_max_over_mean=1 + v, hottest_rank=1,
                                     compared_as="per-tier bytes"))
    return rows


def _overlap_rows():
    return [_row("overlap", 4, b, 900.0 + i, mode="single", params={"mode": "single"}, placement=None,
                 overlap_osu_pct=20.0 + 30 * i, overlap_imb_pct=15.0 + 30 * i, compute_slowdown=1.0 + i / 10,
                 exposed_us=100.0 / (i + 1), t_comm_us=5970.0, t_compute_us=1966.0, t_overall_us=7000.0)
            for i, b in enumerate(BUCKETS)]


def _write_run(path: Path, rows, variants=None) -> Path:
    rd = RunDir(path).open({"schema": 3, "status": "running", "suite": "fixture", "backend": "mpi", "device": "cpu",
                            "world": 4, "hosts": ["h"] * 4, "command": ["commbench", "run", "fixture", "--np", "4"],
                            "ceilings": {"profile": "loopback", "fields": {"scaleup_latency_us": 300.0}},
                            **({"variants": variants} if variants else {})})
    for r in rows:
        rd.append({k: v for k, v in r.items() if k != "run"})
    rd.finish(Status.COMPLETE)
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixture")
    rows = [_row(b, w, s, 300.0 * w + s / (1e3 * w)) for b in BENCHES for w in WORLDS for s in SIZES]
    rows += [_row("all_reduce", 4, s, 200.0 + s / 2e3, variant="nccl-ring") for s in SIZES]
    rows += _moe_rows() + _overlap_rows()
    variants = {"default": {"status": "complete"}, "nccl-ring": {"status": "complete"},
                "nccl-nvls": {"status": "skipped", "reason": "needs NVLink SHARP"}}
    run = _write_run(root / "run", rows, variants)
    return write_report([run], root / "rep")


def _legend_texts(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


def test_every_figure_axis_scale_and_legend(report):
    drawn = report["drawn"]
    assert {"busbw_all_reduce", "latency_all_reduce", "scaling", "overlap", "moe_tokens", "moe_skew"} <= set(drawn)
    for name, info in drawn.items():
        fig = info.figure
        assert fig is not None, name
        axes = fig.get_axes()
        texts = [t for ax in axes for t in _legend_texts(ax)]
        assert len(texts) == len(set(texts)), (name, texts)  # no legend entry twice on one figure
        if name.startswith("busbw_"):
            ax = axes[0]
            # Log busbw: the small sizes are not squashed onto zero.
            assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log"), name
            lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
            assert len(texts) == len(lines) == len(info.series)
            assert min(min(ln.get_ydata()) for ln in lines) < 1e-3  # 8 B is on the plot, above zero
        elif name.startswith("latency_"):
            assert (axes[0].get_xscale(), axes[0].get_yscale()) == ("log", "log"), name
        elif name == "scaling":
            assert len(texts) == len(info.series) == len(axes[0].get_lines()) - 1  # the 100 % reference is unnamed
        elif name.startswith("moe_"):
            p50 = [ax for ax in axes if "p50" in ax.get_ylabel()]
            assert p50 and all(ax.get_yscale() == "log" for ax in p50), name
            assert len(texts) == len(info.series)


def test_overlap_legend_beside_the_lines_and_every_bucket_ticked(report):
    fig = report["drawn"]["overlap"].figure
    fig.canvas.draw()
    ax = fig.get_axes()[0]
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent())
    ticks = {round(t) for t in fig.get_axes()[-1].get_xticks()}
    assert set(BUCKETS) <= ticks
    assert "25M" in [t.get_text() for t in fig.get_axes()[-1].get_xticklabels()]


def test_report_opens_with_the_summary(report):
    md = report["markdown"].read_text()
    html = report["html"].read_text()
    for doc, first_table in ((md, "| world |"), (html, "<details>")):
        assert doc.index("Summary") < doc.index(first_table)
    summary = md.split("## Summary")[1].split("\n## ")[0]
    for want in ("peak busbw", "% of the 9.422 GB/s line rate", "small-message latency", "x the latency floor",
                 "weak scaling", "dispatch (n=4)", "combine (n=4)", "hottest-rank load", "OSU overlap",
                 "default vs nccl-ring", "nccl-nvls skipped"):
        assert want in summary, want
    # The raw tables come folded, after the answer.
    assert md.count("<details><summary>") >= len(BENCHES) and "<details><summary>all_reduce:" in html
    assert "command: commbench run fixture --np 4" in md and "__main__" not in md


def test_report_has_what_the_terminal_says_about_variants_and_moe(report):
    md = report["markdown"].read_text()
    assert "variants side by side (baseline nccl-ring)" in md
    assert "vs nccl-ring: cannot judge: one run each (--repeat 3 to judge)" in md and "clearly" not in md
    assert "variant nccl-nvls: skipped: needs NVLink SHARP" in md
    # MoE rows say the copies mode (rank and expert copies differ 3.4x here).
    assert "copies=rank" in md and "copies=expert" in md
    scaling = md.split("## Scaling")[1].split("\n## ")[0]
    moe = [ln for ln in scaling.splitlines() if ln.startswith("| moe |")]
    assert moe and all("T=" in ln for ln in moe)  # its params column filled


def test_one_token_count_says_why_there_is_no_moe_figure(tmp_path):
    rows = [r for r in _moe_rows(tokens=(512,)) if r["params"]["routing"] == "uniform"]
    res = write_report([_write_run(tmp_path / "run", rows)], tmp_path / "rep")
    assert not [n for n in res["figures"] if n in ("moe_tokens", "moe_skew")]
    md = res["markdown"].read_text()
    assert "no tokens or skew figure: the tokens figure needs one shape at two or more token counts (measured: T=512)" in md


def test_header_names_the_command_as_typed(tmp_path):
    from commbench.report.sections import command_line

    # A record that kept the interpreter's view of the command reads as the user typed it.
    assert command_line(["/x/commbench/__main__.py", "run", "quick", "--np", "4"]) == "commbench run quick --np 4"
    assert command_line(["/usr/bin/python3", "-m", "commbench", "run", "quick"]) == "commbench run quick"
    run = _write_run(tmp_path / "run", [_row("send_recv", 2, s, 10.0 + s / 1e3) for s in SIZES[:4]])
    meta = (run / "meta.json").read_text().replace('"commbench",', '"/venv/lib/commbench/__main__.py",', 1)
    assert "__main__.py" in meta
    (run / "meta.json").write_text(meta)
    md = write_report([run], tmp_path / "rep")["markdown"].read_text()
    assert "command: commbench run fixture --np 4" in md and "__main__" not in md
