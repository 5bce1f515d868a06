"""Byte accounting of the hierarchical (two-tier) and low-latency dispatches, against
counts made by hand."""
from __future__ import annotations

import numpy as np
import pytest

from commbench.moe import accounting as A
from conftest import run_rows

NODES = [0, 0, 1, 1]  # two nodes of two ranks


def test_forwarder_pairs_the_same_local_index():
    assert list(A.local_index(NODES)) == [0, 1, 0, 1]
    assert A.forwarder(0, 1, NODES) == 2 and A.forwarder(1, 1, NODES) == 3 and A.forwarder(3, 0, NODES) == 1
    assert A.forwarder(1, 1, [0, 0, 1]) == 2  # a smaller node: wrap


def _routing(*rows):
    empty = np.zeros((0, 2), dtype=np.int64)
    return [np.array(rows, dtype=np.int64)] + [empty] * 3


def test_hierarchical_rank_copies_by_hand():
    # E = 4, one expert per rank. Rank 0: token 0 -> experts 2, 3 (ranks 2, 3 on node 1);
    # token 1 -> experts 1, 2 (rank 1 on its own node, rank 2).
    r = A.hierarchical_rows(_routing([2, 3], [1, 2]), 4, NODES, "rank")
    # flat: (t0,2) (t0,3) (t1,2) cross the NIC, (t1,1) stays on the node
    assert list(r["flat_scaleout_recv_rows"]) == [0, 0, 2, 1] and list(r["flat_scaleup_recv_rows"]) == [0, 1, 0, 0]
    # two tokens reach node 1: one NIC row each, both to rank 2 (local index 0, as rank 0)
    assert list(r["scaleout_sent_rows"]) == [2, 0, 0, 0] and list(r["scaleout_recv_rows"]) == [0, 0, 2, 0]
    # rank 2 keeps both of its rows, forwards token 0 to rank 3; rank 0 sends token 1 to rank 1
    assert list(r["scaleup_sent_rows"]) == [1, 0, 1, 0] and list(r["scaleup_recv_rows"]) == [0, 1, 0, 1]
    assert list(r["local_rows"]) == [0, 0, 2, 0]
    assert r["scaleout_recv_rows"].sum() == 2 < r["flat_scaleout_recv_rows"].sum() == 3


def test_hierarchical_expert_copies_by_hand():
    # E = 8, two experts per rank. Token 0 -> experts 4, 6 (ranks 2, 3); token 1 -> 4, 5 (rank 2 twice).
    r = A.hierarchical_rows(_routing([4, 6], [4, 5]), 8, NODES, "expert")
    assert list(r["flat_scaleout_recv_rows"]) == [0, 0, 3, 1]
    assert list(r["scaleout_recv_rows"]) == [0, 0, 2, 0]  # one row per (token, node)
    assert list(r["scaleup_recv_rows"]) == [0, 0, 0, 1] and list(r["local_rows"]) == [0, 0, 3, 0]


def test_hierarchical_on_one_node_is_flat():
    rng = np.random.default_rng(0)
    topk = [np.stack([rng.choice(8, 2, replace=False) for _ in range(16)]) for _ in range(4)]
    r = A.hierarchical_rows(topk, 8, [0, 0, 0, 0], "rank")
    assert r["scaleout_recv_rows"].sum() == 0 == r["flat_scaleout_recv_rows"].sum()
    assert np.array_equal(r["scaleup_recv_rows"], r["flat_scaleup_recv_rows"])


def test_low_latency_routed_and_sent_by_hand():
    # One rank, four experts, capacity 2, 8-byte rows: a count header of 4 x 8 bytes is 4 rows.
    r = A.low_latency_rows([[3, 0, 2, 1]], capacity=2, row_nbytes=8)
    assert (r["routed_rows"][0], r["header_rows"][0], r["sent_rows"][0], r["overflow_rows"][0]) == (5, 4, 9, 1)
    assert A.low_latency_rows([[3, 0, 2, 1]], 2, 8, split_sizes=False)["sent_rows"][0] == 4 * 3  # the slot table
    with pytest.raises(ValueError):
        A.low_latency_rows([[1]], 0, 8)


# --- low-latency mode through the CLI (gloo: the device path on CPU tensors) --------------

SMALL = ["--param", "tokens=64", "--param", "hidden=256", "--param", "experts=8", "--param", "topk=2",
         "--param", "copies=expert", "--param", "mode=low_latency"]


def _rows(out):
    return run_rows(out)


@pytest.mark.parametrize("np_,routing", [(2, "uniform"), (4, "zipf")])
@pytest.mark.multirank
def test_low_latency_on_gloo_checks_and_counts_the_bytes_sent(tmp_path, np_, routing):
    pytest.importorskip("torch")
    from commbench.moe import make_routing
    from conftest import run_cli

    out = tmp_path / "ll"
    r = run_cli("run", "moe", "--backend", "gloo", "--np", np_, "--worlds", np_, "--check", "--iters", "3",
                "--warmup", "1", *SMALL, "--param", f"routing={routing}", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = _rows(out)
    assert {x["check"] for x in rows} == {"ok"} and {x["engine"] for x in rows} == {"torch"}
    assert [x["stage"] for x in rows] == ["dispatch", "combine"]
    assert "stage_us_sync" not in rows[0] and "stage_us_counts" not in rows[0]  # nothing waits on the host
    # The busiest sender's figures, by hand: its T x K routed fp8 rows of H + H/32 bytes and a
    # count header row per destination; combine returns the most any rank received, bf16.
    d, c = rows
    E, T, K, rb = 8, 64, 2, 256 + 256 // 32
    assert d["capacity"] == T and d["overflow_rows"] == 0
    assert d["routed_nbytes"] == T * K * rb and d["sent_nbytes"] == (T * K + np_) * rb
    got = max(sum(int((make_routing(routing, num_tokens=T, num_experts=E, top_k=K, rank=s, world=np_, seed=0,
                                    **({"alpha": 1.0} if routing == "zipf" else {})).topk_idx // (E // np_)
                       == dst).sum()) for s in range(np_)) for dst in range(np_))
    assert c["routed_nbytes"] == c["sent_nbytes"] == got * 2 * 256 and c["padding_factor"] == 1.0


@pytest.mark.multirank
def test_low_latency_capacity_too_small_overflows_and_the_check_says_so(tmp_path):
    pytest.importorskip("torch")
    from conftest import run_cli

    out = tmp_path / "ll"
    r = run_cli("run", "moe", "--backend", "gloo", "--np", 2, "--worlds", 2, "--check", "--iters", "2",
                "--warmup", "1", *SMALL, "--param", "capacity=2", "--out", out)
    assert r.returncode == 1  # dropped tokens never come back: the combine check fails
    rows = _rows(out)
    assert rows[0]["overflow_rows"] > 0 and {x["check"] for x in rows} == {"fail"}


@pytest.mark.parametrize("args,why", [
    (["--backend", "gloo", "--param", "copies=rank"], "use copies=expert"),
    (["--backend", "mpi", "--param", "copies=expert"], "runs on the device path"),
])
@pytest.mark.multirank
def test_low_latency_refusals(tmp_path, args, why):
    from conftest import run_cli

    r = run_cli("run", "moe", "--np", 2, "--param", "mode=low_latency", "--param", "tokens=64", *args,
                "--out", tmp_path / "x")
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
