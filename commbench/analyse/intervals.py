"""The intervals of one point: a run's own ~95 % interval of its p50 (point_ci), and the
between-run interval of new/base from the per-run p50s of one point (between_runs). Pure
Python; compare.py judges whole sweeps with them."""
from __future__ import annotations

import math

from commbench.core.stats import t_quantile

# z for a two-sided 95 % interval.
Z95 = 1.959964
# sqrt(pi/2): the median of n normal samples has standard error ~1.2533 sigma/sqrt(n).
_MEDIAN_SE = math.sqrt(math.pi / 2)


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def point_ci(row) -> tuple[float, float, str]:
    """(low, high, basis) of a ~95 % confidence interval for the row's time_us_p50.

    commbench's own rows: p50 is the median of `iters` per-iteration times. Its
    distribution-free asymptotic interval is p50 +- z * 1/(2 f(m) sqrt(n)), where 1/f(m),
    the slope of the quantile function at the median, is unknown without samples. It is
    estimated from the kept quantiles as (p90 - p50) / 0.4. Iteration times are
    right-skewed (a floor plus a tail), and on a skewed or even a normal distribution the
    quantile function is steeper between p50 and p90 than at p50, so this overstates
    the width (by ~28 % for a normal distribution): the interval is conservative. Unlike
    mean +- z*std/sqrt(n), it ignores the handful of huge outliers (a descheduled rank)
    that inflate std without moving the median. Basis "median (p50..p90 spread)".

    Imported rows (spread "std"): their p50 is the tool's mean, so the interval is the
    mean's, mean +- z * std / sqrt(n). Basis "mean (std)".

    Imported rows with spread "none" (the tool printed only an average), or rows without
    iters: (nan, nan, "no spread").
    """
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    p50 = _num(get("time_us_p50"))
    n = _num(get("iters"))
    spread = get("spread")
    spread = spread if isinstance(spread, str) else ""
    if not (math.isfinite(p50) and math.isfinite(n) and n >= 2):
        return math.nan, math.nan, "no spread"
    if spread == "none":
        return math.nan, math.nan, "no spread"
    if spread == "std":
        std = _num(get("time_us_std"))
        if not math.isfinite(std):
            return math.nan, math.nan, "no spread"
        h = Z95 * std / math.sqrt(n)
        return p50 - h, p50 + h, "mean (std)"
    p90 = _num(get("time_us_p90"))
    if not math.isfinite(p90):
        std = _num(get("time_us_std"))
        if not math.isfinite(std):
            return math.nan, math.nan, "no spread"
        h = Z95 * _MEDIAN_SE * std / math.sqrt(n)
        return p50 - h, p50 + h, "median (std)"
    h = Z95 * max(p90 - p50, 0.0) / 0.4 / (2.0 * math.sqrt(n))
    return p50 - h, p50 + h, "median (p50..p90 spread)"


# --- Student's t, for the between-run interval -------------------------------------------
# Welch's degrees of freedom are fractional and small (2..4 with three runs a side), where
# the normal 1.96 would be far too narrow (t(0.975, 2) = 4.30), so the quantile is computed
# exactly: the t CDF through the regularized incomplete beta function, inverted by bisection.


def between_runs(base_p50s, new_p50s) -> dict | None:
    """A ~95 % interval of new/base from the per-run p50s of one point on each side.

    Why this statistic: a run's p50 already averages hundreds of iterations, so what is
    left to decide is whether the runs of one side differ from those of the other by more
    than runs of one side differ among themselves -- a two-sample question with a handful
    of values a side. Timing changes are multiplicative (a slower path is a factor, and
    the threshold is a ratio) and run-to-run scatter is right-skewed, so the test runs on
    log p50: the difference of the sides' mean log p50 is the log of the ratio of their
    geometric means. Welch's t-interval does not assume the two sides are equally noisy
    (a change can bring noise with it) and uses Student's t at the Welch-Satterthwaite
    degrees of freedom, which keeps the interval honest at 2-5 runs a side. A rank test
    (Mann-Whitney) cannot reach 5 % at all with 3 runs a side (its smallest two-sided
    p is 0.1), and a bootstrap over 3 runs has only a few distinct resamples.

    When one side has a single run, its scatter is unknown: it is taken to be the other
    side's (a pooled two-sample t with that side's runs - 1 degrees of freedom).

    Each run's own interval (point_ci) takes no part: a run's p50 carries its sampling
    error into the spread between runs already, and a run of few iterations has an
    interval so wide (p90 many times p50) that it would swamp the runs that agree. That the
    sample variance of 2-3 runs can come out small by chance is what Student's t, rather
    than the normal, pays for.

    Returns {"ratio", "lo", "hi", "df", "basis"}, or None when a p50 is not a positive
    number, or every run of both sides gave the same p50 (no spread to judge by).
    """
    lb = [math.log(x) for x in map(_num, base_p50s) if x > 0 and math.isfinite(x)]
    ln = [math.log(x) for x in map(_num, new_p50s) if x > 0 and math.isfinite(x)]
    m, n = len(lb), len(ln)
    if m != len(base_p50s) or n != len(new_p50s) or not m or not n or m + n < 3:
        return None

    def var(v):
        mu = sum(v) / len(v)
        return sum((x - mu) ** 2 for x in v) / (len(v) - 1)

    if m > 1 and n > 1:
        eb, en = var(lb) / m, var(ln) / n
        se2 = eb + en
        df = se2 * se2 / (eb * eb / (m - 1) + en * en / (n - 1)) if se2 > 0 else math.nan
        basis = f"between runs: Welch t on log p50, {m} vs {n} runs"
    else:
        many, side = (lb, "base") if m > 1 else (ln, "new")
        se2 = var(many) * (1.0 / m + 1.0 / n)
        df = len(many) - 1
        basis = f"between runs: t on log p50, {m} vs {n} runs, the {side} side's spread for both"
    if not se2 > 0:
        return None
    h = t_quantile(0.975, df) * math.sqrt(se2)
    d = sum(ln) / n - sum(lb) / m
    return {"ratio": math.exp(d), "lo": math.exp(d - h), "hi": math.exp(d + h), "df": df, "basis": basis}
