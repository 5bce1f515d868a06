"""Seeded top-k routing generators for the MoE dispatch/combine benchmark.

Every generator has the signature

    gen(num_tokens, num_experts, top_k, rank, world, seed, step=0, **own_params) -> Routing

and is deterministic: a rank's tokens at step 0 come from ``SeedSequence([seed, rank])``
and at step s > 0 from ``SeedSequence([seed, rank, s])``, so the same (seed, rank, step,
parameters) gives the same routing on every run and every rank can regenerate any other
rank's routing at any step (the correctness check relies on that). Anything all ranks
must agree on (which experts are hot, the balanced assignment's expert order) comes
from a stream that depends on the seed alone (or on the seed and step, where a workload
moves with the step). ``num_tokens`` is the nominal tokens per rank: a workload may give
a rank more or fewer rows (``Routing.num_tokens``), see tokens_per_rank.

More routings (workloads.py) join through register_routing, which sets their own
parameters, a one-line description (ROUTING_HELP, shown by `commbench list`), their
validation and, where they have them, closed forms for the expected load.

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

from .sampling import (
    _EXPECTATION_SAMPLES_KEY,
    _hot_pick_share,
    _random_weights,
    _rank_rng,
    _sample_distinct,
    _shared_expert_order,
    _shared_rng,
)

# Keys every generator takes; validate_routing_params accepts them in `params`. All but
# step (default 0) are required.
COMMON_KEYS = ("num_tokens", "num_experts", "top_k", "rank", "world", "seed", "step")
_REQUIRED_KEYS = COMMON_KEYS[:-1]


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


def _check_rank(rank: int, world: int, seed: int, step: int = 0) -> None:
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside [0, {world})")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not _is_int(step) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")


def _finish(rng: np.random.Generator, topk_idx: np.ndarray) -> Routing:
    return Routing(topk_idx=topk_idx, weights=_random_weights(rng, *topk_idx.shape))


# ---------------------------------------------------------------- generators


def uniform(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
            seed: int, step: int = 0) -> Routing:
    """Each token picks ``top_k`` distinct experts uniformly at random."""
    _validate("uniform", {}, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    rng = _rank_rng(seed, rank, step)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k))


def balanced(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
             seed: int, step: int = 0) -> Routing:
    """Every expert receives exactly T * world * K / E (token, expert) pairs summed over
    all ranks (ValueError when that is not an integer).

    Global token g = rank * T + t takes the K consecutive slots (g * K + j) % E of a
    seeded expert order shared by all ranks: the slots g*K .. g*K + K-1 of all tokens
    tile [0, T * world * K) and so hit every residue mod E equally often. When
    T * K % E == 0 every rank on its own is exactly balanced too. Each rank then
    shuffles its rows with its own stream so ranks do not route token t alike.
    """
    _validate("balanced", {}, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    order = _shared_expert_order(seed, num_experts)
    g = rank * num_tokens + np.arange(num_tokens, dtype=np.int64)
    slots = (g[:, None] * top_k + np.arange(top_k, dtype=np.int64)) % num_experts
    rng = _rank_rng(seed, rank, step)
    topk_idx = order[slots][rng.permutation(num_tokens)]
    return _finish(rng, topk_idx)


def zipf(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
         step: int = 0, alpha: float = 1.0) -> Routing:
    """Power-law expert popularity: the expert at position i of a seeded order shared by
    all ranks has weight 1 / (i + 1) ** alpha; each token takes K distinct experts by
    successive sampling with those weights. alpha = 0 is uniform. Sampling without
    replacement flattens the distribution: the hot experts are picked less often than
    their weight share, see expected_rank_load_share. The popular experts stay the same at
    every step; only the tokens' draws change."""
    _validate("zipf", {"alpha": alpha}, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    p = expert_probabilities("zipf", num_experts, world, seed=seed, alpha=alpha)
    rng = _rank_rng(seed, rank, step)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k, p))


def hot_rank(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
             seed: int, step: int = 0, ratio: float = 2.0, hot: int = 0) -> Routing:
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
    _check_rank(rank, world, seed, step)
    p = expert_probabilities("hot_rank", num_experts, world, **params)
    rng = _rank_rng(seed, rank, step)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k, p))


def group_limited(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
                  seed: int, step: int = 0, groups: int | None = None,
                  max_groups: int | None = None) -> Routing:
    """Node-limited routing: the experts form ``groups`` contiguous groups (default:
    one per rank); each token picks ``max_groups`` distinct groups uniformly, then K
    distinct experts uniformly among the experts of those groups, so no token touches
    more than ``max_groups`` groups. Needs K <= max_groups * E / groups."""
    groups = world if groups is None else groups
    _validate("group_limited", {"groups": groups, "max_groups": max_groups},
              num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    rng = _rank_rng(seed, rank, step)
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

# One line per routing: what it does (`commbench list` shows it with the knobs).
ROUTING_HELP: dict[str, str] = {
    "uniform": "each token picks top_k distinct experts uniformly at random",
    "balanced": "every expert receives exactly the same number of picks over all ranks",
    "zipf": "power-law expert popularity: the i-th expert of a seeded order weighs 1/(i+1)^alpha",
    "hot_rank": "one rank's experts are `ratio` times as likely to be picked as the others",
    "group_limited": "each token reaches at most max_groups expert groups (node-limited, DeepSeek-V3)",
}


@dataclass(frozen=True)
class RoutingHooks:
    """What a registered routing adds besides its generator; each is optional.

    validate(own, num_experts, top_k, world, num_tokens): ValueError, one line, for bad
        own parameters (after the common checks; num_tokens may be None).
    probabilities(num_experts, top_k, world, seed, step, own) -> (E,) selection weights.
    expected_share(num_experts, top_k, world, seed, step, own) -> (world,) expected share
        of all picks per rank; without it expected_rank_load_share runs a Monte-Carlo.
    tokens(num_tokens, world, seed, step, own) -> (world,) rows each rank has at that
        step; without it every rank has num_tokens.
    """

    validate: Callable | None = None
    probabilities: Callable | None = None
    expected_share: Callable | None = None
    tokens: Callable | None = None


ROUTING_HOOKS: dict[str, RoutingHooks] = {}


def register_routing(name: str, gen: Callable[..., Routing], params: tuple = (), help: str = "",
                     hooks: RoutingHooks = RoutingHooks()) -> Callable[..., Routing]:
    """Add a routing: ``gen(num_tokens, num_experts, top_k, rank, world, seed, step=0,
    **own) -> Routing`` taking the own parameters ``params``; ``help`` is its line in
    `commbench list` (default: the generator's first docstring line)."""
    if name in ROUTINGS and ROUTINGS[name] is not gen:
        raise ValueError(f"routing {name!r} is already registered")
    ROUTINGS[name] = gen
    ROUTING_PARAMS[name] = tuple(params)
    ROUTING_HELP[name] = help or (gen.__doc__ or "").strip().split("\n")[0]
    ROUTING_HOOKS[name] = hooks
    return gen


def _given(params: dict) -> dict:
    """None means "not given": a CLI may hold every routing's options at None."""
    return {k: v for k, v in params.items() if v is not None}


def make_routing(name: str, **params) -> Routing:
    """``make_routing("zipf", num_tokens=4096, num_experts=256, top_k=8, rank=r,
    world=8, seed=0, step=0, alpha=1.0)``. Parameters set to None take their defaults."""
    params = _given(params)
    missing = [k for k in _REQUIRED_KEYS if k not in params]
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

    hooks = ROUTING_HOOKS.get(name)
    if hooks is not None and hooks.validate is not None:
        hooks.validate(own, num_experts, top_k, world, num_tokens)
    elif name == "balanced":
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
    if "step" in given and (not _is_int(given["step"]) or given["step"] < 0):
        raise ValueError(f"step must be a non-negative integer, got {given['step']!r}")
    own = {k: given[k] for k in ROUTING_PARAMS[name] if k in given}
    _validate(name, own, num_experts, top_k, world, num_tokens)


# ---------------------------------------------------------------- expected load


def expert_probabilities(name: str, num_experts: int, world: int, *,
                         seed: int | None = None, top_k: int | None = None, step: int = 0,
                         **params) -> np.ndarray:
    """Per-expert selection weights (float64 (E,), summing to 1) a routing samples from.

    These are the weights of each draw, not the marginal chance that a token picks
    the expert: without replacement the hot experts are picked less often than their
    weight share. zipf needs ``seed`` (it fixes which experts are hot); the others
    ignore it. uniform, balanced and group_limited give every expert the same
    marginal load. A registered routing's weights may depend on top_k and step.
    """
    params = _given(params)
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; choose one of {', '.join(ROUTINGS)}")
    hooks = ROUTING_HOOKS.get(name)
    if hooks is not None and hooks.probabilities is not None:
        w = hooks.probabilities(num_experts, top_k, world, seed, step, params)
    elif name == "zipf":
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
                             seed: int | None = None, step: int = 0,
                             num_samples: int = 1 << 18, **params) -> np.ndarray:
    """Expected share (float64 (world,), sums to 1) of all (token, expert) pairs that
    land on each rank at ``step``, so a run can compare the measured hottest rank with it.

    - uniform, balanced, group_limited: exactly 1/world each (every expert has the
      same marginal; group_limited by symmetry of the group and expert draws).
    - hot_rank: exact. The hot rank's E/world experts carry weight r and the rest
      weight 1, so the number of a token's picks landing there is a Markov chain over
      (hot picks, other picks); the share is its expectation after K draws over K.
    - zipf: no closed form for successive-sampling marginals, so a seeded Monte-Carlo
      of ``num_samples`` tokens drawn with the generator's own sampler (from a stream
      apart from every rank's). With the default 2**18 tokens the standard error of
      each share is below 4e-4 for K = 8 (it shrinks as 1/sqrt(num_samples)).
    - a registered routing: its closed form where it has one (workloads.py), else a
      Monte-Carlo over about ``num_samples`` tokens of its own generator, all ranks.
    """
    params = _given(params)
    validate_routing_params(name, params, num_experts, top_k, world)
    per_rank = num_experts // world
    hooks = ROUTING_HOOKS.get(name)
    if hooks is not None:
        if hooks.expected_share is not None:
            return np.asarray(hooks.expected_share(num_experts, top_k, world, seed, step, params),
                              dtype=np.float64)
        return _monte_carlo_share(name, num_experts, top_k, world, seed, step, num_samples, params)
    if name == "hot_rank":
        hot = int(params.get("hot", 0))
        hot_share = _hot_pick_share(per_rank, num_experts - per_rank, top_k,
                                    float(params.get("ratio", 2.0)))
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


def _monte_carlo_share(name: str, num_experts: int, top_k: int, world: int, seed: int | None,
                       step: int, num_samples: int, own: dict) -> np.ndarray:
    """Every rank's routing at (seed or 0, step), about num_samples tokens in all."""
    tokens = max(1, -(-num_samples // world))
    counts = np.zeros(world, dtype=np.int64)
    for rank in range(world):
        r = make_routing(name, num_tokens=tokens, num_experts=num_experts, top_k=top_k, rank=rank,
                         world=world, seed=seed or 0, step=step, **own)
        counts += np.bincount(r.topk_idx.ravel() // (num_experts // world), minlength=world)
    return counts / max(int(counts.sum()), 1)


def expected_load_imbalance(name: str, num_experts: int, top_k: int, world: int, *,
                            seed: int | None = None, **params) -> tuple[float, int]:
    """(hottest rank's expected load / mean load, that rank): the expectation to set
    beside load_imbalance of a run. A finite run measures a little above 1 even for
    uniform routing, since the max picks up sampling noise."""
    share = expected_rank_load_share(name, num_experts, top_k, world, seed=seed, **params)
    hottest = int(np.argmax(share))
    return float(share[hottest] * world), hottest
