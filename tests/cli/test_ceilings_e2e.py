"""Ceilings, scaling, fits and the what-if model through the real CLI, on the loopback."""
from __future__ import annotations

import numpy as np
import pytest

import commbench
from commbench.analyse import ceilings
from commbench.analyse import model as M
from commbench.analyse.analysis import fit_table
from conftest import needs_mpi, run_cli, run_meta, starts_processes


@pytest.fixture(scope="module")
@starts_processes
def big_run(tmp_path_factory):
    """2 ranks, messages beyond the 32 MiB-class last-level cache, plus in-cache sizes for the fit."""
    out = tmp_path_factory.mktemp("ceil") / "run"
    r = run_cli("run", "quick", "--np", "2", "-b", "all_reduce,all_to_all,all_gather,barrier", "--worlds", "2",
                "--sizes", "256K,1M,4M,128M", "--no-check", "--iters", "15", "--out", out)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


@pytest.fixture(scope="module")
@starts_processes
def in_cache_run(tmp_path_factory):
    """all_to_all and all_gather at in-cache sizes, for the model check: a run of its own, in the
    serial phase, as it compares times."""
    out = tmp_path_factory.mktemp("incache") / "run"
    r = run_cli("run", "quick", "--np", "2", "-b", "all_to_all,all_gather", "--worlds", "2",
                "--sizes", "64K,256K,1M", "--no-check", "--iters", "15", "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def _cache_nbytes(out) -> int:
    """The LLC the run's probe read from sysfs, or 64 MiB where it read more: a VM sees its
    host's whole L3 (480 MiB on some 2-core guests), of which one core's copy holds far less
    (the 128 MiB rows run at the DRAM rate there)."""
    return min(run_meta(out)["ceilings"]["probe"]["llc_nbytes"], 64 << 20)


@needs_mpi
@pytest.mark.multirank
def test_loopback_probe_lands_in_meta(big_run):
    out, _ = big_run
    m = run_meta(out)["ceilings"]
    assert m["profile"] == "loopback"
    p = m["probe"]
    assert p["memcpy_in_cache_gbps"] > 0 and p["memcpy_beyond_cache_gbps"] > 0
    assert p["latency_us"] > 0 and p["llc_nbytes"] > 0
    # A steady reference: the median of several probes, their spread recorded beside it.
    from commbench.backends import probe

    for where in ("in_cache", "beyond_cache"):
        runs = p[f"memcpy_{where}_runs_gbps"]
        assert len(runs) == probe.PROBES and p[f"memcpy_{where}_gbps"] == pytest.approx(float(np.median(runs)))
        assert p[f"memcpy_{where}_spread_pct"] == pytest.approx((max(runs) - min(runs)) / np.median(runs) * 100)
    assert f"median of {probe.PROBES} probes (spread" in m["fields"]["scaleup_link"]


@needs_mpi
def test_pct_of_ceiling_within_bounds_beyond_cache(big_run):
    out, stdout = big_run
    df = commbench.load(out)
    big = df[(df.nbytes > _cache_nbytes(out)) & (df.benchmark != "barrier")]
    assert len(big) == 3
    for r in big.to_dict("records"):
        assert r["tier"] == "scaleup" and r["compared_as"] == "busbw"
        assert 0 < r["pct_of_ceiling"] <= 100, r
        assert r["time_bound_us"] < r["time_us_p50"]
    barrier = df[df.benchmark == "barrier"].iloc[0]
    assert barrier["pct_of_ceiling"] is None or barrier["pct_of_ceiling"] != barrier["pct_of_ceiling"]
    assert "% line" in stdout and "profile loopback" in stdout
    assert "alpha-beta fit" in stdout


@needs_mpi
@pytest.mark.multirank
def test_report_rejudges_against_another_profile(big_run):
    out, _ = big_run
    r = run_cli("report", out, "--profile", "h100-hgx")
    assert r.returncode == 0, r.stderr
    assert "profile h100-hgx" in r.stdout and "NVLink 4" in r.stdout


@needs_mpi
@pytest.mark.serial
def test_model_calibrated_on_loopback_predicts_measured(in_cache_run):
    """Calibrate scale-up alpha/B from the all_to_all fit over the in-cache sizes, then
    predict all_to_all and all_gather at those sizes. Tolerance 3x either way, and 6x low
    for all_gather: the alpha-beta model charges an all_to_all S*beta but an all_gather
    (p-1)/p*S*beta, while on one host the all_gather also copies the rank's own chunk (a 2x
    at p=2 the model does not see), and 2-core timings move 30 % run to run. Only sizes up to
    1 MiB: the model knows no cache cliff (README, "What-if model"), and the 4 MiB point's
    working set (send and receive buffers of both ranks, 16 MiB) falls out of a last-level
    cache that the parallel test processes share: there it measured 2x to 20x the model
    (ratios 0.49 to 0.05 over four runs under load) while 64 KiB to 1 MiB stayed within 0.28-1.3.
    A run of its own in the serial phase: under the parallel phase's load one rank's stall once
    put the 256 KiB all_to_all p50 at 1000x the model."""
    out = in_cache_run
    df = commbench.load(out)
    in_cache = (df.nbytes <= 1 << 20) & (df.nbytes * 2 <= _cache_nbytes(out))
    small = df[in_cache & df.benchmark.isin(["all_to_all", "all_gather"])]
    fab = M.calibrate_fabric(fit_table(small), M.fabric_from_rates(10.0, 1.0, None))
    for r in small.to_dict("records"):
        f = M.all_to_all_time_us if r["benchmark"] == "all_to_all" else M.all_gather_time_us
        ratio = f(2, r["nbytes"], fab) / r["time_us_p50"]
        # all_gather: the model's (p-1)/p S beta is S/2 beta at p = 2, while on one host the
        # rank also copies its own chunk into the output: the model sees half the copies, so
        # it predicts low by that 2x on top of the 3x spread (measured: 0.28-0.83 from 64 KiB
        # to 1 MiB, over four runs under load); all_to_all was calibrated on, so 3x either way.
        low = 1 / 6 if r["benchmark"] == "all_gather" else 1 / 3
        assert low <= ratio <= 3, (r["benchmark"], r["nbytes"], ratio)
    r = run_cli("model", "--kind", "all_to_all", "--calibrate", out, "--worlds", "2,4", "--sizes", "1M")
    assert r.returncode == 0, r.stderr
    assert "calibrated from" in r.stdout and "assumptions" in r.stdout


@needs_mpi
@pytest.mark.multirank
def test_scaling_table_from_a_rank_sweep(tmp_path):
    out = tmp_path / "s"
    r = run_cli("run", "scaling", "--np", "4", "--sizes", "64K", "--param", "moe.tokens=64", "--iters", "3",
                "--out", out)
    assert r.returncode == 0, r.stderr
    assert "weak-scaling efficiency" in r.stdout
    from commbench.analyse.analysis import scaling_table

    sc = scaling_table(commbench.load(out))
    assert set(sc.benchmark) == {"all_reduce", "all_to_all", "moe"}
    assert set(sc.world) == {2, 4}
    base = sc[sc.world == 2]
    assert (base.efficiency_pct == 100).all()
    assert set(sc[sc.benchmark == "moe"].metric) == {"tokens_per_s_per_rank"}


@pytest.mark.multirank
def test_ceilings_command_prints_every_profile_with_units():
    r = run_cli("ceilings")
    assert r.returncode == 0, r.stderr
    for name in ceilings.list_profiles():
        assert name in r.stdout
    flat = " ".join(r.stdout.split())  # captions wrap
    assert "PER DIRECTION" in flat and "800 Gb/s = 100 GB/s" in flat
    r = run_cli("ceilings", "--profile", "gb300-nvl72", "--nic-gbps", "1600")
    assert r.returncode == 0 and "1600" in r.stdout and "200" in r.stdout


@pytest.mark.multirank
def test_model_default_shows_assumptions_and_both_profiles():
    r = run_cli("model", "--worlds", "8,64")
    assert r.returncode == 0, r.stderr
    assert "assumptions" in r.stdout and "gb300-nvl72" in r.stdout and "h100-hgx" in r.stdout
    assert "hierarchical" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["ceilings", "--profile", "nope"], "unknown profile"),
    (["model", "--profile", "loopback"], "measured at run time"),
    (["model", "--kind", "all_reduce", "--sizes", "1M", "--algos", "magic"], "unknown all_reduce algorithm"),
    (["run", "quick", "--nic-gbps", "800"], "need --profile"),
    (["run", "quick", "--profile", "h100-hgx", "--nic-gbps", "-5"], "nic_gbps"),
    (["model", "--calibrate", "/nonexistent-dir"], "no measured profile"),
])
@pytest.mark.multirank
def test_bad_ceiling_input_is_one_line_exit_2(args, words):
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("body, words", [
    ('name = "x"\n[scaleup]\nlink = "L"\nline_rate = "450 GB/s per direction"\nachieved_rate = "300 GB/s per direction"\n'
     'latency_us = 1.0\n[hbm]\nbandwidth = "3 TB/s total"\n', "domain_gpus"),
    ('name = "x"\n[scaleup]\nlink = "L"\nline_rate = "-450 GB/s per direction"\nachieved_rate = "300 GB/s per direction"\n'
     'domain_gpus = 8\nlatency_us = 1.0\n[hbm]\nbandwidth = "3 TB/s total"\n', "line_rate"),
    ('name = "x"\n[scaleup]\nlink = "L"\nline_rate = "450 GiB/parsec per direction"\n'
     'achieved_rate = "300 GB/s per direction"\ndomain_gpus = 8\nlatency_us = 1.0\n[hbm]\nbandwidth = "3 TB/s total"\n',
     "unit"),
])
@pytest.mark.multirank
def test_bad_profile_file_is_exit_2(tmp_path, body, words):
    f = tmp_path / "p.toml"
    f.write_text(body)
    r = run_cli("run", "quick", "--profile", f, "--np", "2")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.glob("results*"))
