"""MoE figures: p50 time, bandwidth and the hottest rank's load against tokens and against
routing skew, and where the time goes (stacked sub-stages). Rows that are not evidence are
drawn hollow (figflags). Part of the view "moe" (report/views.py)."""
from __future__ import annotations

import json
from pathlib import Path

from commbench.benchmarks.moe import SKEW_AXES, shape
from commbench.report.document import FigureInfo
from commbench.report.figflags import flag_caption, flag_entry, flags, plot_flagged, row_flagged
from commbench.report.fmt import num, text
from commbench.report.moe_view import STAGE_ORDER, _frame, decided_cell, ordered, stage_times
from commbench.report.order import varying_params
from commbench.report.plotkit import int_log2_axis, labeler, legend_beside, new_figure, save_figure

_CAPTION = "p50 time, bandwidth (the hottest rank's remote bytes / p50) and the hottest rank's load"


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
        bad = flags(s)  # rows that are not evidence: hollow, off the line
        line = plot_flagged(ax_t, x, s["time_us_p50"].astype(float), bad, marker="o", ms=3, ls=style, color=color,
                            label=name)
        color = line.get_color()
        plot_flagged(ax_b, x, s["bw"], bad, marker="o", ms=3, ls=style, color=color, label=name)
        series.append(name)
    first = grp[grp["stage"] == grp["stage"].iloc[0]].sort_values(xcol)
    plot_flagged(ax_l, first[xcol].astype(float), first["load"], flags(first), marker="s", ms=3, color=color,
                 label=f"{lab} load".strip())
    return series


def _decorate(axes, col, xlabel, title, rows):
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
    legend_beside(ax_t, fontsize=7, extra=flag_entry(rows))


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
        _decorate(axes, col, xlabel, f"moe {routing}: vs skew (T={','.join(map(str, tokens))})", f)
    fig.suptitle("MoE dispatch (solid) / combine (dashed) vs routing skew")
    return FigureInfo(f"{name}_skew", save_figure(fig, out_dir, f"{name}_skew"), "MoE vs skew",
                      f"{_CAPTION} (max/mean rows received) per skew parameter"
                      + flag_caption(m[m["routing"].isin([r for r, *_ in fams])]), series)


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
    _decorate(axes, 0, "tokens per rank (log2)", "", sub)
    for r_ in range(3):
        int_log2_axis(axes[r_][0], xs, "tokens per rank (log2)" if r_ == 2 else "")
    fig.suptitle("MoE dispatch (solid) / combine (dashed) vs tokens")
    return FigureInfo(f"{name}_tokens", save_figure(fig, out_dir, f"{name}_tokens"), "MoE vs tokens",
                      f"{_CAPTION} per tokens-per-rank value" + flag_caption(sub), series)


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
            # A row that is not evidence: its bars hollow, outlined in each sub-stage's colour.
            bad = row_flagged(r)
            for k, v in parts:
                c = _STAGE_COLOURS.get(k, "#999999")
                ax.barh(y, v, left=left, color="none" if bad else c, edgecolor=c if bad else "white",
                        lw=1.0 if bad else 0.5, label=k if k not in seen else None)
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
    from matplotlib.patches import Patch

    handles, names = [], []
    for ax in axes[0]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                # A sub-stage's entry filled in its colour, whichever bar (hollow or not) came first.
                handles.append(h if n == "p50 of the step" else Patch(facecolor=_STAGE_COLOURS.get(n, "#999999")))
                names.append(n)
    order = sorted(range(len(names)), key=lambda i: (STAGE_ORDER + ("other", "p50 of the step")).index(names[i])
                   if names[i] in STAGE_ORDER + ("other", "p50 of the step") else 99)
    legend_beside(axes[0][-1], fontsize=7, handles=[handles[i] for i in order], labels=[names[i] for i in order],
                  extra=flag_entry(rows), whole_figure=True, title="sub-stage", title_fontsize=7)
    fig.suptitle("MoE: where the time goes (stacked sub-stages)")
    return FigureInfo(f"{name}_stages", save_figure(fig, out_dir, f"{name}_stages"), "MoE stage breakdown",
                      "p50 of each sub-stage of dispatch and combine (slowest rank), stacked, per configuration and "
                      "rank count; grey: the part of p50 the sub-stages do not cover; black tick: the step's p50 (the "
                      "sub-stages' medians need not add up to it); after each bar its p50 and the sub-stage(s) that "
                      "decide it" + flag_caption(rows).replace("markers", "bars").replace(", not joined by the line", ""),
                      series)


def figures(rows, out_dir: Path, name: str) -> list[FigureInfo]:
    """<name>_stages (every run with per-stage times), <name>_tokens (when a shape was
    measured at several token counts) and <name>_skew (when a routing's skew parameter
    took several values)."""
    if rows.empty:
        return []
    m = _frame(rows)
    return [f for f in (stages_figure(m, out_dir, name), _tokens_figure(m, out_dir, name),
                        _skew_figure(m, out_dir, name)) if f is not None]
