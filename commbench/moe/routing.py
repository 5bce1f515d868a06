"""Seeded top-k routing generators for the MoE dispatch/combine benchmark.

Every generator has the signature

    gen(num_tokens, num_experts, top_k, rank, world, seed, **own_params) -> Routing

and is deterministic: a rank's tokens come from ``SeedSequence([seed, rank])``, so the
same (seed, rank, parameters) gives the same routing on every run and every rank can
regenerate any other rank's routing (the correctness check relies on that). Anything
all ranks must agree on (which experts are hot, the balanced assignment's expert
order) comes from a stream that depends on the seed alone.

Experts are spread evenly over ranks: rank j hosts experts
[j * E / world, (j + 1) * E / world).

Weights: each token's K weights are K independent Exp(1) draws renormalised to sum
to 1 (a flat Dirichlet: random, positive, rows sum to 1 up to float32 rounding). They
are drawn independently of which experts were picked, so a weighted combine
exercises the per-slot weights without changing the traffic.

The K experts of a token are drawn by successive sampling without replacement
(the Plackett-Luce / Gumbel-top-k distribution): slot i draws from the expert weights
with the experts already taken removed. It is implemented as "draw from the full
distribution, redraw collisions", which is the same distribution and costs O(T K)
instead of the O(T E) of partitioning Gumbel keys for every token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

# spawn_key tags for streams that depend on the seed but not on the rank; a spawn key
# keeps them apart from every rank's SeedSequence([seed, rank]) stream.
_SHARED_EXPERT_ORDER_KEY = 1
_EXPECTATION_SAMPLES_KEY = 2

# Collision redraw rounds before Plackett-Luce keys take over a row; only very skewed
# weights (large zipf alpha) or K close to E get that far.
_MAX_REDRAW_ROUNDS = 4
_DRAWS_PER_ROUND = 4

# Keys every generator takes; validate_routing_params accepts them in `params`.
COMMON_KEYS = ("num_tokens", "num_experts", "top_k", "rank", "world", "seed")


@dataclass(frozen=True, eq=False)
class Routing:
    """One rank's routing: ``topk_idx`` int64 (T, K) distinct expert ids per row,
    ``weights`` float32 (T, K) positive, each row summing to 1."""

    topk_idx: np.ndarray
    weights: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.topk_idx.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk_idx.shape[1])


# ---------------------------------------------------------------- random streams


def _rank_rng(seed: int, rank: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, rank]))


def _shared_rng(seed: int, key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


def _shared_expert_order(seed: int, num_experts: int) -> np.ndarray:
    """A permutation of expert ids all ranks agree on; element 0 is the hottest for zipf."""
    return _shared_rng(seed, _SHARED_EXPERT_ORDER_KEY).permutation(num_experts)


# ---------------------------------------------------------------- sampling core


def _sample_distinct(rng: np.random.Generator, num_rows: int, n: int, k: int,
                     probs: np.ndarray | None = None) -> np.ndarray:
    """(num_rows, k) int64 of distinct values in [0, n): successive sampling without
    replacement from ``probs`` (uniform when None), slot by slot in pick order.

    Slot i's value is the first of an i.i.d. stream of draws that misses slots < i.
    All rows draw their first K candidates at once; only rows whose candidates
    collide go through the slot-by-slot redraws, and rows still colliding after a
    few rounds (very skewed weights, K close to n) get their remaining slots from
    Plackett-Luce keys over the values left, which is the same distribution.
    """
    alias = None if probs is None else _alias_table(probs)

    def draw(m: int) -> np.ndarray:
        i = rng.integers(0, n, size=m, dtype=np.int64)
        if alias is None:
            return i
        keep, other = alias
        return np.where(rng.random(m) < keep[i], i, other[i])

    out = draw(num_rows * k).reshape(num_rows, k)
    if k < 2 or num_rows == 0:
        return out
    ordered = np.sort(out, axis=1)
    clashing = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
    if clashing.size == 0:
        return out
    sub = out[clashing]
    m = clashing.size
    # taken[row, value]: a collision test is one lookup instead of a scan of the slots.
    taken = np.zeros((m, n), dtype=bool)
    taken[np.arange(m), sub[:, 0]] = True
    active = np.arange(m)
    for slot in range(1, k):
        first = sub[active, slot]
        clash = taken[active, first]
        taken[active[~clash], first[~clash]] = True
        pending = active[clash]
        for _ in range(_MAX_REDRAW_ROUNDS):
            if pending.size == 0:
                break
            # A few draws per row per round: the first one free is the pick.
            cand = draw(pending.size * _DRAWS_PER_ROUND).reshape(-1, _DRAWS_PER_ROUND)
            free = ~taken[pending[:, None], cand]
            found = free.any(axis=1)
            pick = cand[found, np.argmax(free[found], axis=1)]
            ok = pending[found]
            sub[ok, slot] = pick
            taken[ok, pick] = True
            pending = pending[~found]
        if pending.size:
            sub[pending, slot:] = _plackett_luce_rest(rng, taken[pending], k - slot, probs)
            active = np.setdiff1d(active, pending, assume_unique=True)
    out[clashing] = sub
    return out


def _alias_table(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table: a draw is a uniform column i, kept with chance
    keep[i] and otherwise replaced by other[i]. O(1) a draw: a binary search of the
    CDF with random queries was the sampler's largest cost."""
    n = probs.size
    scaled = np.asarray(probs, dtype=np.float64) * (n / float(np.sum(probs)))
    keep = np.ones(n)
    other = np.arange(n, dtype=np.int64)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        keep[s], other[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    # Whatever is left holds 1 up to rounding: keep it always.
    return keep, other


def _plackett_luce_rest(rng: np.random.Generator, taken: np.ndarray, m: int,
                        probs: np.ndarray | None) -> np.ndarray:
    """(rows, m): the next m successive picks of each row, ``taken`` (rows, n) bool
    marking the values already picked. Exponential keys divided by the weights,
    smallest first, order the values left exactly as successive sampling would (the
    Gumbel-top-k trick)."""
    keys = rng.standard_exponential(taken.shape)
    if probs is not None:
        with np.errstate(divide="ignore"):
            keys /= probs
    keys[taken] = np.inf
    part = np.argpartition(keys, m - 1, axis=1)[:, :m]
    by_key = np.argsort(np.take_along_axis(keys, part, axis=1), axis=1)
    return np.take_along_axis(part, by_key, axis=1)


def _random_weights(rng: np.random.Generator, num_tokens: int, top_k: int) -> np.ndarray:
    # float64 draws: numpy's float32 exponential returns exactly 0 about once in 2**23.
    w = rng.standard_exponential((num_tokens, top_k))
    w /= w.sum(axis=1, keepdims=True)
    return np.maximum(w, np.finfo(np.float32).tiny).astype(np.float32)


def _check_rank(rank: int, world: int, seed: int) -> None:
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside [0, {world})")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _finish(rng: np.random.Generator, topk_idx: np.ndarray) -> Routing:
    return Routing(topk_idx=topk_idx, weights=_random_weights(rng, *topk_idx.shape))


# ---------------------------------------------------------------- generators


def uniform(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
            seed: int) -> Routing:
    """Each token picks ``top_k`` distinct experts uniformly at random."""
    _validate("uniform", {}, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed)
    rng = _rank_rng(seed, rank)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k))


def balanced(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
             seed: int) -> Routing:
    """Every expert receives exactly T * world * K / E (token, expert) pairs summed over
    all ranks (ValueError when that is not an integer).

    Global token g = rank * T + t takes the K consecutive slots (g * K + j) % E of a
    seeded expert order shared by all ranks: the slots g*K .. g*K + K-1 of all tokens
    tile [0, T * world * K) and so hit every residue mod E equally often. When
    T * K % E == 0 every rank on its own is exactly balanced too. Each rank then
    shuffles its rows with its own stream so ranks do not route token t alike.
    """
    _validate("balanced", {}, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed)
    order = _shared_expert_order(seed, num_experts)
    g = rank * num_tokens + np.arange(num_tokens, dtype=np.int64)
    slots = (g[:, None] * top_k + np.arange(top_k, dtype=np.int64)) % num_experts
    rng = _rank_rng(seed, rank)
    topk_idx = order[slots][rng.permutation(num_tokens)]
    return _finish(rng, topk_idx)


def zipf(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
         alpha: float = 1.0) -> Routing:
    """Power-law expert popularity: the expert at position i of a seeded order shared by
    all ranks has weight 1 / (i + 1) ** alpha; each token takes K distinct experts by
    successive sampling with those weights. alpha = 0 is uniform. Sampling without
    replacement flattens the distribution: the hot experts are picked less often than
    their weight share, see expected_rank_load_share."""
    _validate("zipf", {"alpha": alpha}, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed)
    p = expert_probabilities("zipf", num_experts, world, seed=seed, alpha=alpha)
    rng = _rank_rng(seed, rank)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k, p))


def hot_rank(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
             seed: int, ratio: float = 2.0, hot: int = 0) -> Routing:
    """Each expert hosted on rank ``hot`` has selection weight ``ratio``, every other
    expert weight 1, and each token takes K distinct experts by successive sampling.

    Exact meaning: per-expert weight ``ratio`` on the hot rank's experts. With
    replacement the hot rank would get ``ratio`` times the load of each other rank,
    i.e. ratio * world / (ratio + world - 1) times the mean; sampling without
    replacement (at most E/world of a token's picks can land there) lowers that
    somewhat. expected_rank_load_share gives the exact expectation.
    """
    params = {"ratio": ratio, "hot": hot}
    _validate("hot_rank", params, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed)
    p = expert_probabilities("hot_rank", num_experts, world, **params)
    rng = _rank_rng(seed, rank)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k, p))


def group_limited(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
                  seed: int, groups: int | None = None,
                  max_groups: int | None = None) -> Routing:
    """Node-limited routing: the experts form ``groups`` contiguous groups (default:
    one per rank); each token picks ``max_groups`` distinct groups uniformly, then K
    distinct experts uniformly among the experts of those groups, so no token touches
    more than ``max_groups`` groups. Needs K <= max_groups * E / groups."""
    groups = world if groups is None else groups
    _validate("group_limited", {"groups": groups, "max_groups": max_groups},
              num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed)
    rng = _rank_rng(seed, rank)
    group_size = num_experts // groups
    chosen = _sample_distinct(rng, num_tokens, groups, max_groups)
    local = _sample_distinct(rng, num_tokens, max_groups * group_size, top_k)
    group_of_pick = np.take_along_axis(chosen, local // group_size, axis=1)
    return _finish(rng, group_of_pick * group_size + local % group_size)


ROUTINGS: dict[str, Callable[..., Routing]] = {
    "uniform": uniform,
    "balanced": balanced,
    "zipf": zipf,
    "hot_rank": hot_rank,
    "group_limited": group_limited,
}

# Parameters each routing takes besides COMMON_KEYS.
ROUTING_PARAMS: dict[str, tuple[str, ...]] = {
    "uniform": (),
    "balanced": (),
    "zipf": ("alpha",),
    "hot_rank": ("ratio", "hot"),
    "group_limited": ("groups", "max_groups"),
}


def _given(params: dict) -> dict:
    """None means "not given": a CLI may hold every routing's options at None."""
    return {k: v for k, v in params.items() if v is not None}


def make_routing(name: str, **params) -> Routing:
    """``make_routing("zipf", num_tokens=4096, num_experts=256, top_k=8, rank=r,
    world=8, seed=0, alpha=1.0)``. Parameters set to None take their defaults."""
    params = _given(params)
    missing = [k for k in COMMON_KEYS if k not in params]
    if missing:
        raise ValueError(f"routing {name!r} needs {', '.join(missing)}")
    validate_routing_params(name, params, params["num_experts"], params["top_k"],
                            params["world"], params["num_tokens"])
    return ROUTINGS[name](**params)


# ---------------------------------------------------------------- validation


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _validate(name: str, own: dict, num_experts: int, top_k: int, world: int,
              num_tokens: int | None) -> None:
    for key, v in (("num_experts", num_experts), ("top_k", top_k), ("world", world)):
        if not _is_int(v):
            raise ValueError(f"{key} must be an integer, got {v!r}")
    if num_tokens is not None and (not _is_int(num_tokens) or num_tokens < 0):
        raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_k > num_experts:
        raise ValueError(f"top_k {top_k} exceeds num_experts {num_experts}")
    if num_experts % world:
        raise ValueError(f"num_experts {num_experts} is not divisible by world {world}")

    if name == "balanced":
        if num_tokens is not None and (num_tokens * world * top_k) % num_experts:
            raise ValueError(
                f"balanced routing needs num_tokens*world*top_k ({num_tokens}*{world}*{top_k}"
                f" = {num_tokens * world * top_k}) divisible by num_experts {num_experts}")
    elif name == "zipf":
        alpha = own.get("alpha", 1.0)
        if not (isinstance(alpha, (int, float, np.number)) and math.isfinite(alpha)) or alpha < 0:
            raise ValueError(f"zipf alpha must be a finite number >= 0, got {alpha!r}")
    elif name == "hot_rank":
        ratio = own.get("ratio", 2.0)
        if not (isinstance(ratio, (int, float, np.number)) and math.isfinite(ratio)) or ratio < 1:
            raise ValueError(f"hot_rank ratio must be a finite number >= 1, got {ratio!r}")
        hot = own.get("hot", 0)
        if not _is_int(hot) or not 0 <= hot < world:
            raise ValueError(f"hot_rank hot rank {hot!r} is outside [0, {world})")
    elif name == "group_limited":
        groups = own.get("groups")
        groups = world if groups is None else groups
        m = own.get("max_groups")
        if m is None:
            raise ValueError("group_limited routing needs max_groups")
        if not _is_int(groups) or groups < 1:
            raise ValueError(f"group_limited groups must be an integer >= 1, got {groups!r}")
        if not _is_int(m) or m < 1:
            raise ValueError(f"group_limited max_groups must be an integer >= 1, got {m!r}")
        if m > groups:
            raise ValueError(f"group_limited max_groups {m} exceeds groups {groups}")
        if num_experts % groups:
            raise ValueError(
                f"group_limited groups {groups} does not divide num_experts {num_experts}")
        reachable = m * num_experts // groups
        if top_k > reachable:
            raise ValueError(
                f"group_limited top_k {top_k} exceeds the {reachable} experts in "
                f"max_groups={m} of groups={groups} (max_groups*num_experts/groups)")


def validate_routing_params(name: str, params: dict, num_experts: int, top_k: int,
                            world: int, num_tokens: int | None = None) -> None:
    """Return None, or raise ValueError with a one-line message naming the problem.

    ``params`` holds the routing's own parameters (alpha, ratio, hot, groups,
    max_groups); it may also hold the common ones (num_tokens, seed, ...), and None
    values count as not given. The balanced integrality check needs the token count:
    pass ``num_tokens`` (or put it in ``params``); without it that one check is
    skipped and the generator raises the same error instead.
    """
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; choose one of {', '.join(ROUTINGS)}")
    given = _given(dict(params))
    unknown = sorted(set(given) - set(ROUTING_PARAMS[name]) - set(COMMON_KEYS))
    if unknown:
        raise ValueError(f"routing {name!r} takes no parameter {', '.join(unknown)}")
    if num_tokens is None:
        num_tokens = given.get("num_tokens")
    own = {k: given[k] for k in ROUTING_PARAMS[name] if k in given}
    _validate(name, own, num_experts, top_k, world, num_tokens)


# ---------------------------------------------------------------- expected load


def expert_probabilities(name: str, num_experts: int, world: int, *,
                         seed: int | None = None, **params) -> np.ndarray:
    """Per-expert selection weights (float64 (E,), summing to 1) a routing samples from.

    These are the weights of each draw, not the marginal chance that a token picks
    the expert: without replacement the hot experts are picked less often than their
    weight share. zipf needs ``seed`` (it fixes which experts are hot); the others
    ignore it. uniform, balanced and group_limited give every expert the same
    marginal load.
    """
    params = _given(params)
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; choose one of {', '.join(ROUTINGS)}")
    if name == "zipf":
        if seed is None:
            raise ValueError("zipf expert popularity depends on the seed: pass seed")
        alpha = float(params.get("alpha", 1.0))
        w = np.empty(num_experts)
        w[_shared_expert_order(seed, num_experts)] = \
            1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** alpha
    elif name == "hot_rank":
        hot = int(params.get("hot", 0))
        per_rank = num_experts // world
        w = np.ones(num_experts)
        w[hot * per_rank:(hot + 1) * per_rank] = float(params.get("ratio", 2.0))
    else:
        w = np.ones(num_experts)
    return w / w.sum()


def expected_rank_load_share(name: str, num_experts: int, top_k: int, world: int, *,
                             seed: int | None = None, num_samples: int = 1 << 18,
                             **params) -> np.ndarray:
    """Expected share (float64 (world,), sums to 1) of all (token, expert) pairs that
    land on each rank, so a run can compare the measured hottest rank with it.

    - uniform, balanced, group_limited: exactly 1/world each (every expert has the
      same marginal; group_limited by symmetry of the group and expert draws).
    - hot_rank: exact. The hot rank's E/world experts carry weight r and the rest
      weight 1, so the number of a token's picks landing there is a Markov chain over
      (hot picks, other picks); the share is its expectation after K draws over K.
    - zipf: no closed form for successive-sampling marginals, so a seeded Monte-Carlo
      of ``num_samples`` tokens drawn with the generator's own sampler (from a stream
      apart from every rank's). With the default 2**18 tokens the standard error of
      each share is below 4e-4 for K = 8 (it shrinks as 1/sqrt(num_samples)).
    """
    params = _given(params)
    validate_routing_params(name, params, num_experts, top_k, world)
    per_rank = num_experts // world
    if name == "hot_rank":
        r = float(params.get("ratio", 2.0))
        hot = int(params.get("hot", 0))
        a, b = per_rank, num_experts - per_rank
        # dist[h] = P(h of the picks so far are hot-rank experts)
        dist = np.zeros(top_k + 1)
        dist[0] = 1.0
        for i in range(top_k):
            h = np.arange(i + 1, dtype=np.float64)
            # States past a full hot rank (h > a) are unreachable; keep them at 0.
            hot_w = r * np.maximum(a - h, 0.0)
            cold_w = np.maximum(b - (i - h), 0.0)
            den = hot_w + cold_w
            p_hot = np.divide(hot_w, den, out=np.zeros_like(den), where=den > 0)
            nxt = np.zeros_like(dist)
            nxt[1:i + 2] += dist[:i + 1] * p_hot
            nxt[:i + 1] += dist[:i + 1] * (1.0 - p_hot)
            dist = nxt
        hot_share = float(np.dot(np.arange(top_k + 1), dist)) / top_k
        share = np.full(world, (1.0 - hot_share) / (world - 1) if world > 1 else 0.0)
        share[hot] = hot_share
        return share
    if name == "zipf" and float(params.get("alpha", 1.0)) != 0.0:
        p = expert_probabilities(name, num_experts, world, seed=seed, **params)
        rng = _shared_rng(seed, _EXPECTATION_SAMPLES_KEY)
        counts = np.zeros(num_experts, dtype=np.int64)
        chunk = 1 << 14
        for start in range(0, num_samples, chunk):
            picks = _sample_distinct(rng, min(chunk, num_samples - start), num_experts,
                                     top_k, p)
            counts += np.bincount(picks.ravel(), minlength=num_experts)
        per_rank_counts = counts.reshape(world, per_rank).sum(axis=1)
        return per_rank_counts / per_rank_counts.sum()
    return np.full(world, 1.0 / world)


def expected_load_imbalance(name: str, num_experts: int, top_k: int, world: int, *,
                            seed: int | None = None, **params) -> tuple[float, int]:
    """(hottest rank's expected load / mean load, that rank): the expectation to set
    beside load_imbalance of a run. A finite run measures a little above 1 even for
    uniform routing, since the max picks up sampling noise."""
    share = expected_rank_load_share(name, num_experts, top_k, world, seed=seed, **params)
    hottest = int(np.argmax(share))
    return float(share[hottest] * world), hottest
