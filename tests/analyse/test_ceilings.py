"""Hardware profiles and link ceilings: units, profile files, overrides, tiers."""
from __future__ import annotations

import pytest

from commbench.analyse import ceilings as C
from commbench.analyse.profiles import default_profile_name
from commbench.core.errors import UsageError

GIB = 1 << 30


def rate(text, **kw):
    return C.parse_rate_gbps(text, field="scaleup.line_rate", where="t.toml", **kw)


# --- rates ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, gbps", [
    ("450 GB/s per direction", 450.0),
    ("900 GB/s bidirectional", 450.0),
    ("1.8 TB/s bidirectional", 900.0),
    ("800 Gb/s per direction", 100.0),
    ("400 Gbps per direction", 50.0),
    ("3.6 Tb/s per direction", 450.0),
    ("50000 MB/s per direction", 50.0),
    ("400000 Mb/s per direction", 50.0),
    ("  450GB/s   Per  Direction ", 450.0),
])
def test_parse_rate(text, gbps):
    assert rate(text) == pytest.approx(gbps)


def test_bits_and_bytes_differ_by_eight():
    assert rate("400 GB/s per direction") == pytest.approx(8 * rate("400 Gb/s per direction"))


def test_total_only_where_allowed():
    assert rate("3.35 TB/s total", allow=("total",)) == pytest.approx(3350.0)
    with pytest.raises(UsageError, match="direction"):
        rate("3.35 TB/s total")
    with pytest.raises(UsageError, match="direction"):
        rate("450 GB/s per direction", allow=("total",))


@pytest.mark.parametrize("text, match", [
    ("450 GB/s", "no direction"),
    ("450 Gib/s per direction", "unknown unit"),
    ("450 gb/s per direction", "unknown unit"),
    ("0 GB/s per direction", "positive"),
    ("-5 GB/s per direction", "positive"),
    ("fast", "not a rate"),
    ("450 GB/s sideways", "direction"),
])
def test_bad_rates(text, match):
    with pytest.raises(UsageError, match=match) as e:
        rate(text)
    assert "scaleup.line_rate" in str(e.value) and "t.toml" in str(e.value)


def test_rate_must_be_a_string():
    with pytest.raises(UsageError, match="must be a string"):
        rate(450)


def test_format_rate():
    assert C.format_rate(450) == "450 GB/s per direction (3600 Gb/s)"
    assert C.format_rate(100) == "100 GB/s per direction (800 Gb/s)"
    assert C.format_rate(None) == "-"


# --- built-in profiles -----------------------------------------------------------------------

# hardware.md: scale-up GB/s per direction, domain, NIC GB/s per direction, HBM TB/s.
TABLE = {
    "gb300-nvl72": (900, 72, 100, 8.0),
    "gb200-nvl72": (900, 72, 50, 8.0),
    "b200-hgx": (900, 8, 50, 8.0),
    "b300-hgx": (900, 8, 100, 8.0),  # not in hardware.md: HGX B300 (NVLink 5, ConnectX-8 800G a GPU)
    "h200-hgx": (450, 8, 50, 4.8),
    "h100-hgx": (450, 8, 50, 3.35),
    "h800-hgx": (200, 8, 50, 3.35),
    "a100-hgx": (300, 8, 25, 2.0),
}


# HGX nodes on other scale-out fabrics (docs/model.md): their NVLink tier is their HGX board's.
FABRIC_PROFILES = {"h100-p5-efa": "h100-hgx", "h100-a3mega-tcpxo": "h100-hgx", "h100-roce": "h100-hgx",
                   "b200-p6-efa": "b200-hgx"}


def test_list_profiles():
    assert set(C.list_profiles()) == set(TABLE) | set(FABRIC_PROFILES) | {"loopback"}


@pytest.mark.parametrize("name", sorted(FABRIC_PROFILES))
def test_fabric_profiles_keep_their_boards_nvlink_and_name_their_nic(name):
    p, board = C.load_profile(name), C.load_profile(FABRIC_PROFILES[name])
    assert p.scaleup_line_gbps == board.scaleup_line_gbps and p.scaleup_domain_gpus == 8, name
    assert p.scaleup_achieved_gbps == board.scaleup_achieved_gbps and p.gpu_arch == board.gpu_arch, name
    assert p.scaleout_line_gbps and p.notes and p.description


@pytest.mark.parametrize("name", sorted(TABLE))
def test_builtin_matches_hardware_table(name):
    p = C.load_profile(name)
    up, domain, nic, hbm_tbps = TABLE[name]
    assert p.name == name and not p.measured and p.notes and p.description
    assert p.scaleup_line_gbps == pytest.approx(up)
    assert p.scaleup_domain_gpus == domain
    assert p.scaleout_line_gbps == pytest.approx(nic)
    assert p.hbm_gbps == pytest.approx(hbm_tbps * 1e3)
    for v in (p.scaleup_achieved_gbps, p.scaleup_latency_us, p.scaleout_achieved_gbps, p.scaleout_latency_us):
        assert v is not None and v > 0
    assert p.scaleup_achieved_gbps <= p.scaleup_line_gbps
    assert p.scaleout_achieved_gbps <= p.scaleout_line_gbps
    assert "assumption" in p.notes  # latencies are model inputs, not measurements


def test_achieved_figures():
    assert C.load_profile("h100-hgx").scaleup_achieved_gbps == 370
    assert C.load_profile("h100-hgx").scaleup_inswitch_achieved_gbps == 480
    assert C.load_profile("gb300-nvl72").scaleup_achieved_gbps == 695
    assert C.load_profile("gb300-nvl72").scaleout_achieved_gbps == 96
    assert "estimate" in C.load_profile("gb300-nvl72").notes.lower()
    assert C.load_profile("a100-hgx").scaleup_achieved_gbps == 230
    assert C.load_profile("a100-hgx").scaleup_inswitch_achieved_gbps is None
    assert C.load_profile("h800-hgx").scaleup_achieved_gbps == 160
    assert C.load_profile("h100-hgx").scaleout_achieved_gbps == 48
    assert C.load_profile("a100-hgx").scaleout_achieved_gbps == 24


def test_loopback_builtin_is_unfilled():
    p = C.load_profile("loopback")
    assert p.measured and p.scaleup_domain_gpus is None and p.scaleout_line_gbps is None
    assert p.scaleup_line_gbps is None and p.scaleup_achieved_gbps is None
    assert p.scaleup_link == "shared memory (memcpy)"


def test_unknown_profile_lists_known():
    with pytest.raises(UsageError, match="h100-hgx"):
        C.load_profile("h999-hgx")
    with pytest.raises(UsageError, match="not found"):
        C.load_profile("/nonexistent/p.toml")


# --- profile files ---------------------------------------------------------------------------

GOOD = """\
name = "mine"
description = "test"
[scaleup]
link = "NVLink 4"
line_rate = "900 GB/s bidirectional"
achieved_rate = "370 GB/s per direction"
domain_gpus = 8
latency_us = 2.0
[scaleout]
link = "NDR"
line_rate = "400 Gb/s per direction"
achieved_rate = "48 GB/s per direction"
latency_us = 5
[hbm]
bandwidth = "3.35 TB/s total"
[sources]
notes = "x"
"""


def write(tmp_path, text):
    f = tmp_path / "p.toml"
    f.write_text(text)
    return f


def test_file_profile_loads(tmp_path):
    p = C.load_profile(str(write(tmp_path, GOOD)))
    assert (p.scaleup_line_gbps, p.scaleout_line_gbps, p.scaleout_latency_us) == (450, 50, 5.0)
    assert p.source_path.endswith("p.toml")


def test_scaleout_is_optional(tmp_path):
    text = GOOD.split("[scaleout]")[0] + "[hbm]" + GOOD.split("[hbm]")[1]
    p = C.load_profile(write(tmp_path, text))
    assert p.scaleout_line_gbps is None and p.scaleout_link is None


@pytest.mark.parametrize("old, new, field", [
    ('latency_us = 2.0\n', '', "scaleup.latency_us"),                                   # missing field
    ('domain_gpus = 8\n', '', "scaleup.domain_gpus"),
    ('achieved_rate = "48 GB/s per direction"\n', '', "scaleout.achieved_rate"),
    ('"400 Gb/s per direction"', '"-400 Gb/s per direction"', "scaleout.line_rate"),    # negative
    ('"3.35 TB/s total"', '"3.35 TiB/s total"', "hbm.bandwidth"),                       # unknown unit
    ('"900 GB/s bidirectional"', '"900 GB/s"', "scaleup.line_rate"),                    # no direction
    ('domain_gpus = 8', 'domain_gpus = 8\nlanes = 18', "scaleup.lanes"),               # unknown key
    ('name = "mine"', 'name = "mine"\ncolour = "red"', "colour"),
    ('domain_gpus = 8', 'domain_gpus = "8"', "scaleup.domain_gpus"),                   # wrong type
    ('domain_gpus = 8', 'domain_gpus = 8.5', "scaleup.domain_gpus"),
    ('domain_gpus = 8', 'domain_gpus = 0', "scaleup.domain_gpus"),
    ('latency_us = 2.0', 'latency_us = "2 us"', "scaleup.latency_us"),
    ('"900 GB/s bidirectional"', '900', "scaleup.line_rate"),
    ('link = "NVLink 4"', 'link = 4', "scaleup.link"),
    ('"370 GB/s per direction"', '"740 GB/s per direction"', "scaleup.achieved_rate"),   # above line
])
def test_bad_profile_files(tmp_path, old, new, field):
    assert old in GOOD
    f = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(UsageError) as e:
        C.load_profile(f)
    assert field in str(e.value) and str(f) in str(e.value)


def test_missing_tables_and_bad_toml(tmp_path):
    with pytest.raises(UsageError, match=r"\[scaleup\]"):
        C.load_profile(write(tmp_path, 'name = "x"\n'))
    with pytest.raises(UsageError, match="hbm"):
        C.load_profile(write(tmp_path, GOOD.split("[hbm]")[0]))
    with pytest.raises(UsageError, match="name"):
        C.load_profile(write(tmp_path, GOOD.replace('name = "mine"\n', "")))
    with pytest.raises(UsageError, match="TOML"):
        C.load_profile(write(tmp_path, "name = \n"))


# --- overrides ---------------------------------------------------------------------------------

def test_overrides():
    p = C.apply_overrides(C.load_profile("h100-hgx"),
                          {"nic_gbps": 800, "scaleup_GBps": 400, "domain_gpus": 16, "hbm_GBps": 3000})
    assert p.scaleout_line_gbps == p.scaleout_achieved_gbps == 100
    assert p.scaleup_line_gbps == p.scaleup_achieved_gbps == 400
    assert p.scaleup_domain_gpus == 16 and p.hbm_gbps == 3000
    assert "overridden" in p.notes


def test_overrides_none_is_not_given():
    p = C.load_profile("h100-hgx")
    assert C.apply_overrides(p, {"nic_gbps": None}) == p


@pytest.mark.parametrize("overrides, match", [
    ({"nic_gbps": 0}, "nic_gbps"),
    ({"scaleup_GBps": -1}, "scaleup_GBps"),
    ({"domain_gpus": 2.5}, "domain_gpus"),
    ({"hbm_GBps": "lots"}, "hbm_GBps"),
    ({"nic_GBps": 100}, "nic_GBps"),
])
def test_bad_overrides(overrides, match):
    with pytest.raises(UsageError, match=match):
        C.apply_overrides(C.load_profile("h100-hgx"), overrides)


def test_nic_override_gives_loopback_a_scaleout_tier():
    p = C.apply_overrides(C.loopback_profile(20, 10, 1 << 20, 0.3), {"nic_gbps": 100})
    assert p.scaleout_line_gbps == 12.5 and p.scaleout_link


# --- domains --------------------------------------------------------------------------------

def test_domains_hgx():
    nodes = [0] * 8 + [1] * 8 + [2] * 8
    assert C.domains_of_ranks(nodes, 8) == [0] * 8 + [1] * 8 + [2] * 8


def test_domains_nvl72_four_per_node():
    nodes = [r // 4 for r in range(4 * 20)]  # 20 trays of 4: 18 in the first rack
    doms = C.domains_of_ranks(nodes, 72)
    assert doms[:72] == [0] * 72 and doms[72:] == [1] * 8


def test_domains_node_order_is_first_appearance():
    assert C.domains_of_ranks([5, 5, 3, 3], 2) == [0, 0, 1, 1]


def test_domains_loopback_is_the_node():
    assert C.domains_of_ranks([0, 0, 1, 1], None) == [0, 0, 1, 1]


def test_domains_node_gpus_keeps_sparse_nodes_apart():
    # One rank on each of two 8-GPU HGX nodes: different domains, not one packed domain.
    assert C.domains_of_ranks([0, 1], 8) == [0, 0]
    assert C.domains_of_ranks([0, 1], 8, node_gpus=8) == [0, 1]


# --- ceilings ------------------------------------------------------------------------------

def coll(bench="all_reduce", world=8, nbytes=GIB, time_us=5000.0, factor=None, **kw):
    factor = 2 * (world - 1) / world if factor is None else factor
    algbw = nbytes / (time_us * 1e3)
    return {"benchmark": bench, "world": world, "nbytes": nbytes, "time_us_p50": time_us,
            "algbw_gbps": algbw, "busbw_gbps": algbw * factor, "busbw_factor": factor, **kw}


H100 = C.load_profile("h100-hgx")


def test_one_domain_compares_busbw_with_nvlink():
    row = coll()
    c = C.ceiling_for_row(H100, row, [0] * 8)
    assert (c["tier"], c["bottleneck"], c["compared_as"]) == ("scaleup", "NVLink 4", "busbw")
    assert c["ceiling_gbps"] == 450 and c["ceiling_achieved_gbps"] == 370
    assert c["compared_gbps"] == pytest.approx(row["busbw_gbps"])
    assert c["pct_of_ceiling"] == pytest.approx(row["busbw_gbps"] / 450 * 100)
    assert c["pct_of_achieved"] == pytest.approx(row["busbw_gbps"] / 370 * 100)
    assert c["time_bound_us"] == pytest.approx(GIB * 1.75 / 450e3)
    assert set(c) == set(C.CEILING_KEYS)


def test_one_rank_per_domain_compares_busbw_with_nic():
    row = coll(world=2, factor=1.0)
    c = C.ceiling_for_row(H100, row, [0, 1])  # two nodes, one rank each
    assert (c["tier"], c["compared_as"]) == ("scaleout", "busbw")
    assert c["bottleneck"] == "ConnectX-7 NDR 400G NIC"
    assert c["ceiling_gbps"] == 50 and c["ceiling_achieved_gbps"] == 48
    assert c["pct_of_ceiling"] == pytest.approx(row["busbw_gbps"] / 50 * 100)


def test_multi_domain_ring_spreads_over_the_nics():
    # 2 HGX nodes x 8: a NIC carries busbw/8, NVLink 7/8 of busbw; 8 x 50 GB/s NICs bind first.
    row = coll(world=16, time_us=10000.0)
    c = C.ceiling_for_row(H100, row, [0] * 8 + [1] * 8)
    busbw_nbytes = GIB * 2 * 15 / 16
    assert (c["tier"], c["compared_as"]) == ("scaleup+scaleout", "per-tier bytes")
    assert c["bottleneck"].endswith("NIC") and c["ceiling_gbps"] == 50
    assert c["time_bound_us"] == pytest.approx(busbw_nbytes / 8 / 50e3)
    assert c["compared_gbps"] == pytest.approx(row["busbw_gbps"] / 8)
    assert c["pct_of_ceiling"] == pytest.approx(row["busbw_gbps"] / 8 / 50 * 100)


def test_nvl72_within_rack_is_scaleup_across_racks_nvlink_still_binds():
    gb = C.load_profile("gb300-nvl72")
    nodes = [r // 4 for r in range(144)]
    assert C.ceiling_for_row(gb, coll(world=72), nodes)["tier"] == "scaleup"
    c = C.ceiling_for_row(gb, coll(world=144), nodes)
    assert c["tier"] == "scaleup+scaleout" and c["bottleneck"] == "NVLink 5"


def test_all_to_all_multi_domain():
    row = coll("all_to_all", world=16, factor=15 / 16)
    c = C.ceiling_for_row(H100, row, [0] * 8 + [1] * 8)
    # NIC: S (P-G)/P = S/2 at 50 GB/s; NVLink: S 7/16 at 450 GB/s.
    assert c["time_bound_us"] == pytest.approx(GIB / 2 / 50e3)
    assert c["bottleneck"].endswith("NIC")


def test_send_recv_pairs_across_nodes():
    row = coll("send_recv", world=2, factor=1.0)
    assert C.ceiling_for_row(H100, row, [0, 0])["tier"] == "scaleup"
    c = C.ceiling_for_row(H100, row, [0, 1])
    assert c["tier"] == "scaleout" and c["ceiling_gbps"] == 50 and c["compared_as"] == "busbw"


@pytest.mark.parametrize("extra", [{"variant": "NVLS"}, {"variant": "ring+sharp"}, {"variant": "CollNet"},
                                   {"inswitch": True}])
def test_inswitch_compares_wire_bandwidth(extra):
    row = coll(**extra)
    c = C.ceiling_for_row(H100, row, [0] * 8)
    assert c["compared_as"] == "wire_bw = algbw*(n+1)/n"
    assert c["compared_gbps"] == pytest.approx(row["algbw_gbps"] * 9 / 8)
    assert c["pct_of_ceiling"] == pytest.approx(row["algbw_gbps"] * 9 / 8 / 450 * 100)
    assert c["time_bound_us"] == pytest.approx(GIB * 9 / 8 / 450e3)


def test_plain_variant_is_not_inswitch():
    assert C.ceiling_for_row(H100, coll(variant="default"), [0] * 8)["compared_as"] == "busbw"


def test_moe_per_tier_bound():
    # 16 ranks on 2 HGX nodes: 45e6 B over NVLink (450 GB/s) = 100 us, 10e6 B over the NIC
    # (50 GB/s) = 200 us; achieved 45e6/370e3 = 121.6 us and 10e6/48e3 = 208.3 us.
    row = {"benchmark": "moe", "world": 16, "nbytes": 55_000_000, "time_us_p50": 400.0, "stage": "dispatch",
           "algbw_gbps": 0.0, "busbw_gbps": 0.0, "busbw_factor": 15 / 16,
           "scaleup_nbytes": 45_000_000, "scaleout_nbytes": 10_000_000}
    c = C.ceiling_for_row(H100, row, [0] * 8 + [1] * 8)
    assert (c["tier"], c["compared_as"]) == ("scaleup+scaleout", "per-tier bytes")
    assert c["bottleneck"].endswith("NIC") and c["ceiling_gbps"] == 50
    assert c["time_bound_us"] == pytest.approx(200.0)
    assert c["pct_of_ceiling"] == pytest.approx(50.0)
    assert c["pct_of_achieved"] == pytest.approx(10e6 / 48e3 / 400 * 100)
    assert c["compared_gbps"] == pytest.approx(10e6 / 400e3)


def test_moe_one_domain_counts_all_remote_bytes_as_scaleup():
    row = {"benchmark": "moe", "world": 8, "nbytes": 1, "time_us_p50": 100.0, "busbw_factor": 7 / 8,
           "scaleup_nbytes": 30e6, "scaleout_nbytes": 15e6}
    c = C.ceiling_for_row(C.load_profile("gb300-nvl72"), row, [0] * 4 + [1] * 4)  # two trays, one rack
    assert c["tier"] == "scaleup" and c["time_bound_us"] == pytest.approx(45e6 / 900e3)
    c = C.ceiling_for_row(H100, row, [0] * 4 + [1] * 4)  # two HGX hosts of 8 GPUs, 4 ranks on each
    assert c["tier"] == "scaleup+scaleout" and c["time_bound_us"] == pytest.approx(15e6 / 50e3)


def test_barrier_and_zero_bytes_are_latency_only():
    for row in (coll("barrier", nbytes=0, factor=0.0), coll(nbytes=0)):
        c = C.ceiling_for_row(H100, row, [0] * 8)
        assert c["pct_of_ceiling"] is None and c["pct_of_achieved"] is None and c["ceiling_gbps"] is None
        assert c["time_bound_us"] == H100.scaleup_latency_us and c["ceiling_note"]


def test_loopback_size_dependent_rates():
    lb = C.loopback_profile(memcpy_in_cache_gbps=40.0, memcpy_beyond_cache_gbps=10.0, cache_nbytes=32 << 20,
                            latency_us=0.3)
    assert lb.measured and lb.scaleup_latency_us == 0.3
    assert C.scaleup_rates_for(lb, 1 << 20) == (40.0, 40.0)
    assert C.scaleup_rates_for(lb, 64 << 20) == (10.0, 10.0)
    small = coll("send_recv", world=2, nbytes=1 << 20, factor=1.0)   # working set 2 MiB: in cache
    big = coll("send_recv", world=2, nbytes=64 << 20, factor=1.0)    # 128 MiB: beyond
    assert C.ceiling_for_row(lb, small, [0, 0])["ceiling_gbps"] == 40.0
    assert C.ceiling_for_row(lb, big, [0, 0])["ceiling_gbps"] == 10.0
    assert C.ceiling_for_row(lb, big, [0, 0])["bottleneck"] == "shared memory (memcpy)"


def test_missing_tier_gives_a_note_not_a_crash():
    lb = C.loopback_profile(40.0, 10.0, 32 << 20, 0.3)
    c = C.ceiling_for_row(lb, coll(world=4), [0, 0, 1, 1])  # loopback across two hosts
    assert c["ceiling_gbps"] is None and c["pct_of_ceiling"] is None and "scale-out" in c["ceiling_note"]
    c = C.ceiling_for_row(C.load_profile("loopback"), coll(world=2), [0, 0])  # not measured yet
    assert c["ceiling_gbps"] is None and "measured" in c["ceiling_note"]
    no_nic = C.Profile(name="x", scaleup_link="L", scaleup_line_gbps=100.0, scaleup_achieved_gbps=90.0,
                       scaleup_domain_gpus=8, scaleup_latency_us=1.0)
    c = C.ceiling_for_row(no_nic, coll(world=16), [0] * 8 + [1] * 8)
    assert c["ceiling_gbps"] is None and c["ceiling_note"]


def test_table_rows_are_strings():
    rows = C.profiles_table_rows(C.list_profiles())
    assert len(rows) == len(C.list_profiles())
    assert all(isinstance(v, str) for r in rows for v in r.values())
    gb300 = next(r for r in rows if r["profile"] == "gb300-nvl72")
    assert (gb300["NIC Gb/s/dir"], gb300["NIC GB/s/dir"], gb300["line GB/s/dir"], gb300["bidir GB/s"]) == \
        ("800", "100", "900", "1800")


def test_a_benchmark_unknown_to_the_registry_is_judged_ring_like():
    # An imported gather: S x its busbw_factor, as an all_reduce row with the same factor.
    mine, ring = coll("gather", world=16, factor=15 / 16), coll(world=16, factor=15 / 16)
    nodes = [0] * 8 + [1] * 8
    assert C.ceiling_for_row(H100, mine, nodes) == C.ceiling_for_row(H100, ring, nodes)


def test_a_plugin_judges_its_own_rows_through_the_ceiling_hooks(monkeypatch):
    from commbench.benchmarks import Benchmark, base

    class Halves(Benchmark):  # half of S on each tier, whatever the layout; busbw no link's rate
        name = "halves_test"
        inswitch_applies = False

        def tier_nbytes(self, row, world, domains, inswitch):
            return row["nbytes"] / 2, row["nbytes"] / 2

        def busbw_is_link_rate(self, scaleup_nbytes, scaleout_nbytes):
            return False

        def tier_note(self, nodes, domains):
            return "halves"

    monkeypatch.setitem(base._REGISTRY, "halves_test", Halves())
    c = C.ceiling_for_row(H100, coll("halves_test", world=16, time_us=20000.0, variant="nvls"), [0] * 8 + [1] * 8)
    assert (c["tier"], c["compared_as"], c["ceiling_note"]) == ("scaleup+scaleout", "per-tier bytes", "halves")
    assert c["time_bound_us"] == pytest.approx(GIB / 2 / 50e3)


def test_inswitch_flag_from_a_dataframe_row():
    assert not C.is_inswitch({"inswitch": float("nan"), "variant": "default"})
    assert C.is_inswitch({"inswitch": float("nan"), "variant": "nccl-nvls"})
    assert C.is_inswitch({"inswitch": True, "variant": "symm-mem"})


@pytest.mark.parametrize("gpu,profile", [("NVIDIA B300 SXM6 AC", "b300-hgx"), ("NVIDIA GB300", "gb300-nvl72"),
                                         ("NVIDIA B200", "b200-hgx"), ("NVIDIA H100 80GB HBM3", "h100-hgx"),
                                         ("Tesla T4", None)])
def test_the_default_profile_is_the_one_whose_gpu_the_device_names(gpu, profile):
    # B300 boards carry ConnectX-8 (800 Gb/s a GPU), not B200's 400G NICs; GB300 is matched before B300
    assert default_profile_name("cuda", [gpu]) == profile
    assert default_profile_name("cpu", [gpu]) == "loopback"
