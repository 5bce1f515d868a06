"""Named routing workloads: the patterns used to stress MoE dispatchers, beside the
routings of routing.py, plus the statistics a row reports of the routing it measured.

Each workload registers itself with routing.register_routing, so make_routing, the
validation, expected_rank_load_share and `commbench list` know it. All of them are
deterministic in (seed, rank, step, knobs), like every generator (routing.py):

- ``hot_experts`` (hot_k, hot_share): hot_k experts, contiguous in expert order from
  expert 0 (so they sit on as few ranks as they fit on), take a share hot_share of all
  (token, expert) picks.
- ``spread_hot`` (hot_k, hot_share): the same, with hot expert i on rank i % world, so
  every rank hosts about as many hot experts: the per-expert load is skewed, the per-rank
  load is not.
- ``rotating_hot`` (hot_k, hot_share): hot_experts whose hot set moves with the step:
  step s heats the hot_k experts from expert (s * hot_k) mod E on (wrapping around), a
  fixed shift rather than a seeded draw, so a sweep's steps walk the hot set over every
  rank in turn. Step 0 is hot_experts' step 0.
- ``zero_rank`` (zero): the experts of rank ``zero`` (default: the last) get no picks;
  each token takes K distinct experts uniformly among the others.
- ``source_ragged`` (ragged_cv or tokens_by_rank): source ranks hold different token
  counts, routed uniformly. Either an explicit list, one entry >= 1 a rank, written
  "4096/1024/2048/512" (slashes: a comma separates sweep values in --param), or a seeded
  spread: world lognormal draws with coefficient of variation ragged_cv (one draw per
  step, shared by all ranks) scaled so the counts sum to world * num_tokens, every
  rank keeping at least 1 token (largest remainders round). The mean is exactly
  num_tokens; over a few ranks the realised spread is narrower than ragged_cv.
- ``burst`` (burst_every, burst_factor): step s has round(burst_factor * num_tokens)
  tokens a rank when s % burst_every == burst_every - 1, else num_tokens, routed
  uniformly: the burst comes after burst_every - 1 ordinary steps, so a point needs
  steps >= burst_every to meet one.

How hot_share is met. Hot experts weigh r each, the others 1, and a token takes its K
experts by successive sampling without replacement, so it can pick each hot expert once:
the share of picks on the hot set is not r h / (r h + c) (h hot, c other experts) but
the expectation of a Markov chain over the picks (sampling._hot_pick_share). That share
rises monotonically with r, so r is solved for by bisection (on log r) to give exactly
hot_share in expectation; the measured share then matches hot_share up to sampling
noise at any shape. Reachable shares lie between max(0, K - c) / K (r -> 0) and
min(h, K) / K (r -> inf): a share outside is refused. A share below h / E (the uniform
share) makes the set colder than the rest.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .layout import load_imbalance
from .routing import (
    ROUTING_HOOKS,
    ROUTING_PARAMS,
    ROUTINGS,
    Routing,
    RoutingHooks,
    _check_rank,
    _finish,
    _given,
    _is_int,
    _validate,
    expert_probabilities,
    register_routing,
)
from .sampling import _TOKEN_SPREAD_KEY, _hot_pick_share, _rank_rng, _sample_distinct, _shared_rng

DEFAULT_HOT_SHARE = 0.5
DEFAULT_RAGGED_CV = 0.5
DEFAULT_BURST_EVERY = 4
DEFAULT_BURST_FACTOR = 4.0

HOT_KNOBS = ("hot_k", "hot_share")
RAGGED_KNOBS = ("ragged_cv", "tokens_by_rank")
BURST_KNOBS = ("burst_every", "burst_factor")

# Bisection on log r: e**40 is far past the point where the reachable share is met to
# float64 precision, for any K a router uses.
_LOG_RATIO_BOUND = 40.0
_BISECTIONS = 100


def _is_num(v) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------- hot sets


def hot_set(name: str, num_experts: int, world: int, hot_k: int, step: int = 0) -> np.ndarray:
    """The hot experts' ids (int64 (hot_k,)) of hot_experts, spread_hot or rotating_hot."""
    i = np.arange(hot_k, dtype=np.int64)
    if name == "spread_hot":
        return (i % world) * (num_experts // world) + i // world
    if name == "rotating_hot":
        return (step * hot_k + i) % num_experts
    return i


@lru_cache(maxsize=256)
def hot_weight_ratio(num_experts: int, top_k: int, hot_k: int, hot_share: float) -> float:
    """The weight r of each hot expert (others weigh 1) whose successive sampling puts
    hot_share of a token's top_k picks on the hot_k hot experts in expectation."""
    cold = num_experts - hot_k
    if cold == 0:
        return 1.0  # every expert is hot: the share is 1 whatever r is
    lo, hi = -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if _hot_pick_share(hot_k, cold, top_k, math.exp(mid)) < hot_share:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def _hot_knobs(own: dict, top_k: int) -> tuple[int, float]:
    return int(own.get("hot_k", top_k)), float(own.get("hot_share", DEFAULT_HOT_SHARE))


def _check_hot(name: str):
    def check(own: dict, num_experts: int, top_k: int, world: int, num_tokens) -> None:
        hot_k = own.get("hot_k", top_k)
        if not _is_int(hot_k) or not 1 <= hot_k <= num_experts:
            raise ValueError(f"{name} hot_k must be an integer in [1, {num_experts}] (num_experts), "
                             f"got {hot_k!r}")
        s = own.get("hot_share", DEFAULT_HOT_SHARE)
        if not _is_num(s) or not 0 < s <= 1:
            raise ValueError(f"{name} hot_share must be a number in (0, 1], got {s!r}")
        cold = num_experts - hot_k
        most, least = min(hot_k, top_k), max(0, top_k - cold)
        if s > most / top_k + 1e-12:
            raise ValueError(f"{name} hot_share {s} is out of reach: a token picks each expert once, so at most "
                             f"{most} of its top_k={top_k} picks (share {most / top_k:.4g}) land on hot_k={hot_k}")
        if s < least / top_k - 1e-12:
            raise ValueError(f"{name} hot_share {s} is out of reach: with {cold} other experts at least {least} "
                             f"of a token's top_k={top_k} picks (share {least / top_k:.4g}) land on hot_k={hot_k}")
    return check


def _hot_probabilities(name: str):
    def probabilities(num_experts, top_k, world, seed, step, own) -> np.ndarray:
        if top_k is None:
            raise ValueError(f"{name} expert weights depend on top_k: pass top_k")
        hot_k, s = _hot_knobs(own, top_k)
        w = np.ones(num_experts)
        w[hot_set(name, num_experts, world, hot_k, step)] = hot_weight_ratio(num_experts, top_k, hot_k, s)
        return w
    return probabilities


def _hot_expected(name: str):
    def expected(num_experts, top_k, world, seed, step, own) -> np.ndarray:
        """Exact: each hot expert gets share/hot_k of the picks, each other one the rest
        evenly (the experts of either kind are alike), summed per rank."""
        hot_k, s = _hot_knobs(own, top_k)
        cold = num_experts - hot_k
        got = _hot_pick_share(hot_k, cold, top_k, hot_weight_ratio(num_experts, top_k, hot_k, s))
        per_expert = np.full(num_experts, (1.0 - got) / cold if cold else 0.0)
        per_expert[hot_set(name, num_experts, world, hot_k, step)] = got / hot_k
        return per_expert.reshape(world, -1).sum(axis=1)
    return expected


def _sampled(name: str, num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
             seed: int, step: int, own: dict) -> Routing:
    own = _given(own)
    _validate(name, own, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    p = expert_probabilities(name, num_experts, world, seed=seed, top_k=top_k, step=step, **own)
    rng = _rank_rng(seed, rank, step)
    return _finish(rng, _sample_distinct(rng, num_tokens, num_experts, top_k, p))


def hot_experts(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
                step: int = 0, hot_k: int | None = None,
                hot_share: float = DEFAULT_HOT_SHARE) -> Routing:
    """hot_k experts (default top_k) next to each other in expert order, so on few ranks,
    take hot_share of all picks (the module's docstring says how the share is met)."""
    return _sampled("hot_experts", num_tokens, num_experts, top_k, rank, world, seed, step,
                    {"hot_k": hot_k, "hot_share": hot_share})


def spread_hot(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
               step: int = 0, hot_k: int | None = None,
               hot_share: float = DEFAULT_HOT_SHARE) -> Routing:
    """hot_k experts (default top_k) spread evenly over the ranks take hot_share of all picks."""
    return _sampled("spread_hot", num_tokens, num_experts, top_k, rank, world, seed, step,
                    {"hot_k": hot_k, "hot_share": hot_share})


def rotating_hot(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
                 step: int = 0, hot_k: int | None = None,
                 hot_share: float = DEFAULT_HOT_SHARE) -> Routing:
    """hot_experts whose hot set moves on by hot_k experts every step (wrapping around)."""
    return _sampled("rotating_hot", num_tokens, num_experts, top_k, rank, world, seed, step,
                    {"hot_k": hot_k, "hot_share": hot_share})


# ---------------------------------------------------------------- zero_rank


def _zero(own: dict, world: int) -> int:
    return int(own.get("zero", world - 1))


def _check_zero(own: dict, num_experts: int, top_k: int, world: int, num_tokens) -> None:
    if world < 2:
        raise ValueError("zero_rank needs world >= 2: with one rank every expert is on it")
    zero = own.get("zero", world - 1)
    if not _is_int(zero) or not 0 <= zero < world:
        raise ValueError(f"zero_rank zero must be a rank in [0, {world}), got {zero!r}")
    others = num_experts - num_experts // world
    if top_k > others:
        raise ValueError(f"zero_rank top_k {top_k} exceeds the {others} experts outside rank {zero}")


def zero_rank(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
              step: int = 0, zero: int | None = None) -> Routing:
    """The experts of rank ``zero`` (default the last) get no picks; the rest uniform."""
    own = _given({"zero": zero})
    _validate("zero_rank", own, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    per_rank, z = num_experts // world, _zero(own, world)
    rng = _rank_rng(seed, rank, step)
    idx = _sample_distinct(rng, num_tokens, num_experts - per_rank, top_k)
    # Ids past the zero rank's first expert step over its block.
    idx += per_rank * (idx >= z * per_rank)
    return _finish(rng, idx)


def _zero_probabilities(num_experts, top_k, world, seed, step, own) -> np.ndarray:
    w = np.ones(num_experts)
    per_rank, z = num_experts // world, _zero(own, world)
    w[z * per_rank:(z + 1) * per_rank] = 0.0
    return w


def _zero_expected(num_experts, top_k, world, seed, step, own) -> np.ndarray:
    share = np.full(world, 1.0 / (world - 1))
    share[_zero(own, world)] = 0.0
    return share


# ---------------------------------------------------------------- token counts


def parse_tokens_by_rank(value) -> list[int]:
    """"4096/1024/2048/512" (or a sequence of ints) -> [4096, 1024, 2048, 512]."""
    if isinstance(value, str):
        parts = value.replace(" ", "").split("/")
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"source_ragged tokens_by_rank {value!r} is not integers separated by '/' "
                             "(e.g. 4096/1024/2048/512)")
        counts = [int(p) for p in parts]
    else:
        counts = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
        if not all(_is_int(c) for c in counts):
            raise ValueError(f"source_ragged tokens_by_rank must be integers, got {value!r}")
    if any(c < 1 for c in counts):
        raise ValueError(f"source_ragged tokens_by_rank entries must be >= 1, got {value!r}")
    return [int(c) for c in counts]


def _ragged_knobs(own: dict, world: int, num_tokens) -> list[int] | float:
    """The explicit counts, or the spread's coefficient of variation; ValueError if bad."""
    listed, cv = own.get("tokens_by_rank"), own.get("ragged_cv")
    if listed is not None and cv is not None:
        raise ValueError("source_ragged takes ragged_cv or tokens_by_rank, not both")
    if listed is not None:
        counts = parse_tokens_by_rank(listed)
        if len(counts) != world:
            raise ValueError(f"source_ragged tokens_by_rank has {len(counts)} entries for {world} ranks")
        return counts
    cv = DEFAULT_RAGGED_CV if cv is None else cv
    if not _is_num(cv) or cv < 0:
        raise ValueError(f"source_ragged ragged_cv must be a finite number >= 0, got {cv!r}")
    if num_tokens is not None and num_tokens < 1:
        raise ValueError(f"source_ragged keeps every rank at >= 1 token: num_tokens must be >= 1, got {num_tokens}")
    return float(cv)


def _check_ragged(own, num_experts, top_k, world, num_tokens) -> None:
    _ragged_knobs(own, world, num_tokens)


def _ragged_tokens(num_tokens: int, world: int, seed: int, step: int, own: dict) -> np.ndarray:
    knob = _ragged_knobs(own, world, num_tokens)
    if isinstance(knob, list):
        return np.asarray(knob, dtype=np.int64)
    if knob == 0.0 or world == 1:
        return np.full(world, num_tokens, dtype=np.int64)
    sigma2 = math.log1p(knob * knob)
    x = _shared_rng(seed, _TOKEN_SPREAD_KEY, step).lognormal(-sigma2 / 2, math.sqrt(sigma2), world)
    # One token each up front, the rest shared out by the draws (largest remainders).
    extra = world * (num_tokens - 1)
    share = extra * x / x.sum()
    counts = np.floor(share).astype(np.int64)
    by_remainder = np.argsort(-(share - counts), kind="stable")
    counts[by_remainder[:extra - int(counts.sum())]] += 1
    return counts + 1


def _burst_knobs(own: dict) -> tuple[int, float]:
    every = own.get("burst_every", DEFAULT_BURST_EVERY)
    if not _is_int(every) or every < 1:
        raise ValueError(f"burst burst_every must be an integer >= 1, got {every!r}")
    factor = own.get("burst_factor", DEFAULT_BURST_FACTOR)
    if not _is_num(factor) or factor < 1:
        raise ValueError(f"burst burst_factor must be a finite number >= 1, got {factor!r}")
    return int(every), float(factor)


def _check_burst(own, num_experts, top_k, world, num_tokens) -> None:
    _burst_knobs(own)


def _burst_tokens(num_tokens: int, world: int, seed: int, step: int, own: dict) -> np.ndarray:
    every, factor = _burst_knobs(own)
    n = int(math.floor(factor * num_tokens + 0.5)) if step % every == every - 1 else num_tokens
    return np.full(world, n, dtype=np.int64)


def _check_counts(num_tokens, world, seed, step) -> None:
    if not _is_int(num_tokens) or num_tokens < 0:
        raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
    if not _is_int(world) or world < 1:
        raise ValueError(f"world must be an integer >= 1, got {world!r}")
    _check_rank(0, world, seed, step)


def tokens_per_rank(name: str, num_tokens: int, world: int, seed: int, step: int = 0,
                    **own) -> np.ndarray:
    """Rows each source rank routes at ``step`` (int64 (world,)): num_tokens everywhere but
    for the workloads that change it (source_ragged, burst)."""
    if name not in ROUTINGS:
        raise ValueError(f"unknown routing {name!r}; choose one of {', '.join(ROUTINGS)}")
    _check_counts(num_tokens, world, seed, step)
    own = {k: v for k, v in _given(own).items() if k in ROUTING_PARAMS[name]}
    hooks = ROUTING_HOOKS.get(name)
    if hooks is None or hooks.tokens is None:
        return np.full(world, num_tokens, dtype=np.int64)
    return np.asarray(hooks.tokens(num_tokens, world, seed, step, own), dtype=np.int64)


def max_tokens_per_rank(name: str, num_tokens: int, world: int, seed: int, steps: int, **own) -> int:
    """The most rows any rank routes over steps 0 .. steps-1: what its buffers must hold."""
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    hooks = ROUTING_HOOKS.get(name)
    if hooks is None or hooks.tokens is None:  # the same count at every step
        steps = 1
    return max(int(tokens_per_rank(name, num_tokens, world, seed, s, **own).max()) for s in range(steps))


def _routed(name: str, num_tokens: int, num_experts: int, top_k: int, rank: int, world: int,
            seed: int, step: int, own: dict) -> Routing:
    """Uniform routing of the rank's own token count at this step."""
    own = _given(own)
    _validate(name, own, num_experts, top_k, world, num_tokens)
    _check_rank(rank, world, seed, step)
    n = int(tokens_per_rank(name, num_tokens, world, seed, step, **own)[rank])
    rng = _rank_rng(seed, rank, step)
    return _finish(rng, _sample_distinct(rng, n, num_experts, top_k))


def source_ragged(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
                  step: int = 0, ragged_cv: float | None = None,
                  tokens_by_rank: str | list | None = None) -> Routing:
    """Tokens per source rank vary (seeded spread ragged_cv, or tokens_by_rank a/b/...); uniform routing."""
    return _routed("source_ragged", num_tokens, num_experts, top_k, rank, world, seed, step,
                   {"ragged_cv": ragged_cv, "tokens_by_rank": tokens_by_rank})


def burst(num_tokens: int, num_experts: int, top_k: int, rank: int, world: int, seed: int,
          step: int = 0, burst_every: int = DEFAULT_BURST_EVERY,
          burst_factor: float = DEFAULT_BURST_FACTOR) -> Routing:
    """One step in burst_every (the last) carries burst_factor times the tokens; uniform routing."""
    return _routed("burst", num_tokens, num_experts, top_k, rank, world, seed, step,
                   {"burst_every": burst_every, "burst_factor": burst_factor})


def _uniform_expected(num_experts, top_k, world, seed, step, own) -> np.ndarray:
    # Token counts change how many picks there are, not where they land.
    return np.full(world, 1.0 / world)


# The lines `commbench list` shows (knob values as the benchmark's params take them).
WORKLOAD_HELP = {
    "hot_experts": "hot_k experts (0: topk) side by side in expert order, so on few ranks, take hot_share "
                   "of all picks",
    "spread_hot": "hot_k experts (0: topk) spread evenly over the ranks take hot_share of all picks",
    "rotating_hot": "hot_experts whose hot set moves on by hot_k experts every step",
    "zero_rank": "the experts of rank `zero` (-1: the last) get no picks; the others share them uniformly",
    "source_ragged": "source ranks hold different token counts (a seeded spread ragged_cv, or tokens_by_rank "
                     "a/b/c/..., one entry a rank); uniform routing",
    "burst": "one step in burst_every (the last) carries burst_factor times the tokens; uniform routing",
}

for _name, _gen in (("hot_experts", hot_experts), ("spread_hot", spread_hot), ("rotating_hot", rotating_hot)):
    register_routing(_name, _gen, HOT_KNOBS, WORKLOAD_HELP[_name], RoutingHooks(
        validate=_check_hot(_name), probabilities=_hot_probabilities(_name), expected_share=_hot_expected(_name)))
register_routing("zero_rank", zero_rank, ("zero",), WORKLOAD_HELP["zero_rank"], RoutingHooks(
    validate=_check_zero, probabilities=_zero_probabilities, expected_share=_zero_expected))
register_routing("source_ragged", source_ragged, RAGGED_KNOBS, WORKLOAD_HELP["source_ragged"], RoutingHooks(
    validate=_check_ragged, expected_share=_uniform_expected, tokens=_ragged_tokens))
register_routing("burst", burst, BURST_KNOBS, WORKLOAD_HELP["burst"], RoutingHooks(
    validate=_check_burst, expected_share=_uniform_expected, tokens=_burst_tokens))


# ---------------------------------------------------------------- statistics


def routing_stats(topk_by_rank: list, num_experts: int, world: int) -> dict:
    """What a routing asks of the exchange, from every source rank's top-k ids
    (``topk_by_rank[src]``: int (tokens, K)), experts spread evenly over ``world`` ranks:

    rank_load_max_over_mean, expert_load_max_over_mean: the most (token, expert) picks
        landing on one rank / one expert over the mean (1.0 when nothing is picked);
    local_pick_share: the share of picks whose expert sits on the token's own rank;
    tokens_min, tokens_max: the fewest and most tokens of a source rank;
    hottest_rank, hottest_expert: where the most picks land (the lowest id on a tie).
    """
    if not _is_int(world) or world < 1 or not _is_int(num_experts) or num_experts < 1 or num_experts % world:
        raise ValueError(f"routing_stats needs num_experts ({num_experts!r}) divisible by world ({world!r}) >= 1")
    if len(topk_by_rank) != world:
        raise ValueError(f"routing_stats got {len(topk_by_rank)} source ranks' routing for world {world}")
    per_rank = num_experts // world
    expert_load = np.zeros(num_experts, dtype=np.int64)
    local = 0
    tokens = []
    for src, idx in enumerate(topk_by_rank):
        idx = np.asarray(idx)
        flat = idx.ravel().astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
            raise ValueError(f"routing_stats: rank {src} picks an expert outside [0, {num_experts})")
        tokens.append(int(idx.shape[0]) if idx.ndim else 0)
        expert_load += np.bincount(flat, minlength=num_experts)
        local += int(np.count_nonzero(flat // per_rank == src))
    rank_load = expert_load.reshape(world, per_rank).sum(axis=1)
    rank_imb, hottest_rank = load_imbalance(rank_load)
    expert_imb, hottest_expert = load_imbalance(expert_load)
    total = int(expert_load.sum())
    return {"rank_load_max_over_mean": rank_imb, "expert_load_max_over_mean": expert_imb,
            "local_pick_share": local / total if total else 0.0,
            "tokens_min": min(tokens), "tokens_max": max(tokens),
            "hottest_rank": hottest_rank, "hottest_expert": hottest_expert}
