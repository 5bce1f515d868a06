"""The sampling core of the routing generators: seeded streams, successive sampling of
distinct experts without replacement, and per-token weights (routing.py states the law).

Streams: a rank's step-0 draws come from ``SeedSequence([seed, rank])``; step s > 0 from
``SeedSequence([seed, rank, s])``, so every step is an independent stream any rank can
regenerate, and step 0 is the stream the generators used before steps existed.
"""
from __future__ import annotations

import numpy as np

# spawn_key tags for streams that depend on the seed but not on the rank; a spawn key
# keeps them apart from every rank's SeedSequence([seed, rank]) stream.
_SHARED_EXPERT_ORDER_KEY = 1
_EXPECTATION_SAMPLES_KEY = 2
_TOKEN_SPREAD_KEY = 3  # source_ragged's tokens per rank, one draw per step

# Collision redraw rounds before Plackett-Luce keys take over a row; only very skewed
# weights (large zipf alpha) or K close to E get that far.
_MAX_REDRAW_ROUNDS = 4
_DRAWS_PER_ROUND = 4

# ---------------------------------------------------------------- random streams


def _rank_rng(seed: int, rank: int, step: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, rank] + ([step] if step else [])))


def _shared_rng(seed: int, key: int, step: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,) + ((step,) if step else ())))


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


def _hot_pick_share(hot: int, cold: int, top_k: int, ratio: float) -> float:
    """Expected share of a token's K successive picks (without replacement) that land in a
    set of ``hot`` experts of weight ``ratio`` each, the other ``cold`` experts weighing 1.

    The number of hot picks so far is a Markov chain: with h hot and i - h cold taken, the
    next pick is hot with chance ratio (hot - h) / (ratio (hot - h) + cold - (i - h)).
    """
    # dist[h] = P(h of the picks so far are hot)
    dist = np.zeros(top_k + 1)
    dist[0] = 1.0
    for i in range(top_k):
        h = np.arange(i + 1, dtype=np.float64)
        # States past a full hot set (h > hot) are unreachable; keep them at 0.
        hot_w = ratio * np.maximum(hot - h, 0.0)
        cold_w = np.maximum(cold - (i - h), 0.0)
        den = hot_w + cold_w
        p_hot = np.divide(hot_w, den, out=np.zeros_like(den), where=den > 0)
        nxt = np.zeros_like(dist)
        nxt[1:i + 2] += dist[:i + 1] * p_hot
        nxt[:i + 1] += dist[:i + 1] * (1.0 - p_hot)
        dist = nxt
    return float(np.dot(np.arange(top_k + 1), dist)) / top_k
