"""Variants side by side: per collective, world, dtype and placement, each variant's p50,
bandwidths, wire rate, % of the scale-up ceiling and speedup over the baseline, and a
verdict per variant that rests only on usable rows (analyse/verdicts.py)."""
from __future__ import annotations

import json

from commbench.analyse.analysis import presenters
from commbench.analyse.speedups import (
    MIN_PAIRS,
    judged_from,
    pairing,
    pick_baseline,
    size_verdict,
    usable_pairs,
    wire_gbps,
)
from commbench.analyse.verdicts import CANNOT_JUDGE, NO_CHANGE, changes_algorithm, median_row, untrusted_reason
from commbench.core.schema import has
from commbench.core.units import fmt_size
from commbench.report.fmt import fixed, size_cells, text
from commbench.report.tables import ALWAYS, COMPACT, WIDE


def variant_comparisons(df, baseline: str | None = None) -> list[dict]:
    """Side by side per collective, world, dtype and placement (and run): each variant's
    p50, algbw, busbw, wire bandwidth (algbw*(n+1)/n for in-switch variants, else busbw),
    % of the scale-up ceiling and speedup over the baseline; then per variant its best
    speedup and the size from which it wins. One dict a group: title, caption, columns
    [(header, level)] (the terminal's: one "busbw" per variant), headers (each named with
    its variant), rows (text cells), lines (the verdict of each variant, text) and
    verdicts [(variant, best speedup, its size, crossover size, judgement)]: best, size and
    crossover None when the variant was not clearly faster at any size, or when neither it
    nor the baseline changes this collective's algorithm ("no change expected"); claims
    {variant: {"faster": sizes, "slower": sizes}}, the sizes it was judged clearly faster or
    slower at. A verdict needs MIN_PAIRS interleaved repeats in fresh launches (_judge)."""
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
        lines, verdicts, claims = [], [], {}
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
                claims[n] = {"faster": [], "slower": []}
                continue
            verdict, claims[n] = _judge(g, base, n, speed[n], span)
            verdicts.append((n, *verdict))
            lines.append(head + verdict[-1])
        full = ["size (B)"] + [h if i % 6 == 0 else f"{here[i // 6]} {h}" for i, (h, _) in enumerate(cols[1:])]
        out.append({"headers": full,
                    "title": f"{bench} world {world} {k.get('dtype', '')}{(' ' + where) if where else ''}: "
                             f"variants side by side (baseline {base})",
                    "caption": "wire = algbw*(n+1)/n for in-switch variants (what each link carries), busbw "
                               "otherwise; % line = wire or busbw of the scale-up ceiling's line rate; x = speedup of "
                               "p50 over the baseline",
                    "benchmark": bench, "world": int(world), "baseline": base, "columns": cols, "rows": rows,
                    "lines": lines, "verdicts": verdicts, "claims": claims})
    return out


def _judge(g, base: str, n: str, speed: list, span: str) -> tuple[tuple, dict]:
    """Variant n against the baseline over the sizes both ran: (best speedup, its size, the
    size from which it is clearly faster, the line) and its claims {"faster": sizes,
    "slower": sizes}. No "clearly" without MIN_PAIRS interleaved repeats in fresh launches
    (variants.pairing); then a size counts where every pair agrees (variants.size_verdict)."""
    sizes = [s_ for s_, _ in speed]
    both = g[g["variant"].isin([n, base]) & g["nbytes"].isin(sizes)]
    rows = {v: both[both["variant"] == v].to_dict("records") for v in (base, n)}
    bad = sum(1 for r in rows[base] + rows[n] if untrusted_reason(r))
    tail = f"; {span}" + (f"; {bad} row(s) not usable (warning, disturbed or oversubscribed)" if bad else "")
    pairs, why, hint = pairing(rows[base], rows[n])
    if why:
        return (None, None, None, f"{CANNOT_JUDGE}: {why} ({hint}){tail}"), {"faster": [], "slower": []}
    usable = [usable_pairs([r for r in rows[base] if r["nbytes"] == s_], [r for r in rows[n] if r["nbytes"] == s_],
                           untrusted_reason) for s_ in sizes]
    judged = [size_verdict(p) for p in usable]
    wins = [(s_, x) for (s_, x), j in zip(speed, judged) if j is True]
    losses = [(s_, x) for (s_, x), j in zip(speed, judged) if j is False]
    thin = sum(len(p) < MIN_PAIRS for p in usable)
    split = judged.count(None) - thin
    basis = f"{pairs} interleaved repeats in fresh launches, every pair agrees"
    tail += f"; at {split} size(s) the pairs disagree" if split else ""
    tail += f"; at {thin} size(s) fewer than {MIN_PAIRS} pairs had both rows usable" if 0 < thin < len(sizes) else ""
    tail += "; a pair agrees when one side's p90 is below the other's p50"
    claims = {"faster": [int(s_) for s_, _ in wins], "slower": [int(s_) for s_, _ in losses]}

    def at(ps):
        return ", ".join(fmt_size(int(s_)) for s_, _ in ps)

    if not wins and not losses:
        why = (f"at no size {MIN_PAIRS} pairs with both rows usable" if thin == len(sizes) else
               "at no size clearly faster or slower in every pair")
        return (None, None, None, f"{CANNOT_JUDGE}: {why} ({pairs} interleaved repeats in fresh launches){tail}"), claims
    parts = []
    if wins:
        best = max(wins, key=lambda p: p[1])
        cross = judged_from(sizes, judged, True)
        parts.append(f"clearly faster at {len(wins)} of {len(sizes)} sizes ({basis}: {at(wins)}); best {best[1]:.2f}x "
                     f"at {fmt_size(int(best[0]))}; " + (f"faster from {fmt_size(int(cross))} up" if cross is not None
                                                         else "not clearly faster at the largest size"))
    if losses:
        worst = min(losses, key=lambda p: p[1])
        slow = judged_from(sizes, judged, False)
        where_ = f": {at(losses)}" if wins else f" ({basis}: {at(losses)})"  # the basis said once a line
        parts.append(f"clearly slower at {len(losses)} of {len(sizes)} sizes{where_}; at worst {worst[1]:.2f}x at "
                     f"{fmt_size(int(worst[0]))}" + (f"; slower from {fmt_size(int(slow))} up" if slow is not None else ""))
    if not wins:
        return (None, None, None, "; ".join(parts) + tail), claims
    return (best[1], int(best[0]), None if cross is None else int(cross), "; ".join(parts) + tail), claims


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


