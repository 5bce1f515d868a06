"""Ceilings a reader can check: every % of a ceiling names it in the row's own unit (busbw),
the busbw figure draws that bound; a disturbed loopback probe carries no line-rate verdict;
`run` without --np starts ranks that cross a link, and world-1 rows are judged by nothing."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from commbench.analyse import ceilings as C
from conftest import fixture_path, make_row, needs_mpi, run_cli, run_meta, run_rows, starts_processes

H100_2X8 = fixture_path("real-outputs/a3mega_nccl_allreduce_16r.txt")
H100 = C.load_profile("h100-hgx")
TWO_NODES = [0] * 8 + [1] * 8


# --- the bound in busbw ---------------------------------------------------------------

@pytest.fixture(scope="module")
@starts_processes
def h100_report(tmp_path_factory):
    pytest.importorskip("matplotlib")
    from commbench.commands.report import write_report
    from commbench.store.importers import import_file, write_imported_run

    root = tmp_path_factory.mktemp("h100")
    rows, meta = import_file(H100_2X8)
    run = write_imported_run(rows, meta, root / "imp")
    return write_report([run], root / "rep", profile="h100-hgx")


def test_imported_h100_2x8_summary_names_the_busbw_the_nics_allow(h100_report):
    peak = next(f for f in h100_report["findings"] if f.measure == "peak busbw")
    assert peak.value.startswith("338.8 GB/s at 8G")
    assert "= 84.7% of the 400 GB/s busbw that 8 NICs of 50 GB/s allow at 2 nodes x 8" in peak.value, peak.value
    assert "50.00 GB/s line rate" not in peak.value


def test_imported_h100_2x8_figure_draws_the_bound_above_the_curve(h100_report):
    fig = h100_report["drawn"]["busbw_all_reduce"].figure
    ax = fig.axes[0]
    curves = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    peak = max(max(ln.get_ydata()) for ln in curves)
    assert peak == pytest.approx(338.82)
    assert len(dashed) == 1
    bound = set(dashed[0].get_ydata())
    assert len(bound) == 1
    (y,) = bound
    # The ceiling the 84.7 % is a share of: the curve stays under it, at that share.
    assert y >= peak and peak / y * 100 == pytest.approx(84.7, abs=0.05)
    assert any("400 GB/s (8 NICs of 50 GB/s allow at 2 nodes x 8)" in s
               for s in h100_report["series"]["busbw_all_reduce"])


def test_the_table_caption_and_ceiling_column_are_in_busbw():
    from commbench.report.terminal import _ceiling_caption

    row = make_row("all_reduce", world=16, nbytes=8 << 30, p50=47535.0)
    row.update(C.ceiling_for_row(H100, row, TWO_NODES), profile="h100-hgx")
    assert row["bound_busbw_gbps"] == pytest.approx(400.0)
    assert C.ceiling_busbw(row) == pytest.approx(400.0)
    cap = _ceiling_caption([row])
    assert "% line = busbw / the busbw the line rate allows (400 GB/s busbw that 8 NICs of 50 GB/s allow at " \
           "2 nodes x 8)" in cap, cap


CASES = [  # (benchmark, world, node_of_rank, variant)
    ("all_reduce", 8, [0] * 8, "default"),  # one domain: busbw against NVLink
    ("all_reduce", 16, TWO_NODES, "default"),  # 2 x 8: per-tier bytes, the NICs bound it
    ("all_gather", 16, TWO_NODES, "default"),
    ("all_to_all", 16, TWO_NODES, "default"),
    ("all_reduce", 2, [0, 1], "default"),  # one rank a node: busbw against one NIC
    ("all_reduce", 8, [0] * 8, "nccl-nvls"),  # in-switch: wire rate against NVLink
]


@pytest.mark.parametrize("bench, world, nodes, variant", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES])
def test_pct_of_ceiling_is_busbw_over_the_bound_busbw(bench, world, nodes, variant):
    row = make_row(bench, world=world, nbytes=1 << 30, p50=9000.0, variant=variant)
    c = C.ceiling_for_row(H100, row, nodes)
    assert c["pct_of_ceiling"] is not None and c["bound_busbw_gbps"] is not None, c
    assert row["busbw_gbps"] / c["bound_busbw_gbps"] * 100 == pytest.approx(c["pct_of_ceiling"], rel=1e-9)
    assert row["busbw_gbps"] / c["bound_achieved_busbw_gbps"] * 100 == pytest.approx(c["pct_of_achieved"], rel=1e-9)
    share = C.share_of_ceiling({**row, **c})
    assert share.startswith(f"{c['pct_of_ceiling']:.1f}% of the {c['bound_busbw_gbps']:.4g} GB/s")


# --- the loopback probe ----------------------------------------------------------------

QUIET = {"memcpy_in_cache_spread_pct": 2.0, "memcpy_in_cache_wait_pct": 0.3, "memcpy_in_cache_steal_pct": 0.0,
         "memcpy_beyond_cache_spread_pct": 1.0, "memcpy_beyond_cache_wait_pct": 0.1,
         "memcpy_beyond_cache_steal_pct": 0.0}


def test_probe_doubt_from_hand_made_metas():
    assert C.probe_doubt(QUIET, "in_cache") == "" and C.probe_doubt(QUIET, "beyond_cache") == ""
    assert C.probe_doubt({}, "in_cache") == ""  # a run from before the probe recorded its state
    spread = dict(QUIET, memcpy_in_cache_spread_pct=35.0)
    assert C.probe_doubt(spread, "in_cache") == "the in-cache memcpy probe spread 35 % (> 20 %)"
    assert C.probe_doubt(spread, "beyond_cache") == ""
    waited = dict(QUIET, memcpy_beyond_cache_wait_pct=40.0)
    assert C.probe_doubt(waited, "beyond_cache") == "the beyond-cache memcpy probe waited for a CPU 40 % of its " \
                                                    "time (> 10 %)"
    stolen = dict(QUIET, memcpy_in_cache_steal_pct=25.0)
    assert "CPU steal 25 %" in C.probe_doubt(stolen, "in_cache")


def test_resolve_profile_takes_the_doubt_from_the_probe(monkeypatch):
    from commbench.run import rank_run

    probe = dict(QUIET, llc_nbytes=32 << 20, memcpy_in_cache_gbps=12.75, memcpy_beyond_cache_gbps=17.0,
                 latency_us=0.5, memcpy_in_cache_spread_pct=35.0)
    monkeypatch.setattr(rank_run.probe, "loopback_probe", lambda comm: dict(probe))
    spec = type("Spec", (), {"config": type("Cfg", (), {"profile": None})(), "profile": None,
                             "profile_overrides": {}})()
    prof, meta = rank_run.resolve_profile(spec, None, "cpu", [])
    assert prof.scaleup_in_cache_doubt == "the in-cache memcpy probe spread 35 % (> 20 %)"
    assert prof.scaleup_doubt == ""
    assert meta["fields"]["scaleup_in_cache_doubt"] == prof.scaleup_in_cache_doubt


def _loopback(**doubts):
    return replace(C.loopback_profile(12.75, 17.0, 32 << 20, 0.5), **doubts)


def _peak_verdict(row):
    from commbench.report.sections import collective_findings

    df = pd.DataFrame([dict(row, run="r")])
    return next(f for f in collective_findings("all_reduce", df, False, {}) if f.measure == "peak busbw")


def test_a_disturbed_probe_is_no_ceiling_for_a_verdict():
    # 88 % of the 12.75 GB/s in-cache rate: "the link is the limit" from a steady probe only.
    row = make_row("all_reduce", world=2, nbytes=1 << 20, p50=(1 << 20) / (0.88 * 12.75e3))
    steady = {**row, **C.ceiling_for_row(_loopback(), row, [0, 0])}
    assert steady["ceiling_doubt"] is None and steady["pct_of_ceiling"] == pytest.approx(88.0)
    assert _peak_verdict(steady).verdict == "at the link's rate: the link is the limit"
    doubt = "the in-cache memcpy probe spread 35 % (> 20 %)"
    shaky = {**row, **C.ceiling_for_row(_loopback(scaleup_in_cache_doubt=doubt), row, [0, 0])}
    assert shaky["ceiling_doubt"] == doubt
    f = _peak_verdict(shaky)
    assert f.verdict == f"cannot judge against the line rate: {doubt}"
    assert "88.0% of the 12.75 GB/s line rate" in f.value
    # Beyond the cache the row is compared with the beyond-cache probe, and so is its doubt.
    big = make_row("all_reduce", world=2, nbytes=256 << 20, p50=(256 << 20) / (0.9 * 17e3))
    c = C.ceiling_for_row(_loopback(scaleup_in_cache_doubt=doubt), big, [0, 0])
    assert c["ceiling_doubt"] is None and c["ceiling_gbps"] == 17.0


def test_the_probe_records_its_own_wait(monkeypatch):
    from commbench.backends import probe

    monkeypatch.setattr(probe, "IN_CACHE_MAX_NBYTES", 1 << 20)
    monkeypatch.setattr(probe, "BEYOND_CACHE_MIN_NBYTES", 2 << 20)
    monkeypatch.setattr(probe, "BEYOND_CACHE_MAX_NBYTES", 2 << 20)

    class OneRank:
        rank, size, backend = 0, 1, "mpi"

        def idle_barrier(self):
            pass

        def allgather_obj(self, obj):
            return [obj]

    m = probe.loopback_probe(OneRank())
    for where in ("in_cache", "beyond_cache"):
        assert 0.0 <= m[f"memcpy_{where}_wait_pct"] <= 100.0
        assert m[f"memcpy_{where}_steal_pct"] >= 0.0


# --- world 1 and run without --np ------------------------------------------------------

def test_run_without_np_and_launcher_chooses_local_ranks():
    from commbench.commands.run import default_local_ranks

    for launcher in ("mpirun", "srun", "torchrun", "mpich"):
        assert default_local_ranks(launcher, "cpu", cores=8, gpus=0, most=64) == (None, "")
    assert default_local_ranks("none", "cpu", cores=8, gpus=0, most=64) == \
        (8, "no --np and no launcher: starting 8 local ranks, one per core")
    n, line = default_local_ranks("none", "cpu", cores=1, gpus=0, most=64)
    assert n == 2 and "starting 2 local ranks" in line
    assert default_local_ranks("none", "cpu", cores=96, gpus=0, most=40)[0] == 40  # this host's rank limit
    assert default_local_ranks("none", "cuda", cores=64, gpus=4, most=256) == \
        (4, "no --np and no launcher: starting 4 local ranks, one per visible GPU")
    n, line = default_local_ranks("none", "cuda", cores=64, gpus=1, most=256)
    assert n == 1 and "one visible GPU, so world 1: nothing crosses a link" in line


@needs_mpi
@pytest.mark.multirank
def test_run_quick_without_np_runs_ranks_that_cross_a_link(tmp_path):
    from commbench.core.hoststate import cores

    r = run_cli("run", "quick", "-b", "all_reduce", "--sizes", "8:64", "--iters", "20", "--out", tmp_path / "run",
                timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    want = max(2, cores())
    assert r.stdout.splitlines()[0] == f"no --np and no launcher: starting {want} local ranks, one per core" + \
        (" (at least 2)" if cores() < 2 else ""), r.stdout[:500]
    rows = run_rows(tmp_path / "run")
    assert rows and {x["world"] for x in rows} == {want}
    assert run_meta(tmp_path / "run")["world"] == want


def test_world_1_rows_carry_no_pct_of_line_and_no_bandwidth_verdict():
    from commbench.report.terminal import collective_table

    rows = [make_row("broadcast", world=1, nbytes=n, p50=0.02) for n in (2048, 1 << 19)]
    for prof in (_loopback(), H100):
        for r in rows:
            c = C.ceiling_for_row(prof, r, [0])
            assert c["pct_of_ceiling"] is None and c["bound_busbw_gbps"] is None
            assert c["ceiling_note"] == "world 1: nothing crosses a link"
    r = dict(rows[1])
    C.add_ceiling(r, None, [0])  # a GPU with no profile: still said
    assert r["ceiling_note"] == "world 1: nothing crosses a link" and r["pct_of_ceiling"] is None
    assert r["busbw_gbps"] == rows[1]["busbw_gbps"] > 20000  # the formula's busbw, as nccl-tests prints it
    judged = [{**x, **C.ceiling_for_row(_loopback(), x, [0]), "profile": "loopback"} for x in rows]
    f = _peak_verdict(judged[1])
    assert f.verdict == "world 1: nothing crosses a link" and "line rate" not in f.value
    from commbench.benchmarks import get

    caption = collective_table("broadcast", get("broadcast"), judged, plain=True).caption
    assert "world 1: nothing crosses a link" in str(caption)


def test_world_1_all_reduce_figure_is_left_out_not_a_traceback(tmp_path):
    pytest.importorskip("matplotlib")
    from commbench.report import plots

    rows = [make_row("all_reduce", world=1, nbytes=n, p50=1.0, run="w1") for n in (8, 1024)]
    assert all(r["busbw_gbps"] == 0 for r in rows)
    figs = plots.make_figures(pd.DataFrame(rows), tmp_path / "figs")
    assert "busbw_all_reduce" not in figs and "latency_all_reduce" in figs


def test_world_1_is_no_base_for_weak_scaling():
    from commbench.analyse.analysis import scaling_table

    rows = [dict(make_row("broadcast", world=w, nbytes=1 << 20, p50=p), run="r")
            for w, p in ((1, 0.02), (2, 100.0), (4, 150.0))]
    sc = scaling_table(pd.DataFrame(rows))
    assert set(sc["base_world"]) == {2} and set(sc["world"]) == {2, 4}
