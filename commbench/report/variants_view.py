"""Variants side by side: per collective, world, dtype and placement, each variant's p50,
bandwidths, wire rate, % of the scale-up ceiling and speedup over the baseline, and a
verdict per variant that rests only on usable rows (analyse/verdicts.py)."""
from __future__ import annotations

import json

from commbench.analyse.analysis import presenters
from commbench.analyse.variants import crossover_nbytes, pick_baseline, wire_gbps
from commbench.analyse.verdicts import (
    CANNOT_JUDGE,
    NO_CHANGE,
    changes_algorithm,
    faster_at_size,
    median_row,
    untrusted_reason,
)
from commbench.core.schema import has
from commbench.core.units import fmt_size
from commbench.report.viewkit import ALWAYS, COMPACT, WIDE, fixed, size_cells, text


def variant_comparisons(df, baseline: str | None = None) -> list[dict]:
    """Side by side per collective, world, dtype and placement (and run): each variant's
    p50, algbw, busbw, wire bandwidth (algbw*(n+1)/n for in-switch variants, else busbw),
    % of the scale-up ceiling and speedup over the baseline; then per variant its best
    speedup and the size from which it wins. One dict a group: title, caption, columns
    [(header, level)] (the terminal's: one "busbw" per variant), headers (each named with
    its variant), rows (text cells), lines (the verdict of each variant, text) and
    verdicts [(variant, best speedup, its size, crossover size, judgement)]: best, size and
    crossover None when the variant was not clearly faster at any size, or when neither it
    nor the baseline changes this collective's algorithm ("no change expected")."""
    if df.empty or "variant" not in df:
        return []
    df = df.copy()
    df["variant"] = df["variant"].map(text).replace("", "default")
    names = list(dict.fromkeys(df["variant"]))
    if len(names) < 2:
        return []
    base = pick_baseline(names, baseline)
    views = presenters(df)
    keys = [k for k in ("run", "benchmark", "world", "dtype", "placement") if k in df.columns]
    for k in keys:
        if k not in ("world",):
            df[k] = df[k].map(text)
    multi_run = "run" in keys and df["run"].nunique() > 1
    out = []
    for key, g in df.groupby(keys, sort=False):
        k = dict(zip(keys, key))
        bench, world = k["benchmark"], k["world"]
        if not (views[bench].sized and views[bench].collective_rows) or g["variant"].nunique() < 2:
            continue
        here = [n for n in names if n in set(g["variant"])]
        inswitch = "inswitch" in g.columns and g["inswitch"].map(lambda v: has(v) and bool(v)).any()
        where = " ".join(x for x in ((k.get("run") if multi_run else ""), k.get("placement", "")) if x)
        cols = [("size (B)", ALWAYS)]
        for n in here:
            cols += [(f"{n} p50 (us)", ALWAYS), ("algbw (GB/s)", WIDE), ("busbw (GB/s)", COMPACT),
                     ("wire (GB/s)", COMPACT if inswitch else WIDE), ("% line", COMPACT), ("x (speedup)", ALWAYS)]
        speed = {n: [] for n in here}
        rows = []
        all_sizes = sorted(set(g["nbytes"]))
        for s_, size in zip(all_sizes, size_cells(all_sizes)):
            cells = [size]
            reps: dict = {}
            for r in g[g["nbytes"] == s_].to_dict("records"):
                reps.setdefault(r["variant"], []).append(r)
            at = {v: median_row(rs) for v, rs in reps.items()}  # repeats: the median one stands for them
            b = at.get(base)
            for n in here:
                r = at.get(n)
                if r is None:
                    cells += ["-"] * 6
                    continue
                wire = wire_gbps(r["algbw_gbps"], int(world), has(r.get("inswitch")) and bool(r.get("inswitch")),
                                 r["busbw_gbps"])
                x = b["time_us_p50"] / r["time_us_p50"] if b is not None and r["time_us_p50"] > 0 else None
                if x is not None:
                    speed[n].append((s_, x))
                cells += [f"{r['time_us_p50']:.2f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}",
                          f"{wire:.3f}", fixed(r.get("pct_of_ceiling"), 1), f"{x:.2f}" if x is not None else "-"]
            rows.append(cells)
        lines, verdicts = [], []
        for n in here:
            if n == base or not speed[n]:
                continue
            head = f"{bench} w{world}{(' ' + where) if where else ''}: {n} vs {base}: "
            xs = [x for _, x in speed[n]]
            span = f"{min(xs):.2f}..{max(xs):.2f}x over {len(xs)} sizes"
            # A variant that sets nothing, or forces other collectives' algorithms only, runs the
            # library's default here: what it shows against the baseline is not its doing.
            plain = [m == "default" or changes_algorithm(_env(g, m), bench) is False for m in (n, base)]
            if plain[0] and (plain[1] or n != "default"):
                judged = (f"{NO_CHANGE}: " + (f"neither changes {bench}'s algorithm here ({span}: noise)" if plain[1]
                                              else f"{n} leaves {bench} at the library's default ({span} is the "
                                                   f"default against {base}, not a speedup of {n})"))
                verdicts.append((n, None, None, None, judged))
                lines.append(head + judged)
                continue
            # A size counts only where both rows may be evidence and the variant is clearly
            # faster, in every repeat when there are several (verdicts.faster_at_size).
            wins, split, losses = [], 0, 0
            for s_, x in speed[n]:
                here_rows = g[g["nbytes"] == s_]
                got = faster_at_size(here_rows[here_rows["variant"] == base].to_dict("records"),
                                     here_rows[here_rows["variant"] == n].to_dict("records"))
                if got:
                    wins.append((s_, x))
                split += got is None
                losses += got is False
            both = g[g["variant"].isin([n, base]) & g["nbytes"].isin([s_ for s_, _ in speed[n]])]
            bad = sum(1 for r in both.to_dict("records") if untrusted_reason(r))
            nrep = int(both.groupby(["variant", "nbytes"]).size().min())
            rest = ((f"rests on {nrep} interleaved repeats of each, {len(xs)} sizes: a size counts when the variant "
                     f"is clearly faster in every repeat (its p90 below the baseline's p50); at {split} size(s) the "
                     f"spread was larger than the effect or a row was unusable") if nrep > 1 else
                    (f"rests on one run of each, {len(xs)} sizes, the spread inside each run (p90 of the variant "
                     f"below the baseline's p50); run-to-run noise not measured"))
            rest += f"; {bad} row(s) not usable (warning, disturbed or oversubscribed)" if bad else ""
            cross = crossover_nbytes([s_ for s_, _ in speed[n]], xs)
            if not wins and losses == len(xs):
                judged = f"not faster: slower at every size ({span}; {rest})"
                verdicts.append((n, None, None, None, judged))
                lines.append(head + judged)
                continue
            if not wins:
                judged = f"{CANNOT_JUDGE} a speedup: at no size clearly faster ({span}; {rest})"
                verdicts.append((n, None, None, None, judged))
                lines.append(head + judged)
                continue
            best = max(wins, key=lambda p: p[1])
            judged = (f"best {best[1]:.2f}x at {fmt_size(int(best[0]))}, clearly faster at {len(wins)} of {len(xs)} "
                      f"sizes; " + (f"faster from {fmt_size(int(cross))} up" if cross is not None
                                    else "never faster at the largest sizes") + f" ({rest})")
            verdicts.append((n, best[1], int(best[0]), None if cross is None else int(cross), judged))
            lines.append(head + judged)
        full = ["size (B)"] + [h if i % 6 == 0 else f"{here[i // 6]} {h}" for i, (h, _) in enumerate(cols[1:])]
        out.append({"headers": full,
                    "title": f"{bench} world {world} {k.get('dtype', '')}{(' ' + where) if where else ''}: "
                             f"variants side by side (baseline {base})",
                    "caption": "wire = algbw*(n+1)/n for in-switch variants (what each link carries), busbw "
                               "otherwise; % line = wire or busbw of the scale-up ceiling's line rate; x = speedup of "
                               "p50 over the baseline",
                    "benchmark": bench, "world": int(world), "baseline": base, "columns": cols, "rows": rows,
                    "lines": lines, "verdicts": verdicts})
    return out


def _env(g, variant: str) -> dict:
    """A variant's environment as its rows recorded it."""
    if "variant_env" not in g.columns:
        return {}
    v = g[g["variant"] == variant]["variant_env"]
    v = v.iloc[0] if len(v) else {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            v = {}
    return v if isinstance(v, dict) else {}


