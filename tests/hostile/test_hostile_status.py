"""A run's status is the truth about all of its rows, a gate that compared nothing does not
pass, and numbers that cannot be are refused: resume, --out of an existing run, repeated
sweep values, compare with nothing in common, impossible times, unphysical fits and model
shapes."""
from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest

from commbench.analyse import analysis as an
from commbench.store.load import load
from commbench.store.results import RunDir, Status
from conftest import make_row, needs_mpi, run_cli, run_meta, run_rows, starts_processes

RUN = ["quick", "--np", "2", "--backend", "mpi", "-b", "all_reduce", "--sizes", "8,16", "--iters", "3",
       "--warmup", "1", "--check"]


def _meta(out):
    return run_meta(out)


def _rows(out):
    return run_rows(out)


def _one_line(r, words):
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error:"), r.stderr
    assert words in lines[0], lines[0]


@pytest.fixture(scope="module")
@starts_processes
def complete_run(tmp_path_factory):
    """A finished two-point mpi run (8 and 16 B all_reduce, checked), made once."""
    out = tmp_path_factory.mktemp("base") / "run"
    r = run_cli("run", *RUN, "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _stopped(complete_run, dst, first_check="ok"):
    """A copy of the run as if a hang had stopped it after its first point."""
    shutil.copytree(complete_run, dst)
    rows = _rows(dst)[:1]
    rows[0]["check"] = first_check
    (dst / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = _meta(dst)
    meta.update(status="failed", reason="timeout: no progress for 3 s")
    meta["variants"]["default"]["status"] = "failed"
    (dst / "meta.json").write_text(json.dumps(meta))
    (dst / "results.csv").unlink(missing_ok=True)
    return dst


# ------------------------------------------------------------------ status and rows


@needs_mpi
@pytest.mark.multirank
def test_resume_decides_the_status_from_every_row_of_the_run(complete_run, tmp_path):
    out = _stopped(complete_run, tmp_path / "run", first_check="fail")
    r = run_cli("run", "--resume", out, "--np", "2", timeout=120)
    assert r.returncode == 1, (r.stdout[-1000:], r.stderr[-1500:])
    assert "1 point(s) failed the data check" in r.stderr
    meta = _meta(out)
    assert meta["status"] == "check_failed" and meta["variants"]["default"]["status"] == "check_failed", meta
    assert [x["check"] for x in _rows(out)] == ["fail", "ok"]


@needs_mpi
@pytest.mark.multirank
def test_resume_dry_run_runs_nothing(complete_run, tmp_path):
    out = _stopped(complete_run, tmp_path / "run")
    before = ((out / "rows.jsonl").read_text(), (out / "meta.json").read_text())
    r = run_cli("run", "--resume", out, "--np", "2", "--dry-run", timeout=60)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "1 of 2 points already" in r.stdout and "1 to run" in r.stdout
    assert "16 B" in r.stdout or " 16 " in r.stdout
    assert ((out / "rows.jsonl").read_text(), (out / "meta.json").read_text()) == before


RESUME_FLAGS = [
    (["--iters", "50"], "--iters"),
    (["--warmup", "0"], "--warmup"),
    (["--no-check"], "--no-check"),
    (["--check"], "--check"),
    (["--timing", "barrier"], "--timing"),
    (["--in-place"], "--in-place"),
    (["--min-time-ms", "5"], "--min-time-ms"),
    (["--min-iters", "2"], "--min-iters"),
    (["--max-iters", "9"], "--max-iters"),
    (["--per-op-events"], "--per-op-events"),
    (["--variants", "default,ompi-ring"], "--variants"),
    (["--device", "cuda"], "--device"),
    (["--ranks-per-node", "1"], "--ranks-per-node"),
    (["--list-variants"], "--list-variants"),
]


@needs_mpi
@pytest.mark.parametrize("flags, name", RESUME_FLAGS, ids=[f[1] for f in RESUME_FLAGS])
@pytest.mark.multirank
def test_resume_refuses_measurement_flags_in_one_line(complete_run, tmp_path, flags, name):
    out = _stopped(complete_run, tmp_path / "run")
    before = (out / "rows.jsonl").read_text()
    r = run_cli("run", "--resume", out, "--np", "2", *flags, timeout=60)
    _one_line(r, name)
    assert "--resume" in r.stderr
    assert (out / "rows.jsonl").read_text() == before and _meta(out)["status"] == "failed"


@needs_mpi
@pytest.mark.multirank
def test_resume_takes_the_flags_that_do_not_change_the_measurement(complete_run, tmp_path):
    out = _stopped(complete_run, tmp_path / "run")
    r = run_cli("run", "--resume", out, "--np", "2", "--timeout", "60", "--backend", "mpi", "--device", "cpu",
                "--variant", "default", timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert _meta(out)["status"] == "complete" and [x["nbytes"] for x in _rows(out)] == [8, 16]


@needs_mpi
@pytest.mark.multirank
def test_resume_refuses_a_variant_the_run_never_had(complete_run, tmp_path):
    out = _stopped(complete_run, tmp_path / "run")
    before = (out / "rows.jsonl").read_text()
    r = run_cli("run", "--resume", out, "--np", "2", "--variant", "ompi-ring", timeout=60)
    _one_line(r, "ompi-ring")
    assert "default" in r.stderr  # the variants it has
    assert (out / "rows.jsonl").read_text() == before


SWEEP_CHANGES = [
    (["--sizes", "32"], "sizes"),
    (["-b", "all_gather"], "benchmarks"),
    (["--dtypes", "int32"], "dtypes"),
    (["--iters", "7"], "iters"),
    (["--no-check"], "check"),
]


@needs_mpi
@pytest.mark.parametrize("change, name", SWEEP_CHANGES, ids=[c[1] for c in SWEEP_CHANGES])
@pytest.mark.multirank
def test_out_of_an_existing_run_with_another_sweep_is_refused_naming_the_difference(complete_run, tmp_path,
                                                                                  change, name):
    out = tmp_path / "run"
    shutil.copytree(complete_run, out)
    before = (out / "rows.jsonl").read_text()
    args = list(RUN)
    for flag in change[:1]:  # the changed flag replaces the run's own value
        if flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    if change == ["--no-check"]:
        args.remove("--check")
    r = run_cli("run", *args, *change, "--variant", "ompi-ring", "--out", out, timeout=60)
    _one_line(r, name)
    assert str(out) in r.stderr
    assert (out / "rows.jsonl").read_text() == before


@needs_mpi
@pytest.mark.multirank
def test_out_of_an_existing_run_with_the_same_sweep_still_joins_as_another_variant(complete_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(complete_run, out)
    r = run_cli("run", *RUN, "--variant", "ompi-ring", "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert sorted(x["variant"] for x in _rows(out)) == ["default", "default", "ompi-ring", "ompi-ring"]


REPEATS = [
    (["--dtypes", "float32,float32"], ["--dtypes", "float32"]),
    (["--dtypes", "float32,int32,float32"], ["--dtypes", "float32,int32"]),
    (["-b", "all_reduce,all_reduce"], ["-b", "all_reduce"]),
    (["--worlds", "2,2"], ["--worlds", "2"]),
    (["--sizes", "8,16,8"], ["--sizes", "8,16"]),
    (["-b", "moe", "--param", "moe.topk=2,2"], ["-b", "moe", "--param", "moe.topk=2"]),
]


def _points(tmp_path, flags) -> str:
    args = ["quick", "--np", "2", "--backend", "mpi", "-b", "all_reduce", "--sizes", "8,16", "--dry-run"]
    for flag in flags:
        if flag.startswith("-") and flag in args:
            i = args.index(flag)
            del args[i:i + 2]
    r = run_cli("run", *args, *flags, timeout=60)
    assert r.returncode == 0, r.stderr[-1500:]
    return next(x for x in r.stdout.splitlines() if " points on " in x)


@pytest.mark.parametrize("flags, once", REPEATS, ids=[" ".join(r[0]) for r in REPEATS])
@pytest.mark.multirank
def test_a_repeated_sweep_value_is_one_point(tmp_path, flags, once):
    assert _points(tmp_path, flags) == _points(tmp_path, once)


@needs_mpi
@pytest.mark.multirank
def test_repeated_dtypes_measure_each_point_once_and_compare_takes_the_run(tmp_path):
    out = tmp_path / "run"
    r = run_cli("run", *RUN, "--dtypes", "float32,float32", "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    keys = [x["point_key"] for x in _rows(out)]
    assert len(keys) == 2 and len(set(keys)) == 2
    r = run_cli("compare", out, out)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ a gate that passes on nothing


def _row(nbytes, p50=1.0, backend="mpi"):
    return make_row("all_reduce", 2, nbytes, p50, backend=backend, algbw_gbps=1.0, busbw_gbps=1.0,
                    busbw_factor=1.0)


def _run_dir(path, rows):
    rd = RunDir(path).open({"status": "running"})
    for r in rows:
        rd.append(r)
    rd.finish(Status.COMPLETE)
    return path


@pytest.mark.parametrize("case", ["empty-new", "empty-base", "mpi-vs-gloo", "other-sizes"])
@pytest.mark.parametrize("gate", [True, False], ids=["gate", "plain"])
@pytest.mark.multirank
def test_compare_with_nothing_in_common_exits_2_saying_so(tmp_path, case, gate):
    a = _run_dir(tmp_path / "a", [_row(8), _row(16)])
    other = {"empty-new": [], "empty-base": [], "mpi-vs-gloo": [_row(8, backend="gloo"), _row(16, backend="gloo")],
             "other-sizes": [_row(32), _row(64)]}[case]
    b = _run_dir(tmp_path / "b", other)
    sides = (b, a) if case == "empty-base" else (a, b)
    r = run_cli("compare", *(["--fail-on-regression"] if gate else []), *sides)
    _one_line(r, "nothing was compared")
    if case == "mpi-vs-gloo":
        assert "backend" in r.stderr and "gloo" in r.stderr
    if case.startswith("empty"):
        assert "no rows" in r.stderr


# ------------------------------------------------------------------ numbers that cannot be


@pytest.mark.parametrize("bad", [0.0, -3.0, math.nan, math.inf], ids=["zero", "negative", "nan", "inf"])
@pytest.mark.multirank
def test_a_row_whose_time_cannot_be_is_flagged_on_load_and_never_compared(tmp_path, bad):
    a = _run_dir(tmp_path / "a", [_row(8, 2.0), _row(16, 2.0)])
    b = _run_dir(tmp_path / "b", [_row(8, 2.0), _row(16, bad)])
    said = []
    df = load(b, warn=said.append)
    assert list(df["nbytes"]) == [8]
    assert len(said) == 1 and "time_us_p50" in said[0] and "cannot be" in said[0], said
    r = run_cli("compare", "--fail-on-regression", "--all", a, b)
    assert r.returncode == 0, r.stderr
    assert "-100" not in r.stdout and "1 not significant" in r.stdout
    assert "cannot be" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.multirank
def test_a_run_of_only_impossible_times_is_refused_in_one_line(tmp_path):
    a = _run_dir(tmp_path / "a", [_row(8, 2.0)])
    b = _run_dir(tmp_path / "b", [_row(8, 0.0)])
    r = run_cli("compare", "--fail-on-regression", a, b)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot be" in r.stderr or "nothing was compared" in r.stderr


def _sweep(world, times, benchmark="broadcast", factor=1.0):
    sizes = [8, 1024, 65536, 1 << 20]
    return pd.DataFrame([{"benchmark": benchmark, "backend": "mpi", "world": world, "nbytes": s, "dtype": "float32",
                          "variant": "default", "params": {}, "stage": "", "placement": "in-place",
                          "time_us_p50": t, "busbw_factor": factor, "algbw_gbps": s / t / 1e3,
                          "busbw_gbps": s / t / 1e3 * factor} for s, t in zip(sizes, times)])


@pytest.mark.parametrize("world, times, factor, why", [
    (1, [0.030, 0.030, 0.030, 0.0300001], 1.0, "moves no bytes"),   # a tiny slope: B of ~1e17 GB/s
    (1, [1.0, 1.1, 3.0, 40.0], 1.0, "moves no bytes"),  # even a slope: one rank sends to no one
    (2, [5.0, 4.9, 5.1, 4.8], 1.0, "does not grow"),  # flat: no size term
    (4, [1.0, 1.1, 3.0, 40.0], 0.0, "moves no bytes"),  # a factor of 0: no bytes on any link
], ids=["np1-flat", "np1-sloped", "flat", "factor-0"])
def test_an_unphysical_alpha_beta_fit_is_refused_with_its_reason(world, times, factor, why):
    refused = []
    ft = an.fit_table(_sweep(world, times, factor=factor), refused=refused)
    assert ft.empty, ft.to_dict("records")
    assert len(refused) == 1 and why in refused[0], refused


def test_a_physical_fit_is_kept():
    sizes = [8, 1024, 65536, 1 << 20]
    times = [5.0 + s / 1e4 for s in sizes]  # alpha 5 us, B 10 GB/s
    refused = []
    ft = an.fit_table(_sweep(2, times), refused=refused)
    assert refused == [] and ft["bandwidth_gbps"].iloc[0] == pytest.approx(10.0, rel=1e-6)


@needs_mpi
@pytest.mark.multirank
def test_run_np_1_fits_no_broadcast_bandwidth(tmp_path):
    r = run_cli("run", "quick", "--np", "1", "--backend", "mpi", "-b", "broadcast", "--sizes", "8,1K,64K,1M",
                "--iters", "20", "--warmup", "2", "--out", tmp_path / "run", timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "alpha-beta fit t =" not in r.stdout
    assert "no alpha-beta fit" in r.stdout and "moves no bytes" in r.stdout
    r = run_cli("report", tmp_path / "run")
    assert r.returncode == 0 and "alpha-beta fit t =" not in r.stdout and "moves no bytes" in r.stdout


MODEL_FLAGS = [
    (["model", "--topk", "0"], "--topk"),
    (["model", "--topk", "-1"], "--topk"),
    (["model", "--experts", "0"], "--experts"),
    (["model", "--tokens", "0"], "--tokens"),
    (["model", "--max-groups", "0"], "--max-groups"),
    (["model", "--topk", "300"], "--topk"),
    (["ceilings", "--profile", "h100-hgx", "--scaleup-GBps", "inf"], "scaleup_GBps"),
    (["ceilings", "--profile", "h100-hgx", "--nic-gbps", "inf"], "nic_gbps"),
    (["ceilings", "--profile", "h100-hgx", "--scaleup-GBps", "1e400"], "scaleup_GBps"),
    (["run", "quick", "--np", "2", "--dry-run", "--profile", "h100-hgx", "--scaleup-GBps", "inf"], "scaleup_GBps"),
    (["model", "--scaleup-GBps", "inf"], "inf"),
    (["model", "--scaleup-GBps", "nan"], "nan"),
    (["model", "--nic-gbps", "-1"], "nic_gbps"),
    (["model", "--domain-gpus", "0"], "domain_gpus"),
]


@pytest.mark.parametrize("args, words", MODEL_FLAGS, ids=[" ".join(a[0][:1] + a[0][-2:]) for a in MODEL_FLAGS])
@pytest.mark.multirank
def test_a_rate_or_shape_that_cannot_be_is_refused_in_one_line(args, words):
    r = run_cli(*args, *(["--worlds", "8"] if args[0] == "model" else []), timeout=60)
    _one_line(r, words)
