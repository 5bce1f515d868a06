"""The what-if model class by class (issue 38; docs/model.md#what-the-table-says): the verdict
of `commbench model --against` judges each class (collective x tier x fabric, and each MoE
kernel stack) and names every class without a held-out row; the shipped table covers the
classes it claims; and one direction-and-size check a class."""
import dataclasses

import pytest

from commbench.analyse import latency as L
from commbench.analyse import model as md
from commbench.analyse import model_check as mc
from commbench.analyse.profiles import load_profile
from commbench.core.errors import UsageError
from commbench.report.model_view import class_lines, summary_lines

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def fab(name):
    return md.fabric_from_profile(load_profile(name))


@pytest.fixture(scope="module")
def table():
    rows = mc.load_table(mc.default_table())
    return rows, mc.check(rows)


def _row(i, group="all_reduce-multi", use="held-out", profile="h100-hgx", world=16, **kw):
    return {"id": f"r{i}", "group": group, "use": use, "source": "https://example.org", "hardware": "x",
            "profile": profile, "kind": group.split("-")[0], "algorithm": "nccl-default", "world": world,
            "measure": "busbw_GBps", "published": 1.0, "nbytes": GiB, **kw}


# ------------------------------------------------------------------ the verdict judges classes

def _checked(ratios_by_row):
    return [{**r, "ratio": x} for r, x in ratios_by_row]


def test_a_class_outside_the_band_fails_the_verdict_though_the_rows_are_within_1_5x():
    # 10 held-out rows all within 1.5x; the EFA class's median 1.3 is outside 0.8-1.25
    rows = [(_row(i), 1.0) for i in range(6)] + [(_row(10 + i, profile="h100-p5-efa"), 1.3) for i in range(4)]
    s = mc.summary(_checked(rows))
    assert s["held_within"] == (10, 10)
    assert s["class_misses"] == {("all_reduce-multi", "EFA"): "median 1.30"} and not s["ok"]
    text = "\n".join(summary_lines(s) + class_lines(s["classes"]))
    assert "verdict: the model misses: all_reduce-multi / EFA: median 1.30" in text
    assert "class all_reduce-multi / EFA: fit 0, held-out 4" in text and "OUTSIDE" in text


def test_a_class_with_fit_rows_only_is_named_and_fails():
    rows = [(_row(i), 1.0) for i in range(5)] + [(_row(9, use="fit", profile="h100-a3mega-tcpxo"), 1.0)]
    s = mc.summary(_checked(rows))
    assert s["class_misses"] == {("all_reduce-multi", "TCPXO"): "no held-out row"} and not s["ok"]
    assert "all_reduce-multi / TCPXO: no held-out row" in summary_lines(s)[-2]
    assert any("NO HELD-OUT ROW" in x for x in class_lines(s["classes"]))


def test_every_class_in_band_passes_and_the_absent_ones_are_listed():
    rows = [(_row(i), 1.1) for i in range(4)] + [(_row(5, group="all_reduce-intra", world=8), 0.9)]
    s = mc.summary(_checked(rows))
    assert s["ok"] and s["class_misses"] == {}
    assert ("all_gather-multi", "TCPXO") in s["absent"] and ("all_reduce-multi", "InfiniBand") not in s["absent"]
    assert ("moe", "deepep") in s["absent"]  # each MoE kernel stack is a class
    lines = summary_lines(s)
    assert lines[-2].startswith("verdict: the model agrees") and "each of the 2 classes" in lines[-2]
    assert lines[-1].startswith("classes with no published figure in this table (not judged):")


def test_the_90_percent_rule_still_holds_beside_the_classes():
    rows = [(_row(i), 1.0) for i in range(8)] + [(_row(20 + i), 2.0) for i in range(2)]  # 80 % within 1.5x
    s = mc.summary(_checked(rows))
    assert s["class_misses"] == {} and not s["ok"]
    assert "80 % within 1.5x, under 90 %" in summary_lines(s)[-2]


def test_moe_rows_are_classed_by_their_kernel_stack(table):
    rows, _ = table
    r = next(r for r in rows if r["kind"] == "moe" and r["stack"] == "deepep-ll")
    assert mc.class_of(r) == ("moe", "deepep-ll")
    assert mc.class_of(next(r for r in rows if r["id"] == "h100-4x8-roce")) == ("all_reduce-multi", "RoCE")


# ------------------------------------------------------------------ the shipped table covers its classes

def test_every_class_the_table_has_holds_out_at_least_half_but_tcpxo_all_reduce(table):
    _, checked = table
    classes = mc.class_summary(checked)
    short = {k: v for k, v in classes.items() if v["held"] < v["fit"]}
    # TCPXO's all_reduce: 7 rows of the sweep that set the profile's terms, 5 held out (a later
    # torch.distributed sweep on the same machine type); the only class under half
    assert set(short) == {("all_reduce-multi", "TCPXO")}, short
    assert classes[("all_reduce-multi", "TCPXO")]["held"] >= 5
    # the classes issue 38 names: all_gather across nodes on two fabrics, all_reduce on all four
    for k in [("all_gather-multi", "RoCE"), ("all_gather-multi", "TCPXO"), ("all_gather-multi", "InfiniBand"),
              ("all_reduce-multi", "RoCE"), ("all_reduce-multi", "EFA"), ("all_reduce-multi", "InfiniBand"),
              ("all_to_all-multi", "EFA"), ("all_to_all-multi", "InfiniBand"), ("all_gather-intra", "NVLink"),
              ("all_to_all-multi", "RoCE"), ("reduce_scatter-intra", "NVLink")]:
        assert classes[k]["held"] >= 2, k


def test_small_messages_across_domains_are_held_out_on_three_fabrics(table):
    rows, _ = table
    small = {mc.fabric_of(r) for r in rows
             if r["use"] == "held-out" and r.get("nbytes", 1 << 40) <= 64 * KiB and mc.fabric_of(r) != "NVLink"}
    assert {"InfiniBand", "RoCE", "EFA"} <= small, small
    ag = {mc.fabric_of(r) for r in rows if r["use"] == "held-out" and r["group"] == "all_gather-multi"}
    assert {"InfiniBand", "RoCE", "TCPXO"} <= ag, ag


def test_a_source_is_on_one_side_for_every_row_added_across_fabrics(table):
    rows, _ = table
    mine = [r for r in rows if r["group"] in ("all_gather-multi", "reduce_scatter-multi")
            or mc.fabric_of(r) in ("RoCE", "TCPXO") or r["profile"] == "b200-p6-efa"]
    sides = {}
    for r in mine:
        sides.setdefault(r["source"], set()).add(r["use"])
    assert len(sides) >= 6 and {k: v for k, v in sides.items() if len(v) > 1} == {}


# ------------------------------------------------------------------ row keys: placement, fabric, protocols

def test_domain_gpus_places_the_run_and_fabric_names_its_network(table):
    rows, checked = table
    r = next(r for r in rows if r["id"] == "gb300-2x4-roce-ar-peak")
    assert r["domain_gpus"] == 4 and mc.fabric_of(r) == "RoCE"
    c = next(c for c in checked if c["id"] == r["id"])
    # a ring across two domains of 4 carries the traffic on 4 NICs: 4 x 96 GB/s, not NVLink's 695
    assert c["bound"] == "NIC-bound" and c["projected"] == pytest.approx(4 * 96, rel=0.02)
    assert mc.fabric_of({**r, "domain_gpus": None, "world": 8}) == "NVLink"  # the profile's 72: one rack


def test_protocols_is_the_runs_nccl_proto():
    tcpxo = fab("h100-a3mega-tcpxo")
    r = _row(1, group="all_gather-multi", profile="h100-a3mega-tcpxo", nbytes=16 * MiB)
    plain = mc.project_row(r, {})
    ll128 = mc.project_row({**r, "protocols": "LL128,Simple"}, {})
    assert tcpxo.terms.net_protocols == ("LL", "Simple") and plain["algorithm"] == "Ring LL"
    assert ll128["algorithm"] == "Ring LL128" and ll128["time_us"] < plain["time_us"] / 2


@pytest.mark.parametrize("extra,needle", [
    ({"domain_gpus": 5}, "must divide world"),
    ({"domain_gpus": 16}, "must divide world"),
    ({"fabric": "Slingshot"}, "choose one of InfiniBand, RoCE, EFA, TCPXO"),
    ({"protocols": "LL256"}, "NCCL protocols the run enabled"),
])
def test_bad_placement_keys_are_one_line_errors(tmp_path, extra, needle):
    f = tmp_path / "t.toml"
    f.write_text("[[figure]]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in _row(1, **extra).items()))
    with pytest.raises(UsageError, match=needle):
        mc.load_table(f)


# ------------------------------------------------------------------ one direction-and-size check a class

def test_all_reduce_inside_a_domain_nvls_beats_the_ring_at_the_published_rate():
    h100 = fab("h100-hgx")
    nvls, ring = (md.all_reduce_detail(a, 8, 4 * GiB, h100) for a in ("inswitch", "ring"))
    busbw = lambda d: 4 * GiB * 2 * 7 / 8 / (d["time_us"] * 1e3)  # noqa: E731
    assert nvls["time_us"] < ring["time_us"]
    assert 0.8 * 480 < busbw(nvls) < 1.25 * 480 and 0.8 * 370 < busbw(ring) < 1.25 * 370  # NVIDIA/nccl#1455


def test_all_reduce_across_infiniband_runs_nvlstree_near_the_nvlink_rate_on_two_nodes():
    d = md.nccl_pick(16, 8 * GiB, fab("h100-hgx"))
    busbw = 8 * GiB * 2 * 15 / 16 / (d["time_us"] * 1e3)
    assert d["nccl"] == "NVLSTree" and 350 < busbw < 520  # CoreWeave 2 x 8 H100: 441


def test_all_reduce_across_roce_is_slower_than_infiniband_by_its_nic_rate():
    roce, ib = (md.nccl_pick(32, 8 * GiB, fab(n)) for n in ("h100-roce", "h100-hgx"))
    assert roce["time_us"] > ib["time_us"]
    busbw = 8 * GiB * 2 * 31 / 32 / (roce["time_us"] * 1e3)
    assert 0.8 * 320 < busbw < 1.25 * 320  # NVIDIA/nccl#1221: 320 on 4 x 8 H100 over RoCE


def test_efa_8_bytes_is_slower_than_infiniband_8_bytes_and_near_the_published_times():
    efa, ib = (md.nccl_pick(16, 8, fab(n))["time_us"] for n in ("h100-p5-efa", "h100-hgx"))
    assert efa > 2 * ib
    p6 = md.nccl_pick(16, 8, fab("b200-p6-efa"))["time_us"]
    assert 50.58 / 1.5 < p6 < 50.58 * 1.5  # dstack PR 3961: 2 x p6-b200, 50.58 us


def test_tcpxo_8_bytes_is_slower_than_efa_8_bytes():
    tcpxo, efa = (md.nccl_pick(16, 8, fab(n))["time_us"] for n in ("h100-a3mega-tcpxo", "h100-p5-efa"))
    assert tcpxo > efa and 135.8 / 1.5 < tcpxo < 135.8 * 1.5  # the ztan 2 x a3-mega sweep's 8 B


def test_all_gather_across_2x8_no_slower_than_all_reduce_on_every_fabric():
    for n in ("h100-hgx", "h100-roce", "h100-p5-efa", "h100-a3mega-tcpxo"):
        f = fab(n)
        for S in (MiB, 64 * MiB, GiB):
            assert md.all_gather_detail(16, S, f)["time_us"] <= md.nccl_pick(16, S, f)["time_us"] * 1.001, (n, S)


def test_all_gather_across_roce_is_nic_bound_at_the_nic_rate():
    f = dataclasses.replace(fab("gb300-nvl72"), domain_gpus=4)
    d = md.all_gather_detail(8, 8 * GiB, f)
    busbw = 8 * GiB * 7 / 8 / (d["time_us"] * 1e3)
    assert d["bound"] == "NIC-bound" and 0.8 * 357.7 < busbw <= 4 * 96  # GCP A4X Max: 357.7 at 8 GiB


def test_reduce_scatter_across_nodes_costs_what_all_gather_does_plus_its_reduction():
    f = fab("h100-hgx")
    for S in (8 * KiB, 256 * MiB):
        assert md.reduce_scatter_detail(16, S, f)["time_us"] == pytest.approx(md.all_gather_detail(16, S, f)["time_us"])
    g = dataclasses.replace(f, gamma_us_per_byte=1e-6)
    assert md.reduce_scatter_detail(16, GiB, g)["time_us"] > md.all_gather_detail(16, GiB, g)["time_us"]


def test_all_to_all_across_nodes_is_nic_bound_and_slower_than_inside_one():
    f = fab("h100-p5-efa")
    inside, across = md.all_to_all_detail(8, GiB, f), md.all_to_all_detail(16, GiB, f)
    assert across["bound"] == "NIC-bound" and across["time_us"] > 3 * inside["time_us"]


def test_reduce_scatter_inside_a_domain_runs_the_ring_at_all_gathers_rate():
    # NCCL's ring inside one H100 node (NVIDIA/nccl#1083: Ring, not NVLS, for reduce_scatter there):
    # 8 GiB at the ring's ~370 busbw; NVIDIA/nccl#1047 measures 362 on 8 H100s
    f = fab("h100-hgx")
    rs, ag = md.reduce_scatter_detail(8, 8 * GiB, f), md.all_gather_detail(8, 8 * GiB, f)
    assert (rs["nccl"], rs["bound"]) == ("Ring", "NVLink-bound") and rs["time_us"] >= ag["time_us"]
    busbw = 8 * GiB * 7 / 8 / (rs["time_us"] * 1e3)
    assert 362.16 / 1.25 < busbw < 362.16 * 1.25


def test_all_gather_inside_a_domain_runs_the_ring_at_nvlinks_rate_and_faster_than_across():
    # 8 B200 on NVLink 5: NCCL's ring at the profile's 695 busbw; Vultr's 1 x 8 measures 663.8 at 8 GiB.
    # Across two such nodes the same bytes ride 8 NICs of 48 and take longer
    f = fab("b200-hgx")
    d = md.all_gather_detail(8, 8 * GiB, f)
    busbw = 8 * GiB * 7 / 8 / (d["time_us"] * 1e3)
    assert (d["nccl"], d["bound"]) == ("Ring", "NVLink-bound") and busbw <= 695
    assert 663.8 / 1.1 < busbw < 663.8 * 1.1
    assert md.all_gather_detail(16, 8 * GiB, f)["time_us"] > 1.5 * d["time_us"]


def test_all_to_all_inside_a_domain_is_nvlink_bound_at_the_published_rate():
    # 8 A100 (NVLink 3, 230 GB/s a GPU): all_to_all moves (p-1)/p of S over NVLink at once, so busbw is
    # 230 x 7/8; the table's 1 GiB row measures 216.7. On 8 B200 the same rule gives 695 x 7/8, where
    # Vultr's B200 and Oracle's B300 measure 668.3 and 675.5 at 8 GiB
    a100 = md.all_to_all_detail(8, GiB, fab("a100-hgx"))
    busbw = GiB * 7 / 8 / (a100["time_us"] * 1e3)
    assert a100["bound"] == "NVLink-bound" and busbw == pytest.approx(230 * 7 / 8, rel=0.01)
    assert 216.7 / 1.25 < busbw < 216.7 * 1.25
    b200 = md.all_to_all_detail(8, 8 * GiB, fab("b200-hgx"))
    busbw = 8 * GiB * 7 / 8 / (b200["time_us"] * 1e3)
    assert all(x / 1.15 < busbw < x * 1.15 for x in (668.3, 675.5))
    # a small all_to_all inside one node pays one NCCL step whatever the peers (its sends are posted at
    # once), not one a peer: 7 peers cost well under twice what 1 does
    assert md.all_to_all_detail(8, KiB, fab("b200-hgx"))["time_us"] < 2 * md.all_to_all_detail(2, KiB, fab("b200-hgx"))["time_us"]


def test_all_to_all_across_two_gb300_racks_over_roce_is_nic_bound_and_slower_than_one_rack():
    # OCI's 128 ranks in 2 racks of 64: half of each rank's bytes cross the NICs. The published 47.3
    # busbw is a quarter of what the profile's NICs carry (docs/model.md#what-the-table-says): the check
    # is the direction, and that the model's rate is the NICs' (2 x 96 x 127/128), not NVLink's
    f = dataclasses.replace(fab("gb300-nvl72"), domain_gpus=64)
    across, inside = md.all_to_all_detail(128, 8 * GiB, f), md.all_to_all_detail(64, 8 * GiB, f)
    assert across["bound"] == "NIC-bound" and across["time_us"] > 2 * inside["time_us"]
    busbw = 8 * GiB * 127 / 128 / (across["time_us"] * 1e3)
    assert 47.3 < busbw <= 2 * 96 * 127 / 128 * 1.001


def test_all_to_all_across_two_b300_nodes_runs_at_their_800g_nics():
    # HGX B300 carries ConnectX-8 (800 Gb/s a GPU): across 2 x 8, half of each rank's bytes cross its NIC,
    # so busbw = 2 x 96 x 15/16, twice B200's 400G pair; Oracle's BM.GPU.B300.8 pair over RoCE measures 180.98
    b300, b200 = md.all_to_all_detail(16, 8 * GiB, fab("b300-hgx")), md.all_to_all_detail(16, 8 * GiB, fab("b200-hgx"))
    busbw = 8 * GiB * 15 / 16 / (b300["time_us"] * 1e3)
    assert b300["bound"] == "NIC-bound" and busbw == pytest.approx(2 * 96 * 15 / 16, rel=0.02)
    assert b200["time_us"] == pytest.approx(2 * b300["time_us"], rel=0.05)
    assert 180.98 / 1.1 < busbw < 180.98 * 1.1


def test_tcpxo_all_reduce_with_ll128_on_matches_the_held_out_torch_sweep(table):
    # the lab-22 torch.distributed sweep (2 x a3-mega, NCCL_PROTO=Simple,LL128): every size within 1.5x
    _, checked = table
    rows = [c for c in checked if c["id"].startswith("h100-2x8-a3mega-tcpxo-torch-ar-")]
    assert len(rows) == 5 and all(c["use"] == "held-out" for c in rows)
    assert all(1 / 1.5 <= c["ratio"] <= 1.5 for c in rows), [(c["id"], c["ratio"]) for c in rows]


def test_all_to_all_across_infiniband_runs_each_gpu_at_its_own_nic():
    # 2 x 8 A100, one HDR NIC a GPU: half of each rank's bytes cross its NIC, so busbw = R x 15/8 at
    # most (NVIDIA/nccl-tests#130's N/(N-1) rule); Azure NDm A100 v4 measures 37.8 at 1 GiB
    f = fab("a100-hgx")
    d = md.all_to_all_detail(16, GiB, f)
    busbw = GiB * 15 / 16 / (d["time_us"] * 1e3)
    assert d["bound"] == "NIC-bound" and busbw == pytest.approx(24 * 15 / 8, rel=0.02)
    assert 37.8 < busbw < 37.8 * 1.25


def test_reduce_scatter_across_infiniband_is_nic_bound_at_the_rails():
    # 2 x 8 B200, 8 NDR NICs a node: the ring across nodes runs at 8 x 48; Vultr's pair measures 307.9
    # busbw at 8 GiB (its slowest rails at 40 GB/s: 0.80, docs/model.md#what-the-table-says)
    d = md.reduce_scatter_detail(16, 8 * GiB, fab("b200-hgx"))
    busbw = 8 * GiB * 15 / 16 / (d["time_us"] * 1e3)
    assert d["bound"] == "NIC-bound" and 8 * 48 * 0.98 < busbw <= 8 * 48
    assert 307.9 < busbw < 307.9 * 1.3
    # and on 4 x 8, where Together AI's tuned run (healthy rails) measures 384.1 at 8 GiB
    d4 = md.reduce_scatter_detail(32, 8 * GiB, fab("b200-hgx"))
    busbw4 = 8 * GiB * 31 / 32 / (d4["time_us"] * 1e3)
    assert d4["bound"] == "NIC-bound" and 384.1 / 1.1 < busbw4 <= 8 * 48


def test_reduce_scatter_across_roce_is_nic_bound_at_the_rails():
    # 2 GB200 hosts in distinct NVLink cliques, 4 x 400G RoCE a host (GCP A4X): every byte between the
    # hosts crosses 4 NICs, so the ring runs at 4 x 48; the page measures 188.89 busbw at 16 GiB, and
    # 378.8 on two cliques of 8 (8 NICs a domain)
    f = fab("gb200-nvl72")
    for g, published in ((4, 188.89), (8, 378.8)):
        d = md.reduce_scatter_detail(2 * g, 16 * GiB, dataclasses.replace(f, domain_gpus=g))
        busbw = 16 * GiB * (2 * g - 1) / (2 * g) / (d["time_us"] * 1e3)
        assert d["bound"] == "NIC-bound" and busbw <= g * 48 and published / 1.1 < busbw < published * 1.1
    # two cliques of 32: the profile's 9 rails (fitted on CoreWeave's 20 racks) bind it at 9 x 48, where
    # the same page measures 701.8, NVLink's rate (a known miss, docs/model.md#what-the-table-says)
    d32 = md.reduce_scatter_detail(64, 16 * GiB, dataclasses.replace(f, domain_gpus=32))
    busbw32 = 16 * GiB * 63 / 64 / (d32["time_us"] * 1e3)
    assert d32["bound"] == "NIC-bound" and busbw32 == pytest.approx(9 * 48, rel=0.02) and busbw32 < 701.8


def test_reduce_scatter_across_efa_and_tcpxo_runs_all_gathers_ring_at_their_fabrics_rates():
    # No public reduce_scatter figure across EFA or TCPXO exists (docs/model.md#what-the-table-says), so
    # these two classes have no row. NCCL runs reduce_scatter across nodes as the ring all_gather runs
    # (p-1 steps, S/p a step), so the check leans on each fabric's published all_gather at 16 GiB on
    # 2 x 8 (Cluster Readiness Engine: p5 338.57, a3-mega 189.3): within 1.25x of it, TCPXO below EFA,
    # and small messages paying each fabric's own steps (TCPXO > EFA > InfiniBand at 1 KiB).
    small = {n: md.reduce_scatter_detail(16, KiB, fab(n))["time_us"]
             for n in ("h100-a3mega-tcpxo", "h100-p5-efa", "h100-hgx")}
    assert small["h100-a3mega-tcpxo"] > small["h100-p5-efa"] > small["h100-hgx"]
    busbw = {}
    for n, all_gather_published in (("h100-p5-efa", 338.57), ("h100-a3mega-tcpxo", 189.3)):
        d = md.reduce_scatter_detail(16, 16 * GiB, fab(n))
        busbw[n] = 16 * GiB * 15 / 16 / (d["time_us"] * 1e3)
        assert all_gather_published / 1.25 < busbw[n] < all_gather_published * 1.25, (n, busbw[n])
    assert busbw["h100-a3mega-tcpxo"] < busbw["h100-p5-efa"]
    assert md.reduce_scatter_detail(16, 16 * GiB, fab("h100-a3mega-tcpxo"))["bound"] == "NIC-bound"


def test_all_gather_across_efa_pays_efas_steps_small_and_runs_near_the_published_rate_large():
    # 2 x 8 p5 (400 Gb/s EFA a GPU): a small all_gather pays EFA's per-step latency, which InfiniBand's
    # NICs do not; at 16 GiB the NVIDIA Cluster Readiness Engine report measures 338.6 busbw
    efa, ib = fab("h100-p5-efa"), fab("h100-hgx")
    assert md.all_gather_detail(16, KiB, efa)["time_us"] > md.all_gather_detail(16, KiB, ib)["time_us"]
    d = md.all_gather_detail(16, 16 * GiB, efa)
    busbw = 16 * GiB * 15 / 16 / (d["time_us"] * 1e3)
    assert 338.57 < busbw < 338.57 * 1.25 and busbw <= 8 * 50


def test_all_to_all_across_tcpxo_is_nic_bound_below_efas():
    # 2 x 8 a3-mega: 8 x 200 Gb/s a node, half p5's 400 Gb/s EFA a GPU, so all_to_all across the pair
    # runs at most 2 x 25 x 15/16 busbw and slower than on p5; the Cluster Readiness Engine measures 40.16
    tcpxo, efa = md.all_to_all_detail(16, 16 * GiB, fab("h100-a3mega-tcpxo")), md.all_to_all_detail(16, 16 * GiB, fab("h100-p5-efa"))
    assert tcpxo["bound"] == "NIC-bound" and tcpxo["time_us"] > 1.8 * efa["time_us"]
    busbw = 16 * GiB * 15 / 16 / (tcpxo["time_us"] * 1e3)
    assert 40.16 < busbw <= 2 * 25 * 15 / 16


def test_forced_tree_across_b200_nodes_runs_at_nccls_per_channel_ceiling(table):
    # NCCL 2.28's Blackwell Tree ceilings (tuning.cc:198-203) on 8 channels, one a NIC: 8 x 42.8 on two
    # nodes, 8 x 24 from three; Together AI's two B200 clusters measure 335-339 and 190-196 (held out)
    f = fab("b200-hgx")
    two, four = md.all_reduce_detail("tree", 16, 32 * GiB, f), md.all_reduce_detail("tree", 32, 32 * GiB, f)
    bus2 = 32 * GiB * 2 * 15 / 16 / (two["time_us"] * 1e3)
    bus4 = 32 * GiB * 2 * 31 / 32 / (four["time_us"] * 1e3)
    assert bus4 < bus2 < 8 * 48  # both under the 8 NICs' ring rate
    assert 338.5 / 1.1 < bus2 < 338.5 * 1.1 and 192.2 / 1.1 < bus4 < 192.2 * 1.1
    _, checked = table
    tree = [c for c in checked if c["algorithm"] == "tree" and c["world"] > 8]
    assert len(tree) == 12 and all(0.95 <= c["ratio"] <= 1.1 for c in tree), [(c["id"], c["ratio"]) for c in tree]


def test_nvlstree_4_bytes_on_2x8_hopper_is_what_ncclS_tuner_charges():
    # tuning.cc (master 5067397c): baseLat 0 (:153) + hwLat NVLink 25 (:161) + 2 log2(2) x hwLat net 20.9
    # (:173) = 66.8 us (:427-428); the published 47.5 us (NVIDIA/nccl#1244, H20) is 1.41x under it: the
    # model stays NCCL's and the check is the one the figure supports, within 1.5x of it
    d = md.all_reduce_detail("inswitch", 16, 4, fab("h100-hgx"))
    assert d["latency_us"] == pytest.approx(L.HW_LAT_NVLINK_US["nvls_tree"][2] + 2 * L.HW_LAT_NET_US["nvls_tree"][2])
    assert d["latency_us"] == pytest.approx(66.8)
    assert 47.54 / 1.5 < d["time_us"] < 47.54 * 1.5


def test_ring_all_gather_across_infiniband_is_what_the_nccl_tuner_charges():
    # tuning.cc (master 5067397c): nsteps p-1 (:289-290), N-1 of them across (:411), each other step at
    # max(NVLink step, net overhead) (:404-410); ring LL 6.6 base (:151), 0.6 / 1.0 a step, 2.7 net (:171);
    # one rank a node takes Tree's network latency, 5.0 (:386-388). The NDm A100 v4 rows measure 33.7 and
    # 16.1 us (docs/model.md#what-the-table-says).
    f = fab("a100-hgx")
    two_by_eight = md.all_gather_detail(16, KiB, f)
    assert (two_by_eight["nccl"], two_by_eight["proto"]) == ("Ring", "LL")
    # and InfiniBand's fixed cost across nodes (net_fixed_us, fitted on ABCI 2.0's 8 B all_reduce)
    assert two_by_eight["latency_us"] == pytest.approx(6.6 + 14 * 1.0 + 2.7 + 6.7)
    one_a_node = md.all_gather_detail(2, KiB, dataclasses.replace(f, domain_gpus=1))
    assert one_a_node["latency_us"] == pytest.approx(6.6 + 5.0 + 6.7)
    # bandwidth: (p-1)/p S at min(B_up, rails x B_nic), the ring busbw NCCL's tuner uses (:324, :377-381)
    big = md.all_gather_detail(16, 4 * GiB, f)
    busbw = 4 * GiB * 15 / 16 / (big["time_us"] * 1e3)
    assert big["bound"] == "NIC-bound" and 0.9 * 8 * 24 < busbw <= 8 * 24


def test_the_sources_on_both_sides_are_the_six_docs_model_lists(table):
    # docs/model.md#what-the-table-says: NVIDIA/nccl#1455 is held out whole (its rates come from
    # NVIDIA/nccl-tests#212, a fit source whole), CoreWeave's 20-rack run is a fit source whole; six
    # MoE and rack sources keep both sides, each for a reason the docs give
    rows, _ = table
    sides = {}
    for r in rows:
        sides.setdefault(r["source"], set()).add(r["use"])
    both = {s for s, u in sides.items() if len(u) > 1}
    assert sides["https://github.com/NVIDIA/nccl/issues/1455"] == {"held-out"}
    assert sides["https://github.com/NVIDIA/nccl-tests/issues/212"] == {"fit"}
    assert sides["https://github.com/coreweave/nccl-tests/blob/main/README.md (GB200, 20 Racks)"] == {"fit"}
    assert len(both) == 6 and all(("DeepEP" in s or "uccl" in s or "Single Rack" in s) for s in both), both
