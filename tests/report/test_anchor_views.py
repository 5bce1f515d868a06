"""Results in the shapes other tools' users read: params as pandas columns, the MoE stage
view, nccl-tests' and OSU's tables, MoE's refusals and progress lines."""
from __future__ import annotations

import json

import pytest

import commbench
from conftest import FIXTURES, make_row


def _moe_row(copies, stage, p50, world=2, tokens=256):
    params = {"tokens": tokens, "hidden": 7168, "experts": 256, "topk": 8, "copies": copies, "routing": "uniform"}
    return make_row("moe", world, 1000, p50, dtype="fp8", placement=None, params=params, stage=stage,
                    time_us_p99=p50 * 1.5,
                    point_key=f"default|moe|{world}|0|float32|{json.dumps(params, sort_keys=True)}|{stage}")


def test_load_flattens_params_into_columns(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [_moe_row("rank", "dispatch", 100.0), _moe_row("rank", "combine", 300.0),
            _moe_row("expert", "dispatch", 200.0), _moe_row("expert", "combine", 700.0)]
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = commbench.load(run)
    assert {"moe.tokens", "moe.copies", "moe.routing"} <= set(df.columns)
    assert isinstance(df["params"].iloc[0], dict)  # the dict column stays
    mean = df.groupby("moe.copies")["time_us_p50"].mean()
    assert mean.to_dict() == {"expert": 450.0, "rank": 200.0}
    assert df.pivot_table(index="moe.copies", columns="stage", values="time_us_p50").loc["rank", "combine"] == 300.0


def _points(raw, world=2):
    from commbench.run import suite as suite_mod

    cfg = suite_mod.build_config(dict(raw, name="t"))
    points, _ = suite_mod.expand(cfg, world, ("float32",))
    return cfg, points


MOE_SMALL = {"benchmarks": ["moe"], "worlds": [2], "params": {"moe": {"tokens": 4096, "copies": ["rank", "expert"]}}}


def test_moe_progress_lines_show_no_size_or_dtype():
    from commbench.report.progress import Progress
    from commbench.run.plan import point_seconds

    cfg, points = _points(MOE_SMALL, world=4)
    pr = Progress(points, enabled=False, weight_s=lambda p: point_seconds(cfg, p))
    labels = sorted(pr.label(p) for p in points)
    assert labels == ["moe w2 copies=expert", "moe w2 copies=rank"]


def test_moe_memory_refusal_names_the_moe_knobs_and_the_points_ranks(monkeypatch):
    import pytest

    from commbench.core.errors import UsageError
    from commbench.run import plan as plan_mod

    cfg, points = _points(MOE_SMALL, world=4)
    need = max(plan_mod.plan(cfg, points, 4, "gpu")[i]["mem_nbytes"] for i in range(len(points)))
    # Room for 2 ranks of the largest point but not 4: the 2-rank point fits in a 4-rank launch.
    monkeypatch.setattr(plan_mod, "_mem_available_nbytes", lambda: 3 * need)
    plan_mod.plan(cfg, points, 4, "cpu")
    monkeypatch.setattr(plan_mod, "_mem_available_nbytes", lambda: need)
    with pytest.raises(UsageError) as e:
        plan_mod.plan(cfg, points, 4, "cpu")
    msg = str(e.value)
    assert "for 2 ranks" in msg and "--param moe.tokens" in msg and "MOE_TOKENS" in msg
    assert "sizes" not in msg


def _staged(copies, stage, p50, stages, tokens=256, world=2, remote=1.0, logical=2.0, out=0.0):
    r = _moe_row(copies, stage, p50, world=world, tokens=tokens)
    r.update({f"stage_us_{k}": v for k, v in stages.items()})
    r.update(remote_gbps=remote, logical_gbps=logical, scaleup_gbps=remote - out, scaleout_gbps=out,
             load_max_over_mean=1.0, hottest_rank=0, run="r")
    return r


STAGED = [_staged("rank", "dispatch", 500.0, {"layout": 120.0, "counts": 30.0, "pack": 25.0, "a2a": 320.0},
                  remote=3.9, logical=7.9),
          _staged("rank", "combine", 4800.0, {"pack": 60.0, "a2a": 1450.0, "reduce": 3200.0}, remote=0.77,
                  logical=1.54),
          _staged("expert", "dispatch", 4100.0, {"layout": 370.0, "pack": 260.0, "a2a": 3440.0}),
          _staged("expert", "combine", 23000.0, {"pack": 180.0, "a2a": 9900.0, "reduce": 16100.0})]


def test_moe_table_shows_both_rates_the_tier_split_and_what_decides():
    import io

    from rich.console import Console

    from commbench.report.terminal import print_tables

    c = Console(file=io.StringIO(), width=240, color_system=None)
    print_tables(STAGED, console=c, wide=False)
    out = c.file.getvalue()
    flat = " ".join(out.split())
    for head in ("ours", "DeepEP", "scale-up", "scale-out", "decided", "tokens/s", "(GB/s)"):
        assert head in flat, head
    assert "reduce 67%" in out and "a2a 64%" in out  # 3200/4800, 320/500
    assert "7.90" in out and "3.90" in out  # both GB/s of the rank-copies dispatch


def test_moe_summary_names_the_deciding_stage_and_the_stage_figure_is_drawn(tmp_path):
    from commbench.commands.report import write_report

    run = tmp_path / "r"
    run.mkdir()
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STAGED))
    res = write_report([run], tmp_path / "out")
    assert "moe_stages" in res["figures"] and res["figures"]["moe_stages"].is_file()
    moe = {f.measure: f for f in res["findings"] if f.topic == "moe"}
    assert "reduce outside the exchange decides" in moe["combine (n=2)"].verdict
    assert "exchange (a2a) decides" in moe["dispatch (n=2)"].verdict
    assert "GB/s DeepEP" in moe["dispatch (n=2)"].value and "GB/s ours" in moe["dispatch (n=2)"].value
    # Noise-close stages are named together, never one picked by a coin toss.
    close = _staged("rank", "combine", 1000.0, {"a2a": 450.0, "reduce": 420.0})
    from commbench.report.moe_view import deciding

    assert deciding(close)[0] == ["a2a", "reduce"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.index("reduce outside the exchange decides") < html.index("<figure")  # the answer first


def _data_lines(text_):
    return [ln for ln in text_.splitlines() if ln.strip() and not ln.startswith("#") and ln.lstrip()[0].isdigit()]


def test_imported_nccl_tests_file_reads_as_nccl_tests_printed_it(tmp_path):
    from commbench.report.styles import NCCL_HEADER, nccl_tests_lines
    from commbench.store.importers import import_to_run

    for name in ("nccl_all_reduce_8gpu.txt", "nccl_alltoall_8gpu.txt"):
        src = (FIXTURES / name).read_text()
        out, _ = import_to_run([FIXTURES / name], tmp_path / name)
        lines = nccl_tests_lines(commbench.load(out).to_dict("records"))
        ours = [ln for ln in lines if not ln.startswith("#")]
        # The importer keeps no 0-byte point (alltoall's first line): every other line, as printed.
        assert ours == [ln for ln in _data_lines(src.split("# Out of bounds")[0]) if ln.split()[0] != "0"]
        head = [ln.rstrip() for ln in src.splitlines() if ln.startswith("#  ") and ("size" in ln or "(B)" in ln)]
        assert [h.rstrip() for h in NCCL_HEADER[1:]] == head
        assert "# Out of bounds values : 0 OK" in lines
        if name.startswith("nccl_all_reduce"):
            avg = [ln for ln in lines if ln.startswith("# Avg bus bandwidth")][0]
            # The mean over both placements of the printed busbw (nccl-tests' 76.1415 averages unrounded ones).
            assert abs(float(avg.split(":")[1]) - 76.1415) < 0.005


def test_osu_style_prints_size_avg_min_max_iterations(tmp_path):
    from commbench.report.styles import OSU_HEADER, osu_lines
    from commbench.store.importers import import_to_run

    src = (FIXTURES / "osu_allreduce_f.txt").read_text()
    out, _ = import_to_run([FIXTURES / "osu_allreduce_f.txt"], tmp_path / "osu", world=4)
    lines = osu_lines(commbench.load(out).to_dict("records"))
    assert OSU_HEADER in lines
    assert [ln for ln in lines if not ln.startswith("#")] == _data_lines(src)
    # A measured row: mean, min and max of its own samples.
    r = {"benchmark": "all_reduce", "backend": "mpi", "device": "cpu", "world": 2, "dtype": "float32", "nbytes": 8,
         "params": {}, "time_us_mean": 2.5, "time_us_min": 1.25, "time_us_max": 9.0, "iters": 40}
    assert "8                     2.50              1.25              9.00          40" in osu_lines([r])


@pytest.mark.multirank
def test_run_style_nccl_tests_measures_both_placements_on_one_line(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "commbench", "run", "-b", "all_reduce,all_gather", "--sizes", "64,1K",
                        "--np", "2", "--backend", "mpi", "--iters", "5", "--warmup", "1", "--style", "nccl-tests",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    ar = lines[lines.index(next(ln for ln in lines if "commbench all_reduce" in ln)):]
    rows = _data_lines("\n".join(ar[:12]))[:2]
    # Both halves timed (no --check: #wrong is N/A, as nccl-tests prints it unchecked).
    assert len(rows) == 2 and all(float(ln.split()[5]) > 0 and float(ln.split()[9]) > 0 for ln in rows)
    ag = lines[lines.index(next(ln for ln in lines if "commbench all_gather" in ln)):]
    assert all(ln.split()[-4:] == ["N/A"] * 4 for ln in _data_lines("\n".join(ag[:12]))[:2])  # no in-place
    assert any(ln.startswith("# Avg bus bandwidth") for ln in lines)
    df = commbench.load(out)
    assert sorted(df[df["benchmark"] == "all_reduce"]["placement"].unique()) == ["in-place", "out-of-place"]
    # Told otherwise, one placement.
    from commbench.run import suite as suite_mod

    assert suite_mod.placements_of(suite_mod.build_config({"benchmarks": ["all_reduce"], "in_place": True})) == (True,)


def test_a_size_column_has_one_format():
    from commbench.report.fmt import size_cells

    assert size_cells([8, 1024, 4 << 20]) == ["8", "1K", "4M"]
    # One size that no binary unit divides: the whole column in bytes, never "7154K" beside "15708000".
    assert size_cells([7154 << 10, 15708000]) == ["7325696", "15708000"]


def _compare_frame():
    import pandas as pd

    rows = []
    for nbytes in (7154 << 10, 15708000):
        rows.append({"benchmark": "all_reduce", "backend": "mpi", "world": 2, "nbytes": nbytes, "dtype": "float32",
                     "variant": "default", "placement": "out-of-place", "params": "{}", "stage": "",
                     "base_p50_us": 10.0, "new_p50_us": 10.0, "change_pct": 0.0, "verdict": "not significant",
                     "caveat": False, "base_runs": 1, "new_runs": 1, "base_ci_lo": 9.0, "base_ci_hi": 11.0,
                     "new_ci_lo": 9.0, "new_ci_hi": 11.0, "base_busbw_gbps": 1.0, "new_busbw_gbps": 1.0,
                     "busbw_change_pct": 0.0, "change_lo_pct": float("nan"), "change_hi_pct": float("nan"),
                     "base_run_p50s_us": "10", "new_run_p50s_us": "10", "only_in": ""})
    return pd.DataFrame(rows)


def test_compare_and_tables_name_units_and_keep_one_size_format():
    import io

    from rich.console import Console

    from commbench.report.compare_view import print_compare

    c = Console(file=io.StringIO(), width=240, color_system=None)
    try:
        print_compare(_compare_frame(), console=c, all_points=True, wide=True)
    except KeyError as e:  # the frame's columns follow compare_runs; say which one this test lacks
        raise AssertionError(f"compare frame lacks {e}") from None
    out = c.file.getvalue()
    assert "size (B)" in out and "7325696" in out and "7154K" not in out
    assert "busbw base (GB/s)" in out


def test_overlap_table_counts_buckets_as_integers_and_names_units():
    import io

    from rich.console import Console

    from commbench.report.terminal import print_tables

    row = {"benchmark": "overlap", "backend": "mpi", "device": "cpu", "world": 2, "nbytes": 1 << 20,
           "dtype": "float32", "params": {"mode": "sequence", "buckets": 8}, "mode": "sequence", "buckets": 8.0,
           "progress": "polls", "polls": 4, "time_us_p50": 10.0, "time_us_p99": 12.0, "t_comm_us": 5.0,
           "t_compute_us": 6.0, "t_overall_us": 8.0, "overlap_osu_pct": 50.0, "check": "ok", "run": "r"}
    c = Console(file=io.StringIO(), width=240, color_system=None)
    print_tables([row], console=c, wide=True)
    out = c.file.getvalue()
    assert "sequence x8 " in out and "x8.0" not in out
    for head in ("size (B)", "t_comm", "t_overall", "OSU"):  # two-line headers: "t_comm" over "(us)"
        assert head in out, head


def test_moe_progress_line_gives_our_rate_not_busbw(monkeypatch, capsys):
    from commbench.report.progress import Progress
    from commbench.run.plan import point_seconds

    monkeypatch.setenv("COMMBENCH_TTY", "0")
    cfg, points = _points(MOE_SMALL, world=2)
    pr = Progress(points, enabled=True, weight_s=lambda p: point_seconds(cfg, p))
    rows = [{"stage": s, "time_us_p50": 480.0, "busbw_gbps": 3.9, "remote_gbps": 3.94, "check": "ok"}
            for s in ("dispatch", "combine")]
    pr.update(points[0], rows)
    line = capsys.readouterr().out
    assert "dispatch 480.00 us 3.940 GB/s ours" in line and "busbw" not in line and "float32" not in line


def test_moe_summary_comes_first_beside_other_benchmarks(tmp_path):
    from commbench.commands.report import write_report

    ar = make_row("all_reduce", 2, 1024, 5.0, time_us_p99=6.0, algbw_gbps=0.2, busbw_gbps=0.2, point_key="ar")
    run = tmp_path / "r"
    run.mkdir()
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [ar] + STAGED))
    md = write_report([run], tmp_path / "out")["markdown"].read_text()
    summary = md[md.index("## Summary"):]
    assert summary.index("| moe |") < summary.index("| all_reduce |")


def test_style_and_placement_flags_refuse_bad_input_in_one_line(capsys):
    from commbench.cli import main

    assert main(["report", "nowhere", "--style", "imb"]) == 2
    assert main(["run", "quick", "--np", "2", "--in-place", "--placement", "both", "--dry-run"]) == 2
    err = capsys.readouterr()
    text_ = err.out + err.err
    assert "placement = both disagree" in text_ and "Traceback" not in text_


def test_deciding_share_never_passes_the_whole_step():
    from commbench.report.moe_view import deciding

    # Medians of the sub-stages can add up to more than the step's p50: the share is of their sum then.
    r = _staged("rank", "combine", 62388.0, {"pack": 2000.0, "a2a": 33000.0, "reduce": 31000.0})
    names, share = deciding(r)
    assert names == ["a2a", "reduce"] and 90 < share <= 100


def test_wide_collective_table_shows_min_and_max():
    import io

    from rich.console import Console

    from commbench.report.terminal import print_tables

    r = {"benchmark": "all_reduce", "backend": "mpi", "device": "cpu", "world": 2, "nbytes": 1024,
         "dtype": "float32", "placement": "out-of-place", "params": {}, "time_us_p50": 5.0, "time_us_p99": 7.0,
         "time_us_min": 4.25, "time_us_max": 31.5, "algbw_gbps": 0.2, "busbw_gbps": 0.2, "check": "ok", "iters": 9}
    c = Console(file=io.StringIO(), width=240, color_system=None)
    print_tables([r], console=c, wide=True)
    out = c.file.getvalue()
    assert "min (us)" in out and "max (us)" in out and "4.25" in out and "31.50" in out


@pytest.mark.multirank
def test_both_placements_on_a_backend_with_one_measure_it_once(tmp_path):
    import subprocess
    import sys

    from commbench.run.point_harness import describe_point

    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "commbench", "run", "-b", "all_reduce", "--sizes", "64", "--np", "2",
                        "--backend", "gloo", "--iters", "3", "--warmup", "1", "--placement", "both", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    df = commbench.load(out)
    # torch.distributed's all_reduce works in place only: one point, said as such, not two of one key.
    assert list(df["placement"]) == ["in-place"]
    cfg, points = _points({"benchmarks": ["all_reduce"], "sizes": ["64"], "placement": "both"})
    assert sorted(describe_point(pt) for pt in points) == ["all_reduce 64 float32 in-place world 2",
                                                     "all_reduce 64 float32 world 2"]
