"""MoE routing, dispatch layout and byte accounting: numpy only, no communication."""
import math

import numpy as np
import pytest

from commbench.moe import accounting as acc
from commbench.moe import layout as lay
from commbench.moe import routing as rt

E, K, W, T = 256, 8, 4, 512

GENERATORS = {
    "uniform": {},
    "balanced": {},
    "zipf": {"alpha": 1.2},
    "hot_rank": {"ratio": 4.0, "hot": 2},
    "group_limited": {"max_groups": 2},
}


def route(name, rank=0, seed=7, num_tokens=T, num_experts=E, top_k=K, world=W, **own):
    params = dict(GENERATORS[name], **own)
    return rt.make_routing(name, num_tokens=num_tokens, num_experts=num_experts,
                           top_k=top_k, rank=rank, world=world, seed=seed, **params)


def all_ranks_counts(name, world, num_tokens, seed=0, **own):
    """Per-expert (token, expert) pairs summed over every rank."""
    counts = np.zeros(E, dtype=np.int64)
    for r in range(world):
        idx = route(name, rank=r, seed=seed, num_tokens=num_tokens, world=world, **own).topk_idx
        counts += np.bincount(idx.ravel(), minlength=E)
    return counts


def rank_share(counts, world):
    per_rank = counts.reshape(world, -1).sum(axis=1)
    return per_rank / per_rank.sum()


# ------------------------------------------------------------------ routing


@pytest.mark.parametrize("name", GENERATORS)
def test_routing_shape_distinct_and_weights(name):
    r = route(name)
    assert r.topk_idx.shape == (T, K) and r.topk_idx.dtype == np.int64
    assert r.weights.shape == (T, K) and r.weights.dtype == np.float32
    assert r.topk_idx.min() >= 0 and r.topk_idx.max() < E
    s = np.sort(r.topk_idx, axis=1)
    assert (s[:, 1:] != s[:, :-1]).all(), "experts repeat within a token"
    assert (r.weights > 0).all()
    np.testing.assert_allclose(r.weights.sum(axis=1), 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", GENERATORS)
def test_routing_deterministic_per_seed_and_rank(name):
    a, b = route(name, rank=1), route(name, rank=1)
    assert np.array_equal(a.topk_idx, b.topk_idx)
    assert np.array_equal(a.weights, b.weights)
    assert not np.array_equal(a.topk_idx, route(name, rank=2).topk_idx)
    assert not np.array_equal(a.topk_idx, route(name, rank=1, seed=8).topk_idx)


def test_k_equal_to_e_and_skewed_weights_still_distinct():
    r = rt.uniform(64, 16, 16, 0, 1, 3)
    assert (np.sort(r.topk_idx, axis=1) == np.arange(16)).all()
    z = rt.zipf(256, 16, 12, 0, 2, 3, alpha=6.0)
    s = np.sort(z.topk_idx, axis=1)
    assert (s[:, 1:] != s[:, :-1]).all()


def test_sampler_matches_gumbel_top_k():
    # The redraw-collisions sampler must give the successive-sampling (Gumbel-top-k)
    # law slot by slot; alpha = 3 on 24 experts forces the Plackett-Luce fallback too.
    n_exp, k, n = 24, 5, 60_000
    p = rt.expert_probabilities("zipf", n_exp, 1, seed=1, alpha=3.0)
    rng = np.random.default_rng(11)
    ours = rt._sample_distinct(rng, n, n_exp, k, p)
    ref = np.argsort(rng.standard_exponential((n, n_exp)) / p, axis=1)[:, :k]
    for slot in range(k):
        f1 = np.bincount(ours[:, slot], minlength=n_exp) / n
        f2 = np.bincount(ref[:, slot], minlength=n_exp) / n
        # z-score of a difference of two binomial frequencies; 5 sigma over 24*5 cells.
        z = np.abs(f1 - f2) / np.sqrt((f1 + f2) / n + 1e-12)
        assert z.max() < 5, (slot, z.max())


def test_balanced_is_exact_globally_and_per_rank():
    counts = all_ranks_counts("balanced", W, T)
    assert (counts == T * W * K // E).all()
    # T * K % E == 0: every rank is balanced on its own too.
    one_rank = route("balanced", rank=3).topk_idx
    assert (np.bincount(one_rank.ravel(), minlength=E) == T * K // E).all()
    # Only the global total is a multiple of E here: 24 * 4 * 8 = 3 * 256.
    counts = all_ranks_counts("balanced", 4, 24)
    assert (counts == 3).all()
    with pytest.raises(ValueError, match="balanced routing needs"):
        route("balanced", num_tokens=25)


def test_zipf_hottest_rank_matches_expected_share():
    world, tokens = 8, 4096
    expect = rt.expected_rank_load_share("zipf", E, K, world, seed=0, alpha=1.2)
    measured = rank_share(all_ranks_counts("zipf", world, tokens, seed=0, alpha=1.2), world)
    hot = int(np.argmax(expect))
    assert int(np.argmax(measured)) == hot
    # Over 20 seeds the measured-minus-expected hottest share (32768 sampled tokens
    # against the helper's 2**18) had a standard deviation of 6.6e-4: 4e-3 is 6 sigma.
    assert abs(measured[hot] - expect[hot]) < 4e-3
    # The raw weight share ignores sampling without replacement and is far off.
    weight_share = rt.expert_probabilities("zipf", E, world, seed=0, alpha=1.2)
    assert weight_share.reshape(world, -1).sum(axis=1)[hot] > expect[hot] + 0.05
    ratio, hottest = rt.expected_load_imbalance("zipf", E, K, world, seed=0, alpha=1.2)
    assert hottest == hot and ratio == pytest.approx(expect[hot] * world)


def test_zipf_shares_all_ranks_same_hot_experts_and_alpha_zero_is_uniform():
    p0 = rt.expert_probabilities("zipf", E, W, seed=5, alpha=1.0)
    hot_expert = int(np.argmax(p0))
    for r in range(W):
        idx = route("zipf", rank=r, seed=5, alpha=1.0).topk_idx
        assert int(np.argmax(np.bincount(idx.ravel(), minlength=E))) == hot_expert
    np.testing.assert_allclose(rt.expert_probabilities("zipf", E, W, seed=5, alpha=0.0), 1 / E)
    np.testing.assert_allclose(
        rt.expected_rank_load_share("zipf", E, K, W, seed=5, alpha=0.0), 1 / W)
    with pytest.raises(ValueError, match="pass seed"):
        rt.expert_probabilities("zipf", E, W, alpha=1.0)


def test_hot_rank_share_exact_and_measured():
    ratio, hot, world = 4.0, 2, W
    expect = rt.expected_rank_load_share("hot_rank", E, K, world, ratio=ratio, hot=hot)
    assert expect.sum() == pytest.approx(1.0)
    # Without replacement the hot rank gets a little less than the with-replacement
    # r / (r + world - 1).
    assert expect[hot] < ratio / (ratio + world - 1)
    assert expect[hot] > ratio / (ratio + world - 1) - 0.02
    measured = rank_share(all_ranks_counts("hot_rank", world, 4096, ratio=ratio, hot=hot), world)
    # 16384 tokens: the hot share's standard error is about 1.5e-3.
    assert abs(measured[hot] - expect[hot]) < 6e-3
    np.testing.assert_allclose(
        rt.expected_rank_load_share("hot_rank", E, K, world, ratio=1.0), 1 / world)
    # K above the hot rank's E/world experts: the chain must cap at a full hot rank.
    small = rt.expected_rank_load_share("hot_rank", 16, 6, 8, ratio=50.0)
    assert np.isfinite(small).all() and small[0] <= 2 / 6 + 1e-12
    measured = rank_share(np.bincount(rt.hot_rank(20000, 16, 6, 0, 8, 1, ratio=50.0)
                                      .topk_idx.ravel(), minlength=16), 8)
    assert abs(measured[0] - small[0]) < 5e-3
    w = rt.expert_probabilities("hot_rank", E, world, ratio=ratio, hot=hot)
    per = E // world
    assert w[hot * per] == pytest.approx(ratio * w[0])


def test_group_limited_respects_max_groups():
    for groups, m in ((None, 2), (8, 3), (16, 1)):
        n_groups = W if groups is None else groups
        r = route("group_limited", rank=1, groups=groups, max_groups=m)
        g = r.topk_idx // (E // n_groups)
        gs = np.sort(g, axis=1)
        used = 1 + (gs[:, 1:] != gs[:, :-1]).sum(axis=1)
        assert used.max() <= m
    # Expert marginals are uniform by symmetry.
    np.testing.assert_allclose(
        rt.expected_rank_load_share("group_limited", E, K, W, max_groups=2), 1 / W)


def test_make_routing_dispatch_and_none_params():
    assert set(GENERATORS) <= set(rt.ROUTINGS)  # the workloads (test_workloads.py) join them
    a = rt.make_routing("zipf", num_tokens=8, num_experts=E, top_k=K, rank=0, world=W,
                        seed=1, alpha=None, ratio=None)
    b = rt.zipf(8, E, K, 0, W, 1)
    assert np.array_equal(a.topk_idx, b.topk_idx)
    with pytest.raises(ValueError, match="needs seed"):
        rt.make_routing("uniform", num_tokens=8, num_experts=E, top_k=K, rank=0, world=W)


@pytest.mark.parametrize("name, params, e, k, world, match", [
    ("gaussian", {}, E, K, W, "unknown routing 'gaussian'"),
    ("uniform", {}, 4, 8, 2, "top_k 8 exceeds num_experts 4"),
    ("uniform", {}, E, 0, W, "top_k must be >= 1"),
    ("uniform", {}, 10, 2, 4, "num_experts 10 is not divisible by world 4"),
    ("zipf", {"alpha": -0.5}, E, K, W, "alpha must be a finite number >= 0"),
    ("hot_rank", {"ratio": 0.5}, E, K, W, "ratio must be a finite number >= 1"),
    ("hot_rank", {"hot": 4}, E, K, W, "hot rank 4 is outside"),
    ("group_limited", {"groups": 4, "max_groups": 5}, E, K, W, "max_groups 5 exceeds groups 4"),
    ("group_limited", {"groups": 5, "max_groups": 1}, 12, 2, 2, "groups 5 does not divide"),
    ("group_limited", {"groups": 8, "max_groups": 1}, 32, 5, 4, "top_k 5 exceeds the 4 experts"),
    ("group_limited", {}, E, K, W, "needs max_groups"),
    ("balanced", {"num_tokens": 3}, E, K, W, "divisible by num_experts"),
    ("uniform", {"alpha": 1.0}, E, K, W, "takes no parameter alpha"),
])
def test_validate_routing_params_errors(name, params, e, k, world, match):
    with pytest.raises(ValueError, match=match) as info:
        rt.validate_routing_params(name, params, e, k, world)
    assert "\n" not in str(info.value)


def test_validate_routing_params_accepts_valid():
    assert rt.validate_routing_params("zipf", {"alpha": 0.0, "seed": 3}, E, K, W) is None
    assert rt.validate_routing_params("balanced", {}, E, K, W, num_tokens=T) is None
    assert rt.validate_routing_params("group_limited", {"groups": 8, "max_groups": 4},
                                      E, K, 64) is None


# ------------------------------------------------------------------ layout


def brute_layout(topk, weights, world, copies):
    """Token-by-token reference: list of (dest, token, expert, weight) rows in send order."""
    per = E // world
    rows = []
    for t in range(topk.shape[0]):
        if copies == "expert":
            rows += [(int(e) // per, t, int(e), float(w)) for e, w in zip(topk[t], weights[t])]
        else:
            for d in sorted({int(e) // per for e in topk[t]}):
                w = sum(float(wk) for e, wk in zip(topk[t], weights[t]) if int(e) // per == d)
                rows.append((d, t, -1, w))
    rows.sort(key=lambda r: r[0])  # stable: keeps (token, k) order inside a destination
    return rows


@pytest.mark.parametrize("copies", lay.COPIES)
@pytest.mark.parametrize("name", ["uniform", "zipf", "group_limited"])
def test_layout_matches_token_by_token_reference(name, copies):
    r = route(name, num_tokens=60, rank=1)
    L = lay.dispatch_layout(r, E, W, copies)
    ref = brute_layout(r.topk_idx, r.weights, W, copies)
    assert L.num_rows == len(ref) == L.send_counts.sum()
    assert np.array_equal(np.repeat(np.arange(W), L.send_counts), [x[0] for x in ref])
    assert np.array_equal(L.send_token_idx, [x[1] for x in ref])
    assert np.array_equal(L.send_expert, [x[2] for x in ref])
    np.testing.assert_allclose(L.send_weight, [x[3] for x in ref], rtol=1e-6)
    assert L.send_weight.dtype == np.float32
    dests = [len({int(e) // (E // W) for e in row}) for row in r.topk_idx]
    assert np.array_equal(L.dest_ranks_per_token, dests)


def test_layout_counts_and_grouping_at_full_size():
    r = route("uniform", num_tokens=4096)
    per = E // W
    for copies in lay.COPIES:
        L = lay.dispatch_layout(r, E, W, copies)
        assert np.array_equal(L.tokens_per_expert, np.bincount(r.topk_idx.ravel(), minlength=E))
        dest = np.repeat(np.arange(W), L.send_counts)
        off = L.send_offsets
        for d in range(W):
            tok = L.send_token_idx[off[d]:off[d + 1]]
            assert (np.diff(tok) > 0).all() if copies == "rank" else (np.diff(tok) >= 0).all()
        if copies == "expert":
            assert L.num_rows == 4096 * K
            assert np.array_equal(L.send_expert // per, dest)
            assert np.array_equal(L.send_counts,
                                  L.tokens_per_expert.reshape(W, per).sum(axis=1))
        else:
            assert L.num_rows == L.dest_ranks_per_token.sum() < 4096 * K
            assert (L.send_expert == -1).all()
        same = lay.dispatch_layout(route("uniform", num_tokens=4096), E, W, copies)
        assert np.array_equal(same.send_token_idx, L.send_token_idx)


@pytest.mark.parametrize("copies", lay.COPIES)
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_reduce_of_identity_dispatch_equals_expected(copies, weighted):
    r = route("hot_rank", num_tokens=1024)
    L = lay.dispatch_layout(r, E, W, copies)
    x = np.random.default_rng(0).standard_normal((1024, 48)).astype(np.float32)
    back = x[L.send_token_idx]  # identity experts, rows return in send order
    got = lay.combine_reduce(back, L, 1024, weighted=weighted)
    want = lay.combine_expected(x, L, weighted=weighted)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    factor = lay.combine_factor(L, weighted)
    if weighted:
        np.testing.assert_allclose(factor, r.weights.astype(np.float64).sum(axis=1), rtol=1e-6)
        np.testing.assert_allclose(factor, 1.0, atol=1e-6)
    elif copies == "rank":
        assert np.array_equal(factor, L.dest_ranks_per_token)
    else:
        assert (factor == K).all()


def test_global_layout_and_recv_counts():
    def routing_for_rank(rank):
        return route("zipf", rank=rank, seed=3)

    for copies in lay.COPIES:
        m = lay.global_layout(routing_for_rank, E, W, copies)
        assert m.shape == (W, W) and m.dtype == np.int64
        for src in range(W):
            own = lay.dispatch_layout(routing_for_rank(src), E, W, copies)
            assert np.array_equal(m[src], own.send_counts)
        recv = lay.recv_counts_from_all(m)
        assert np.array_equal(recv, m.T)
        assert recv.sum() == m.sum()
    assert m.sum(axis=1).tolist() == [T * K] * W


def test_load_imbalance():
    assert lay.load_imbalance([10, 30, 20, 20]) == (1.5, 1)
    assert lay.load_imbalance([0, 0]) == (1.0, 0)


def test_layout_rejects_bad_input():
    with pytest.raises(ValueError, match="copies"):
        lay.dispatch_layout(np.zeros((2, 1), np.int64), E, W, "token")
    with pytest.raises(ValueError, match="expert ids"):
        lay.dispatch_layout(np.full((2, 1), E), E, W, "rank")


# ------------------------------------------------------------------ accounting


def test_token_bytes():
    assert acc.token_bytes(7168, "fp8") == 7392
    assert acc.token_bytes(7168, "bf16") == acc.token_bytes(7168, "fp16") == 14336
    assert acc.token_bytes(7168, "fp32") == 28672
    with pytest.raises(ValueError, match="divisible by 128"):
        acc.token_bytes(100, "fp8")
    with pytest.raises(ValueError, match="unknown token dtype"):
        acc.token_bytes(128, "int4")


def test_dispatch_bytes_by_hand():
    # 4 ranks on 2 nodes; rank 1 sends [1, 2, 3, 4] and receives [5, 6, 7, 8].
    node = np.array([0, 0, 1, 1])
    b = acc.dispatch_bytes([1, 2, 3, 4], [5, 6, 7, 8], 1, node, 10)
    assert b == {
        "recv_rows": 26, "sent_rows": 10,
        "logical_nbytes": 260, "local_nbytes": 60, "remote_nbytes": 200,
        "scaleup_nbytes": 50, "scaleout_nbytes": 150,
        "sent_logical_nbytes": 100, "sent_remote_nbytes": 80,
        "sent_scaleup_nbytes": 10, "sent_scaleout_nbytes": 70,
    }


def test_q_at_least_one_edges():
    q = acc.q_at_least_one
    assert q(10, 3, 0) == 0.0 and q(10, 0, 4) == 0.0
    assert q(10, 10, 1) == 1.0 and q(10, 7, 4) == 1.0  # 4 picks cannot all miss 7 of 10
    assert q(10, 3, 1) == pytest.approx(0.3)
    assert q(32, 4, 2) == pytest.approx(1 - math.comb(28, 2) / math.comb(32, 2))
    # Gamma form: continuous at integers, increasing in k between them.
    assert q(32, 4, 2 + 1e-9) == pytest.approx(q(32, 4, 2), abs=1e-8)
    assert q(32, 4, 2) < q(32, 4, 8 / 3) < q(32, 4, 3)
    assert q(32.0, 4.0, 2.0) == q(32, 4, 2)
    for bad in ((10, 11, 1), (10, 3, 11), (10, -1, 1)):
        with pytest.raises(ValueError):
            q(*bad)


def test_expected_dest_ranks_deepseek_ep8():
    assert round(acc.expected_dest_ranks(256, 8, 8), 2) == 5.29
    # The layout of uniform routing agrees (32768 tokens; per-token sd ~1, so 0.03 is 5 sigma).
    mean = np.mean([lay.dispatch_layout(route("uniform", rank=r, num_tokens=4096, world=8),
                                        E, 8, "rank").dest_ranks_per_token.mean()
                    for r in range(8)])
    assert mean == pytest.approx(acc.expected_dest_ranks(256, 8, 8), abs=0.03)


@pytest.mark.parametrize("case, nic, nvl", [
    ("flat", 7.0, 0.875),
    ("hierarchical", 4.63, 6.72),
    ("node_limited", 3.50, 6.66),
])
def test_deepseek_v3_copies_per_token(case, nic, nvl):
    got = acc.dispatch_copies_per_token(case, E=256, K=8, P=64, G=8, M=4)
    assert got == pytest.approx((nic, nvl), abs=5e-3)
    v_nic, v_nvl = acc.dispatch_volume_nbytes(case, 4096, 7168, "fp8", 256, 8, 64, 8, 4)
    assert v_nic == pytest.approx(got[0] * 4096 * 7392)
    assert v_nvl == pytest.approx(got[1] * 4096 * 7392)
    assert acc.dispatch_volume_nbytes(case, 10, 7168, 100, 256, 8, 64, 8, 4) == \
        pytest.approx((got[0] * 1000, got[1] * 1000))


def test_copies_formulas_consistency_and_errors():
    nic, nvl = acc.dispatch_copies_per_token("flat", 256, 8, 16, 4)
    assert nic + nvl == pytest.approx(8 * 15 / 16)
    # One node: nothing on the NIC, and the NVLink copies are the other ranks reached.
    nic, nvl = acc.dispatch_copies_per_token("hierarchical", 256, 8, 8, 8)
    assert nic == 0 and nvl == pytest.approx(7 * acc.q_at_least_one(256, 32, 8))
    # K/M not an integer: the gamma form applies and stays between its neighbours.
    mid = acc.dispatch_copies_per_token("node_limited", 256, 8, 64, 8, 3)[1] / (3 * 7)
    assert acc.q_at_least_one(32, 4, 2) < mid < acc.q_at_least_one(32, 4, 3)
    for args, match in ((("mesh", 256, 8, 64, 8), "unknown dispatch case"),
                        (("flat", 256, 8, 64, 6), "multiple of ranks per node"),
                        (("node_limited", 256, 8, 64, 8), "needs the node limit"),
                        (("node_limited", 256, 8, 64, 8, 9), "must lie in")):
        with pytest.raises(ValueError, match=match):
            acc.dispatch_copies_per_token(*args)
