"""Analysis of measured rows: alpha-beta fits of size sweeps and weak-scaling efficiency.

Rows are dicts or a pandas DataFrame with the columns results.py writes (run is
optional). Times are the p50 (time_us_p50); formulas follow README "Formulas".
"""
from __future__ import annotations

import json
import math

import numpy as np

from .errors import UsageError

# Group keys; `run` leads when the rows carry it.
FIT_KEYS = ("benchmark", "backend", "world", "dtype", "variant", "params", "stage")
SCALING_KEYS = ("benchmark", "backend", "nbytes", "dtype", "variant", "params", "stage")
FIT_COLUMNS = ("alpha_us", "bandwidth_gbps", "busbw_asymptote_gbps", "n_half_nbytes",
               "rms_rel_err_pct", "max_rel_err_pct", "points", "min_nbytes", "max_nbytes")
SCALING_COLUMNS = ("world", "metric", "value", "base_world", "efficiency_pct")
MOE_BENCHMARK = "moe"
# Rows whose time is not one collective's (overlap: start + compute + wait): no fit, and
# no busbw scaling either.
NOT_COLLECTIVE = ("moe", "overlap")


# ------------------------------------------------------------------ alpha-beta fit

def _rel_sq_err(a: float, b: float, x: np.ndarray, t: np.ndarray) -> float:
    r = (a + b * x) / t - 1.0
    return float(r @ r)


def fit_alpha_beta(nbytes, time_us, busbw_factor: float | None = None) -> dict | None:
    """Fit t = alpha + S/B to a size sweep (README "Formulas" "Cost models").

    S is the message size as the rows give it (nccl-tests S), so B is the algbw-like
    asymptote; busbw_asymptote_gbps = B * busbw_factor when the factor is given.

    Plain least squares is ruled by the largest sizes (their absolute errors are the
    biggest) and leaves alpha meaningless, often negative. So this minimises the
    RELATIVE error sum(((alpha + S/B) - t) / t)^2, which weighs every size alike, under
    alpha >= 0 and 1/B >= 0. The objective is a convex quadratic in (alpha, 1/B), so the
    constrained optimum is the unconstrained one when feasible, else the best of the two
    boundary fits (alpha = 0, or no bandwidth term). A sweep whose time does not grow
    with size (latency only) gets bandwidth_gbps = inf and n_half_nbytes = inf.

    Points with non-finite or non-positive time are ignored. Fewer than 2 distinct sizes:
    None (nothing to separate alpha from B with).

    Returns alpha_us, bandwidth_gbps, busbw_asymptote_gbps (None without a factor),
    n_half_nbytes (= alpha * B, the size reaching half of B), rms_rel_err_pct,
    max_rel_err_pct, points, min_nbytes, max_nbytes.
    """
    s = np.asarray(nbytes, dtype=np.float64).ravel()
    t = np.asarray(time_us, dtype=np.float64).ravel()
    if s.shape != t.shape:
        raise UsageError(f"fit needs as many sizes as times, got {s.size} and {t.size}")
    ok = np.isfinite(s) & np.isfinite(t) & (t > 0) & (s >= 0)
    s, t = s[ok], t[ok]
    if np.unique(s).size < 2:
        return None
    scale = float(s.max())  # sizes scaled to <= 1 keep the two columns comparable
    x = s / scale

    cands = []
    sol, *_ = np.linalg.lstsq(np.column_stack([1.0 / t, x / t]), np.ones_like(t), rcond=None)
    a, b = float(sol[0]), float(sol[1])
    if a >= 0 and b > 0:
        cands.append((a, b))
    u = x / t
    cands.append((0.0, float(u.sum() / (u @ u))))  # alpha = 0
    w = 1.0 / t
    cands.append((float(w.sum() / (w @ w)), 0.0))  # no bandwidth term
    a, b = min(cands, key=lambda ab: _rel_sq_err(ab[0], ab[1], x, t))

    rel = (a + b * x) / t - 1.0
    # b is microseconds per `scale` bytes; B [GB/s] = bytes/us / 1e3.
    bw_gbps = scale / b / 1e3 if b > 0 else math.inf
    return {
        "alpha_us": a,
        "bandwidth_gbps": bw_gbps,
        "busbw_asymptote_gbps": None if busbw_factor is None else bw_gbps * float(busbw_factor),
        "n_half_nbytes": a * bw_gbps * 1e3 if a > 0 else 0.0,
        "rms_rel_err_pct": float(np.sqrt(np.mean(rel ** 2)) * 100.0),
        "max_rel_err_pct": float(np.max(np.abs(rel)) * 100.0),
        "points": int(t.size),
        "min_nbytes": int(s.min()),
        "max_nbytes": int(s.max()),
    }


# ------------------------------------------------------------------ helpers

def _frame(rows):
    import pandas as pd

    return rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _blank(v) -> str:
    return "" if _missing(v) else str(v)


def params_dict(v) -> dict:
    """params as a dict, whether the row holds a dict, a JSON string or nothing."""
    if _missing(v) or v == "":
        return {}
    if isinstance(v, dict):
        return v
    try:
        out = json.loads(v)
    except (TypeError, ValueError):
        raise UsageError(f"params {v!r} is not a JSON object") from None
    if not isinstance(out, dict):
        raise UsageError(f"params {v!r} is not a JSON object")
    return out


def _params_key(v) -> str:
    # One canonical text per parameter set, so a dict and its JSON string group together.
    return json.dumps(params_dict(v), sort_keys=True)


def _keyed(rows, keys):
    """Rows with hashable, canonical key columns (None/NaN -> "" for text keys)."""
    df = _frame(rows)
    need = [k for k in keys if k not in ("variant", "params", "stage")] + ["time_us_p50"]
    missing = [k for k in need if k not in df.columns]
    if missing:
        raise UsageError(f"rows lack the column(s) {', '.join(missing)}")
    for k in ("variant", "stage"):
        df[k] = df[k].map(_blank) if k in df.columns else ""
    df["params"] = df["params"].map(_params_key) if "params" in df.columns else "{}"
    return df


def _busbw_factor(g) -> float | None:
    if "busbw_factor" in g.columns:
        f = g["busbw_factor"].astype(float)
        f = f[np.isfinite(f) & (f > 0)]
        if len(f):
            return float(f.median())
    if {"busbw_gbps", "algbw_gbps"} <= set(g.columns):
        alg, bus = g["algbw_gbps"].astype(float), g["busbw_gbps"].astype(float)
        ok = np.isfinite(alg) & np.isfinite(bus) & (alg > 0)
        if ok.any():
            return float((bus[ok] / alg[ok]).median())
    return None


# ------------------------------------------------------------------ tables

def fit_table(df):
    """One alpha-beta fit per (run, benchmark, backend, world, dtype, variant, params,
    stage) with >= 2 distinct sizes; barrier-like benchmarks (every nbytes 0) and moe
    (its size follows the routing, not a sweep) are skipped.

    Columns: the keys (run only when the rows carry it; params as canonical JSON,
    missing variant/stage as "") + alpha_us, bandwidth_gbps, busbw_asymptote_gbps,
    n_half_nbytes, rms_rel_err_pct, max_rel_err_pct, points, min_nbytes, max_nbytes.
    """
    import pandas as pd

    df = _frame(df)
    keys = (["run"] if "run" in df.columns else []) + list(FIT_KEYS)
    if df.empty:
        return pd.DataFrame(columns=keys + list(FIT_COLUMNS))
    df = _keyed(df, keys + ["nbytes"])
    df = df[~df["benchmark"].isin(NOT_COLLECTIVE)]
    sized = df.groupby("benchmark")["nbytes"].transform(lambda n: (n.astype(float) > 0).any())
    df = df[sized.astype(bool)]
    out = []
    for key, g in df.groupby(keys, sort=True):
        fit = fit_alpha_beta(g["nbytes"], g["time_us_p50"], _busbw_factor(g))
        if fit is not None:
            out.append({**dict(zip(keys, key)), **fit})
    return pd.DataFrame(out, columns=keys + list(FIT_COLUMNS))


def scaling_table(df):
    """Weak-scaling efficiency over world (README "Formulas" "Scaling efficiency").

    Per (run, benchmark, backend, nbytes, dtype, variant, params, stage), each world's
    per-rank throughput against that at the smallest world measured:
    efficiency_pct = value(n) / value(n_min) * 100.

    - Collectives: value = busbw_gbps, the bytes each rank's busiest link moves per
      second; sizes with nbytes 0 (barrier) have none and are skipped.
    - moe: value = tokens per rank / time_us_p50, in tokens/s per rank, for the dispatch
      and combine stages separately. Bytes per rank are the wrong measure here: in weak
      scaling the tokens per rank are fixed, but the remote share of each rank's copies
      (and so its bytes) grows with world, so a byte rate would flatter larger worlds.
      The same holds for nbytes, so moe groups leave nbytes out of the key and each row
      shows its own world's bytes.

    Several rows for one (group, world) are reduced to their median. Groups measured
    at a single world are dropped. Columns: the keys + world, metric, value,
    base_world, efficiency_pct.
    """
    import pandas as pd

    df = _frame(df)
    keys = (["run"] if "run" in df.columns else []) + list(SCALING_KEYS)
    cols = keys + list(SCALING_COLUMNS)
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = _keyed(df, keys + ["world"])
    moe = df["benchmark"] == MOE_BENCHMARK

    coll = df[~moe & (df["benchmark"] != "overlap") & (df["nbytes"].astype(float) > 0)].copy()
    if "busbw_gbps" not in coll.columns:
        if len(coll):
            raise UsageError("rows lack the column busbw_gbps")
        coll["busbw_gbps"] = []
    coll["metric"] = "busbw_gbps"
    coll["value"] = coll["busbw_gbps"].astype(float)

    m = df[moe].copy()
    if len(m):
        tokens = m["params"].map(lambda p: params_dict(p).get("tokens"))
        if tokens.map(_missing).any():
            raise UsageError("moe rows need params with 'tokens' for tokens/s per rank")
        t_us = m["time_us_p50"].astype(float)
        m["value"] = np.where(t_us > 0, tokens.astype(float) / (t_us * 1e-6), np.nan)
    else:
        m["value"] = []
    m["metric"] = "tokens_per_s_per_rank"

    out = []
    for part, gkeys in ((coll, keys), (m, [k for k in keys if k != "nbytes"])):
        part = part[np.isfinite(part["value"].astype(float)) & (part["value"].astype(float) > 0)]
        for key, g in part.groupby(gkeys, sort=True):
            per_world = g.groupby("world").agg(value=("value", "median"), nbytes=("nbytes", "median"))
            if len(per_world) < 2:
                continue
            base_world = int(per_world.index.min())
            base = float(per_world["value"].loc[base_world])
            head = dict(zip(gkeys, key))
            for world, r in per_world.iterrows():
                out.append({**head, "nbytes": head.get("nbytes", int(r["nbytes"])), "world": int(world),
                            "metric": g["metric"].iloc[0], "value": float(r["value"]),
                            "base_world": base_world, "efficiency_pct": float(r["value"]) / base * 100.0})
    return pd.DataFrame(out, columns=cols)
