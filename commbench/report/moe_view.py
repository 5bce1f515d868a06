"""How moe rows are shown: the terminal table, the report section, the figures against
tokens and against routing skew, and weak scaling in tokens per second per rank. Called
through report/views.py for the MoE benchmark; its shape in words and scaling measure are
the benchmark's own (benchmarks/moe/)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from commbench.analyse.verdicts import cannot_judge, excluded_note, trusted_mask
from commbench.benchmarks.base import for_rows
from commbench.benchmarks.moe import _IN_SHAPE, SKEW_AXES, shape  # noqa: F401 (shape: this view's cells)
from commbench.core.schema import has
from commbench.report.viewkit import (
    ALWAYS,
    COMPACT,
    WIDE,
    FigureInfo,
    Finding,
    Section,
    add_column,
    fmt,
    int_log2_axis,
    judge_ceiling,
    labeler,
    new_figure,
    num,
    params_order,
    save_figure,
    table,
    text,
    varying_params,
)

# Sub-stages in the order a step runs them (every path's names: host, device, hierarchical,
# low-latency); the exchange itself is every stage named a2a*.
STAGE_ORDER = ("layout", "counts", "sync", "pack", "a2a", "a2a_out", "forward", "a2a_in", "unpack", "reduce")
# Two stages whose times are this close (ratio) share the decision: p50s of one run move by
# more than that on a shared host.
CLOSE_RATIO = 1.25


def stage_times(r: dict) -> list[tuple[str, float]]:
    """[(sub-stage, p50 us of the slowest rank)] of one row, in STAGE_ORDER."""
    got = {k[len("stage_us_"):]: float(v) for k, v in r.items() if k.startswith("stage_us_") and has(v)
           and math.isfinite(float(v))}
    return sorted(got.items(), key=lambda kv: (STAGE_ORDER.index(kv[0]) if kv[0] in STAGE_ORDER else 99, kv[0]))


def deciding(r: dict) -> tuple[list[str], float] | None:
    """The sub-stage(s) that decide a row's time: the longest, with any other within
    CLOSE_RATIO of it; and their share of the step in per cent: of p50, or of the
    sub-stages' sum where their medians add up to more than p50 (never over 100 %). None
    without stages."""
    st = [(k, v) for k, v in stage_times(r) if v > 0]
    p50 = float(r.get("time_us_p50") or 0)
    if not st or p50 <= 0:
        return None
    top = max(v for _, v in st)
    names = [k for k, v in sorted(st, key=lambda kv: -kv[1]) if v * CLOSE_RATIO >= top]
    return names, 100.0 * sum(v for k, v in st if k in names) / max(p50, sum(v for _, v in st))


def decided_cell(r: dict) -> str:
    """"a2a 63%", "reduce+a2a 92%": a table cell naming what decides a row."""
    d = deciding(r)
    return f"{'+'.join(d[0])} {d[1]:.0f}%" if d else "-"


def tokens_per_s(r: dict) -> float:
    """Tokens per second per rank: the rank's tokens over the step's p50."""
    t, p50 = (r.get("params") or {}).get("tokens"), float(r.get("time_us_p50") or 0)
    return float(t) / (p50 * 1e-6) if has(t) and p50 > 0 else math.nan


def _in_words(names: list[str]) -> str:
    ex = [n for n in names if n.startswith("a2a")]
    other = [n for n in names if not n.startswith("a2a")]
    parts = ([f"the exchange ({'+'.join(ex)})"] if ex else []) + \
        ([f"{'+'.join(other)} outside the exchange"] if other else [])
    return " and ".join(parts)


def judge_stages(rs: list[dict]) -> str:
    """The verdict of one stage (dispatch or combine) over its points: which sub-stage
    decides, its share of the step (deciding()), and, where the exchange decides, how
    near the link it is. Rests on the per-stage p50s of the slowest rank; stages within CLOSE_RATIO are named
    together, since a shared host moves them by that much."""
    dec = [(r, deciding(r)) for r in rs]
    dec = [(r, d) for r, d in dec if d is not None]
    if not dec:
        pcts = [r.get("pct_of_ceiling") for r in rs if has(r.get("pct_of_ceiling"))]
        return judge_ceiling(max(pcts) if pcts else None) + " (no per-stage times in the rows)"
    names = list(dict.fromkeys(n for _, d in dec for n in d[0]))
    shares = [d[1] for _, d in dec]
    share = f"{min(shares):.0f}%" if len(shares) == 1 or round(min(shares)) == round(max(shares)) else \
        f"{min(shares):.0f}-{max(shares):.0f}%"
    words = _in_words(names)
    out = f"{words} {'decide' if ' and ' in words else 'decides'}: {share} of the step (per-stage p50s, slowest rank)"
    if any(n.startswith("a2a") for n in names) and not all(n.startswith("a2a") for n in names):
        out += "; the exchange and work outside it both set the time"
    elif all(n.startswith("a2a") for n in names):
        pcts = [float(r["pct_of_ceiling"]) for r, _ in dec if has(r.get("pct_of_ceiling"))]
        if pcts:
            out += f"; the step runs at {fmt(max(pcts), 1)}% of the link's line rate at best"
    else:
        out += "; work outside the exchange, not the link, sets the time"
    return out


def ordered(rows: list[dict]) -> list[dict]:
    """Rows by run, world, then the shape in the benchmark's declared param order (routing,
    then its skew by value: zipf 0.0, 0.5, 1.0 ...), dispatch before combine."""
    declared = for_rows(rows[0]["benchmark"]).params if rows else {}
    return sorted(rows, key=lambda r: (text(r.get("run")), int(r["world"]), params_order(r.get("params"), declared),
                                       text(r.get("stage")) != "dispatch", text(r.get("stage"))))


# ---------------------------------------------------------------------------------------
# tables

# What both GB/s columns divide, said under every MoE table.
GBPS_NOTE = ("ours GB/s = the most loaded rank's bytes to other ranks / slowest-rank p50; DeepEP GB/s = rows "
             "received incl. the rank's own (DeepEP's tests' count) / the same p50; scale-up (NVLink) and "
             "scale-out (RDMA) GB/s: the most loaded rank's bytes on each tier / p50; tokens/s = tokens per rank / "
             "p50; decided by = the longest sub-stage(s) and their share of the step (of p50, or of the sub-stages' "
             "sum where their medians add up to more); load = max/mean rows received "
             "(hottest rank); GB = 1e9 B")


def terminal_table(rs: list[dict], plain: bool):
    """Dispatch and combine side by side: time, both GB/s, the per-tier split, tokens/s,
    the sub-stage that decides, the load."""
    t = table(f"moe dispatch/combine  [{rs[0]['backend']}/{rs[0]['device']}]",
              GBPS_NOTE + "; stages (us): p50 of each sub-stage, slowest rank; % line: per-tier time bound at the "
              "profile's line rate / p50", plain)
    rs = ordered(rs)
    show_run = len({r.get("run") for r in rs}) > 1
    vary = [k for k in varying_params(r.get("params") for r in rs) if k != "copies"]
    # The identity of a point, its time, both rates, the tier split and what decides always;
    # the tail, tokens/s and the load while the table fits; the raw stage split with --wide.
    # Two-line headers: the rates' columns are as narrow as their numbers.
    cols = [("run", True, ALWAYS, show_run), ("world", False, ALWAYS, True), ("shape", True, ALWAYS, True),
            ("stage", True, ALWAYS, True), ("dtype", True, WIDE, True), ("p50 (us)", False, ALWAYS, True),
            ("p99 (us)", False, COMPACT, True), ("max (us)", False, WIDE, True),
            ("tokens/s", False, COMPACT, True), ("ours\n(GB/s)", False, ALWAYS, True),
            ("DeepEP\n(GB/s)", False, ALWAYS, True), ("scale-up\n(GB/s)", False, ALWAYS, True),
            ("scale-out\n(GB/s)", False, ALWAYS, True), ("decided\nby", True, ALWAYS, True),
            ("load\n(max/mean)", False, COMPACT, True), ("stages (us)", True, WIDE, True),
            ("outside\na2a (%)", False, WIDE, True), ("% line", False, COMPACT, True), ("check", True, ALWAYS, True)]
    cols = [c for c in cols if c[3]]
    for name, left, level, _ in cols:
        add_column(t, name, left, level, wrap=name in ("shape", "stages (us)"))
    for r in rs:
        stages = " ".join(f"{k}={v:.0f}" for k, v in stage_times(r))
        hot = f"{fmt(r.get('load_max_over_mean'))} (r{int(r['hottest_rank'])})" if has(r.get("hottest_rank")) else "-"
        cell = {"run": text(r.get("run")), "world": str(r["world"]), "shape": shape(r.get("params") or {}, vary=vary),
                "stage": text(r.get("stage")), "dtype": text(r.get("dtype")), "p50 (us)": fmt(r["time_us_p50"], 1),
                "p99 (us)": fmt(r["time_us_p99"], 1), "max (us)": fmt(r.get("time_us_max"), 1),
                "tokens/s": fmt(tokens_per_s(r), 0), "ours\n(GB/s)": fmt(r.get("remote_gbps")),
                "DeepEP\n(GB/s)": fmt(r.get("logical_gbps")), "scale-up\n(GB/s)": fmt(r.get("scaleup_gbps")),
                "scale-out\n(GB/s)": fmt(r.get("scaleout_gbps")), "decided\nby": decided_cell(r),
                "load\n(max/mean)": hot, "stages (us)": stages, "outside\na2a (%)": fmt(r.get("outside_a2a_pct"), 0),
                "% line": fmt(r.get("pct_of_ceiling"), 1), "check": text(r.get("check"))}
        t.add_row(*[cell[c[0]] for c in cols])
    return t


# A MoE table this long or shorter is shown open in the report, not folded.
OPEN_ROWS = 24


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
    heads = (["run"] if multi_run else []) + ["world", "shape", "stage", "p50 (us)", "p99 (us)", "tokens/s",
                                               "ours (GB/s)", "DeepEP (GB/s)", "scale-up (GB/s)", "scale-out (GB/s)",
                                               "decided by", "load (max/mean)"] + (["% line"] if ceil else []) + \
        ["check"]
    rows = []
    for r in rows_in:
        hot = r.get("hottest_rank")
        hot = str(int(hot)) if has(hot) and fmt(hot) != "-" else text(hot)
        load = f"{fmt(r.get('load_max_over_mean'))} (r{hot})" if has(r.get("load_max_over_mean")) else "-"
        cells = ([text(r["run"])] if multi_run else []) + [
            str(r["world"]), shape(r.get("params") or {}, terminal=False, vary=vary), text(r.get("stage")),
            fmt(r["time_us_p50"], 1), fmt(r["time_us_p99"], 1), fmt(tokens_per_s(r), 0), fmt(r.get("remote_gbps")),
            fmt(r.get("logical_gbps")), fmt(r.get("scaleup_gbps")), fmt(r.get("scaleout_gbps")), decided_cell(r),
            load]
        if ceil:
            cells.append(fmt(r.get("pct_of_ceiling"), 1))
        cells.append(text(r.get("check")))
        rows.append(cells)
    note = GBPS_NOTE
    if not [f for f in figures if f.name.endswith("_tokens") or f.name.endswith("_skew")]:
        note += f"; no tokens or skew figure: {no_figure_reason(_frame(m))}"
    return Section("MoE dispatch / combine", note, heads, rows, figures, findings=findings(m, vary),
                   fold=len(rows) > OPEN_ROWS)


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
    """The summary's MoE lines, at the largest world of each run: per stage, each point's
    p50 and both GB/s (or their range over many points) with the sub-stage that decides
    (judge_stages); the hottest rank's load at its highest."""
    out = []
    bench = text(m["benchmark"].iloc[0]) if len(m) else ""
    for run, g in m.groupby(m["run"].map(text), sort=True):
        world = int(g["world"].max())
        g = g[g["world"] == world]
        who = f"{run + ' ' if m['run'].nunique() > 1 else ''}n={world}"
        for stage in sorted(g["stage"].map(text).unique(), key=lambda s_: (s_ != "dispatch", s_)):
            rows = g[g["stage"].map(text) == stage]
            if not len(rows):
                continue
            # Never a warned, disturbed or oversubscribed row as evidence (analyse/verdicts.py).
            ok = trusted_mask(rows)
            if not ok.any():
                out.append(Finding(bench, f"{stage} ({who})", _stage_value(ordered(rows.to_dict("records")), vary),
                                   cannot_judge(rows, "what decides")))
                continue
            rs = ordered(rows[ok].to_dict("records"))
            out.append(Finding(bench, f"{stage} ({who})", _stage_value(rs, vary) + excluded_note(rows, ok),
                               judge_stages(rs)))
        if "load_max_over_mean" in g.columns and g["load_max_over_mean"].astype(float).notna().any():
            ld = g["load_max_over_mean"].astype(float)
            hot = g.loc[ld.idxmax()]
            out.append(Finding(bench, f"hottest-rank load ({who})",
                               f"{fmt(ld.max())} max/mean at {shape(hot['params'], terminal=False, vary=vary)}"
                               + (f"; {fmt(ld.min())} at the most even point" if len(g) > 2 else ""),
                               judge_load(float(ld.max()))))
    return out


# Points a summary line lists one by one; more are given as ranges.
LIST_POINTS = 4


def _stage_value(rs: list[dict], vary) -> str:
    def one(r):
        return (f"{num(r['time_us_p50'])} us, {fmt(r.get('remote_gbps'))} GB/s ours / {fmt(r.get('logical_gbps'))} "
                f"GB/s DeepEP, {num(tokens_per_s(r))} tokens/s, {decided_cell(r)}")
    if len(rs) == 1:
        return one(rs[0])
    if len(rs) <= LIST_POINTS:
        # Each point by the params that tell the points apart (the shape is in the table).
        def who(p):
            return " ".join(f"{k}={p.get(k)}" for k in vary) or shape(p, terminal=False)
        return "; ".join(f"{who(r['params'])}: {one(r)}" for r in rs)
    t = [float(r["time_us_p50"]) for r in rs]
    bw = [float(r["remote_gbps"]) for r in rs if has(r.get("remote_gbps"))]
    return (f"{len(rs)} points: {num(min(t))} to {num(max(t))} us"
            + (f", {num(min(bw))} to {num(max(bw))} GB/s ours" if bw else ""))


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


# One colour per sub-stage in every stage figure; the exchange in the strong ones.
_STAGE_COLOURS = {"layout": "#9ecae1", "counts": "#c6dbef", "sync": "#fdd0a2", "pack": "#a1d99b", "a2a": "#d62728",
                  "a2a_out": "#d62728", "a2a_in": "#ff7f0e", "forward": "#9467bd", "unpack": "#bcbddc",
                  "reduce": "#1f77b4", "other": "#bbbbbb"}


def stages_figure(rows, out_dir: Path, name: str) -> FigureInfo | None:
    """<name>_stages: where the time goes. One panel per stage (dispatch, combine), one
    horizontal bar per configuration and rank count, stacked by sub-stage (p50 of each,
    slowest rank); what the sub-stages leave of p50 is grey ("other"), and each bar ends
    with its p50 and what decides it. Drawn for every run with per-stage times."""
    rs = [r for r in ordered(rows.to_dict("records")) if stage_times(r)]
    if not rs:
        return None
    stages = sorted({text(r.get("stage")) for r in rs}, key=lambda s_: (s_ != "dispatch", s_))
    vary = [k for k in varying_params(r.get("params") for r in rs) if k != "copies"]
    multi_run = len({text(r.get("run")) for r in rs}) > 1
    n_bars = max(sum(1 for r in rs if text(r.get("stage")) == st) for st in stages)
    fig, axes = new_figure(1, len(stages), w=6.0 * len(stages) + 1, h=1.6 + 0.45 * n_bars)
    series, seen = [], set()
    for col, st in enumerate(stages):
        ax = axes[0][col]
        mine = [r for r in rs if text(r.get("stage")) == st]
        labels, right = [], 0.0
        for y, r in enumerate(mine):
            p = r.get("params") or {}
            labels.append(" ".join(x for x in ((text(r.get("run")) if multi_run else ""), f"n={r['world']}",
                                               f"copies={p.get('copies')}" if p.get("copies") else "",
                                               shape(p, terminal=False, vary=vary) if vary else "") if x))
            left = 0.0
            parts = stage_times(r)
            rest = float(r["time_us_p50"]) - sum(v for _, v in parts)
            if rest > 0:
                parts = parts + [("other", rest)]
            for k, v in parts:
                ax.barh(y, v, left=left, color=_STAGE_COLOURS.get(k, "#999999"), edgecolor="white", lw=0.5,
                        label=k if k not in seen else None)
                seen.add(k)
                left += v
            # The step's own p50 as a tick: medians of the sub-stages need not add up to it.
            p50 = float(r["time_us_p50"])
            ax.plot([p50, p50], [y - 0.42, y + 0.42], color="black", lw=1.2, label="p50 of the step"
                    if "p50" not in seen else None)
            seen.add("p50")
            ax.text(max(left, p50), y, f" p50 {num(p50)} us, {decided_cell(r)}", va="center", fontsize=7)
            right = max(right, left, p50)
            series.append(f"{labels[-1]} {st}")
        ax.set_yticks(range(len(mine)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("time (us), p50 of each sub-stage, slowest rank")
        ax.set_title(st)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlim(0, right * 1.55)
    handles, names = [], []
    for ax in axes[0]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    order = sorted(range(len(names)), key=lambda i: (STAGE_ORDER + ("other", "p50 of the step")).index(names[i])
                   if names[i] in STAGE_ORDER + ("other", "p50 of the step") else 99)
    axes[0][-1].legend([handles[i] for i in order], [names[i] for i in order], fontsize=7, loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), borderaxespad=0, title="sub-stage", title_fontsize=7)
    fig.suptitle("MoE: where the time goes (stacked sub-stages)")
    return FigureInfo(f"{name}_stages", save_figure(fig, out_dir, f"{name}_stages"), "MoE stage breakdown",
                      "p50 of each sub-stage of dispatch and combine (slowest rank), stacked, per configuration and "
                      "rank count; grey: the part of p50 the sub-stages do not cover; black tick: the step's p50 (the "
                      "sub-stages' medians need not add up to it); after each bar its p50 and the sub-stage(s) that "
                      "decide it", series)


def figures(rows, out_dir: Path, name: str) -> list[FigureInfo]:
    """<name>_stages (every run with per-stage times), <name>_tokens (when a shape was
    measured at several token counts) and <name>_skew (when a routing's skew parameter
    took several values)."""
    if rows.empty:
        return []
    m = _frame(rows)
    return [f for f in (stages_figure(m, out_dir, name), _tokens_figure(m, out_dir, name),
                        _skew_figure(m, out_dir, name)) if f is not None]
