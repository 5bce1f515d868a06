"""What summaries rest verdicts on: rows without warnings, disturbance or oversubscription;
variants that leave a collective alone are 'no change expected'; repeats that disagree
cannot be judged."""
from __future__ import annotations

import pandas as pd
import pytest

from commbench.analyse.verdicts import changes_algorithm, faster_at_size, untrusted_reason
from commbench.report.variants_view import variant_comparisons
from commbench.run.variants import BUILTIN
from conftest import make_row, needs_mpi

SIZES = [1024, 65536, 1 << 20]


def _row(bench, variant, nbytes, p50, repeat=1, **kw):
    # Each repeat of each variant a launch of its own, the variants alternating repeat by
    # repeat: the launch id's time orders them so, as `run --np N --repeat 3` does.
    launch = f"7-{repeat * 100 + sorted(BUILTIN).index(variant)}"
    return {"launch": launch, "run": "r", "benchmark": bench, "backend": "mpi", "device": "cpu", "world": 2, "nbytes": nbytes,
            "dtype": "float32", "placement": "out-of-place", "variant": variant, "params": {}, "stage": "",
            "variant_env": BUILTIN[variant].env, "inswitch": False, "time_us_p50": p50, "time_us_p90": p50 * 1.02,
            "algbw_gbps": nbytes / p50 / 1e3, "busbw_gbps": nbytes / p50 / 1e3, "repeat": repeat, **kw}


def _lines(rows):
    (c,) = [c for c in variant_comparisons(pd.DataFrame(rows), "ompi-ring")]
    return {v[0]: v for v in c["verdicts"]}, c["lines"]


def test_which_variant_changes_which_collective():
    ring = BUILTIN["ompi-ring"].env
    assert changes_algorithm(ring, "all_reduce") is True and changes_algorithm(ring, "reduce_scatter") is False
    assert changes_algorithm(BUILTIN["ompi-rabenseifner"].env, "all_gather") is False
    assert changes_algorithm(BUILTIN["nccl-ring"].env, "all_gather") is None  # NCCL_ALGO: measured, not assumed


def test_a_variant_that_leaves_the_collective_alone_is_no_change_expected():
    rows = [_row("reduce_scatter", v, s, 10.0 * k, rep) for rep in (1, 2, 3) for s in SIZES
            for v, k in (("ompi-ring", 3.0), ("default", 1.0), ("ompi-recursive-doubling", 1.0))]
    verdicts, lines = _lines(rows)
    assert verdicts["default"][1] is None and "no change expected: neither changes reduce_scatter" in verdicts["default"][4]
    # recursive doubling forces reduce_scatter_block's algorithm: judged, and 3x is clear here.
    assert verdicts["ompi-recursive-doubling"][1] == 3.0
    rows = [_row("all_gather", v, s, 10.0 * k) for s in SIZES for v, k in (("ompi-ring", 3.0), ("ompi-rabenseifner", 1.0))]
    verdicts, _ = _lines(rows)
    assert verdicts["ompi-rabenseifner"][1] is None
    assert "ompi-rabenseifner leaves all_gather at the library's default" in verdicts["ompi-rabenseifner"][4]


def test_warned_rows_are_never_the_best_and_repeats_that_disagree_cannot_judge():
    # Fastest at 1M, but one repeat of that row ran disturbed: the best is taken from the other sizes.
    rows = [r for rep in (1, 2, 3) for r in [_row("all_reduce", "ompi-ring", s, 30.0, rep) for s in SIZES] +
            [_row("all_reduce", "ompi-recursive-doubling", s, p, rep) for s, p in zip(SIZES, (20.0, 15.0, 3.0))]]
    rows[5].update(disturbed=True, warning="disturbed: a rank waited for a CPU 50 % of the point's time")
    verdicts, lines = _lines(rows)
    assert verdicts["ompi-recursive-doubling"][1] == 2.0 and verdicts["ompi-recursive-doubling"][2] == 65536
    assert "1 row(s) not usable" in verdicts["ompi-recursive-doubling"][4]
    # Three repeats each: the variant is 1.5x faster in repeat 1 and 2, slower in repeat 3, at every size.
    rows = []
    for rep, k in ((1, 1.5), (2, 1.5), (3, 0.8)):
        rows += [_row("all_reduce", "ompi-ring", s, 30.0, rep) for s in SIZES]
        rows += [_row("all_reduce", "ompi-recursive-doubling", s, 30.0 / k, rep) for s in SIZES]
    verdicts, _ = _lines(rows)
    v = verdicts["ompi-recursive-doubling"]
    assert v[1] is None and v[4].startswith("cannot judge: at no size clearly faster or slower in every pair")
    assert "3 interleaved repeats" in v[4] and "at 3 size(s) the pairs disagree" in v[4]
    for r in rows:  # all three repeats agree: judged faster
        if r["variant"] != "ompi-ring" and r["repeat"] == 3:
            r.update(time_us_p50=25.0, time_us_p90=25.5)
    verdicts, _ = _lines(rows)
    assert verdicts["ompi-recursive-doubling"][1] == 1.5


def test_untrusted_reasons():
    assert untrusted_reason({"oversubscribed": True, "ranks_per_core": 2.0}) == "oversubscribed (2 ranks per core)"
    assert untrusted_reason({"disturbed": "True"}) == "disturbed while it ran"
    assert untrusted_reason({"warning": "calibration missed"}) == "carries a warning"
    assert untrusted_reason({"warning": float("nan"), "disturbed": False}) == ""
    b = [_row("all_reduce", "ompi-ring", 8, 10.0, k) for k in (1, 2)]
    assert faster_at_size(b, [_row("all_reduce", "default", 8, 5.0, k) for k in (1, 2)]) is True
    assert faster_at_size(b, [_row("all_reduce", "default", 8, 20.0, k) for k in (1, 2)]) is False
    # Both repeats point the same way, but one only inside the spread of its own iterations
    # (p90 above the baseline's p50): not evidence of a speedup.
    v = [_row("all_reduce", "default", 8, 5.0, 1), _row("all_reduce", "default", 8, 9.9, 2, time_us_p90=10.5)]
    assert faster_at_size(b, v) is None


def test_overlap_best_is_never_a_warned_or_impossible_row():
    from commbench.report.overlap_view import findings

    def ov(nbytes, pct, t_overall, t_compute, **kw):
        return {"run": "r", "benchmark": "overlap", "world": 2, "nbytes": nbytes, "mode": "single",
                "overlap_osu_pct": pct, "t_overall_us": t_overall, "t_compute_us": t_compute, "warning": None, **kw}

    rows = [ov(1 << 20, 100.0, 900.0, 1000.0),  # overall shorter than the compute alone: noise
            ov(4 << 20, 95.0, 1100.0, 1000.0, oversubscribed=True, ranks_per_core=2.0),
            ov(25 << 20, 40.0, 1500.0, 1000.0)]
    (f,) = findings(pd.DataFrame(rows))
    assert f.value.startswith("best 40% at 25M") and "1 row(s) finished before the compute alone" in f.value
    assert "1 oversubscribed" in f.value and f.verdict.startswith("partly hidden") and "rests on 1 row(s)" in f.verdict
    rows[2]["disturbed"] = True
    (f,) = findings(pd.DataFrame(rows))
    assert f.verdict.startswith("cannot judge the overlap") and "hidden behind" not in f.verdict


def test_overlap_with_repeats_rests_on_the_lowest_repeat_and_cannot_judge_across_the_bounds():
    """`run --repeat 3`: a point stands for the lowest overlap of its repeats; the best point
    is the one whose lowest is highest; repeats spread across 80 % at that point: cannot judge."""
    from commbench.report.overlap_view import findings

    def ov(nbytes, pct, rep, polls=0):
        return {"run": "r", "benchmark": "overlap", "world": 2, "nbytes": nbytes, "mode": "single", "repeat": rep,
                "params": {"polls": polls}, "overlap_osu_pct": pct, "t_overall_us": 1500.0,
                "t_compute_us": 1000.0, "warning": None}

    # 1M: 90 92 85 (every repeat hidden); 4M: 99 40 97 (one repeat only partly: its lowest is 40).
    rows = [ov(1 << 20, x, k + 1) for k, x in enumerate((90.0, 92.0, 85.0))] + \
           [ov(4 << 20, x, k + 1) for k, x in enumerate((99.0, 40.0, 97.0))]
    (f,) = findings(pd.DataFrame(rows))
    assert f.value.startswith("best 85% at 1M (the lowest of 3 repeats; they spread 85..92%)"), f.value
    assert f.verdict.startswith("communication hidden behind the compute") and "lowest of their interleaved" in f.verdict
    # Two points of one size, told apart by the parameter that varies.
    rows = [ov(1 << 20, x, k + 1) for k, x in enumerate((90.0, 92.0, 85.0))] + \
           [ov(1 << 20, x, k + 1, polls=8) for k, x in enumerate((99.0, 40.0, 97.0))]
    (f,) = findings(pd.DataFrame(rows))
    assert f.value.startswith("best 85% at 1M polls=0 (the lowest of 3 repeats"), f.value
    # Now 1M's repeats disagree across 80 %: 95 70 96.
    rows = [ov(1 << 20, x, k + 1) for k, x in enumerate((95.0, 70.0, 96.0))] + \
           [ov(4 << 20, x, k + 1) for k, x in enumerate((50.0, 40.0, 45.0))]
    (f,) = findings(pd.DataFrame(rows))
    assert f.verdict.startswith("cannot judge the overlap: its repeats at 1M spread 70..96%"), f.verdict
    assert "hidden behind" not in f.verdict.split("(")[0]


def test_the_planted_slowdown_hook(monkeypatch):
    """commbench/plant.py: only named points, a spin of the agreed median op time x pct."""
    import time
    from types import SimpleNamespace

    import numpy as np
    import pytest

    from commbench.core.errors import UsageError
    from commbench.run import plant

    point = SimpleNamespace(benchmark="all_reduce", dtype="float32", nbytes=4096)
    monkeypatch.delenv(plant.POINTS_ENV, raising=False)
    assert plant.planted_pct(point) is None
    monkeypatch.setenv(plant.POINTS_ENV, "all_reduce:float32:8,all_reduce:float32:4096")
    monkeypatch.setenv(plant.PCT_ENV, "50")
    assert plant.planted_pct(point) == 50.0
    assert plant.planted_pct(SimpleNamespace(benchmark="all_reduce", dtype="float16", nbytes=4096)) is None
    monkeypatch.setenv(plant.PCT_ENV, "-3")
    with pytest.raises(UsageError):
        plant.planted_pct(point)

    def busy(s=2e-3):
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    class Comm:
        def barrier(self):
            pass

        def max_over_ranks(self, v):
            return np.asarray(v) * 1.5  # a slower peer: its median decides

        def time_ops(self, op, n):
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                op()
                out.append(time.perf_counter() - t0)
            return np.array(out)

    class Measured(Comm):
        def time_ops(self, op, n):  # the hook's own measurement of the op: 2 ms each
            return np.full(n, 2e-3)

    # The spin is the agreed median (the slower peer's 3 ms) x 50 %: 1.5 ms after each op.
    # A busy host can only add to the time, so the bound below is exact and the one above loose.
    slowed = plant.wrap(lambda: busy(1e-3), 50.0, Measured())
    t = Comm().time_ops(slowed, 20)
    assert np.min(t) >= 1e-3 + 1.5e-3 and np.median(t) < 1e-3 + 1.5e-3 + 0.02
    plain = plant.wrap(lambda: busy(1e-3), 0.0, Measured())
    assert not hasattr(plain, "compiled_loop") and 1e-3 <= np.min(Comm().time_ops(plain, 10)) < 2.5e-3


def test_scaling_with_repeats_judges_only_what_every_repeat_agrees_on():
    """The report's weak-scaling line of a `--repeat 2` run: repeats whose medians fall under
    different words (95 % vs 60 %) cannot judge; repeats that agree give the verdict and say
    what it rests on."""
    from commbench.report.sections import scaling_section

    def rows(eff_by_rep):
        out = []
        for rep, eff in eff_by_rep.items():
            for w, bw in ((2, 10.0), (4, 10.0 * eff / 100)):
                out.append(make_row("all_reduce", w, 1 << 20, 100.0, busbw_gbps=bw, run="r", repeat=rep,
                                    busbw_factor=1.0))
        return pd.DataFrame(out)

    sec = scaling_section(rows({1: 95.0, 2: 60.0}), {})
    (f,) = sec.findings
    assert f.verdict.startswith("cannot judge: the repeats disagree") and "60..95%" in f.verdict, f.verdict
    sec = scaling_section(rows({1: 95.0, 2: 93.0}), {})
    (f,) = sec.findings
    assert f.verdict.startswith("scales: per-rank throughput holds") and "median of 2 interleaved repeats" in f.verdict


def _ab_gate() -> list[str]:
    import sys

    from conftest import ROOT

    return [sys.executable, str(ROOT / "tools" / "ab_gate.py")]


@needs_mpi
@pytest.mark.multirank
@pytest.mark.slow  # nine 2-rank runs and two compares: 40 s on 2 cores; the refusals below stay in `make test`
def test_the_ab_gate_script_runs_a_round(tmp_path):
    """tools/ab_gate.py end to end on a 3-point sweep (one round: nine 2-rank runs, two
    compares): its record of the round. Whether it catches the planted points on this host
    is what `make ab-gate` measures, not a test."""
    import json
    import subprocess

    from conftest import ROOT

    gate = _ab_gate()
    named = "all_reduce:float32:4096,all_reduce:float32:16384,all_reduce:float32:65536,all_reduce:float16:512"
    p = subprocess.run(gate + ["--rounds", "1", "--sizes", "4096,16384,65536", "--dtypes", "float32",
                               "--planted", named, "--run-repeat", "2", "--min-time-ms", "5",
                               "--out", str(tmp_path / "g")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    (rec,) = [json.loads(x) for x in open(tmp_path / "g" / "rounds.jsonl")]
    assert rec["same_exit"] in (0, 1, 3) and rec["planted_exit"] in (0, 1, 3)  # 3: inconclusive
    assert sorted(rec["order"]) == sorted(f"{s}{i}" for s in "ABP" for i in (1, 2, 3))
    assert set(rec["planted_found"]) <= {"all_reduce:float32:4096", "all_reduce:float32:16384",
                                         "all_reduce:float32:65536"}
    assert set(rec["planted_cannot_judge"]) <= {"all_reduce:float32:4096", "all_reduce:float32:16384",
                                                "all_reduce:float32:65536"}
    assert "planted 20 % on 3 points" in p.stdout and "nothing slower (compare exit 0 or 3) in" in p.stdout and (tmp_path / "g" / "round01" / "planted.csv").is_file()


@pytest.mark.multirank
def test_the_ab_gate_script_refuses_what_could_find_nothing(tmp_path):
    import subprocess

    from conftest import ROOT

    gate = _ab_gate()
    for args, words in ((["--sizes", "8,16"], "no planted point"), (["--sizes", "x"], "--sizes"),
                        (["--rounds", "0"], "--rounds"), (["--planted", "all_reduce:float32"], "--planted")):
        p = subprocess.run(gate + args + ["--out", str(tmp_path / "bad")], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_the_latency_line_of_a_repeated_run_rests_on_each_points_fastest_repeat():
    from commbench.report.sections import collective_findings

    rows = [make_row("all_reduce", 2, 8, p50, run="r", repeat=k) for k, p50 in ((1, 9.0), (2, 3.0), (3, 7.5))]
    rows += [make_row("all_reduce", 2, 1024, 20.0, run="r", repeat=k) for k in (1, 2, 3)]
    (lat,) = [f for f in collective_findings("all_reduce", pd.DataFrame(rows), False, {"r": 1.0})
              if f.measure == "small-message latency"]
    assert "3.000 us at 8 B (n=2; the fastest of 3 repeats, 3.000..9.000 us)" in lat.value, lat.value
    assert lat.verdict.startswith("3.0x the latency floor") and "the fastest of each point's interleaved repeats" in lat.verdict
