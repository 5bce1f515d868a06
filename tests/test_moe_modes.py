"""Byte accounting of the hierarchical (two-tier) and low-latency dispatches, against
counts made by hand."""
from __future__ import annotations

import numpy as np
import pytest

from commbench.moe import accounting as A

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


def test_low_latency_padded_and_useful_by_hand():
    r = A.low_latency_rows([3, 0, 2, 1], [[1, 0], [2, 3]], capacity=2)
    assert r == {"padded_sent_rows": 8, "useful_sent_rows": 5, "padded_recv_rows": 8, "useful_recv_rows": 5,
                 "overflow_rows": 1}
    with pytest.raises(ValueError):
        A.low_latency_rows([1], [[1]], 0)
