"""The what-if model across scale-up domains that a world does not fill: the placement rule
(p ranks in equal parts over the fewest domains) and the rows it gives on 72-GPU racks,
against hand-computed figures."""
import re

import pytest

from commbench.analyse import model as md
from commbench.core.errors import UsageError
from conftest import run_cli

# A GB300-NVL72-like fabric with round numbers: 700 GB/s and 2 us on NVLink, 100 GB/s and
# 5 us on the NIC, 72 GPUs a rack.
RACK = md.fabric_from_rates(700.0, 2.0, 72, scaleout_gbps=100.0, scaleout_latency_us=5.0)


@pytest.mark.parametrize("p,domain,G", [
    (8, 72, 8), (64, 72, 64), (72, 72, 72),      # one domain holds the world
    (128, 72, 64), (256, 72, 64), (1024, 72, 64),  # 64 of each rack's 72
    (144, 72, 72), (96, 72, 48),                   # two full racks; two racks of 48
    (12, 8, 6), (16, 8, 8),                        # 8-GPU nodes
    (73, 72, 1),                                   # a prime: one rank a rack
    (5, None, 5),                                  # unbounded domain (one host)
])
def test_ranks_per_domain(p, domain, G):
    assert md.ranks_per_domain(p, domain) == G
    assert p % G == 0


def test_placement_text():
    assert md.placement(128, RACK) == {"domain_ranks": 64, "domains": 2, "placement": "2 x 64/72"}
    assert md.placement(1024, RACK)["placement"] == "16 x 64/72"
    assert md.placement(8, RACK)["placement"] == "8/72"
    assert md.placement(4, md.fabric_from_rates(10.0, 1.0, None))["placement"] == "one host"


def test_hierarchical_all_reduce_across_partial_racks():
    # p = 128: G = 64, N = 2. S = 1.12e9 B: S/B_nvl = 1600 us, (S/G)/B_nic = 175 us.
    # 2*63*2 + 2*1*5 = 262 us latency; 2*63/64 * 1600 = 3150; 2*1/2 * 175 = 175. The phases
    # are pipelined (NCCL's tree / NVLSTree): the slower one counts, not the sum.
    assert md.all_reduce_time_us("hierarchical", 128, 1.12e9, RACK) == pytest.approx(262 + max(3150, 175))
    # p = 1024: G = 64, N = 16: 252 + 2*15*5 = 402 us; 3150; 2*15/16 * 175 = 328.125.
    assert md.all_reduce_time_us("hierarchical", 1024, 1.12e9, RACK) == pytest.approx(402 + max(3150, 328.125))


def test_flat_all_to_all_across_partial_racks():
    # p = 128, G = 64: 64 NIC steps of 5 us, 63 NVLink steps of 2 us; half of S over the
    # NIC (S = 1e9: 5000 us), 63/128 of it over NVLink (703 us): the NIC decides.
    assert md.all_to_all_time_us(128, 1e9, RACK) == pytest.approx(64 * 5 + 63 * 2 + 5000)


def test_moe_at_128_on_72_gpu_racks():
    d = md.moe_scenario_defaults()  # T 4096, 7392-byte FP8 rows, E 256, K 8, M 4
    per_copy = d["tokens"] * d["token_nbytes"]  # 30,277,632 bytes
    flat = md.moe_time_us("flat", d["tokens"], d["hidden"], d["token_nbytes"], d["experts"], d["topk"],
                          128, None, d["M"], RACK)
    # flat: K (P-G)/P = 8*64/128 = 4 copies over the NIC, K (G-1)/P = 8*63/128 = 3.9375 on NVLink
    assert (flat["nic_copies_per_token"], flat["nvl_copies_per_token"]) == (4.0, 3.9375)
    # 4 * 30,277,632 B / 100 GB/s = 1211.10528 us, plus one alpha per tier (5 + 2)
    assert flat["time_us"] == pytest.approx(4 * per_copy / 100e3 + 7)
    assert flat["bottleneck"] == "scaleout"
    # node-limited: M = 4 capped at the N = 2 racks there are, M (N-1)/N = 1 NIC copy
    nl = md.moe_time_us("node_limited", d["tokens"], d["hidden"], d["token_nbytes"], d["experts"], d["topk"],
                        128, None, d["M"], RACK)
    assert nl["nic_copies_per_token"] == pytest.approx(1.0)


def test_project_keeps_every_world_that_fits_and_says_why_the_others_do_not():
    skipped = []
    rows = md.project("moe", [64, 128, 256, 512, 1024], RACK, skipped=skipped)
    worlds = {r["world"] for r in rows}
    assert worlds == {64, 128, 256}  # 256 experts cannot spread over 512 or 1024 ranks
    assert {(s["world"], s["case"]) for s in skipped} == {(w, c) for w in (512, 1024) for c in md.accounting.CASES}
    assert all("not divisible" in s["reason"] for s in skipped)
    assert {r["placement"] for r in rows if r["world"] == 256} == {"4 x 64/72"}

    ar = md.project("all_reduce", [64, 128, 1024], RACK, sizes_nbytes=[1.12e9], algos=["ring", "hierarchical"])
    hier = {r["world"]: r for r in ar if r["algo"] == "hierarchical"}
    assert set(hier) == {64, 128, 1024}  # beyond one rack too
    assert hier[128]["time_us"] == pytest.approx(262 + 3150)
    assert hier[128]["bound"] == "NVLink-bound"
    assert (hier[1024]["domains"], hier[1024]["domain_ranks"]) == (16, 64)


def test_an_explicit_domain_size_must_still_divide_the_world():
    d = md.moe_scenario_defaults()
    with pytest.raises(UsageError, match="multiple"):
        md.moe_time_us("flat", d["tokens"], d["hidden"], d["token_nbytes"], d["experts"], d["topk"],
                       128, 72, d["M"], RACK)


@pytest.mark.multirank
def test_make_model_shows_gb300_across_racks():
    """What `make model` runs, at worlds above one 72-GPU rack: rows at 128 and 256 for every
    MoE case, hierarchical all_reduce at 128 and 1024, and the placement rule among the
    printed assumptions."""
    def table_rows(out, world, word):
        return [ln for ln in out.splitlines() if re.match(rf"^\|\s*{world}\s*\|", ln) and word in ln]

    r = run_cli("model", "--kind", "moe", "--profile", "gb300-nvl72", "--worlds", "64,128,256")
    assert r.returncode == 0, r.stderr
    for w in (128, 256):
        for case in md.accounting.CASES:
            assert len(table_rows(r.stdout, w, case)) == 1, (w, case, r.stdout[-3000:])
    assert "largest divisor of p" in " ".join(r.stdout.split())
    r = run_cli("model", "--kind", "all_reduce", "--profile", "gb300-nvl72", "--sizes", "1G",
                "--algos", "ring,hierarchical", "--worlds", "128,1024")
    assert r.returncode == 0, r.stderr
    for w in (128, 1024):
        assert len(table_rows(r.stdout, w, "hierarchical")) == 1, (w, r.stdout[-3000:])
