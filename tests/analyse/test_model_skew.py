"""The what-if model under skewed routing: a workload's or a trace's most loaded rank sets
the bandwidth term (skew = the hottest rank's expected share x world), the latency terms
stay; the model's MoE cases carry the benchmark's dispatcher names."""
import re

import numpy as np
import pytest

from commbench.analyse import model as md
from commbench.analyse import model_skew as ms
from commbench.core.errors import UsageError
from commbench.moe import routing as rt
from commbench.moe.trace import load_trace
from conftest import run_cli

RACK = md.fabric_from_rates(700.0, 2.0, 72, scaleout_gbps=100.0, scaleout_latency_us=5.0)
E, K = 256, 8


def _pairs(rows):
    """(uniform row, skewed row) per (world, dispatcher)."""
    by = {}
    for r in rows:
        by.setdefault((r["world"], r["dispatcher"]), {})[r["routing"] == "uniform"] = r
    return {k: (v[True], v[False]) for k, v in by.items()}


@pytest.mark.parametrize("name, own", [("hot_rank", {"ratio": 4.0}), ("hot_rank", {"ratio": 2.0, "hot": 3}),
                                       ("zipf", {"alpha": 1.2})])
def test_bandwidth_term_scales_by_the_hottest_ranks_share_latency_unchanged(name, own):
    """alltoall (one copy per (token, expert)): bandwidth terms x (hottest share x world),
    exactly; the rank-copy dispatchers by their copy skew, at most the picks'; latency kept."""
    worlds = [8, 64, 256]
    skew_of = lambda p, G: ms.workload_skew(name, E, K, p, 4096, seed=0, G=G, **own)  # noqa: E731
    rows = md.project("moe", worlds, RACK, skew_of=skew_of)
    pairs = _pairs(rows)
    assert {w for w, _ in pairs} == set(worlds) and len(pairs) == 3 * len(worlds)
    for (p, disp), (u, s) in pairs.items():
        want = float(rt.expected_rank_load_share(name, E, K, p, seed=0, **own).max()) * p
        if disp == "alltoall":
            assert s["skew"] == pytest.approx(want, rel=1e-12) and u["skew"] == 1.0
        else:
            assert 1.0 <= s["skew"] <= want * 1.001  # a token's second pick on a rank adds no copy
        for stage in ("dispatch", "combine"):
            assert s[f"{stage}_latency_us"] == u[f"{stage}_latency_us"]
            assert s[f"{stage}_us"] > u[f"{stage}_us"]
            if disp == "alltoall" or p <= 64:  # one tier moves (64 fill a rack) or both by the same factor
                assert s[f"{stage}_bw_us"] / u[f"{stage}_bw_us"] == pytest.approx(s["skew"], rel=1e-12)
                assert s[f"{stage}_us"] == pytest.approx(u[f"{stage}_latency_us"] + s["skew"] * u[f"{stage}_bw_us"])
        if disp == "alltoall":
            assert s["dispatch_v_nvl_nbytes"] == pytest.approx(want * u["dispatch_v_nvl_nbytes"])
            assert s["dispatch_v_nic_nbytes"] == pytest.approx(want * u["dispatch_v_nic_nbytes"])


def test_rank_copy_dispatchers_scale_each_tier_by_its_own_skew():
    """Across racks, hierarchical's NIC copies go one per (token, node): the hot rank's node
    takes little more than the mean, its NVLink forwarding the hot rank's copies."""
    s = ms.workload_skew("hot_rank", E, K, 256, 4096, G=64, ratio=4.0)
    assert s["node_skew"] < 1.1 < 3 < s["rank_skew"] == pytest.approx(s["skew"], rel=1e-9)  # one expert a rank
    d = md.moe_scenario_defaults()
    u = md.moe_time_us("hierarchical", d["tokens"], d["hidden"], d["token_nbytes"], E, K, 256, None, d["M"], RACK)
    row = [r for r in md.project("moe", [256], RACK, skew_of=lambda p, G: s)
           if r["dispatcher"] == "hierarchical" and r["routing"] != "uniform"][0]
    want = u["latency_us"] + max(u["nic_us"] * s["node_skew"], u["nvl_us"] * s["rank_skew"])
    assert row["dispatch_us"] == pytest.approx(want) and (row["nvl_skew"], row["nic_skew"]) == (s["rank_skew"],
                                                                                                s["node_skew"])
    assert row["dispatch_v_nic_nbytes"] == pytest.approx(u["v_nic_nbytes"] * s["node_skew"])


def test_copy_skew_against_a_large_sample():
    """The copy skew's estimate (exact picks x sampled copies per pick) agrees with the
    copies counted on 2**20 tokens from another rank's stream and seed's draws."""
    big = rt.make_routing("hot_rank", num_tokens=1 << 20, num_experts=E, top_k=K, rank=3, world=8, seed=7, ratio=4.0)
    hits = ms.copy_hits(big.topk_idx // 32, 8)
    got = ms.workload_skew("hot_rank", E, K, 8, 4096, ratio=4.0)
    assert got["rank_skew"] == pytest.approx(hits[0] / hits.mean(), rel=0.01)
    assert got["rank_skew"] < got["skew"] - 1  # at 32 experts a rank, many tokens pick the hot rank twice


def test_copy_hits_by_hand():
    dest = np.array([[0, 0, 1], [2, 2, 2], [1, 0, 1]])
    assert ms.copy_hits(dest, 4).tolist() == [2, 2, 1, 0]


def test_hot_rank_skew_by_hand():
    # hot_rank ratio 4 at world 8: 32 experts a rank; the Markov chain of expected_rank_load_share is exact.
    got = ms.workload_skew("hot_rank", E, K, 8, 4096, ratio=4.0)
    assert got["skew"] == pytest.approx(float(rt.expected_rank_load_share("hot_rank", E, K, 8, ratio=4.0)[0]) * 8)
    # the hot rank's 32 experts weigh 4 against 224 at 1: a draw lands there with 128/352, x8 = 2.91;
    # without replacement later picks find the hot experts partly taken, so a little less
    assert 2.8 < got["skew"] < 128 / 352 * 8
    assert got["sent"] == 1.0 and "hot_rank ratio=4.0" in got["basis"] and "receives" in got["basis"]
    assert ms.workload_skew("uniform", E, K, 64, 4096)["skew"] == pytest.approx(1.0)


@pytest.mark.parametrize("name, own", [("hot_experts", {"hot_k": 8, "hot_share": 0.3}),
                                       ("spread_hot", {"hot_share": 0.5}), ("zero_rank", {})])
def test_named_workloads_alltoall_skew_is_the_expected_share_times_world(name, own):
    skews = []
    for p in (8, 64, 256):
        got = ms.workload_skew(name, E, K, p, 4096, G=min(p, 64), **own)
        want = float(rt.expected_rank_load_share(name, E, K, p, seed=0, **own).max()) * p
        assert got["skew"] == pytest.approx(want, rel=1e-12)
        assert 1.0 <= got["rank_skew"] <= want * 1.001 and 1.0 <= got["node_skew"] <= want * 1.001
        skews.append(got["skew"])
    assert max(skews) > 1.01  # (spread_hot's 8 hot experts on 8 ranks load them all alike)


def test_source_ragged_the_busiest_sender_decides():
    got = ms.workload_skew("source_ragged", E, K, 4, 1920, tokens_by_rank="4096/1024/2048/512")
    assert (got["skew"], got["rank_skew"], got["node_skew"]) == pytest.approx((4096 / 1920,) * 3)
    assert got["received"] == pytest.approx(1.0) and "the busiest rank sends" in got["basis"]


def test_burst_skew_is_the_mean_over_its_steps():
    got = ms.workload_skew("burst", E, K, 64, 4096, steps=4, burst_every=4, burst_factor=3.0)
    assert (got["skew"], got["worst"]) == pytest.approx(((1 + 1 + 1 + 3) / 4, 3.0))
    assert "mean over 4 steps, worst step x3.00" in got["basis"]
    assert ms.workload_skew("burst", E, K, 64, 4096, steps=3, burst_every=4)["skew"] == pytest.approx(1.0)


def test_with_skew_exact_arithmetic():
    d = {"nic_us": 30.0, "nvl_us": 10.0, "latency_us": 7.0, "time_us": 37.0, "v_nic_nbytes": 3e6,
         "v_nvl_nbytes": 1e6, "bound": "NIC-bound"}
    s = ms.with_skew(d, 1.5)
    assert (s["nic_us"], s["nvl_us"], s["latency_us"], s["time_us"]) == (45.0, 15.0, 7.0, 52.0)
    assert (s["v_nic_nbytes"], s["v_nvl_nbytes"]) == (4.5e6, 1.5e6)
    t = ms.with_skew(d, 4.0, 1.0)  # NVLink by 4, the NIC by 1: NVLink decides now
    assert (t["nic_us"], t["nvl_us"], t["time_us"], t["bound"]) == (30.0, 40.0, 47.0, "NVLink-bound")
    assert ms.with_skew({**d, "nic_us": 1.0, "nvl_us": 2.0}, 1.0)["bound"] == "latency-bound"


def test_dispatcher_names_are_the_benchmarks_and_the_old_cases_still_work():
    from commbench.benchmarks.moe.dispatchers import DISPATCHERS

    assert set(md.MOE_DISPATCHERS) <= set(DISPATCHERS)
    rows = md.project("moe", [64], RACK)
    assert [(r["dispatcher"], r["case"]) for r in rows] == [
        ("alltoall", "flat"), ("hierarchical", "hierarchical"), ("deepep-normal", "node_limited")]
    d = md.moe_scenario_defaults()
    args = (d["tokens"], d["hidden"], d["token_nbytes"], d["experts"], d["topk"], 256, None, d["M"], RACK)
    for new, old in (("alltoall", "flat"), ("deepep-normal", "node_limited"), ("hierarchical", "hierarchical")):
        assert md.moe_time_us(new, *args) == md.moe_time_us(old, *args)
    ll = md.moe_time_us("low-latency", *args)
    assert ll == md.moe_time_us("flat", *args, low_latency=True)
    assert md.project("moe", [64], RACK, cases=["low-latency"])[0]["dispatcher"] == "low-latency"
    with pytest.raises(UsageError, match="unknown MoE dispatcher 'pplx'"):
        md.moe_time_us("pplx", *args)


def _npz(path, topk, num_experts, ep_size=None):
    arrays = {"topk_idx": np.asarray(topk, np.int64), "num_experts": np.int64(num_experts)}
    if ep_size:
        arrays["ep_size"] = np.int64(ep_size)
    np.savez(path, **arrays)
    return path


def test_trace_skew_one_rank_takes_everything_and_uniform_is_about_one(tmp_path):
    hot = load_trace(_npz(tmp_path / "hot.npz", np.tile(np.arange(K), (2, 512, 1)), E, ep_size=8))
    for p in (8, 16, 32):  # experts 0-7 sit on rank 0 up to world 32
        got = ms.trace_skew(hot, p)
        assert got["skew"] == pytest.approx(p) and got["worst"] == pytest.approx(p)
        assert got["rank_skew"] == pytest.approx(p)  # one copy a token, all to rank 0
    assert "recorded at EP 8, re-sharded to 16" in ms.trace_skew(hot, 16)["basis"]
    rng = np.random.default_rng(1)
    uni = np.stack([np.argsort(rng.random((4096, E)), axis=1)[:, :K] for _ in range(2)])
    got = ms.trace_skew(load_trace(_npz(tmp_path / "uni.npz", uni, E)), 8)
    assert 1.0 <= got["skew"] < 1.05
    with pytest.raises(ValueError, match="do not split over 1024"):
        ms.trace_skew(hot, 1024)


def test_trace_copy_skews_by_hand(tmp_path):
    """Every token picks experts 0-3 (rank 0 at world 8, 32 experts a rank) and one expert on
    each of ranks 1-4: picks 4T on rank 0 against a mean of T (x4); copies T on ranks 0-4
    against a mean of 5T/8 (x1.6); on 2 nodes of 4 every token reaches both (x1)."""
    topk = np.tile([0, 1, 2, 3, 32, 64, 96, 128], (1, 64, 1))
    got = ms.trace_skew(load_trace(_npz(tmp_path / "h.npz", topk, E)), 8, G=4)
    assert (got["skew"], got["rank_skew"], got["node_skew"]) == pytest.approx((4.0, 1.6, 1.0))


def test_a_world_the_skew_cannot_take_keeps_its_uniform_rows_and_says_why(tmp_path):
    trace = load_trace(_npz(tmp_path / "t.npz", np.tile(np.arange(K), (1, 96, 1)), E))
    skipped = []
    rows = md.project("moe", [32, 64], RACK, skew_of=lambda p, G: ms.trace_skew(trace, p, G), skipped=skipped)
    assert {(r["world"], r["routing"] == "uniform") for r in rows} == {(32, True), (32, False), (64, True)}
    assert [(s["world"], s["case"]) for s in skipped] == [(64, "")] and "96 tokens" in skipped[0]["reason"]


def _table(out: str) -> dict:
    """(world, dispatcher cell, routing) -> dispatch us from the plain table."""
    got = {}
    for ln in out.splitlines():
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit():
            got[(int(cells[0]), cells[2], cells[3])] = float(cells[7])
    return got


@pytest.mark.multirank
def test_cli_hot_rank_projects_longer_than_uniform_and_says_its_basis():
    r = run_cli("model", "--kind", "moe", "--profile", "gb300-nvl72", "--workload", "hot_rank",
                "--param", "moe.ratio=4", "--worlds", "8,64")
    assert r.returncode == 0, r.stderr
    t = _table(r.stdout)
    for p in (8, 64):
        for disp in ("alltoall (flat)", "hierarchical", "deepep-normal (node_limited)"):
            assert t[(p, disp, "hot_rank ratio=4.0")] > t[(p, disp, "uniform")]
        skew = float(rt.expected_rank_load_share("hot_rank", E, K, p, ratio=4.0).max()) * p
        line = re.search(rf"^skew at world {p}: hot_rank ratio=4.0 seed=0, T=4096: the hottest rank receives ([0-9.]+)x",
                         r.stdout, re.M)
        assert line and float(line.group(1)) == pytest.approx(skew, abs=0.005)


@pytest.mark.multirank
def test_cli_hot_experts_projects_longer_than_uniform_at_64_to_1024():
    r = run_cli("model", "--kind", "moe", "--profile", "gb300-nvl72", "--workload", "hot_experts",
                "--param", "moe.hot_k=8", "--param", "moe.hot_share=0.3", "--experts", "1024",
                "--worlds", "64,256,1024")
    assert r.returncode == 0, r.stderr
    t = _table(r.stdout)
    label = "hot_experts hot_k=8 hot_share=0.3"
    for p in (64, 256, 1024):
        for disp in ("alltoall (flat)", "hierarchical", "deepep-normal (node_limited)"):
            assert t[(p, disp, label)] > t[(p, disp, "uniform")], (p, disp)
        assert re.search(rf"^skew at world {p}: {label} seed=0, T=4096: the hottest rank receives", r.stdout, re.M)


@pytest.mark.multirank
def test_cli_burst_takes_its_steps_and_a_listed_ragged_split_its_mean():
    r = run_cli("model", "--profile", "gb300-nvl72", "--workload", "burst", "--param", "moe.burst_factor=3",
                "--worlds", "8")
    assert r.returncode == 0, r.stderr
    assert "mean over 4 steps, worst step x3.00" in " ".join(r.stdout.split())
    r = run_cli("model", "--profile", "gb300-nvl72", "--workload", "source_ragged", "--param",
                "moe.tokens_by_rank=4096/1024/2048/512", "--worlds", "4,8")
    assert r.returncode == 0, r.stderr
    assert "T=1920: the busiest rank sends 2.13x" in r.stdout
    assert "left out: world 8: source_ragged tokens_by_rank has 4 entries for 8 ranks" in r.stdout


@pytest.mark.multirank
@pytest.mark.parametrize("args, words", [
    (["--workload", "nope"], "unknown workload 'nope'"),
    (["--workload", "hot_rank", "--param", "moe.alpha=2"], "moe.alpha does not apply"),
    (["--workload", "hot_rank", "--param", "moe.tokens=128"], "use --tokens"),
    (["--workload", "hot_rank", "--param", "moe.ratio=0.5"], "ratio"),
    (["--workload", "hot_rank", "--param", "allreduce.ratio=2"], "moe.KNOB=V"),
    (["--param", "moe.ratio=4"], "name the workload"),
    (["--workload", "zipf", "--trace", "x.npz"], "give one"),
    (["--kind", "all_reduce", "--workload", "zipf"], "--kind moe only"),
    (["--dispatchers", "pplx"], "unknown MoE dispatcher"),
    (["--workload", "burst", "--param", "moe.steps=2"], "never reaches the burst step"),
    (["--workload", "hot_experts", "--param", "moe.hot_share=2"], "hot_share"),
    (["--workload", "hot_experts", "--param", "moe.ratio=2"], "moe.ratio does not apply"),
    (["--trace", "BAD"], "bad.npy"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, words):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY not really")
    r = run_cli("model", "--profile", "gb300-nvl72", "--worlds", "8", *[str(bad) if a == "BAD" else a for a in args])
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("commbench: error:"), r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


@pytest.mark.multirank
def test_cli_trace_skips_a_world_it_does_not_split_over_in_one_line(tmp_path):
    f = _npz(tmp_path / "t.npz", np.tile(np.arange(K), (1, 96, 1)), E)
    r = run_cli("model", "--profile", "gb300-nvl72", "--trace", f, "--worlds", "32,64")
    assert r.returncode == 0, r.stderr
    t = _table(r.stdout)
    assert t[(32, "alltoall (flat)", "trace t.npz@" + load_trace(f).sha256[:16])] > t[(32, "alltoall (flat)", "uniform")]
    left = [ln for ln in r.stdout.splitlines() if ln.startswith("left out: world 64")]
    assert len(left) == 1 and "96 tokens" in left[0]


def test_a_skew_that_moves_the_slower_tier_moves_the_bottleneck_with_it():
    from commbench.analyse.model_skew import with_skew

    detail = {"nic_us": 100.0, "nvl_us": 50.0, "latency_us": 5.0, "time_us": 105.0, "v_nic_nbytes": 1.0,
              "v_nvl_nbytes": 1.0, "bound": "NIC-bound", "bottleneck": "scaleout",
              "tier_names": ("scaleout", "scaleup")}
    same = with_skew(detail, 1.5, 1.5)
    assert same["bottleneck"] == "scaleout" and same["bound"] == "NIC-bound"
    moved = with_skew(detail, 4.0, 1.0)  # NVLink bytes x4: 200 us against the NIC's 100
    assert moved["bottleneck"] == "scaleup" and moved["bound"] == "NVLink-bound" and moved["time_us"] == 205.0
