"""Named routing workloads (commbench/moe/workloads.py), steps of every routing, the
routing statistics a row reports, and the workloads' params in the moe benchmark."""
import hashlib

import numpy as np
import pytest

import commbench.moe as M
from commbench.core.errors import UsageError
from commbench.moe import routing as rt
from commbench.moe import workloads as wl

E, K, W, T = 64, 4, 4, 1024

OLD = {"uniform": {}, "balanced": {}, "zipf": {"alpha": 1.2}, "hot_rank": {"ratio": 3.0, "hot": 1},
       "group_limited": {"max_groups": 2}}
# sha256 (first 16 hex) of ranks 0-3's topk_idx and weights bytes at T=64, E=32, K=4, world=4,
# seed=5, made by the generators before they took a step: step 0 must stay that routing.
BEFORE_STEPS = {"uniform": "e4b145dc14fe5678", "balanced": "e301d3ac3688374c", "zipf": "9ba0e6228461849f",
                "hot_rank": "c980ca66f62d463a", "group_limited": "3d1e70f7188b677a"}
NEW = {"hot_experts": {"hot_k": 4, "hot_share": 0.5}, "spread_hot": {"hot_k": 4, "hot_share": 0.5},
       "rotating_hot": {"hot_k": 4, "hot_share": 0.5}, "zero_rank": {"zero": 1},
       "source_ragged": {"ragged_cv": 0.5}, "burst": {"burst_every": 2, "burst_factor": 3.0}}


def route(name, rank=0, step=0, seed=3, num_tokens=T, num_experts=E, top_k=K, world=W, **own):
    own = {**{**OLD, **NEW}[name], **own}
    return M.make_routing(name, num_tokens=num_tokens, num_experts=num_experts, top_k=top_k, rank=rank,
                          world=world, seed=seed, step=step, **own)


def picks(name, world=W, step=0, **kw):
    return [route(name, rank=r, world=world, step=step, **kw).topk_idx for r in range(world)]


# ------------------------------------------------------------------ steps and determinism


@pytest.mark.parametrize("name", OLD)
@pytest.mark.parametrize("step", [None, 0])
def test_step_0_is_the_routing_from_before_steps(name, step):
    h = hashlib.sha256()
    for rank in range(4):
        when = {} if step is None else {"step": step}
        r = M.make_routing(name, num_tokens=64, num_experts=32, top_k=4, rank=rank, world=4, seed=5,
                           **OLD[name], **when)
        h.update(r.topk_idx.tobytes())
        h.update(r.weights.tobytes())
    assert h.hexdigest()[:16] == BEFORE_STEPS[name]


@pytest.mark.parametrize("name", [*OLD, *NEW])
def test_same_workload_seed_step_rank_same_routing_and_steps_differ(name):
    a, b = route(name, rank=1, step=2), route(name, rank=1, step=2)
    assert np.array_equal(a.topk_idx, b.topk_idx) and np.array_equal(a.weights, b.weights)
    assert not np.array_equal(a.weights, route(name, rank=1, step=3).weights)
    s = np.sort(a.topk_idx, axis=1)
    assert (s[:, 1:] != s[:, :-1]).all() and a.topk_idx.max() < E and a.topk_idx.min() >= 0
    np.testing.assert_allclose(a.weights.sum(axis=1), 1.0, atol=1e-6)


def test_balanced_stays_exact_at_every_step():
    for step in (1, 5):
        counts = np.bincount(np.concatenate(picks("balanced", step=step)).ravel(), minlength=E)
        assert (counts == T * W * K // E).all()


def test_bad_step_is_refused():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="step must be a non-negative integer"):
            route("uniform", step=bad)


# ------------------------------------------------------------------ hot sets


def hot_share(name, own, num_experts, top_k, world, num_tokens, step=0):
    ps = [M.make_routing(name, num_tokens=num_tokens, num_experts=num_experts, top_k=top_k, rank=r,
                         world=world, seed=1, step=step, **own).topk_idx for r in range(world)]
    hot = wl.hot_set(name, num_experts, world, own.get("hot_k", top_k), step)
    return float(np.isin(np.concatenate(ps), hot).mean()), ps


@pytest.mark.parametrize("name", ["hot_experts", "spread_hot", "rotating_hot"])
@pytest.mark.parametrize("e, k, world, own", [
    (256, 8, 8, {"hot_share": 0.5}),                 # DeepSeek-V3: 8 hot experts of 256
    (256, 8, 8, {"hot_k": 32, "hot_share": 0.8}),
    (64, 6, 4, {"hot_k": 3, "hot_share": 0.4}),      # hot_k < K: at most 3 of 6 picks hot
    (16, 4, 2, {"hot_k": 2, "hot_share": 0.5}),      # the ceiling min(hot_k, K) / K itself
    (16, 4, 2, {"hot_k": 8, "hot_share": 0.3}),      # below the uniform share 8/16: a cold set
])
def test_measured_hot_share_matches_the_knob(name, e, k, world, own):
    got, _ = hot_share(name, own, e, k, world, 2048)
    # Per token the hot count lies in [0, K]: the share's sd is at most 1/(2 sqrt(tokens)).
    assert got == pytest.approx(own["hot_share"], abs=5 / (2 * np.sqrt(2048 * world)))


def test_hot_share_is_met_where_naive_weights_would_miss():
    # Weights r with r h / (r h + c) = s ignore sampling without replacement: here they
    # would put far less than s on the hot set; the solved weight puts s there.
    e, k, h, s = 64, 8, 4, 0.4
    naive_r = s * (e - h) / ((1 - s) * h)
    from commbench.moe.sampling import _hot_pick_share
    assert _hot_pick_share(h, e - h, k, naive_r) < s - 0.05
    assert _hot_pick_share(h, e - h, k, wl.hot_weight_ratio(e, k, h, s)) == pytest.approx(s, abs=1e-9)


def test_hot_experts_sit_on_one_rank_spread_hot_on_all():
    _, ps = hot_share("hot_experts", {"hot_share": 0.6}, 256, 8, 8, 1024)
    st = M.routing_stats(ps, 256, 8)
    assert st["hottest_rank"] == 0 and st["hottest_expert"] < 8 and st["rank_load_max_over_mean"] > 4
    expect = M.expected_rank_load_share("hot_experts", 256, 8, 8, hot_share=0.6)
    assert st["rank_load_max_over_mean"] == pytest.approx(expect[0] * 8, rel=0.03)
    _, ps = hot_share("spread_hot", {"hot_share": 0.6}, 256, 8, 8, 1024)
    st = M.routing_stats(ps, 256, 8)
    assert st["rank_load_max_over_mean"] < 1.1 and st["expert_load_max_over_mean"] > 15
    np.testing.assert_allclose(M.expected_rank_load_share("spread_hot", 256, 8, 8, hot_share=0.6), 1 / 8)
    assert sorted(wl.hot_set("spread_hot", 256, 8, 8) // 32) == list(range(8))


def test_rotating_hot_moves_the_hot_set_every_step():
    e, k, world = 32, 2, 4  # 8 experts a rank; hot_k 4: step s heats experts 4s .. 4s+3
    hottest = []
    for step in range(4):
        got, ps = hot_share("rotating_hot", {"hot_k": 4, "hot_share": 0.7}, e, k, world, 2048, step)
        assert got == pytest.approx(0.7, abs=0.02)
        load = np.bincount(np.concatenate(ps).ravel(), minlength=e)
        assert set(np.argsort(load)[-4:]) == set(range(4 * step, 4 * step + 4))
        hottest.append(M.routing_stats(ps, e, world)["hottest_rank"])
        share = M.expected_rank_load_share("rotating_hot", e, k, world, step=step, hot_k=4, hot_share=0.7)
        assert int(np.argmax(share)) == step // 2
    assert hottest == [0, 0, 1, 1]
    # Step 0 is hot_experts' step 0.
    a = route("rotating_hot", rank=2)
    b = route("hot_experts", rank=2)
    assert np.array_equal(a.topk_idx, b.topk_idx)
    assert not np.array_equal(route("rotating_hot", rank=2, step=1).topk_idx, route("hot_experts", rank=2,
                                                                                      step=1).topk_idx)


# ------------------------------------------------------------------ zero_rank, ragged, burst


@pytest.mark.parametrize("own, zero", [({}, W - 1), ({"zero": 0}, 0), ({"zero": 2}, 2)])
def test_zero_rank_gets_no_rows(own, zero):
    ps = [M.make_routing("zero_rank", num_tokens=T, num_experts=E, top_k=K, rank=r, world=W, seed=0, **own).topk_idx
          for r in range(W)]
    per_rank = np.bincount(np.concatenate(ps).ravel() // (E // W), minlength=W)
    assert per_rank[zero] == 0 and (np.delete(per_rank, zero) > 0).all()
    assert per_rank.max() / per_rank.mean() == pytest.approx(W / (W - 1), rel=0.05)
    share = M.expected_rank_load_share("zero_rank", E, K, W, **own)
    assert share[zero] == 0 and share.sum() == pytest.approx(1)
    lay = M.dispatch_layout(M.make_routing("zero_rank", num_tokens=T, num_experts=E, top_k=K, rank=0, world=W,
                                           seed=0, **own).topk_idx, E, W, "rank")
    assert lay.send_counts[zero] == 0


def test_source_ragged_list_sets_each_ranks_tokens():
    counts = [4096, 1024, 2048, 512]
    for rank, n in enumerate(counts):
        r = M.make_routing("source_ragged", num_tokens=100, num_experts=E, top_k=K, rank=rank, world=4, seed=0,
                           tokens_by_rank="4096/1024/2048/512")
        assert r.num_tokens == n and r.topk_idx.shape == (n, K)
    assert M.tokens_per_rank("source_ragged", 100, 4, 0, tokens_by_rank="4096/1024/2048/512").tolist() == counts
    assert M.max_tokens_per_rank("source_ragged", 100, 4, 0, 3, tokens_by_rank=counts) == 4096


def test_source_ragged_spread_keeps_the_mean_and_varies_by_step():
    seen = []
    for step in range(5):
        t = M.tokens_per_rank("source_ragged", 4096, 8, 7, step, ragged_cv=0.5)
        assert t.dtype == np.int64 and t.sum() == 8 * 4096 and (t >= 1).all()
        seen.append(tuple(t))
        assert [route("source_ragged", rank=r, step=step, num_tokens=4096, world=8, seed=7).num_tokens
                for r in range(8)] == list(t)
    assert len(set(seen)) == 5
    assert M.max_tokens_per_rank("source_ragged", 4096, 8, 7, 5, ragged_cv=0.5) == max(max(s) for s in seen)
    # Over many ranks the spread's CV is about the knob's; cv 0 is no spread at all.
    big = M.tokens_per_rank("source_ragged", 4096, 4096, 1, ragged_cv=0.5)
    assert big.std() / big.mean() == pytest.approx(0.5, abs=0.08)
    assert (M.tokens_per_rank("source_ragged", 9, 4, 1, ragged_cv=0.0) == 9).all()
    # A wide spread of few tokens still leaves every rank one.
    assert (M.tokens_per_rank("source_ragged", 2, 64, 1, ragged_cv=5.0) >= 1).all()


def test_burst_carries_x_times_the_tokens_at_the_last_step_of_each_period():
    own = {"burst_every": 3, "burst_factor": 2.5}
    got = [int(M.tokens_per_rank("burst", 100, 4, 0, s, **own)[0]) for s in range(7)]
    assert got == [100, 100, 250, 100, 100, 250, 100]
    assert route("burst", rank=1, step=2, num_tokens=100, **own).num_tokens == 250
    assert route("burst", rank=1, step=1, num_tokens=100, **own).num_tokens == 100
    assert M.max_tokens_per_rank("burst", 100, 4, 0, 2, **own) == 100
    assert M.max_tokens_per_rank("burst", 100, 4, 0, 3, **own) == 250
    assert M.max_tokens_per_rank("uniform", 100, 4, 0, 9) == 100


def test_expected_share_of_every_routing_sums_to_one():
    for name in [*OLD, *NEW]:
        share = M.expected_rank_load_share(name, E, K, W, seed=0, **{**OLD, **NEW}[name])
        assert share.shape == (W,) and share.sum() == pytest.approx(1.0), name
    np.testing.assert_allclose(M.expected_rank_load_share("burst", E, K, W, seed=0), 1 / W)


def test_a_registered_routing_without_a_closed_form_gets_a_monte_carlo():
    def first_rank(num_tokens, num_experts, top_k, rank, world, seed, step=0):
        """every token picks experts of rank 0 only"""
        rng = np.random.default_rng([seed, rank, step])
        idx = np.argsort(rng.random((num_tokens, num_experts // world)), axis=1)[:, :top_k]
        return M.Routing(idx.astype(np.int64), np.full(idx.shape, 1 / top_k, np.float32))
    try:
        M.register_routing("_probe", first_rank)
        assert rt.ROUTING_HELP["_probe"] == "every token picks experts of rank 0 only"
        share = M.expected_rank_load_share("_probe", 16, 2, 4, seed=1, num_samples=400)
        np.testing.assert_allclose(share, [1, 0, 0, 0])
        with pytest.raises(ValueError, match="already registered"):
            M.register_routing("_probe", M.ROUTINGS["uniform"])
    finally:
        for d in (rt.ROUTINGS, rt.ROUTING_PARAMS, rt.ROUTING_HELP, rt.ROUTING_HOOKS):
            d.pop("_probe", None)


# ------------------------------------------------------------------ routing_stats


def test_routing_stats_on_hand_built_routing():
    # E 4 on 2 ranks (experts 0,1 on rank 0; 2,3 on rank 1).
    r0 = np.array([[0, 1], [0, 2], [0, 3]])   # 3 tokens: picks on rank 0: 4, rank 1: 2
    r1 = np.array([[2, 0]])                   # 1 token: local pick 2 (rank 1), remote 0
    st = M.routing_stats([r0, r1], 4, 2)
    # expert loads [4, 1, 2, 1] (mean 2); rank loads [5, 3] (mean 4); local: 4 of r0's + 1 of r1's of 8
    assert st == {"rank_load_max_over_mean": 1.25, "expert_load_max_over_mean": 2.0, "local_pick_share": 5 / 8,
                  "tokens_min": 1, "tokens_max": 3, "hottest_rank": 0, "hottest_expert": 0}
    empty = M.routing_stats([np.zeros((0, 2), np.int64)] * 2, 4, 2)
    assert empty["rank_load_max_over_mean"] == 1.0 and empty["local_pick_share"] == 0.0
    assert empty["tokens_min"] == empty["tokens_max"] == 0
    with pytest.raises(ValueError, match="outside"):
        M.routing_stats([r0, np.array([[4, 0]])], 4, 2)
    with pytest.raises(ValueError, match="1 source ranks"):
        M.routing_stats([r0], 4, 2)


# ------------------------------------------------------------------ bad knobs


@pytest.mark.parametrize("name, own, match", [
    ("hot_experts", {"hot_k": 0}, "hot_k must be an integer in \\[1, 64\\]"),
    ("spread_hot", {"hot_k": 65}, "hot_k must be an integer"),
    ("rotating_hot", {"hot_k": 2.5}, "hot_k must be an integer"),
    ("hot_experts", {"hot_share": 0.0}, "hot_share must be a number in \\(0, 1\\]"),
    ("hot_experts", {"hot_share": 1.5}, "hot_share must be a number in \\(0, 1\\]"),
    ("hot_experts", {"hot_share": float("nan")}, "hot_share must be a number"),
    ("hot_experts", {"hot_k": 2, "hot_share": 0.9}, "hot_share 0.9 is out of reach: .* at most 2"),
    ("hot_experts", {"hot_k": 62, "hot_share": 0.4}, "hot_share 0.4 is out of reach: with 2 other experts"),
    ("zero_rank", {"zero": 4}, "zero must be a rank in \\[0, 4\\)"),
    ("zero_rank", {"zero": -1}, "zero must be a rank"),
    ("source_ragged", {"ragged_cv": -0.1}, "ragged_cv must be a finite number >= 0"),
    ("source_ragged", {"ragged_cv": None, "tokens_by_rank": "1/2/3"}, "has 3 entries for 4 ranks"),
    ("source_ragged", {"ragged_cv": None, "tokens_by_rank": "1/0/3/4"}, "entries must be >= 1"),
    ("source_ragged", {"ragged_cv": None, "tokens_by_rank": "1,2,3,4"}, "not integers separated by '/'"),
    ("source_ragged", {"ragged_cv": None, "tokens_by_rank": "1//3/4"}, "not integers separated by '/'"),
    ("source_ragged", {"ragged_cv": 0.5, "tokens_by_rank": "1/2/3/4"}, "ragged_cv or tokens_by_rank, not both"),
    ("burst", {"burst_every": 0}, "burst_every must be an integer >= 1"),
    ("burst", {"burst_factor": 0.5}, "burst_factor must be a finite number >= 1"),
    ("uniform", {"hot_share": 0.5}, "takes no parameter hot_share"),
])
def test_bad_knobs_are_one_line_value_errors(name, own, match):
    with pytest.raises(ValueError, match=match) as info:
        route(name, **own)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=match):
        M.validate_routing_params(name, {**{**OLD, **NEW}[name], **own}, E, K, W, T)


def test_worlds_and_shapes_a_workload_cannot_serve():
    with pytest.raises(ValueError, match="zero_rank needs world >= 2"):
        route("zero_rank", world=1, zero=None)
    with pytest.raises(ValueError, match="top_k 4 exceeds the 2 experts outside rank 1"):
        M.make_routing("zero_rank", num_tokens=4, num_experts=4, top_k=4, rank=0, world=2, seed=0, zero=1)
    with pytest.raises(ValueError, match="num_tokens must be >= 1"):
        route("source_ragged", num_tokens=0)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        M.max_tokens_per_rank("burst", 4, 2, 0, 0)
    with pytest.raises(ValueError, match="unknown routing 'nope'"):
        M.tokens_per_rank("nope", 4, 2, 0)


# ------------------------------------------------------------------ the benchmark and the list


def test_benchmark_maps_knobs_and_resets_the_ones_that_do_not_apply():
    from commbench.benchmarks.moe import MoE, shape
    b = MoE()
    p = {k: v.default for k, v in b.params.items()}
    assert b.routing_params({**p, "routing": "hot_experts"}, 4) == {"hot_share": 0.5}
    assert b.routing_params({**p, "routing": "hot_experts", "hot_k": 3}, 4) == {"hot_k": 3, "hot_share": 0.5}
    assert b.routing_params({**p, "routing": "zero_rank"}, 4) == {}
    assert b.routing_params({**p, "routing": "zero_rank", "zero": 2}, 4) == {"zero": 2}
    assert b.routing_params({**p, "routing": "source_ragged"}, 4) == {"ragged_cv": 0.5}
    assert b.routing_params({**p, "routing": "source_ragged", "tokens_by_rank": "1/2"}, 2) == \
        {"tokens_by_rank": "1/2"}
    assert b.routing_params({**p, "routing": "burst"}, 4) == {"burst_every": 4, "burst_factor": 4.0}
    # A knob of another routing takes its default: a sweep over it measures one point.
    assert b.canonical_params({**p, "routing": "uniform", "hot_share": 0.9, "zero": 1, "burst_factor": 2.0}) == \
        b.canonical_params({**p, "routing": "uniform"})
    assert b.canonical_params({**p, "routing": "spread_hot", "hot_share": 0.9})["hot_share"] == 0.9
    listed = b.canonical_params({**p, "routing": "source_ragged", "tokens_by_rank": "1/2", "ragged_cv": 2.0})
    assert listed["ragged_cv"] == 0.5 and listed["tokens_by_rank"] == "1/2"
    assert "hot_experts s=0.9" in shape({**p, "routing": "hot_experts", "hot_share": 0.9})
    assert "source_ragged tokens=1/2" in shape({**p, "routing": "source_ragged", "tokens_by_rank": "1/2"})


def test_benchmark_refuses_a_bad_knob_in_one_line():
    from commbench.benchmarks.base import Point
    from commbench.benchmarks.moe import MoE
    b = MoE()
    p = {k: v.default for k, v in b.params.items()}
    p.update(tokens=64, experts=16, topk=4, hidden=256, routing="hot_experts", hot_share=1.0, hot_k=2)
    with pytest.raises(UsageError, match="moe: hot_experts hot_share 1.0 is out of reach"):
        b.validate(Point("moe", 2, "uint8", 0, p))
    b.validate(Point("moe", 2, "uint8", 0, {**p, "hot_share": 0.5}))


def test_commbench_list_shows_every_routing_with_its_knobs(capsys):
    from commbench.cli import main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    section = out.split("moe routings")[1].split("\n\n")[0]
    for name in M.ROUTINGS:
        assert f"  {name} " in section, name
    assert "hot_k=0, hot_share=0.5" in section and "burst_every=4, burst_factor=4.0" in section
    assert "tokens_by_rank=''" in section and "zero=-1" in section
