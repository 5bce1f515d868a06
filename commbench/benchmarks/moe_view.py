"""How moe rows are shown: the terminal table, the report section, the figures against
tokens and against routing skew, and weak scaling in tokens per second per rank. Called
through the MoE class's presentation hooks (benchmarks/base.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..verdicts import cannot_judge, excluded_note, trusted_mask
from ..viewkit import (ALWAYS, COMPACT, WIDE, FigureInfo, Finding, Section, add_column, fmt, has, int_log2_axis,
                       judge_ceiling, labeler, new_figure, num, params_order, save_figure, table, text, varying_params)

# Routing -> (its skew parameter, short name in a terminal cell, name in the report, axis label).
SKEW_AXES = {"zipf": ("alpha", "a", "alpha", "Zipf exponent alpha"),
             "hot_rank": ("ratio", "r", "ratio", "hot-rank load ratio"),
             "group_limited": ("max_groups", "M", "M", "max node groups per token (M)")}


# Shown in every shape, or as the routing's skew, the mode and the path: never again as key=value.
_IN_SHAPE = {"tokens", "hidden", "experts", "topk", "routing", "mode", "path", "capacity", "copies"} | \
    {a[0] for a in SKEW_AXES.values()}


def shape(p: dict, terminal: bool = True, vary=()) -> str:
    """The point's shape in a cell: T, H, E, K, copies (in the terminal always; in the
    report when it varies: rank and expert copies differ several times in bytes), routing
    and its skew, a mode or path that is not the default, and any other param in `vary`
    (those that take several values among the rows shown: dispatch dtype, seed, ...)."""
    axis = SKEW_AXES.get(p.get("routing"))
    skew = f" {axis[1] if terminal else axis[2]}={p.get(axis[0])}" if axis else ""
    copies = f"{p.get('copies')} " if terminal else (f"copies={p.get('copies')} " if "copies" in vary else "")
    # The dispatch's mode and path, where they are not the default one (normal, flat).
    modes = "".join(f" {v}" for v in (p.get("mode"), p.get("path")) if v not in (None, "normal", "flat"))
    if p.get("mode") == "low_latency" and p.get("capacity"):
        modes += f" cap={p['capacity']}"
    extra = "".join(f" {k}={p[k]}" for k in vary if k not in _IN_SHAPE and k in p)
    return (f"T={p.get('tokens')} H={p.get('hidden')} E={p.get('experts')} K={p.get('topk')} "
            f"{copies}{p.get('routing')}{skew}{modes}{extra}")


def ordered(rows: list[dict]) -> list[dict]:
    """Rows by run, world, then the shape in the benchmark's declared param order (routing,
    then its skew by value: zipf 0.0, 0.5, 1.0 ...), dispatch before combine."""
    from .base import for_rows

    declared = for_rows(rows[0]["benchmark"]).params if rows else {}
    return sorted(rows, key=lambda r: (text(r.get("run")), int(r["world"]), params_order(r.get("params"), declared),
                                       text(r.get("stage")) != "dispatch", text(r.get("stage"))))


# ---------------------------------------------------------------------------------------
# tables

def terminal_table(rs: list[dict], plain: bool):
    """Dispatch and combine side by side with the three byte counts and the stages."""
    t = table(f"moe dispatch/combine  [{rs[0]['backend']}/{rs[0]['device']}]",
              "GB/s = the most loaded rank's bytes / slowest-rank p50. logical: rows received incl. "
              "from itself (DeepEP); remote: from other ranks; up/out: from the same / other nodes. "
              "load = max/mean rows received (hottest rank). stages: p50 us, slowest rank. "
              "% line: per-tier time bound at the profile's line rate / p50", plain)
    rs = ordered(rs)
    show_run = len({r.get("run") for r in rs}) > 1
    vary = [k for k in varying_params(r.get("params") for r in rs) if k != "copies"]
    out = any(has(r.get("scaleout_gbps")) and r["scaleout_gbps"] > 0 for r in rs)
    # The identity of a point, its time and the hottest rank's rate and load always; the
    # other byte counts and the tail while the table fits; the per-stage split with --wide.
    cols = [("run", True, ALWAYS, show_run), ("world", False, ALWAYS, True), ("shape", True, ALWAYS, True),
            ("stage", True, ALWAYS, True), ("dtype", True, WIDE, True), ("p50 (us)", False, ALWAYS, True),
            ("p99 (us)", False, COMPACT, True), ("max (us)", False, WIDE, True), ("logical", False, COMPACT, True),
            ("remote", False, ALWAYS, True), ("scale-up", False, WIDE, True),
            ("scale-out", False, COMPACT if out else WIDE, True), ("load (hot)", False, ALWAYS, True),
            ("stages (us)", True, WIDE, True), ("outside a2a", False, WIDE, True), ("% line", False, COMPACT, True),
            ("check", True, ALWAYS, True)]
    cols = [c for c in cols if c[3]]
    for name, left, level, _ in cols:
        add_column(t, name, left, level, wrap=name in ("shape", "stages (us)"))
    for r in rs:
        stages = " ".join(f"{k[9:]}={r[k]:.0f}" for k in r if k.startswith("stage_us_") and r[k] == r[k])
        hot = f"{fmt(r.get('load_max_over_mean'))} (r{int(r['hottest_rank'])})" if has(r.get("hottest_rank")) else "-"
        cell = {"run": text(r.get("run")), "world": str(r["world"]), "shape": shape(r.get("params") or {}, vary=vary),
                "stage": text(r.get("stage")), "dtype": text(r.get("dtype")), "p50 (us)": fmt(r["time_us_p50"], 1),
                "p99 (us)": fmt(r["time_us_p99"], 1), "max (us)": fmt(r.get("time_us_max"), 1),
                "logical": fmt(r.get("logical_gbps")), "remote": fmt(r.get("remote_gbps")),
                "scale-up": fmt(r.get("scaleup_gbps")), "scale-out": fmt(r.get("scaleout_gbps")), "load (hot)": hot,
                "stages (us)": stages, "outside a2a": f"{fmt(r.get('outside_a2a_pct'), 0)}%",
                "% line": fmt(r.get("pct_of_ceiling"), 1), "check": text(r.get("check"))}
        t.add_row(*[cell[c[0]] for c in cols])
    return t


def section(m, figures: list) -> Section:
    """report.md/report.html: one row per point and stage (the params that vary among the
    rows in the shape), the figures above it, or why there are none; the summary's MoE
    findings."""
    m = m.copy()
    m["params"] = m["params"].map(lambda p: p or {})
    rows_in = ordered(m.to_dict("records"))
    multi_run = m["run"].nunique() > 1
    vary = varying_params(m["params"])
    ceil = "pct_of_ceiling" in m.columns and m["pct_of_ceiling"].astype(float).notna().any()
    heads = (["run"] if multi_run else []) + ["world", "shape", "stage", "p50 (us)", "p99 (us)", "logical GB/s",
                                               "remote GB/s", "load (hot rank)"] + (["% line"] if ceil else []) + \
        ["check"]
    rows = []
    for r in rows_in:
        hot = r.get("hottest_rank")
        hot = str(int(hot)) if has(hot) and fmt(hot) != "-" else text(hot)
        load = f"{fmt(r.get('load_max_over_mean'))} (r{hot})" if has(r.get("load_max_over_mean")) else "-"
        cells = ([text(r["run"])] if multi_run else []) + [
            str(r["world"]), shape(r.get("params") or {}, terminal=False, vary=vary), text(r.get("stage")),
            fmt(r["time_us_p50"], 1), fmt(r["time_us_p99"], 1), fmt(r.get("logical_gbps")), fmt(r.get("remote_gbps")),
            load]
        if ceil:
            cells.append(fmt(r.get("pct_of_ceiling"), 1))
        cells.append(text(r.get("check")))
        rows.append(cells)
    note = "GB/s = the most loaded rank's bytes / slowest-rank p50; load = max/mean rows received (hottest rank)"
    if not figures:
        note += f"; no figure: {no_figure_reason(_frame(m))}"
    return Section("MoE dispatch / combine", note, heads, rows, figures, findings=findings(m, vary))


def no_figure_reason(m) -> str:
    """Why figures() drew nothing: what each figure needs that the rows lack."""
    tokens = sorted({int(t) for t in m["tokens"].dropna()})
    skews = ", ".join(f"{r}: {m.loc[m['routing'] == r, f'skew_{pk}'].dropna().nunique()}"
                      for r, (pk, *_) in SKEW_AXES.items() if (m["routing"] == r).any())
    return ("the tokens figure needs one shape at two or more token counts "
            f"(measured: T={','.join(map(str, tokens))}); "
            f"the skew figure needs a routing's skew at two or more values"
            + (f" (values per routing: {skews})" if skews else " (no zipf, hot_rank or group_limited routing ran)"))


def judge_load(load: float) -> str:
    """A hottest-rank load (max/mean rows received) in words."""
    if load <= 1.1:
        return "balanced: every rank receives about the mean"
    if load <= 1.5:
        return "moderate skew: the hottest rank receives more, and the stage waits for it"
    return "heavy skew: the hottest rank sets the stage time"


def findings(m, vary) -> list:
    """The summary's MoE lines, at the largest world of each run: each stage's rate (the
    hottest rank's remote GB/s) over the points measured and the best against the line
    rate; the hottest rank's load at its highest."""
    out = []
    bench = text(m["benchmark"].iloc[0]) if len(m) else ""
    for run, g in m.groupby(m["run"].map(text), sort=True):
        world = int(g["world"].max())
        g = g[g["world"] == world]
        who = f"{run + ' ' if m['run'].nunique() > 1 else ''}n={world}"
        for stage in sorted(g["stage"].map(text).unique(), key=lambda s_: (s_ != "dispatch", s_)):
            s_ = g[g["stage"].map(text) == stage]
            bw = s_["remote_gbps"].astype(float) if "remote_gbps" in s_.columns else s_["busbw_gbps"].astype(float)
            if bw.notna().sum() == 0:
                continue
            rng = f"{num(bw.min())} to {num(bw.max())} GB/s over {len(s_)} points" if len(s_) > 1 else \
                f"{num(bw.max())} GB/s"
            ok = trusted_mask(s_) & bw.notna()  # never a warned, disturbed or oversubscribed row as best
            if not ok.any():
                out.append(Finding(bench, f"{stage} ({who})", rng, cannot_judge(s_, "the rate")))
                continue
            best = s_.loc[bw[ok].idxmax()]
            pct = best.get("pct_of_ceiling")
            where = shape(best["params"], terminal=False, vary=vary)
            out.append(Finding(bench, f"{stage} ({who})", f"{rng}; best {where}"
                               + (f" = {fmt(pct, 1)}% of the line rate" if has(pct) else "") + excluded_note(s_, ok),
                               judge_ceiling(pct)))
        if "load_max_over_mean" in g.columns and g["load_max_over_mean"].astype(float).notna().any():
            ld = g["load_max_over_mean"].astype(float)
            hot = g.loc[ld.idxmax()]
            out.append(Finding(bench, f"hottest-rank load ({who})",
                               f"{fmt(ld.max())} max/mean at {shape(hot['params'], terminal=False, vary=vary)}"
                               + (f"; {fmt(ld.min())} at the most even point" if len(g) > 2 else ""),
                               judge_load(float(ld.max()))))
    return out


def scaling_metric(m) -> tuple:
    """Tokens per second per rank, each stage apart. Bytes per rank are the wrong measure
    here: in weak scaling the tokens per rank are fixed, but the remote share of each
    rank's copies (and so its bytes) grows with world, so a byte rate would flatter larger
    worlds."""
    tokens = m["params"].map(lambda p: (p or {}).get("tokens"))
    if tokens.map(lambda t: t is None or (isinstance(t, float) and math.isnan(t))).any():
        raise UsageError("moe rows need params with 'tokens' for tokens/s per rank")
    t_us = m["time_us_p50"].astype(float)
    return "tokens_per_s_per_rank", np.where(t_us > 0, tokens.astype(float) / (t_us * 1e-6), np.nan)


# ---------------------------------------------------------------------------------------
# figures: p50 time, bandwidth and the hottest rank's load, against tokens and against skew

_CAPTION = "p50 time, bandwidth (the hottest rank's remote bytes / p50) and the hottest rank's load"


def _frame(rows):
    m = rows.copy()
    p = m["params"]
    m["tokens"] = p.map(lambda x: x.get("tokens"))
    m["routing"] = p.map(lambda x: x.get("routing", ""))
    for pk, *_ in SKEW_AXES.values():
        m[f"skew_{pk}"] = p.map(lambda x, pk=pk: x.get(pk))
    # Shape without tokens (tokens is the x axis of one figure).
    m["shape_nt"] = p.map(lambda x: json.dumps({k: v for k, v in x.items() if k != "tokens"}, sort_keys=True))
    m["bw"] = m["remote_gbps"].astype(float) if "remote_gbps" in m.columns else m["busbw_gbps"].astype(float)
    m["load"] = m["load_max_over_mean"].astype(float) if "load_max_over_mean" in m.columns else math.nan
    return m


def _group(axes, col, grp, xcol, lab):
    """One (run, world, shape) group: p50 time and bandwidth per stage (dispatch solid,
    combine dashed) in one colour; the load once (it does not depend on the stage)."""
    ax_t, ax_b, ax_l = (axes[r][col] for r in range(3))
    series, color = [], None
    for stage, s in sorted(grp.groupby("stage"), key=lambda kv: kv[0] != "dispatch"):
        s = s.sort_values(xcol)
        x = s[xcol].astype(float)
        style = "--" if stage == "combine" else "-"
        name = f"{lab} {stage}".strip()
        (line,) = ax_t.plot(x, s["time_us_p50"].astype(float), marker="o", ms=3, ls=style, color=color, label=name)
        color = line.get_color()
        ax_b.plot(x, s["bw"], marker="o", ms=3, ls=style, color=color, label=name)
        series.append(name)
    first = grp[grp["stage"] == grp["stage"].iloc[0]].sort_values(xcol)
    ax_l.plot(first[xcol].astype(float), first["load"], marker="s", ms=3, color=color, label=f"{lab} load".strip())
    return series


def _decorate(axes, col, xlabel, title):
    ax_t, ax_b, ax_l = (axes[r][col] for r in range(3))
    # p50 spans decades across skews and token counts (a hot rank can take 100x): log.
    ax_t.set_yscale("log")
    ax_t.set_ylabel("p50 time (us, log)")
    ax_b.set_ylabel("remote GB/s (hottest rank)")
    ax_l.set_ylabel("load max/mean (hottest rank)")
    ax_l.axhline(1.0, color="0.6", lw=0.8)
    ax_t.set_title(title)
    for ax in (ax_t, ax_b, ax_l):
        ax.grid(True, alpha=0.3)
    ax_l.set_xlabel(xlabel)
    ax_t.legend(fontsize=7, loc="best")


def _skew_figure(m, out_dir: Path, name: str) -> FigureInfo | None:
    fams = []
    for routing, (pk, _, _, xlabel) in SKEW_AXES.items():
        f = m[m["routing"] == routing]
        if f[f"skew_{pk}"].dropna().nunique() >= 2:
            fams.append((routing, pk, xlabel, f))
    if not fams:
        return None
    fig, axes = new_figure(3, len(fams), w=5.2 * len(fams) + 1, h=9.0, sharex="col")
    series = []
    for col, (routing, pk, xlabel, f) in enumerate(fams):
        f = f.copy()
        f["shape"] = f["params"].map(lambda p, pk=pk: json.dumps({k: v for k, v in p.items() if k != pk},
                                                                 sort_keys=True))
        keys = ["run", "world", "shape"]
        # The shape's varying params (copies, tokens, ...) in the label: one entry a line.
        label = labeler(f.assign(params_key=f["shape"]), ["run", "world", "params_key"])
        for key, grp in f.groupby(keys, sort=True):
            r = dict(zip(keys, key))
            r["params_key"] = r.pop("shape")
            series += _group(axes, col, grp, f"skew_{pk}", label(r))
        tokens = sorted({int(t) for t in f["tokens"].dropna()})
        _decorate(axes, col, xlabel, f"moe {routing}: vs skew (T={','.join(map(str, tokens))})")
    fig.suptitle("MoE dispatch (solid) / combine (dashed) vs routing skew")
    return FigureInfo(f"{name}_skew", save_figure(fig, out_dir, f"{name}_skew"), "MoE vs skew",
                      f"{_CAPTION} (max/mean rows received) per skew parameter", series)


def _tokens_figure(m, out_dir: Path, name: str) -> FigureInfo | None:
    keys = ["run", "world", "shape_nt"]
    groups = [(k, s) for k, s in m.groupby(keys, sort=True) if s["tokens"].dropna().nunique() >= 2]
    if not groups:
        return None
    fig, axes = new_figure(3, 1, w=8.0, h=9.0, sharex="col")
    sub = m[m.set_index(keys).index.isin([k for k, _ in groups])]
    label = labeler(sub.assign(params_key=sub["shape_nt"]), ["run", "world", "params_key"])
    series, xs = [], set()
    for key, grp in groups:
        r = dict(zip(keys, key))
        r["params_key"] = r.pop("shape_nt")
        xs |= set(grp["tokens"].astype(float))
        series += _group(axes, 0, grp, "tokens", label(r))
    _decorate(axes, 0, "tokens per rank (log2)", "")
    for r_ in range(3):
        int_log2_axis(axes[r_][0], xs, "tokens per rank (log2)" if r_ == 2 else "")
    fig.suptitle("MoE dispatch (solid) / combine (dashed) vs tokens")
    return FigureInfo(f"{name}_tokens", save_figure(fig, out_dir, f"{name}_tokens"), "MoE vs tokens",
                      f"{_CAPTION} per tokens-per-rank value", series)


def figures(rows, out_dir: Path, name: str) -> list[FigureInfo]:
    """<name>_tokens (when a shape was measured at several token counts) and <name>_skew
    (when a routing's skew parameter took several values)."""
    if rows.empty:
        return []
    m = _frame(rows)
    return [f for f in (_tokens_figure(m, out_dir, name), _skew_figure(m, out_dir, name)) if f is not None]
