"""Statistics in one place: per-point summaries of iteration times, bandwidths, calibration,
and Student's t distribution for compare's intervals (pure numpy and math: no scipy)."""
from __future__ import annotations

import functools
import math

import numpy as np


def summarize_us(times_s: np.ndarray) -> dict[str, float]:
    """time_us_* fields from per-iteration times in seconds."""
    t = np.asarray(times_s, dtype=np.float64) * 1e6
    if t.size == 0:
        raise ValueError("no samples")
    p50, p90, p99 = np.percentile(t, [50, 90, 99])
    return {
        "time_us_min": float(t.min()),
        "time_us_p50": float(p50),
        "time_us_mean": float(t.mean()),
        "time_us_p90": float(p90),
        "time_us_p99": float(p99),
        "time_us_max": float(t.max()),
        "time_us_std": float(t.std(ddof=1)) if t.size > 1 else 0.0,
    }


def bandwidths_gbps(nbytes: int, time_us: float, busbw_factor: float) -> tuple[float, float]:
    """algbw = S/t, busbw = algbw * F (nccl-tests); GB = 1e9 bytes."""
    if time_us <= 0 or nbytes == 0:
        return 0.0, 0.0
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * busbw_factor


def calibrate_iters(est_op_s: float, min_time_s: float, min_iters: int, max_iters: int) -> int:
    """Iterations so a point lasts about min_time_s: small messages get many samples and
    large ones do not take minutes."""
    if est_op_s <= 0:
        return max_iters
    n = int(np.ceil(min_time_s / est_op_s))
    return int(min(max(n, min_iters), max_iters))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_pdf(t: float, df: float) -> float:
    """Density of Student's t with df degrees of freedom at t."""
    log_c = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1.0) / 2.0 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p quantile (0.5 <= p < 1) of Student's t with df degrees of freedom: Newton's
    method on t_cdf inside a bracket that every step keeps (a step that would leave it
    bisects instead). Compare asks this for every point of a sweep, so a bisection's 200
    incomplete-beta evaluations a call were most of its time; Newton takes about 5."""
    if not (0.5 <= p < 1.0 and df > 0):
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = 0.0, 2.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    t = (lo + hi) / 2.0
    for _ in range(200):
        f = t_cdf(t, df) - p
        if f < 0:
            lo = t
        else:
            hi = t
        step = f / max(t_pdf(t, df), 1e-300)
        nxt = t - step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2.0
        if abs(nxt - t) <= 1e-13 * max(abs(nxt), 1e-300) or hi - lo < 1e-12 * hi:
            return nxt
        t = nxt
    return t


# --- many points at once: noise pooled over neighbouring sizes, false discoveries controlled ---

def bh_adjust(pvalues) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values): a point is a discovery at level q when
    its adjusted p-value is <= q. Controls the expected share of false calls among the calls
    at q; when nothing changed at all (every null true) that is the chance of any false call,
    so a sweep of identical code is called changed anywhere with probability <= q. NaN in,
    NaN out (those points take no part)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    m = int(ok.sum())
    if not m:
        return out
    v = p[ok]
    order = np.argsort(v)
    ranked = v[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    adj = np.empty(m)
    adj[order] = np.minimum(q, 1.0)
    out[ok] = adj
    return out


# The median of a variance estimate with nu degrees of freedom is this share of the variance
# (chi-square median over nu, Wilson-Hilferty); dividing by it makes a median of such
# estimates a variance estimate again.
def _chi2_median_share(nu: float) -> float:
    return (1.0 - 2.0 / (9.0 * nu)) ** 3


# Degrees of freedom a median of k variance estimates is worth, per degree of freedom pooled:
# the median wastes about a third of them. Checked by simulation (normal scatter; 2-9 runs a
# side, 1-5 points pooled): the t-test's false-alarm rate stays at or below its level, at 5 %,
# 0.5 % and 0.05 % (tests/analyse/test_compare_runs.py holds the sweep-wide rate).
MEDIAN_DF_SHARE = 0.65


def pooled_spread(groups, ss, dof, window: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Each point's run-to-run variance pooled with its neighbours: (variance, degrees of freedom).

    groups[i] names the series a point belongs to (one benchmark, dtype, variant ... over its
    sizes), listed in size order; ss[i] is the point's within-side sum of squared deviations
    of log p50 over its runs, dof[i] its degrees of freedom (runs - 2 over both sides).

    Why pool: with 3 runs a side a point's own variance has 4 degrees of freedom and comes
    out small by chance often enough to call noise a change; neighbouring sizes run the same
    protocol on the same machine in the same runs and scatter alike.

    How: the MEDIAN of the variances of the points of its series at most `window` places away
    (made a variance again by the chi-square median share), worth MEDIAN_DF_SHARE of their
    degrees of freedom -- not their sum of squares: on a shared host one neighbour with a run
    caught in a slow stretch has a variance a hundred times the others', and a sum would let
    it hide a real change at every point around it. A point noisier than its neighbours is
    judged on its own variance (the larger of the two): its own scatter is evidence against
    calling it changed. A point with no spread in its window gets (nan, 0)."""
    ss = np.asarray(ss, dtype=np.float64)
    dof = np.asarray(dof, dtype=np.float64)
    own = np.where(dof > 0, ss / np.where(dof > 0, dof, 1.0), np.nan)
    var = np.full(len(ss), np.nan)
    df = np.zeros(len(ss))
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        for j, i in enumerate(idx):
            near = [k for k in idx[max(0, j - window): j + window + 1] if dof[k] > 0]
            if not near:
                continue
            nu = float(np.median(dof[near]))
            pooled = float(np.median(own[near])) / _chi2_median_share(nu)
            v = max(pooled, own[i]) if dof[i] > 0 else pooled
            if v > 0:
                var[i], df[i] = v, MEDIAN_DF_SHARE * float(dof[near].sum())
    return var, df
