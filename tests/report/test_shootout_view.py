"""The dispatcher shoot-out in the report (report/shootout_view.py): the verdict lines
first, the ranked tables, the skipped dispatchers, the heatmap, and the terminal block."""
from __future__ import annotations

from pathlib import Path

import pytest

from commbench.report import shootout_view as V
from commbench.store.results import RunDir, Status
from conftest import make_row, needs_mpi, run_cli, run_meta, run_rows

BASE = {"tokens": 64, "hidden": 256, "experts": 8, "topk": 2, "routing": "uniform", "alpha": 1.0, "ratio": 2.0,
        "seed": 0, "copies": "rank", "mode": "normal", "path": "flat", "capacity": 0}
SKIPPED = [{"point_key": "k", "benchmark": "moe", "params": {**BASE, "dispatcher": "deepep"},
            "reason": "needs a CUDA device and deep_ep"}]


def launch(k: int) -> str:
    return f"{1000 + k}-{1_700_000_000_000_000_000 + k * 10**9}"


def rows_of(disp, d_us, c_us, reps=3, mode="normal", **params):
    p = {**BASE, **params, "dispatcher": disp, "mode": mode}
    out = []
    for k in range(1, reps + 1):
        for stage, us, dt in (("dispatch", d_us, "fp8"), ("combine", c_us, "bf16")):
            out.append(make_row("moe", 2, 0, us, spread_pct=5.0, params=p, stage=stage, dtype=dt, placement=None,
                                run="r", repeat=k, launch=launch(k), logical_nbytes=1000, remote_nbytes=500,
                                logical_gbps=1000 / (us * 1e3), remote_gbps=500 / (us * 1e3), scaleup_gbps=0.1,
                                scaleout_gbps=0.0, load_max_over_mean=1.0, hottest_rank=1,
                                stage_us_a2a=us * 0.6, stage_us_pack=us * 0.2))
    return out


def shootout_rows(reps=3):
    return (rows_of("alltoall", 70.0, 61.0, reps) + rows_of("allgather", 60.0, 40.0, reps)
            + rows_of("alltoall", 30.0, 30.0, reps, routing="zipf", alpha=1.2)
            + rows_of("allgather", 45.0, 45.0, reps, routing="zipf", alpha=1.2)
            + rows_of("low-latency", 20.0, 20.0, reps, mode="low_latency", copies="expert"))


def test_sections_put_the_verdicts_first_then_the_tables_then_how_to_read_them(tmp_path):
    secs = V.sections(shootout_rows(), {"r": {"backend": "mpi", "skipped_points": SKIPPED}}, tmp_path)
    top = secs[0]
    assert top.title == "Dispatcher shoot-out" and top.note == "" and not top.headers
    assert top.bullets == [
        "prefill, mpi n=2: uniform: allgather 1.00, alltoall 1.31x (clearly, 3 repeats in fresh launches)",
        "prefill, mpi n=2: zipf alpha=1.2: alltoall 1.00, allgather 1.50x (clearly, 3 repeats in fresh launches)",
        "decode, mpi n=2: uniform: low-latency 1.00, allgather 2.50x (clearly, 3 repeats in fresh launches)",
        "decode, mpi n=2: zipf alpha=1.2: allgather 1.00 (one dispatcher ran: nothing to rank it against)"]
    prefill, skipped, decode, how = secs[1:]
    assert prefill.title == "prefill (normal mode), mpi, 2 ranks" and decode.title.startswith("decode (low-latency")
    assert prefill.headers == V.HEADERS and prefill.level == 3
    assert [r[:2] + r[4:6] for r in prefill.rows] == [
        ["uniform", "allgather", "100.0", "1.00"], ["", "alltoall", "131.0", "1.31x"],
        ["zipf alpha=1.2", "alltoall", "60.0", "1.00"], ["", "allgather", "90.0", "1.50x"]]
    assert prefill.rows[0][6:] == ["0.020", "0.010", "combine: a2a 13 us"]
    # Under the prefill table (the next section): the dispatcher that could not run there.
    assert (skipped.title, skipped.level, skipped.headers) == ("Not ranked at prefill, mpi n=2", 4, [])
    assert skipped.bullets == ["deepep: skipped (1 point): needs a CUDA device and deep_ep"]
    assert [r[1] for r in decode.rows] == ["low-latency", "allgather", "allgather"]
    assert "its own tokens included (DeepEP's own figure counts them)" in how.note
    assert "the bytes that left the rank" in how.note
    # The heatmap: written, one row per workload and table, a column per dispatcher.
    (fig,) = top.figures
    assert fig.name == "moe_shootout" and Path(fig.path).is_file() and Path(fig.path).stat().st_size > 1000
    ax = fig.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["low-latency", "alltoall", "allgather"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["uniform [prefill]", "zipf alpha=1.2 [prefill]",
                                                            "uniform [decode]", "zipf alpha=1.2 [decode]"]
    assert sorted(t.get_text() for t in ax.texts) == ["1.00"] * 4 + ["1.31", "1.50", "2.50"]


def test_cannot_judge_is_said_in_the_verdict_and_the_summary():
    secs = V.sections(shootout_rows(reps=1), {}, None)
    assert secs[0].figures == []
    assert secs[0].bullets[0].endswith("uniform: allgather 1.00, alltoall 1.31x (cannot judge: one run each; "
                                       "--repeat 3 to judge)")
    f = secs[0].findings[0]
    assert (f.topic, f.measure) == ("moe", "shoot-out, prefill (normal mode), mpi, 2 ranks")
    assert f.value == "allgather lowest median at 1 of 2, alltoall lowest median at 1 of 2 workload(s)"
    assert f.verdict == "cannot judge at any workload: one run each; --repeat 3 to judge"
    clear = V.sections(shootout_rows(), {}, None)[0].findings
    assert [x.verdict for x in clear] == [
        "clearly at 2 of 2 workload(s) (uniform: allgather; zipf alpha=1.2: alltoall)",
        "clearly at 1 of 1 workload(s) (uniform: low-latency)"]


def test_no_section_without_two_dispatchers():
    assert V.sections(rows_of("alltoall", 1.0, 1.0), {}, None) == []
    assert V.terminal_lines(rows_of("alltoall", 1.0, 1.0), {}) == []


def _write_run(path: Path, rows) -> Path:
    rd = RunDir(path).open({"schema": 3, "status": "running", "suite": "moe-shootout", "backend": "mpi",
                            "device": "cpu", "world": 2, "hosts": ["h"] * 2, "skipped_points": SKIPPED,
                            "command": ["commbench", "run", "moe-shootout", "--np", "2"]})
    for r in rows:
        rd.append({k: v for k, v in r.items() if k != "run"})
    rd.finish(Status.COMPLETE)
    return path


def test_report_and_terminal_show_the_shootout(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from commbench.commands.report import report_runs, write_report

    run = _write_run(tmp_path / "run", shootout_rows())
    res = write_report([run], tmp_path / "rep")
    md = res["markdown"].read_text()
    assert md.index("## Dispatcher shoot-out") < md.index("### prefill (normal mode), mpi, 2 ranks") \
        < md.index("| uniform | allgather |") < md.index("- deepep: skipped (1 point)") \
        < md.index("### decode (low-latency mode)") < md.index("## MoE dispatch / combine")
    head = md[md.index("## Dispatcher shoot-out"):md.index("### prefill")]
    assert head.index("uniform: allgather 1.00, alltoall 1.31x (clearly") < head.index("figures/moe_shootout.png")
    assert "deepep: skipped (1 point): needs a CUDA device and deep_ep" in md
    assert res["figures"]["moe_shootout"].is_file()
    assert "Dispatcher shoot-out" in res["html"].read_text()
    report_runs([run])
    out = capsys.readouterr().out
    assert "dispatcher shoot-out:" in out
    assert "    zipf alpha=1.2: alltoall 1.00, allgather 1.50x (clearly, 3 repeats in fresh launches)" in out
    assert "    deepep: skipped (1 point): needs a CUDA device and deep_ep" in out


@pytest.mark.slow  # a launch whose plumbing the in-process tests cover: make test-slow
@pytest.mark.multirank
@needs_mpi
def test_a_run_with_repeats_ends_with_the_shootout_block_of_its_real_rows(tmp_path):
    out = tmp_path / "run"
    p = run_cli("run", "moe", "--backend", "mpi", "--np", 2, "--param", "moe.tokens=16", "--param", "moe.hidden=256",
                "--param", "moe.experts=8", "--param", "moe.topk=2", "--param",
                "moe.dispatcher=deepep-normal,mpi-alltoallv,low-latency", "--iters", 3, "--repeat", 3, "--out", out)
    assert p.returncode == 0, p.stderr
    tail = p.stdout[p.stdout.index("dispatcher shoot-out:"):]
    assert "  prefill (normal mode), mpi, 2 ranks:" in tail and "  decode (low-latency mode), mpi, 2 ranks:" in tail
    line = next(ln for ln in tail.splitlines() if ln.startswith("    uniform: "))
    assert {"deepep-normal", "mpi-alltoallv"} <= set(line.replace(",", " ").split())
    # Noise decides which verdict a loaded host gets; that it is one of the two, on its evidence, does not.
    assert "(clearly, 3 repeats in fresh launches" in line or "(cannot judge: " in line
    assert "    low-latency: skipped (1 point): runs on the device path (gloo, nccl)" in tail
    rows, meta = run_rows(out), run_meta(out)
    assert len({r["launch"] for r in rows}) == 3 and {r["check"] for r in rows} == {"ok"}
    assert len(meta["skipped_points"]) == 3  # one per repeat: counted once as a point
