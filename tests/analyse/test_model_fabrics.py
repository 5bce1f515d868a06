"""The what-if model across fabrics (docs/model.md#latency-and-protocols): NCCL's tuner
latencies and protocols, the fabric's own network latency, ramp and protocols (EFA, TCPXO,
RoCE, InfiniBand profiles), NVLS's latency apart from its ramp, all_gather / reduce_scatter /
all_to_all on every rail, and --nic-gbps keeping the profile's achieved/line ratio."""
import dataclasses

import pytest

from commbench.analyse import collectives as co
from commbench.analyse import latency as L
from commbench.analyse import model as md
from commbench.analyse.profiles import (
    apply_overrides,
    list_profiles,
    load_profile,
    loopback_profile,
    parse_profile_text,
)
from commbench.core.errors import UsageError
from conftest import ROOT, run_cli

GiB, MiB = 1 << 30, 1 << 20


def fab(name):
    return md.fabric_from_profile(load_profile(name))


# ------------------------------------------------------------------ NCCL's tuner, as latency.py reads it

def test_nccl_latencies_follow_tuning_cc():
    # ring all_reduce in one node of 8: base + 2(p-1) NVLink steps (tuning.cc:151, :159, :412)
    assert L.nccl_latency_us("ring", "LL", "all_reduce", 8, 8, 1) == pytest.approx(6.6 + 14 * 0.6)
    assert L.nccl_latency_us("ring", "Simple", "all_gather", 8, 8, 1) == pytest.approx(8.4 + 7 * 3.4)
    # across 2 nodes: 2(N-1) network steps, the others at max(NVLink, net overhead, x3 for Simple)
    assert L.nccl_latency_us("ring", "LL", "all_reduce", 16, 8, 2) == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)
    assert L.nccl_latency_us("ring", "Simple", "all_reduce", 16, 8, 2, 5.0) == pytest.approx(
        8.4 + 28 * 3.4 + 2 * (14.0 + 2 * 5.0))  # the fabric's latency twice for Simple (the flush)
    # tree: 2((G-1) NVLink + log2 N network); NVLS: one 25 us latency whatever G; NVLSTree + 2 log2 N
    assert L.nccl_latency_us("tree", "LL", "all_reduce", 32, 8, 4, 1.0) == pytest.approx(
        6.8 + 2 * (7 * 0.6 + 2 * (5.0 + 1.0)))
    assert L.nccl_latency_us("nvls", "Simple", "all_reduce", 72, 72, 1) == 25.0
    assert L.nccl_latency_us("nvls", "Simple", "all_reduce", 8, 8, 1) == 25.0
    assert L.nccl_latency_us("nvls_tree", "Simple", "all_reduce", 16, 8, 2) == pytest.approx(25 + 2 * 20.9)
    with pytest.raises(ValueError):
        L.nccl_latency_us("nvls", "LL", "all_reduce", 8, 8, 1)  # NVLS runs Simple only (tuning.cc:301)


def test_a_fabric_may_give_simple_its_own_network_extra():
    # NCCL adds the plugin's latency once more for Simple (tuning.cc:391); TCPXO's Simple path costs more
    assert L.inter_latency_us("ring", "Simple", 10.0, 8) == pytest.approx(14.0 + 20.0)
    assert L.inter_latency_us("ring", "Simple", 10.0, 8, 100.0) == pytest.approx(14.0 + 110.0)
    assert L.inter_latency_us("ring", "LL", 10.0, 8, 100.0) == pytest.approx(2.7 + 10.0)
    assert L.inter_latency_us("ring", "LL", 10.0, 1) == pytest.approx(5.0 + 10.0)  # one rank a node: tree's


def test_protocol_rates_follow_tuning_cc():
    assert L.protocol_rate_gbps("ring", "LL", 370, 1, "hopper") == pytest.approx(141.0)  # min(llMaxBw, 0.5 x)
    assert L.protocol_rate_gbps("ring", "LL", 100, 1, "hopper") == pytest.approx(50.0)
    assert L.protocol_rate_gbps("ring", "LL", 370, 2, "hopper") == pytest.approx(39.0)  # two nodes' cap
    assert L.protocol_rate_gbps("ring", "LL128", 370, 4, "hopper") == pytest.approx(0.92 * 370)
    assert L.protocol_rate_gbps("tree", "LL128", 340, 1, "blackwell") == pytest.approx(340 * 7 / 9)
    assert L.protocol_rate_gbps("tree", "LL128", 340, 2, "blackwell") == pytest.approx(340 * 120 / 128)
    assert L.protocol_rate_gbps("nvls", "Simple", 274, 1, "hopper") == 274


def test_nccl_channels_across_nodes_follow_its_graph_search():
    # search.cc: the fastest speed the GPU's path to its NIC carries, one channel a NIC, then
    # ncclTopoDupChannels doubles them unless a channel is slow (< 25, or < 50 with > 4 channels from Hopper)
    assert L.nccl_net_channels(8, 48.0, "blackwell") == 8  # 400G NDR behind PCIe Gen5
    assert L.nccl_net_channels(8, 48.0, "hopper") == 8
    assert L.nccl_net_channels(8, 24.0, "ampere") == 8  # HDR behind Gen4
    assert L.nccl_net_channels(8, 40.0, "hopper") == 8  # 400G RoCE at 40
    assert L.nccl_net_channels(8, 96.0, "blackwell") == 16  # ConnectX-8 800G: 96 a channel, doubled to 48
    assert L.nccl_net_channels(4, 48.0, "blackwell") == 8  # 4 channels are few enough to double


def test_per_channel_ceilings_follow_tuning_cc():
    # perChMaxTreeBws / perChMaxTreeLL128Bws / perChMaxRingLL128Bws (tuning.cc:184-203), times the channels
    assert L.per_channel_cap_gbps("tree", "Simple", 4, "blackwell", 8) == pytest.approx(8 * 24.0)
    assert L.per_channel_cap_gbps("tree", "Simple", 2, "blackwell", 8) == pytest.approx(8 * 42.8)
    assert L.per_channel_cap_gbps("tree", "Simple", 4, "hopper", 8) == pytest.approx(8 * 36.0)
    assert L.per_channel_cap_gbps("tree", "LL128", 4, "blackwell", 8) == pytest.approx(min(8 * 24 * 120 / 128, 8 * 20.0))
    assert L.per_channel_cap_gbps("tree", "LL", 4, "blackwell", 8) == pytest.approx(L.LL_MAX_BUSBW_MORE_NODES)
    assert L.per_channel_cap_gbps("ring", "LL128", 2, "hopper", 8) == pytest.approx(8 * 36.7)
    assert L.per_channel_cap_gbps("ring", "Simple", 2, "hopper", 8) is None
    assert L.per_channel_cap_gbps("nvls_tree", "Simple", 2, "hopper", 8) is None


def test_the_ceilings_bind_across_nodes_on_nccls_own_transport_only():
    # one NIC a GPU on InfiniBand / RoCE: NCCL's channels; a plugin's NICs (EFA, TCPXO) or an NVL72 rack's
    # trays: no channel count, no ceiling
    on = {n: fab(n).terms.nic_channels for n in list_profiles() if n != "loopback"}
    assert {n for n, v in on.items() if v} == {"a100-hgx", "h100-hgx", "h200-hgx", "h800-hgx", "b200-hgx",
                                                "b300-hgx", "h100-roce"}
    # forced Tree, 4 x 8 B200 at 32 GiB: 8 channels x 24 GB/s, S moved at half that bus rate
    d = md.all_reduce_detail("tree", 32, 32 * GiB, fab("b200-hgx"))
    busbw = 32 * GiB * 2 * 31 / 32 / (d["time_us"] * 1e3)
    assert d["bound"] == "NIC-bound" and busbw == pytest.approx(8 * 24.0 * 31 / 32, rel=0.02)
    # NCCL's ring plateau (tuning.cc:647-650): Ring Simple all_reduce latency x 1.4 across those nodes
    f = fab("b200-hgx")
    ring = md.all_reduce_detail("ring", 32, GiB, f, proto="Simple")
    plain = md.all_reduce_detail("ring", 32, GiB, dataclasses.replace(f, terms=dataclasses.replace(f.terms, nic_channels=False)), proto="Simple")
    assert ring["latency_us"] - f.terms.net_fixed_us == pytest.approx(1.4 * (plain["latency_us"] - f.terms.net_fixed_us))
    # inside one node nothing changes: the chain at 0.92 of NVLink
    one = md.all_reduce_detail("tree", 8, 32 * GiB, fab("b200-hgx"))
    assert 8 * GiB * 4 * 2 * 7 / 8 / (one["time_us"] * 1e3) > 500


def test_trees_mid_sizes_take_nccls_correction_factor(monkeypatch):
    # treeCorrectionFactor[proto][log2i(S >> 6)] (tuning.cc:623-627): Tree below 512 MiB (:640-642)
    assert L.tree_correction("tree", "LL128", MiB, "hopper") == 0.6  # logSize 14
    assert L.tree_correction("tree", "Simple", 128 * MiB, "hopper") == 0.9  # logSize 21
    assert L.tree_correction("tree", "Simple", 512 * MiB, "hopper") == 1.0  # logSize 23: none
    assert L.tree_correction("tree", "LL", 8, "hopper") == 1.0  # under 64 B: none
    # NVLSTree below 1 GiB on Blackwell with an x86 host only (:643-646)
    assert L.tree_correction("nvls_tree", "Simple", 128 * MiB, "blackwell") == 0.9
    assert L.tree_correction("nvls_tree", "Simple", 128 * MiB, "blackwell", "arm") == 1.0
    assert L.tree_correction("nvls_tree", "Simple", 128 * MiB, "hopper") == 1.0
    assert L.tree_correction("nvls_tree", "Simple", GiB, "blackwell") == 1.0
    # in the model: a 1 MiB Tree LL128 all_reduce across 2 x 8 H100 moves its bytes at 0.6 of the rate
    f = fab("h100-hgx")
    d = co.all_reduce_detail("tree", 16, MiB, f, "LL128")
    monkeypatch.setattr(L, "tree_correction", lambda *a, **k: 1.0)
    plain = co.all_reduce_detail("tree", 16, MiB, f, "LL128")
    monkeypatch.undo()
    assert d["latency_us"] == plain["latency_us"]
    assert d["time_us"] - d["latency_us"] == pytest.approx((plain["time_us"] - plain["latency_us"]) / 0.6)
    # B200 hosts are x86, GB200 / GB300 racks Grace: the same NVLSTree size costs more on the first
    b200, gb200 = fab("b200-hgx"), fab("gb200-nvl72")
    assert (b200.terms.host_cpu, gb200.terms.host_cpu) == ("x86", "arm")
    on_x86 = co.all_reduce_detail("inswitch", 16, 128 * MiB, b200)
    on_arm = co.all_reduce_detail("inswitch", 16, 128 * MiB, dataclasses.replace(
        b200, terms=dataclasses.replace(b200.terms, host_cpu="arm")))
    assert on_x86["nccl"] == "NVLSTree" and on_x86["time_us"] > on_arm["time_us"] * 1.05


def test_nccl_picks_ll_small_and_simple_large():
    h100 = fab("h100-hgx")
    assert md.nccl_pick(16, 8, h100)["proto"] == "LL"
    assert md.nccl_pick(16, 8 * GiB, h100)["proto"] == "Simple"
    assert md.all_reduce_detail("ring", 8, 64 * MiB, h100, proto="LL")["time_us"] > \
        md.all_reduce_detail("ring", 8, 64 * MiB, h100, proto="Simple")["time_us"]
    with pytest.raises(UsageError, match="Simple only"):
        md.all_reduce_detail("inswitch", 8, GiB, h100, proto="LL")


# ------------------------------------------------------------------ latency inside a domain

def test_a_tiny_all_reduce_on_72_gpus_pays_nvls_latency_not_a_step_per_gpu():
    gb = fab("gb200-nvl72")
    t72 = md.nccl_pick(72, 4, gb)
    assert t72["nccl"] == "NVLS" and t72["time_us"] < 30  # was 284 us: 2 us x 2 x 71 ring steps
    assert md.nccl_pick(8, 4, gb)["time_us"] <= t72["time_us"]  # 8 GPUs: a ring's 14 LL steps are cheaper
    # without NVLS (A100) NCCL's ring does grow with p, as its tuner says
    a100 = fab("a100-hgx")
    assert md.nccl_pick(8, 4, a100)["time_us"] > md.nccl_pick(4, 4, a100)["time_us"]


def test_nvls_latency_is_apart_from_its_bandwidth_ramp():
    gb = fab("gb200-nvl72")
    A = gb.terms.inswitch_algbw_gbps
    R = gb.terms.inswitch_ramp_nbytes_per_gpu * 72
    assert co.nvls_ramp_us(0, 72, gb) == 0.0
    small = md.all_reduce_detail("inswitch", 72, 1 * MiB, gb)
    assert small["time_us"] == pytest.approx(25.0 + 2 * MiB / (A * 1e3))  # below the ramp: half rate
    big = md.all_reduce_detail("inswitch", 72, 8 * GiB, gb)
    assert big["time_us"] == pytest.approx(25.0 + (8 * GiB + R) / (A * 1e3))  # above: R/A in all


def test_nvlstree_4_bytes_on_2x8_hopper_costs_tens_of_us():
    h100 = fab("h100-hgx")
    d = md.all_reduce_detail("inswitch", 16, 4, h100)
    # NCCL's tuner: 25 + 2 x 20.9 (tuning.cc:161, :173); published 47.5 (NVIDIA/nccl#1244); was ~110
    assert d["nccl"] == "NVLSTree" and d["bound"] == "latency-bound"
    assert 40 < d["time_us"] < 70


# ------------------------------------------------------------------ fabrics

def test_small_messages_cost_more_on_efa_and_tcpxo_than_on_infiniband():
    t = {n: md.nccl_pick(16, 8, fab(n))["time_us"] for n in ("h100-hgx", "h100-roce", "h100-p5-efa",
                                                               "h100-a3mega-tcpxo")}
    assert t["h100-p5-efa"] > 2 * t["h100-hgx"]  # 69 us on 2 x p5 (aws-samples) against ~25 on IB
    assert t["h100-a3mega-tcpxo"] > t["h100-p5-efa"]
    assert t["h100-roce"] == pytest.approx(t["h100-hgx"])  # the same NIC and verbs path
    # a large message is NVLink- or NIC-bound on every one: the latencies do not matter there
    big = {n: md.nccl_pick(16, 8 * GiB, fab(n))["time_us"] for n in ("h100-hgx", "h100-roce", "h100-p5-efa")}
    assert max(big.values()) < 1.3 * min(big.values())


def test_efa_runs_no_ll128_across_nodes_but_nvlink_still_does():
    efa = fab("h100-p5-efa")
    assert efa.terms.net_protocols == ("LL", "Simple")
    for S in (8, MiB, 16 * MiB, GiB):
        assert md.nccl_pick(16, S, efa)["proto"] != "LL128"
    with pytest.raises(UsageError, match="not LL128"):
        md.all_reduce_detail("ring", 16, MiB, efa, proto="LL128")
    assert md.all_reduce_detail("ring", 8, 16 * MiB, efa, proto="LL128")["proto"] == "LL128"


def test_the_network_ramp_slows_mid_sizes_only_where_a_profile_has_one():
    efa = fab("h100-p5-efa")
    flat = dataclasses.replace(efa, terms=dataclasses.replace(efa.terms, net_ramp_nbytes_per_gpu=0.0))
    S = 32 * MiB
    with_ramp, without = md.all_to_all_detail(16, S, efa), md.all_to_all_detail(16, S, flat)
    assert with_ramp["nic_us"] == pytest.approx(2 * without["nic_us"])  # S/2 a rank, all below the ramp
    huge = 64 * GiB
    assert md.all_to_all_detail(16, huge, efa)["nic_us"] == pytest.approx(
        md.all_to_all_detail(16, huge, flat)["nic_us"] + 16 * MiB / 48e3)
    assert fab("h100-hgx").terms.net_ramp_nbytes_per_gpu == 0.0


# ------------------------------------------------------------------ every collective on every rail

def test_all_gather_across_2x8_is_no_slower_than_ring_all_reduce():
    h100 = fab("h100-hgx")
    ag = md.all_gather_detail(16, GiB, h100)
    ar = md.all_reduce_detail("ring", 16, GiB, h100)
    assert ag["time_us"] < ar["time_us"]  # half the bytes on the same rails (was 3.8x slower)
    assert ag["time_us"] == pytest.approx(ar["time_us"] / 2, rel=0.05)
    rs = md.reduce_scatter_detail(16, GiB, h100)
    assert rs["time_us"] == pytest.approx(ag["time_us"])
    # on 32 nodes the ring runs at min(B_up, 8 x B_nic) = 370, not one NIC's 48
    big = md.all_gather_detail(256, 2 * GiB, h100)
    busbw = 255 / 256 * 2 * GiB / (big["time_us"] * 1e3)
    assert 250 < busbw < 370


def test_all_gather_rails_and_alpha_path():
    # alpha-beta fabric (no GPU profile): (p-N) a_up + (N-1) a_nic + (p-1)/p S / min(B_up, rails B_nic)
    f = md.fabric_from_rates(450.0, 1.0, 8, scaleout_gbps=50.0, scaleout_latency_us=5.0)
    S = 1e9
    assert md.all_gather_time_us(16, S, f) == pytest.approx(14 * 1.0 + 1 * 5.0 + 15 / 16 * S / 400e3)
    two = dataclasses.replace(f, terms=md.Terms(rails=2))
    d = md.all_gather_detail(16, S, two)
    assert d["bound"] == "NIC-bound" and d["nic_us"] == pytest.approx(15 / 16 * S / 100e3)


def test_infiniband_pays_a_fixed_cost_across_nodes_fitted_on_abci():
    # ABCI 2.0's 8 B all_reduce on 2-16 nodes sits 7.4, 6.8, 6.2 and 6.5 us over NCCL's Tree LL latency
    # (whose 2 x 5.0 us a doubling of nodes it follows): InfiniBand profiles carry their mean, once a
    # collective that crosses nodes, for Ring, Tree and all_to_all; not inside one node, not on NVLSTree
    h100 = fab("h100-hgx")
    assert h100.terms.net_fixed_us == pytest.approx(6.7)
    assert fab("h100-p5-efa").terms.net_fixed_us == 0.0  # EFA's fitted per-step latency holds it
    inside, across = md.nccl_pick(8, 8, h100), md.nccl_pick(16, 8, h100)
    assert across["nccl"] == "Tree" and across["latency_us"] == pytest.approx(
        L.nccl_latency_us("tree", "LL", "all_reduce", 16, 8, 2) + 6.7)
    assert inside["latency_us"] == pytest.approx(L.nccl_latency_us(
        "ring" if inside["nccl"] == "Ring" else "tree", inside["proto"], "all_reduce", 8, 8, 1))
    nvlstree = co.all_reduce_detail("inswitch", 16, 4, h100)
    assert nvlstree["latency_us"] == pytest.approx(L.nccl_latency_us("nvls_tree", "Simple", "all_reduce", 16, 8, 2))
    a100 = fab("a100-hgx")
    for nodes, published in ((2, 32.62), (4, 42.03), (8, 51.38), (16, 61.68)):
        assert md.nccl_pick(8 * nodes, 8, a100)["time_us"] == pytest.approx(published, abs=0.8)


def test_all_to_all_latency_overlaps_on_nccl_and_not_on_mpi():
    h100 = fab("h100-hgx")
    lat16 = md.all_to_all_detail(16, 8, h100)["latency_us"]
    lat256 = md.all_to_all_detail(256, 8, h100)["latency_us"]
    # one step of each tier, every peer at once, and InfiniBand's fixed cost across nodes (net_fixed_us)
    assert lat16 == lat256 == pytest.approx(8.4 + 3.4 + 14.0 + h100.terms.net_fixed_us)
    f = md.fabric_from_rates(450.0, 1.0, 8, scaleout_gbps=50.0, scaleout_latency_us=5.0)
    assert md.all_to_all_detail(32, 8, f)["latency_us"] == pytest.approx(24 * 5.0 + 7 * 1.0)  # pairwise, in turn


# ------------------------------------------------------------------ profiles and overrides

def test_nic_gbps_keeps_the_profiles_achieved_to_line_ratio_in_the_model():
    h100 = load_profile("h100-hgx")
    p = apply_overrides(h100, {"nic_gbps": 400}, nic_keeps_ratio=True)
    assert p.scaleout_line_gbps == 50 and p.scaleout_achieved_gbps == pytest.approx(48)  # not 50
    p = apply_overrides(h100, {"nic_gbps": 800}, nic_keeps_ratio=True)
    assert p.scaleout_achieved_gbps == pytest.approx(96) and "ratio" in p.notes
    assert apply_overrides(h100, {"nic_gbps": 800}).scaleout_achieved_gbps == 100  # ceilings: line = achieved
    lb = apply_overrides(loopback_profile(20, 10, 1 << 20, 0.3), {"nic_gbps": 100}, nic_keeps_ratio=True)
    assert lb.scaleout_achieved_gbps == lb.scaleout_line_gbps == 12.5  # no NIC to take a ratio from


def test_fabric_profiles_load_with_their_sources():
    names = list_profiles()
    for n in ("h100-p5-efa", "h100-a3mega-tcpxo", "h100-roce", "h100-hgx", "gb300-nvl72"):
        assert n in names
    for n in names:
        p = load_profile(n)
        if p.measured:
            assert p.gpu_arch is None  # loopback: plain alpha-beta
            continue
        assert p.gpu_arch in ("ampere", "hopper", "blackwell") and p.net_latency_us is not None
        assert p.model_sources
    gb300 = load_profile("gb300-nvl72")
    assert gb300.scaleout_achieved_gbps == 96 and "aicr/issues/1413" in gb300.notes
    tcpxo = load_profile("h100-a3mega-tcpxo")
    assert tcpxo.net_simple_latency_us == 332.0 and "create-a3mega-ztan-fork" in tcpxo.model_sources
    assert "estimate" in (ROOT / "commbench" / "data" / "h100-roce.toml").read_text().lower()


@pytest.mark.parametrize("line,match", [
    ('gpu_arch = "volta"', "gpu_arch"),
    ('host_cpu = "power"', "host_cpu"),
    ('net_protocols = "LL,LL128"', "Simple"),
    ('net_latency_us = -1.0', "net_latency_us"),
])
def test_bad_fabric_terms_are_one_line_errors(line, match):
    base = (ROOT / "commbench" / "data" / "h100-hgx.toml").read_text()
    key = line.split(" =")[0]
    text = base.replace(next(x for x in base.splitlines() if x.startswith(key + " =")), line) if key in base \
        else base + line + "\n"
    with pytest.raises(UsageError, match=match):
        parse_profile_text(text, "x.toml")


@pytest.mark.multirank
def test_model_cli_all_gather_across_fabrics_and_nic_override():
    r = run_cli("model", "--kind", "all_gather", "--profile", "h100-p5-efa,h100-hgx", "--worlds", "16",
                "--sizes", "8,1G", "--nic-gbps", "400")
    assert r.returncode == 0, r.stderr
    assert "Ring LL" in r.stdout and "NVLink-bound" in r.stdout
    assert "scale-out 48 GB/s/dir" in r.stdout  # 400 Gb/s at the profile's 48/50, not 50
    # the fabric line says how many NCCL channels the per-channel ceilings rest on, where it knows them
    assert "8 NCCL channels across nodes" in r.stdout and r.stdout.count("NCCL channels across nodes") == 1
