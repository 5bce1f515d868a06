"""The low-latency MoE exchange's bytes as sent: the routed rows, what the exchange sends and
their ratio (moe/accounting.py), the rows of a real gloo run that sends only the routed rows
and still passes its check, and the tables and summary that show both."""
from __future__ import annotations

import io

import numpy as np
import pytest

from commbench.moe import accounting as A
from conftest import make_row, run_cli, run_rows

DECODE = {"tokens": 128, "hidden": 7168, "experts": 256, "topk": 8, "dispatch_dtype": "fp8", "copies": "expert",
          "routing": "uniform", "mode": "low_latency"}


# --- byte accounting, pure ------------------------------------------------------------------

def test_low_latency_bytes_by_hand():
    # world 2, E = 4 (2 local experts a rank), capacity 3, rows of 10 bytes: a count header
    # of 2 experts x 8 bytes takes 2 rows per destination.
    counts = [[3, 0, 2, 1],   # rank 0 routes 3 rows to expert 0, 2 to expert 2, 1 to expert 3
              [1, 1, 0, 4]]   # rank 1: 4 rows to expert 3, one over the capacity
    d = A.low_latency_rows(counts, 3, 10, "dispatch")
    assert list(d["routed_rows"]) == [6, 5] and list(d["header_rows"]) == [4, 4]
    assert list(d["sent_rows"]) == [10, 9] and list(d["overflow_rows"]) == [0, 1]
    assert list(d["routed_nbytes"]) == [60, 50] and list(d["sent_nbytes"]) == [100, 90]
    # combine: each rank returns what it received (rank 0's experts 0, 1: 3 + 0 + 1 + 1), no header
    c = A.low_latency_rows(counts, 3, 10, "combine")
    assert list(c["routed_rows"]) == [5, 6] and list(c["sent_rows"]) == [5, 6]
    # the whole slot table: E regions of capacity + 1 rows, used or not, in either stage
    for stage in ("dispatch", "combine"):
        t = A.low_latency_rows(counts, 3, 10, stage, split_sizes=False)
        assert list(t["sent_rows"]) == [16, 16]
    f = A.low_latency_fields(counts, 3, 10, "dispatch")
    assert f == {"routed_nbytes": 60, "sent_nbytes": 100, "padding_factor": 100 / 60, "count_nbytes": 40,
                 "overflow_rows": 1, "exchange": A.EXCHANGE_SPLIT}
    assert A.low_latency_fields(counts, 3, 10, "combine", split_sizes=False)["exchange"] == A.EXCHANGE_SLOT_TABLE
    assert A.padding_factor(10, 0) is None
    with pytest.raises(ValueError):
        A.low_latency_rows(counts, 0, 10)


def test_a_skewed_routing_pads_the_slot_table_not_the_routed_exchange():
    # Every token of both ranks picks expert 0 (rank 0's): 8 rows each, capacity 8; a
    # header of 2 x 8 bytes fits one 16-byte row per destination.
    counts = [[8, 0, 0, 0], [8, 0, 0, 0]]
    split = A.low_latency_fields(counts, 8, 16, "dispatch")
    table = A.low_latency_fields(counts, 8, 16, "dispatch", split_sizes=False)
    assert split["routed_nbytes"] == 8 * 16 and split["sent_nbytes"] == (8 + 2) * 16
    assert split["padding_factor"] == pytest.approx(1.25)
    assert table["sent_nbytes"] == 4 * 9 * 16 and table["padding_factor"] == pytest.approx(4.5)
    # combine: rank 0 returns all 16 rows, rank 1 none; the busiest sender is rank 0
    back = A.low_latency_fields(counts, 8, 16, "combine")
    assert back["routed_nbytes"] == back["sent_nbytes"] == 16 * 16 and back["padding_factor"] == 1.0


def test_at_the_decode_shape_only_the_routed_rows_travel():
    """DeepSeek-V3 decode (T=128, K=8 of E=256, fp8 rows) on 2 ranks: the slot table is 32x
    the routed rows; the routed exchange adds only its count headers."""
    from commbench.moe import make_routing

    p = DECODE
    counts = np.array([np.bincount(make_routing("uniform", num_tokens=p["tokens"], num_experts=p["experts"],
                                                top_k=p["topk"], rank=r, world=2, seed=0).topk_idx.ravel(),
                                   minlength=p["experts"]) for r in range(2)])
    rb = A.token_bytes(p["hidden"], "fp8")
    split = A.low_latency_fields(counts, p["tokens"], rb, "dispatch")
    table = A.low_latency_fields(counts, p["tokens"], rb, "dispatch", split_sizes=False)
    assert split["routed_nbytes"] == p["tokens"] * p["topk"] * rb  # a token reaches an expert once
    assert split["sent_nbytes"] == split["routed_nbytes"] + 2 * rb and split["padding_factor"] < 1.01
    assert table["sent_nbytes"] == 256 * 129 * rb and table["padding_factor"] > 30


# --- the table and the summary ----------------------------------------------------------------

def _moe_row(stage, routed, sent, p50=150_000.0, **kw):
    return make_row("moe", 2, routed, p50, stage=stage, dtype="fp8" if stage == "dispatch" else "bf16",
                    params=DECODE, placement=None, backend="gloo", logical_gbps=0.05, remote_gbps=0.03,
                    scaleup_gbps=0.03, scaleout_gbps=0.0, load_max_over_mean=1.05, hottest_rank=1,
                    stage_us_layout=500.0, stage_us_pack=14000.0, stage_us_a2a=0.9 * p50, pct_of_ceiling=0.2,
                    compared_as="per-tier bytes", run="r", routed_nbytes=routed, sent_nbytes=sent, **kw)


def _table(rows, wide):
    from rich.console import Console

    from commbench.report.moe_view import terminal_table
    from commbench.report.tables import print_table

    console = Console(file=io.StringIO(), width=300, force_terminal=False, color_system=None)
    print_table(console, terminal_table(rows, plain=True), wide=wide)
    return console.file.getvalue()


def _data_lines(out):
    return [ln for ln in out.splitlines() if ln.startswith("|") and (" dispatch " in ln or " combine " in ln)]


def test_the_moe_table_shows_the_padding_when_the_exchange_pads():
    padded = [_moe_row("dispatch", 7_569_408, 244_113_408)]
    out = _table(padded, wide=False)
    assert "sent/" in out and "32.25x" in " ".join(_data_lines(out))
    # rows written before the fields had names of their own: shown the same
    old = [_moe_row("dispatch", 0, 0, useful_sent_nbytes=7_569_408, padded_sent_nbytes=244_113_408)]
    assert "32.25x" in " ".join(_data_lines(_table(old, wide=False)))
    # only the count headers beside the routed rows: not news by default, every byte with --wide
    routed = [_moe_row("dispatch", 7_569_408, 7_584_192), _moe_row("combine", 14_680_064, 14_680_064)]
    out = _table(routed, wide=False)
    assert "1.00x" not in " ".join(_data_lines(out)) and "sent/" in out.split("not shown:")[1]
    wide = _table(routed, wide=True)
    cells = " ".join(_data_lines(wide))
    assert "7.57" in cells and "7.58" in cells and "1.00x" in cells and "14.68" in cells


def test_the_summary_says_the_sent_and_the_routed_rate():
    from commbench.report.moe_view import judge_stages

    padded = judge_stages([_moe_row("dispatch", 7_569_408, 244_113_408)])
    assert "32.25x the routed bytes" in padded and "1.63 GB/s sent" in padded and "0.05 GB/s routed" in padded
    assert "the % counts the routed bytes to other ranks" in padded
    routed = judge_stages([_moe_row("dispatch", 7_569_408, 7_584_192)])
    assert "1.00x the routed bytes" in routed and "0.05 GB/s sent" in routed
    # a row of another mode says nothing of it
    other = _moe_row("dispatch", 7_569_408, 0)
    other.pop("sent_nbytes")
    assert "routed bytes" not in judge_stages([other])


# --- one real run ------------------------------------------------------------------------------

TINY = ["--param", "tokens=64", "--param", "hidden=256", "--param", "experts=8", "--param", "topk=2"]


@pytest.mark.multirank
def test_moe_decode_on_gloo_sends_only_the_routed_rows_and_passes_its_check(tmp_path):
    pytest.importorskip("torch")
    from commbench.moe import make_routing

    out = tmp_path / "decode"
    r = run_cli("run", "moe-decode", "--backend", "gloo", "--np", 2, "--iters", 3, "--warmup", 1, *TINY,
                "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = run_rows(out)
    assert [x["stage"] for x in rows] == ["dispatch", "combine"] and {x["check"] for x in rows} == {"ok"}
    assert "stage_us_unpack" in rows[0] and "stage_us_sync" not in rows[0]  # nothing waits on the host
    # The busiest sender's routed rows, by hand: every (token, expert) row of its routing.
    T, E, K, rb_d, rb_c = 64, 8, 2, 256 + 256 // 32, 2 * 256
    topk = [make_routing("uniform", num_tokens=T, num_experts=E, top_k=K, rank=s, world=2, seed=0).topk_idx
            for s in range(2)]
    received = [sum(int((t // (E // 2) == d).sum()) for t in topk) for d in range(2)]
    d, c = rows
    assert d["exchange"] == c["exchange"] == A.EXCHANGE_SPLIT
    assert d["routed_nbytes"] == T * K * rb_d and d["count_nbytes"] == 2 * rb_d  # one header row per destination
    assert d["sent_nbytes"] == d["routed_nbytes"] + d["count_nbytes"] and 1 < d["padding_factor"] < 1.02
    assert c["routed_nbytes"] == c["sent_nbytes"] == max(received) * rb_c and c["padding_factor"] == 1.0
    assert d["overflow_rows"] == 0
    # The report's table has the byte columns, its summary the ratio (the terminal's: above).
    rep = run_cli("report", out, "--out", tmp_path / "rep")
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| sent/routed |" in md and "a2a" in md and "sends 1.02x the routed bytes" in md
