"""The report's findings on runs of `--repeat N`: each repeat's scaling table apart, the
median efficiency per repeat, and each point's fastest repeat for the latency line."""
from __future__ import annotations

import statistics

from commbench.analyse.analysis import SCALING_KEYS, largest_size, scaling_table
from commbench.report.fmt import num, text


def per_repeat(df) -> dict:
    """A `--repeat N` run's scaling table of each repeat apart ({} without repeats): the
    findings ask whether the repeats agree on the verdict."""
    if "repeat" not in df.columns or df["repeat"].fillna(1).nunique() < 2:
        return {}
    rep = df["repeat"].fillna(1).astype(int)
    out = {}
    for k in sorted(rep.unique()):
        try:
            out[int(k)] = largest_size(scaling_table(df[rep == k]))
        except Exception:  # noqa: BLE001 - a table must not sink the report
            return {}
    return out


def repeat_medians(top, bench: str, per_repeat: dict) -> list[float]:
    """The median efficiency over top's groups (same keys and worlds) in each repeat's table."""
    keys = [k for k in ("run", *SCALING_KEYS, "world", "base_world") if k in top.columns]
    want = {tuple(text(r.get(k)) for k in keys) for r in top.to_dict("records")}
    meds = []
    for t in per_repeat.values():
        if t is None or t.empty:
            continue
        t = t[t["benchmark"] == bench]
        e = [float(r["efficiency_pct"]) for r in t.to_dict("records")
             if tuple(text(r.get(k)) for k in keys) in want]
        if e:
            meds.append(float(statistics.median(e)))
    return meds


def fastest_repeat(rows):
    """A run of `--repeat N`: each point's fastest repeat (what a shared host adds only adds
    time), with the text of its repeats' spread in `_spread`; True when there were repeats.
    Rows without repeats come back as they are."""
    if "repeat" not in rows.columns or rows["repeat"].fillna(1).nunique() < 2:
        return rows.assign(_spread=""), False
    keys = [k for k in ("run", "world", "nbytes", "variant", "placement", "dtype", "params", "stage")
            if k in rows.columns]
    group = rows[keys].astype(str).agg("|".join, axis=1)
    keep, spread = [], {}
    for _, g in rows.groupby(group, sort=False):
        p50 = g["time_us_p50"].astype(float)
        i = p50.idxmin()
        keep.append(i)
        spread[i] = f"; the fastest of {len(g)} repeats, {num(p50.min())}..{num(p50.max())} us" if len(g) > 1 else ""
    out = rows.loc[keep]
    return out.assign(_spread=[spread[i] for i in keep]), True
