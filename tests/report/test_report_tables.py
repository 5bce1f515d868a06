"""Terminal tables (commbench.report.terminal): no cell or header ever cut, a compact default with
every column under --wide, one number format, the weak-scaling table at one size per
collective, ordered MoE rows, variant and placement columns where rows differ in them,
and no alpha-beta fit printed over fewer than three sizes."""
from __future__ import annotations

import io
import re

import pandas as pd
import pytest
from rich.console import Console

from commbench.report.fmt import num
from commbench.report.terminal import analysis_tables, print_tables, variant_tables
from conftest import make_row

WORLDS = (2, 4)
SIZES = [8 << i for i in range(20)]  # 8 B .. 4 MiB, as the quick suite
BENCHES = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "send_recv": lambda n: 1.0}


def _row(bench, world, nbytes, p50, **kw):
    factor = BENCHES.get(bench, lambda n: 1.0)(world)
    alg = nbytes * factor / (p50 * 1e-6) / 1e9 if nbytes else 0.0
    r = make_row(bench, world, nbytes, p50, iters=1234, busbw_factor=factor, time_us_p99=p50 * 3.7,
                 time_us_max=p50 * 9.1, time_us_std=1.0, tier="scaleup", bottleneck="shared memory (memcpy)",
                 ceiling_gbps=9.422, ceiling_achieved_gbps=9.422, compared_as="busbw", pct_of_ceiling=100 * alg / 9.422,
                 pct_of_achieved=100 * alg / 9.422, time_bound_us=nbytes * factor / 9.422e3, profile="loopback",
                 run="r")
    r.update(kw)
    return r


def quick_rows():
    """A quick-sized run: every size at two worlds, slow ranks (p50 in the thousands of us,
    p99 five digits) so the numbers are as wide as a loaded machine makes them."""
    rows = [_row(b, w, s, 300.0 * w + 2980.123 * (w - 1) + s / 1e3) for b in BENCHES for w in WORLDS
            for s in SIZES]
    rows += [_row("barrier", w, 0, 242.49 * w, check="skipped", busbw_gbps=0.0, algbw_gbps=0.0, compared_as=None,
                  ceiling_gbps=None, pct_of_ceiling=None, pct_of_achieved=None, time_bound_us=303.19,
                  ceiling_note="latency only: no bytes to compare with a link rate") for w in WORLDS]
    return rows


def moe_rows():
    rows = []
    for world in WORLDS:
        for routing, key, vals in (("zipf", "alpha", (1.5, 0.0, 1.0, 0.5)), ("hot_rank", "ratio", (8.0, 2.0)),
                                   ("uniform", "alpha", (1.0,))):
            for v in vals:
                for stage, dt in (("combine", "bf16"), ("dispatch", "fp8")):
                    p = {"tokens": 4096, "hidden": 7168, "experts": 256, "topk": 8, "dispatch_dtype": "fp8",
                         "copies": "expert", "routing": routing, "alpha": 1.0, "ratio": 2.0, key: v}
                    rows.append(_row("moe", world, 303163, 303163.2 + v, stage=stage, dtype=dt, params=p,
                                     placement=None, logical_gbps=1.5, remote_gbps=0.75, scaleup_gbps=0.75,
                                     scaleout_gbps=0.0, load_max_over_mean=1 + v / 10, hottest_rank=3,
                                     outside_a2a_pct=41.0, stage_us_layout=300.0, stage_us_counts=1984.0,
                                     stage_us_a2a=2118.0, stage_us_unpack=7.0, compared_as="per-tier bytes"))
    return rows


def _render(fn, rows, width, **kw) -> str:
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    fn(rows, console=console, **kw) if fn is not variant_tables else fn(pd.DataFrame(rows), console=console, **kw)
    return console.file.getvalue()


def _headers_of(out: str) -> str:
    return " ".join(out.split())


@pytest.mark.parametrize("width", [120, 240])
@pytest.mark.parametrize("wide", [False, True])
def test_no_table_cuts_a_number_or_a_header(width, wide):
    rows = quick_rows() + moe_rows()
    out = _render(print_tables, rows, width, wide=wide) + _render(analysis_tables, pd.DataFrame(rows), width,
                                                                   wide=wide)
    assert "\u2026" not in out
    # Every number of the rows appears whole: the slowest p99, the moe p50.
    assert f"{max(r['time_us_p99'] for r in rows if r['benchmark'] != 'moe'):.2f}" in out
    assert "303163.2" in out
    if not wide:
        # The compact default fits the console: no line longer than it.
        assert max(len(line) for line in out.splitlines()) <= width


def test_compact_by_default_every_column_with_wide():
    rows = [r for r in quick_rows() if r["benchmark"] == "all_reduce"]
    compact = _headers_of(_render(print_tables, rows, 120))
    wide = _headers_of(_render(print_tables, rows, 120, wide=True))
    for col in ("iters", "bound (us)", "ceiling (GB/s)", "% achieved"):
        assert col not in compact.split("not shown:")[0] and col in wide
    assert "not shown: iters, min (us), max (us), bound (us), ceiling (GB/s), % achieved (--wide shows them)" in compact
    for col in ("world", "size (B)", "p50 (us)", "busbw (GB/s)", "% line", "check"):
        assert col in compact
    assert "dtype float32" in compact  # a dtype that never changes is said once, in the caption


def test_one_number_format_and_largest_size_in_weak_scaling():
    rows = quick_rows() + moe_rows()
    out = _render(analysis_tables, pd.DataFrame(rows), 240)
    scaling = out.split("weak-scaling efficiency")[1].split("alpha-beta fit")[0]
    assert not re.search(r"\d[eE][+-]\d", scaling)  # no "1.144e+04" beside "2994"
    body = [ln for ln in scaling.splitlines() if "busbw GB/s" in ln]
    # Three collectives x two worlds at their largest size (4M), not every size.
    assert len(body) == len(BENCHES) * len(WORLDS) and all(" 4M " in ln for ln in body)
    assert "at the largest size measured at several worlds" in _headers_of(scaling)
    every = _render(analysis_tables, pd.DataFrame(rows), 240, wide=True)
    assert len([ln for ln in every.split("weak-scaling")[1].splitlines() if "busbw GB/s" in ln]) == \
        len(BENCHES) * len(WORLDS) * len(SIZES)
    # The moe rows say their point in the params column.
    assert "T=4096 H=7168 E=256 K=8 expert zipf a=0.5" in scaling


def test_num_is_fixed_point():
    assert [num(v) for v in (11440.4, 2994.0, 29.94, 0.1236, 2.1e-05, float("nan"))] == \
        ["11440", "2994", "29.94", "0.124", "0.000", "-"]


def test_moe_rows_in_order():
    out = _render(print_tables, moe_rows(), 240)
    shapes = re.findall(r"(zipf a=[\d.]+|hot_rank r=[\d.]+|uniform)\s+\|?\s*(dispatch|combine)", out)
    n2 = shapes[:len(shapes) // 2]
    assert [s for s, _ in n2[::2]] == ["hot_rank r=2.0", "hot_rank r=8.0", "uniform", "zipf a=0.0", "zipf a=0.5",
                                       "zipf a=1.0", "zipf a=1.5"]
    assert [st for _, st in n2[:2]] == ["dispatch", "combine"]


def test_barrier_caption_says_what_its_bound_is():
    out = _headers_of(_render(print_tables, [r for r in quick_rows() if r["benchmark"] == "barrier"], 120))
    assert "comparing None" not in out and "comparing nan" not in out
    assert "bound = the profile's latency floor" in out


def test_variant_and_placement_columns_when_rows_differ():
    rows = []
    for s in SIZES[-6:]:
        for variant, place, k in (("default", "out-of-place", 1.0), ("default", "in-place", 0.9),
                                  ("nccl-ring", "out-of-place", 1.2)):
            rows.append(_row("all_reduce", 8, s, 10.0 + s / 1e4 * k, variant=variant, placement=place))
    table = _render(print_tables, rows, 200)
    assert "variant" in table and "placement" in table and "nccl-ring" in table
    fits = _render(analysis_tables, pd.DataFrame(rows), 200).split("alpha-beta fit")[1]
    fit_lines = [ln for ln in fits.splitlines() if "all_reduce" in ln]
    assert len(fit_lines) == 3  # one per (variant, placement): no two look alike
    assert any("in-place" in ln for ln in fit_lines) and any("nccl-ring" in ln for ln in fit_lines)
    side = _render(variant_tables, rows, 200)
    assert "variants side by side (baseline nccl-ring)" in side and "vs nccl-ring: cannot judge: one run each" in side


def test_a_fit_needs_three_sizes():
    two = [_row("all_reduce", 2, s, 10.0 + s / 1e3) for s in (1024, 1 << 20)]
    three = [_row("send_recv", 2, s, 10.0 + s / 1e3) for s in (1024, 65536, 1 << 20)]
    out = _headers_of(_render(analysis_tables, pd.DataFrame(two + three), 200))
    fits = out.split("alpha-beta fit")[1]
    assert "send_recv" in fits and "all_reduce 2" not in fits
    assert "no alpha-beta fit (fewer than 3 sizes" in out and "all_reduce n=2: 2 sizes" in out


@pytest.mark.multirank
def test_wide_flag_on_report(tmp_path):
    from commbench.store.results import RunDir, Status
    from conftest import run_cli

    rd = RunDir(tmp_path / "run").open({"schema": 3, "status": "running", "hosts": ["h"] * 2})
    for r in quick_rows():
        if r["benchmark"] == "send_recv":
            rd.append({k: v for k, v in r.items() if k != "run"})
    rd.finish(Status.COMPLETE)
    compact = run_cli("report", rd.dir)
    wide = run_cli("report", rd.dir, "--wide")
    assert compact.returncode == 0 and wide.returncode == 0, compact.stderr + wide.stderr
    assert "% achieved" not in compact.stdout.split("not shown")[0] and "% achieved" in wide.stdout
    assert "\u2026" not in compact.stdout + wide.stdout
