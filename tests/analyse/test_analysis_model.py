"""Alpha-beta fits, scaling efficiency and the what-if cost model: pure maths."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from commbench.analyse import analysis as an
from commbench.analyse import model as md
from commbench.core.errors import UsageError
from commbench.moe import accounting as acc
from conftest import make_row

SIZES = [2 ** k for k in range(3, 31)]  # 8 B .. 1 GiB


def synth(alpha_us=5.0, gbps=10.0, sizes=SIZES):
    return np.array([alpha_us + s / (gbps * 1e9) * 1e6 for s in sizes])


# ------------------------------------------------------------------ fit


def test_fit_recovers_alpha_and_bandwidth_exactly():
    f = an.fit_alpha_beta(SIZES, synth(), busbw_factor=0.5)
    assert f["alpha_us"] == pytest.approx(5.0, rel=1e-6)
    assert f["bandwidth_gbps"] == pytest.approx(10.0, rel=1e-6)
    assert f["n_half_nbytes"] == pytest.approx(5e-6 * 10e9, rel=1e-6)
    assert f["busbw_asymptote_gbps"] == pytest.approx(5.0, rel=1e-6)
    assert f["rms_rel_err_pct"] < 1e-6 and f["max_rel_err_pct"] < 1e-6
    assert f["points"] == len(SIZES)
    assert (f["min_nbytes"], f["max_nbytes"]) == (SIZES[0], SIZES[-1])


def test_fit_without_factor_has_no_busbw_asymptote():
    assert an.fit_alpha_beta(SIZES, synth())["busbw_asymptote_gbps"] is None


def test_fit_with_noise_within_a_few_percent():
    rng = np.random.default_rng(0)
    t = synth() * (1 + 0.02 * rng.standard_normal(len(SIZES)))
    f = an.fit_alpha_beta(SIZES, t)
    assert f["alpha_us"] == pytest.approx(5.0, rel=0.05)
    assert f["bandwidth_gbps"] == pytest.approx(10.0, rel=0.05)
    assert 0.5 < f["rms_rel_err_pct"] < 5


def test_fit_latency_only_sweep_keeps_alpha_non_negative():
    sizes = [8, 16, 32, 64, 128, 256]
    t = [3.0, 2.9, 3.1, 2.95, 3.05, 2.9]  # flat, slightly falling: unconstrained B < 0
    f = an.fit_alpha_beta(sizes, t)
    assert f["alpha_us"] >= 0
    assert f["alpha_us"] == pytest.approx(3.0, rel=0.05)
    assert f["bandwidth_gbps"] > 0


def test_fit_bandwidth_only_sweep_clamps_alpha_at_zero():
    sizes = np.array(SIZES[10:], float)
    t = sizes / 1e4 * np.array([1.0, 1.02] * (len(sizes) // 2))  # pure S/B with a zigzag
    f = an.fit_alpha_beta(sizes, t)
    assert f["alpha_us"] >= 0 and f["n_half_nbytes"] >= 0
    assert f["bandwidth_gbps"] == pytest.approx(10.0, rel=0.03)


def test_fit_needs_two_sizes():
    assert an.fit_alpha_beta([1024, 1024], [3.0, 3.1]) is None
    assert an.fit_alpha_beta([], []) is None


def _sweep_rows(benchmark="all_reduce", world=8, factor=1.75, alpha=5.0, gbps=10.0, **extra):
    rows = []
    for s, t in zip(SIZES, synth(alpha, gbps)):
        alg = s / (t * 1e-6) / 1e9
        rows.append({"run": "r1", "benchmark": benchmark, "backend": "loopback", "device": "cpu",
                     "world": world, "nbytes": s, "dtype": "float32", "variant": None,
                     "params": {}, "stage": None, "time_us_p50": t, "time_us_p99": t,
                     "algbw_gbps": alg, "busbw_gbps": alg * factor, "busbw_factor": factor, **extra})
    return rows


def test_fit_table_groups_and_skips_barrier_and_moe():
    rows = (_sweep_rows() + _sweep_rows(world=4, factor=1.5, alpha=2.0, gbps=20.0)
            + [{**r, "params": json.dumps(r["params"])} for r in _sweep_rows("all_to_all", factor=0.875)])
    rows += [{**rows[0], "benchmark": "barrier", "nbytes": 0}, {**rows[0], "benchmark": "barrier", "nbytes": 0}]
    rows += [{**rows[0], "benchmark": "moe", "stage": "dispatch", "params": {"tokens": 4096}, "nbytes": n}
             for n in (1000, 2000)]
    t = an.fit_table(pd.DataFrame(rows))
    assert list(t.columns[:8]) == ["run", "benchmark", "backend", "world", "dtype", "variant", "params", "stage"]
    assert sorted(zip(t["benchmark"], t["world"])) == [("all_reduce", 4), ("all_reduce", 8), ("all_to_all", 8)]
    r4 = t[(t["benchmark"] == "all_reduce") & (t["world"] == 4)].iloc[0]
    assert r4["alpha_us"] == pytest.approx(2.0, rel=1e-6)
    assert r4["bandwidth_gbps"] == pytest.approx(20.0, rel=1e-6)
    assert r4["busbw_asymptote_gbps"] == pytest.approx(30.0, rel=1e-6)
    assert r4["points"] == len(SIZES) and r4["variant"] == "" and r4["params"] == "{}"


def test_fit_table_without_run_column_or_factor():
    rows = [{k: v for k, v in r.items() if k not in ("run", "busbw_factor")} for r in _sweep_rows(factor=1.75)]
    t = an.fit_table(rows)
    assert "run" not in t.columns and len(t) == 1
    assert t["busbw_asymptote_gbps"].iloc[0] == pytest.approx(17.5, rel=1e-6)


@pytest.mark.multirank
def test_analysis_and_model_import_without_pandas():
    code = "import sys, commbench.analyse.analysis, commbench.analyse.model; assert 'pandas' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ scaling


def _row(world, nbytes=1 << 30, busbw=10.0, benchmark="all_reduce", **extra):
    extra = {"backend": "nccl", "device": "gpu", "dtype": "bfloat16", "variant": "", "params": "{}", **extra}
    return make_row(benchmark, world, nbytes, 100.0, run="r1", time_us_p99=110.0, busbw_gbps=busbw,
                    algbw_gbps=busbw / 2, **extra)


def test_scaling_efficiency_busbw():
    df = pd.DataFrame([_row(1024, busbw=9.85), _row(256, busbw=10.0), _row(512, busbw=9.9),
                       _row(256, nbytes=1 << 20, busbw=5.0)])  # alone at its size: dropped
    t = an.scaling_table(df)
    assert list(t["world"]) == [256, 512, 1024]
    assert set(t["metric"]) == {"busbw_gbps"} and set(t["base_world"]) == {256}
    assert t.set_index("world")["efficiency_pct"].to_dict() == pytest.approx({256: 100.0, 512: 99.0, 1024: 98.5})


def test_scaling_moe_uses_tokens_per_second_per_rank():
    def moe(world, stage, t_us, nbytes):
        return _row(world, nbytes=nbytes, benchmark="moe", stage=stage, time_us_p50=t_us,
                    params=json.dumps({"tokens": 4096, "topk": 8}), dtype="fp8")
    df = pd.DataFrame([moe(8, "dispatch", 400.0, 1000), moe(16, "dispatch", 500.0, 1400),
                       moe(8, "combine", 800.0, 2000), moe(16, "combine", 1000.0, 2800)])
    t = an.scaling_table(df)
    assert set(t["metric"]) == {"tokens_per_s_per_rank"} and len(t) == 4
    d = t[t["stage"] == "dispatch"].set_index("world")
    assert d.loc[8, "value"] == pytest.approx(4096 / 400e-6)
    assert d.loc[16, "value"] == pytest.approx(4096 / 500e-6)
    assert d.loc[16, "efficiency_pct"] == pytest.approx(80.0)
    assert d.loc[16, "nbytes"] == 1400  # nbytes grows with world: shown, not grouped on
    c = t[t["stage"] == "combine"].set_index("world")
    assert c.loc[16, "efficiency_pct"] == pytest.approx(80.0)


def test_scaling_moe_without_tokens_is_a_usage_error():
    df = pd.DataFrame([_row(8, benchmark="moe", stage="dispatch"), _row(16, benchmark="moe", stage="dispatch")])
    with pytest.raises(UsageError):
        an.scaling_table(df)


# ------------------------------------------------------------------ model

NVL = md.Tier("scaleup", 0.0, 450.0)
ONE_DOMAIN = md.Fabric(NVL, None, 8)
TWO_TIER = md.fabric_from_rates(450.0, 0.0, 8, scaleout_gbps=50.0, scaleout_latency_us=0.0)
S = 1e9


def us(seconds):
    return seconds * 1e6


def test_ring_and_inswitch_all_reduce():
    assert md.all_reduce_time_us("ring", 8, S, ONE_DOMAIN) == pytest.approx(us(2 * 7 / 8 * S / 450e9))
    assert md.all_reduce_time_us("inswitch", 8, S, ONE_DOMAIN) == pytest.approx(us(9 / 8 * S / 450e9))
    # latency terms: 2(p-1) steps for ring, one for the switch
    f = md.Fabric(md.Tier("scaleup", 2.0, 450.0), None, 8)
    assert md.all_reduce_time_us("ring", 8, 0, f) == pytest.approx(28.0)
    assert md.all_reduce_time_us("inswitch", 8, 0, f) == pytest.approx(2.0)


def test_recursive_doubling_and_rabenseifner():
    f = md.Fabric(md.Tier("scaleup", 3.0, 100.0), None, 8)
    # p = 4: lg p = 2
    assert md.all_reduce_time_us("recursive_doubling", 4, S, f) == pytest.approx(2 * 3.0 + us(2 * S / 100e9))
    assert md.all_reduce_time_us("rabenseifner", 4, S, f) == pytest.approx(4 * 3.0 + us(2 * 3 / 4 * S / 100e9))


def test_gamma_adds_reduction_cost():
    f = md.fabric_from_rates(100.0, 0.0, 8, gamma_us_per_byte=1e-6)
    assert md.all_reduce_time_us("ring", 4, S, f) == pytest.approx(us(1.5 * S / 100e9) + 0.75 * S * 1e-6)


def test_hierarchical_all_reduce():
    f = md.fabric_from_rates(450.0, 1.0, 8, scaleout_gbps=50.0, scaleout_latency_us=5.0)
    G, N = 8, 4
    # the three phases pipelined: latency + the slower of the NVLink and the NIC phase
    want = (2 * (G - 1) * 1.0 + 2 * (N - 1) * 5.0
            + max(us(2 * (G - 1) / G * S / 450e9), us(2 * (N - 1) / N * (S / G) / 50e9)))
    assert md.all_reduce_time_us("hierarchical", 32, S, f) == pytest.approx(want)
    # 12 ranks on 8-GPU nodes run as 2 nodes x 6 (placement rule): G = 6, N = 2
    want12 = (2 * 5 * 1.0 + 2 * 1 * 5.0 + max(us(2 * 5 / 6 * S / 450e9), us(2 * 1 / 2 * (S / 6) / 50e9)))
    assert md.all_reduce_time_us("hierarchical", 12, S, f) == pytest.approx(want12)


def test_flat_algorithms_cross_the_nic_above_a_domain():
    # rail-parallel rings: the 8 NICs of a node carry its inter-node traffic, min(450, 8 x 50)
    assert md.all_reduce_time_us("ring", 16, S, TWO_TIER) == pytest.approx(us(2 * 15 / 16 * S / 400e9))
    # an MPI-style flat algorithm still runs at one NIC
    assert md.all_reduce_time_us("rabenseifner", 16, S, TWO_TIER) == pytest.approx(us(2 * 15 / 16 * S / 50e9))
    with pytest.raises(UsageError):
        md.all_reduce_time_us("ring", 16, S, ONE_DOMAIN)
    assert md.all_reduce_time_us("ring", 1, S, ONE_DOMAIN) == 0.0


def test_ring_all_gather_reduce_scatter():
    f = md.Fabric(md.Tier("scaleup", 2.0, 100.0), None, 8)
    assert md.all_gather_time_us(4, S, f) == pytest.approx(3 * 2.0 + us(0.75 * S / 100e9))
    assert md.reduce_scatter_time_us(4, S, f) == pytest.approx(3 * 2.0 + us(0.75 * S / 100e9))


def test_pairwise_all_to_all():
    f = md.fabric_from_rates(400.0, 1.0, 8, scaleout_gbps=50.0, scaleout_latency_us=4.0)
    assert md.all_to_all_time_us(8, S, f) == pytest.approx(7 * 1.0 + us(S / 400e9))
    # p = 32: 24/32 of S over the NIC, 7/32 over scale-up, at once
    want = 24 * 4.0 + 7 * 1.0 + max(us(24 / 32 * S / 50e9), us(7 / 32 * S / 400e9))
    assert md.all_to_all_time_us(32, S, f) == pytest.approx(want)


@pytest.mark.parametrize("case,nic,nvl", [("flat", 7.0, 0.875), ("hierarchical", 4.63, 6.72),
                                          ("node_limited", 3.50, 6.66)])
def test_moe_deepseek_v3_copies_per_token(case, nic, nvl):
    d = md.moe_scenario_defaults()
    assert d["token_nbytes"] == 7392
    r = md.moe_time_us(case, d["tokens"], d["hidden"], d["token_nbytes"], d["experts"], d["topk"],
                       64, 8, d["M"], TWO_TIER)
    per_token = d["tokens"] * d["token_nbytes"]
    assert r["v_nic_nbytes"] / per_token == pytest.approx(nic, abs=0.006)
    assert r["v_nvl_nbytes"] / per_token == pytest.approx(nvl, abs=0.006)
    assert r["nvl_us"] == pytest.approx(us(r["v_nvl_nbytes"] / 450e9))
    assert r["nic_us"] == pytest.approx(us(r["v_nic_nbytes"] / 50e9))
    assert r["time_us"] == pytest.approx(max(r["nic_us"], r["nvl_us"]))
    assert r["bottleneck"] == "scaleout"
    c = md.moe_time_us(case, d["tokens"], d["hidden"], None, d["experts"], d["topk"],
                       64, 8, d["M"], TWO_TIER, stage="combine")
    assert c["token_nbytes"] == 2 * 7168
    assert c["v_nic_nbytes"] == pytest.approx(r["v_nic_nbytes"] * 14336 / 7392)


def test_moe_latency_one_alpha_per_tier_used():
    f = md.fabric_from_rates(450.0, 2.0, 8, scaleout_gbps=50.0, scaleout_latency_us=10.0)
    one = md.moe_time_us("flat", 128, 7168, 7392, 256, 8, 8, 8, 4, f)
    assert one["v_nic_nbytes"] == 0 and one["latency_us"] == 2.0 and one["bottleneck"] == "scaleup"
    many = md.moe_time_us("flat", 128, 7168, 7392, 256, 8, 64, 8, 4, f)
    assert many["latency_us"] == 12.0


def test_project_rows():
    rows = md.project("all_reduce", [8, 16], TWO_TIER, sizes_nbytes=[S], algos=["ring", "hierarchical"])
    assert len(rows) == 4
    r = rows[0]
    assert (r["world"], r["algo"]) == (8, "ring")
    assert r["algbw_gbps"] == pytest.approx(S / 1e9 / (r["time_us"] * 1e-6))
    assert r["busbw_gbps"] == pytest.approx(450.0)  # ring busbw = link rate at alpha 0
    m = md.project("moe", [8, 64], TWO_TIER)
    assert {(x["world"], x["case"]) for x in m} == {(w, c) for w in (8, 64) for c in acc.CASES}
    assert all(x["combine_us"] > x["dispatch_us"] for x in m)
    with pytest.raises(UsageError):
        md.project("moe", [64], ONE_DOMAIN)
    with pytest.raises(UsageError):
        md.project("all_reduce", [8], ONE_DOMAIN, sizes_nbytes=[S], algos=["butterfly"])


def test_fabric_from_rates_validates():
    with pytest.raises(UsageError):
        md.fabric_from_rates(0.0, 1.0, 8)
    with pytest.raises(UsageError):
        md.fabric_from_rates(450.0, 1.0, 8, scaleout_gbps=50.0)
    assert md.fabric_from_rates(450.0, 1.0, None).scaleout is None
    assert md.ASSUMPTIONS and all(isinstance(a, str) for a in md.ASSUMPTIONS)


def test_calibrate_fabric_from_all_to_all_fit():
    rows = (_sweep_rows("all_to_all", world=4, alpha=6.0, gbps=20.0)
            + _sweep_rows("all_to_all", world=8, alpha=70.0, gbps=5.0)
            + _sweep_rows("send_recv", world=2, alpha=1.0, gbps=40.0)
            + _sweep_rows("all_reduce", world=2, alpha=1.0, gbps=99.0))
    base = md.fabric_from_rates(450.0, 1.0, 8, scaleout_gbps=50.0, scaleout_latency_us=5.0)
    f = md.calibrate_fabric(an.fit_table(rows), base)
    assert f.scaleup.alpha_us == pytest.approx(6.0 / 3, rel=1e-6)
    assert f.scaleup.bandwidth_gbps == pytest.approx(20.0, rel=1e-6)
    assert f.scaleout == base.scaleout and f.domain_gpus == 8
    # the calibrated model reproduces the measurement it came from
    assert md.all_to_all_time_us(4, 1 << 20, f) == pytest.approx(6.0 + (1 << 20) / 20e3, rel=1e-6)


def test_calibrate_fabric_falls_back_to_send_recv_and_needs_something():
    base = md.fabric_from_rates(450.0, 1.0, 8)
    f = md.calibrate_fabric(an.fit_table(_sweep_rows("send_recv", world=2, alpha=1.5, gbps=40.0)), base)
    assert f.scaleup.alpha_us == pytest.approx(1.5, rel=1e-6)
    assert f.scaleup.bandwidth_gbps == pytest.approx(40.0, rel=1e-6)
    with pytest.raises(UsageError, match="no all_to_all or send_recv"):
        md.calibrate_fabric(an.fit_table(_sweep_rows("all_reduce")), base)
