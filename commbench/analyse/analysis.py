"""Analysis of measured rows: alpha-beta fits of size sweeps and weak-scaling efficiency.

Rows are dicts or a pandas DataFrame with the columns results.py writes (run is
optional). Times are the p50 (time_us_p50); formulas follow docs/ceilings.md#formulas.
"""
from __future__ import annotations

import json
import math

import numpy as np

from commbench.benchmarks.base import for_rows
from commbench.core.errors import UsageError
from commbench.core.schema import params_dict, per_params

# Group keys; `run` leads when the rows carry it. In-place and out-of-place rows of one
# size (nccl-tests' two columns) are different points: placement is a key of its own.
FIT_KEYS = ("benchmark", "backend", "world", "dtype", "variant", "params", "stage", "placement")
SCALING_KEYS = ("benchmark", "backend", "nbytes", "dtype", "variant", "params", "stage", "placement")
TEXT_KEYS = ("variant", "params", "stage", "placement")  # may be missing: "" (params "{}")
# alpha-beta has two parameters: it passes exactly through any two sizes, so a fit says
# something about the sweep only from three sizes on.
MIN_FIT_SIZES = 3
FIT_COLUMNS = ("alpha_us", "bandwidth_gbps", "busbw_asymptote_gbps", "n_half_nbytes",
               "rms_rel_err_pct", "max_rel_err_pct", "points", "min_nbytes", "max_nbytes")
SCALING_COLUMNS = ("world", "metric", "value", "base_world", "efficiency_pct")


# ------------------------------------------------------------------ alpha-beta fit

def _rel_sq_err(a: float, b: float, x: np.ndarray, t: np.ndarray) -> float:
    r = (a + b * x) / t - 1.0
    return float(r @ r)


def fit_alpha_beta(nbytes, time_us, busbw_factor: float | None = None) -> dict | None:
    """Fit t = alpha + S/B to a size sweep (docs/ceilings.md#alpha-beta-fit).

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
    """A DataFrame of the rows with params as dicts (rows from load() have them; rows
    built elsewhere may hold JSON text)."""
    import pandas as pd

    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if "params" in df.columns:
        df["params"] = df["params"].map(params_dict)
    return df


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _blank(v) -> str:
    return "" if _missing(v) else str(v)


def params_key(params) -> str:
    """A params dict as canonical JSON: a hashable key to group or match rows on (a dict
    and its JSON text give the same key)."""
    return json.dumps(params_dict(params), sort_keys=True)


def presenters(df) -> dict:
    """benchmark name -> the Benchmark whose hooks present its rows (benchmarks.for_rows)."""

    return {b: for_rows(b) for b in df["benchmark"].unique()} if "benchmark" in df.columns else {}


def collective_mask(df):
    """Rows that time one collective of S > 0 bytes: what busbw, fits and by-size figures
    are about."""
    views = presenters(df)
    return df["benchmark"].map(lambda b: views[b].collective_rows).astype(bool) & (df["nbytes"].astype(float) > 0)


def _keyed(rows, keys):
    """Rows with hashable, canonical key columns (None/NaN -> "" for text keys)."""
    df = _frame(rows)
    need = [k for k in keys if k not in TEXT_KEYS] + ["time_us_p50"]
    missing = [k for k in need if k not in df.columns]
    if missing:
        raise UsageError(f"rows lack the column(s) {', '.join(missing)}")
    for k in ("variant", "stage", "placement"):
        df[k] = df[k].map(_blank) if k in df.columns else ""
    df["params"] = df["params"].map(per_params(params_key)) if "params" in df.columns else "{}"
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

def unphysical_fit(world: int, busbw_factor: float | None, fit: dict) -> str | None:
    """Why a fit describes no link (None: it may). One rank, or a busbw factor of 0, moves no
    bytes between ranks: whatever slope its times show, B is not a link's rate (a broadcast
    at world 1 fits 1e17 GB/s). A slope of 0 or less (time that does not grow with size)
    has no bandwidth term to report."""
    if int(world) < 2:
        return "a world of one rank moves no bytes between ranks"
    if busbw_factor == 0:
        return "its busbw factor is 0 at this world: it moves no bytes between ranks"
    if not (fit["bandwidth_gbps"] > 0 and math.isfinite(fit["bandwidth_gbps"])):
        return "its time does not grow with size: no bandwidth term to fit"
    return None


def fit_table(df, thin: list | None = None, refused: list | None = None):
    """One alpha-beta fit per (run, benchmark, backend, world, dtype, variant, params,
    stage, placement) with >= MIN_FIT_SIZES distinct sizes, of collective rows only
    (Benchmark.collective_rows: not moe, whose size follows the routing, nor overlap);
    benchmarks whose every nbytes is 0 (barrier) are skipped. thin: a list that gets one
    line per group left unfitted for having fewer sizes ("all_reduce n=2: 2 sizes").
    refused: a list that gets one line per group whose fit is not physical (unphysical_fit:
    one rank, no bytes moved, no growth with size); such fits are left out of the table.

    Columns: the keys (run only when the rows carry it; params as canonical JSON,
    missing variant/stage/placement as "") + alpha_us, bandwidth_gbps,
    busbw_asymptote_gbps, n_half_nbytes, rms_rel_err_pct, max_rel_err_pct, points,
    min_nbytes, max_nbytes.
    """
    import pandas as pd

    df = _frame(df)
    keys = (["run"] if "run" in df.columns else []) + list(FIT_KEYS)
    if df.empty:
        return pd.DataFrame(columns=keys + list(FIT_COLUMNS))
    df = _keyed(df, keys + ["nbytes"])
    views = presenters(df)
    df = df[df["benchmark"].map(lambda b: views[b].collective_rows).astype(bool)]
    sized = df.groupby("benchmark")["nbytes"].transform(lambda n: (n.astype(float) > 0).any())
    df = df[sized.astype(bool)]
    out = []
    for key, g in df.groupby(keys, sort=True):
        k = dict(zip(keys, key))
        run = k.get("run", "") if "run" in df.columns and df["run"].nunique() > 1 else ""
        # The defaults (variant default, out-of-place) go unsaid.
        who = " ".join(str(x) for x in (run, k["benchmark"], k["variant"], k["placement"], k["stage"],
                                        f"n={k['world']}") if x and x not in ("default", "out-of-place"))
        sizes = g.loc[g["nbytes"].astype(float) > 0, "nbytes"].nunique()
        if sizes < MIN_FIT_SIZES:
            if thin is not None and sizes > 0:
                thin.append(f"{who}: {sizes} size{'s' if sizes > 1 else ''}")
            continue
        factor = _busbw_factor(g)
        fit = fit_alpha_beta(g["nbytes"], g["time_us_p50"], factor)
        if fit is None:
            continue
        why = unphysical_fit(k["world"], factor, fit)
        if why is not None:
            if refused is not None:
                refused.append(f"{who}: {why}")
            continue
        out.append({**k, **fit})
    return pd.DataFrame(out, columns=keys + list(FIT_COLUMNS))


def scaling_table(df):
    """Weak-scaling efficiency over world (docs/ceilings.md#scaling-efficiency).

    Per (run, benchmark, backend, nbytes, dtype, variant, params, stage), each world's
    per-rank throughput against that at the smallest world measured:
    efficiency_pct = value(n) / value(n_min) * 100.

    The throughput is the benchmark's (Benchmark.scaling_metric); by default, for
    collective rows, busbw_gbps, the bytes each rank's busiest link moves per second
    (sizes with nbytes 0, barrier, have none and are skipped). moe gives tokens per
    second per rank, each stage apart. A benchmark that is not `sized` (moe: its bytes
    per rank grow with world) leaves nbytes out of its groups' key, and each row shows
    its own world's bytes.

    Several rows for one (group, world) are reduced to their median. Groups measured
    at a single world are dropped. Columns: the keys + world, metric, value,
    base_world, efficiency_pct.
    """
    import pandas as pd

    raw = _frame(df)
    keys = (["run"] if "run" in raw.columns else []) + list(SCALING_KEYS)
    cols = keys + list(SCALING_COLUMNS)
    if raw.empty:
        return pd.DataFrame(columns=cols)
    df = _keyed(raw, keys + ["world"])
    views = presenters(df)
    by_size, unsized = [], []
    for bench, g in df.groupby("benchmark", sort=False):
        b = views[bench]
        got = b.scaling_metric(raw.loc[g.index])  # the hook sees params as dicts
        if got is None:
            if not b.collective_rows:
                continue
            # World 1 moves nothing over a link: its busbw (a broadcast's 100,000 GB/s) is no base.
            g = g[(g["nbytes"].astype(float) > 0) & (g["world"].astype(int) > 1)]
            if "busbw_gbps" not in g.columns:
                if len(g):
                    raise UsageError("rows lack the column busbw_gbps")
                continue
            got = ("busbw_gbps", g["busbw_gbps"])
        metric, values = got
        (by_size if b.sized else unsized).append(g.assign(metric=metric, value=np.asarray(values, dtype=float)))

    out = []
    for parts, gkeys in ((by_size, keys), (unsized, [k for k in keys if k != "nbytes"])):
        if not parts:
            continue
        part = pd.concat(parts)
        part = part[np.isfinite(part["value"]) & (part["value"] > 0)]
        # One groupby for every group (not one per group: a run of 300k rows has 100k groups).
        # Sorted by the group's key, then world: each group's first row is its base world.
        med = part.groupby(gkeys + ["world"], sort=True).agg(
            value=("value", "median"), nbytes_median=("nbytes", "median"), metric=("metric", "first")).reset_index()
        by = med.groupby(gkeys, sort=False)
        med = med[by["world"].transform("size") >= 2]
        if med.empty:
            continue
        by = med.groupby(gkeys, sort=False)
        med = med.assign(base_world=by["world"].transform("first"), base=by["value"].transform("first"),
                         group_metric=by["metric"].transform("first"))
        for r in med.to_dict("records"):
            out.append({**{k: r[k] for k in gkeys}, "nbytes": int(r["nbytes"] if "nbytes" in gkeys else
                                                                  r["nbytes_median"]),
                        "world": int(r["world"]), "metric": r["group_metric"], "value": float(r["value"]),
                        "base_world": int(r["base_world"]), "efficiency_pct": float(r["value"]) / r["base"] * 100.0})
    return pd.DataFrame(out, columns=cols)


def largest_size(sc):
    """Of a scaling_table, each group of a sized benchmark at its largest size (the one
    nearest the link's rate: at small sizes busbw is latency, not bandwidth); an unsized
    benchmark's groups (moe: no size key) whole."""
    import pandas as pd

    if sc.empty:
        return sc
    keys = [k for k in ("run",) + SCALING_KEYS if k in sc.columns and k != "nbytes"]
    sized = {b: v.sized for b, v in presenters(sc).items()}
    parts = []
    for _, g in sc.groupby(keys, sort=False):
        if sized[g["benchmark"].iloc[0]]:
            g = g[g["nbytes"] == g["nbytes"].max()]
        parts.append(g)
    return pd.concat(parts)
