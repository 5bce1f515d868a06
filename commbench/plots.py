"""Report figures (PNG) from measured or imported rows. matplotlib is optional and
imported lazily; figures are drawn on matplotlib.figure.Figure with the Agg canvas, never
through pyplot, so nothing global (the user's backend, open figures) is touched.

make_figures(df, out_dir, profile=None) draws each figure only when its data exists and
returns {name: Figure info (path, title, caption, series labels)}. Several runs overlay
on the same axes, labelled by run name.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .units import fmt_size

# Benchmarks that are not size sweeps of one collective.
NOT_COLLECTIVE = ("moe", "overlap", "barrier")
BASELINE_VARIANTS = ("ring", "default")
SKEW_AXES = {"zipf": ("alpha", "Zipf exponent alpha"), "hot_rank": ("ratio", "hot-rank load ratio"),
             "group_limited": ("max_groups", "max node groups per token (M)")}
DPI = 110


@dataclass
class FigureInfo:
    name: str
    path: Path
    title: str
    caption: str = ""
    series: list = field(default_factory=list)


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


# ---------------------------------------------------------------------------------------
# helpers

def _new(nrows=1, ncols=1, w=8.0, h=4.8, sharex=False):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    return fig, axes


def _save(fig, out_dir: Path, name: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = Path(out_dir) / f"{name}.png"
    fig.savefig(path, format="png", dpi=DPI)
    return path


def _size_axis(ax, label="message size S (bytes, log2)"):
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=14))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_size(int(round(x))) if x >= 1 else ""))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label)


def _int_log2_axis(ax, values, label):
    ax.set_xscale("log", base=2)
    vals = sorted({int(v) for v in values})
    ax.set_xticks(vals)
    ax.set_xticklabels([str(v) for v in vals])
    ax.minorticks_off()
    ax.set_xlabel(label)


def _params(v) -> dict:
    if isinstance(v, dict):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return {}
    try:
        d = json.loads(v)
    except (TypeError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _prep(df):
    d = df.copy()
    for c in ("variant", "stage", "run", "dtype", "backend"):
        d[c] = d[c].map(_text) if c in d.columns else ""
    d["variant"] = d["variant"].replace("", "default")
    d["params_key"] = d["params"].map(lambda p: json.dumps(_params(p), sort_keys=True)) if "params" in d.columns \
        else "{}"
    return d


def varying_params(values) -> list[str]:
    """The parameter names that take two or more values across a column of params (dicts
    or JSON); a name some rows lack but that is constant where present does not count."""
    dicts = [_params(v) for v in values]
    names = sorted({k for p in dicts for k in p})
    return [k for k in names if len({json.dumps(p[k], sort_keys=True) for p in dicts if k in p}) > 1]


def _labeler(d, keys):
    """A label function naming only the keys that vary across d (run always when several);
    of the params, only those that vary and are not label columns themselves."""
    vary = {k: d[k].astype(str).nunique() > 1 for k in keys if k in d.columns}
    pkeys = [k for k in varying_params(d["params_key"]) if k not in keys] if "params_key" in d.columns else []

    def label(r: dict, always=()) -> str:
        parts = []
        if vary.get("run") or "run" in always:
            parts.append(str(r["run"]))
        if "world" in r:
            parts.append(f"n={int(r['world'])}")
        for k in keys:
            if k in ("run", "world") or not (vary.get(k) or k in always):
                continue
            v = r.get(k)
            if k == "params_key":
                p = json.loads(v)
                v = " ".join(f"{a}={p[a]}" for a in pkeys if a in p)
            if k == "variant" and v == "default" and not vary.get(k):
                continue
            if v:
                parts.append(str(v))
        return " ".join(parts)
    return label


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _collectives(d):
    sized = d[(~d["benchmark"].isin(NOT_COLLECTIVE)) & (d["nbytes"].astype(float) > 0)]
    return sorted(sized["benchmark"].unique())


# ---------------------------------------------------------------------------------------
# figures

def _ceiling_points(s, col) -> tuple:
    if col not in s.columns:
        return ()
    c = s[["nbytes", col]].dropna()
    pts = tuple(zip(c["nbytes"].astype(float), c[col].astype(float).round(3)))
    vals = {v for _, v in pts}
    # A constant ceiling is one horizontal line whatever sizes a group measured.
    return ((0.0, vals.pop()),) if len(vals) == 1 else pts


# One line per run, rank count, variant, dtype, backend, params and stage.
SERIES_KEYS = ["run", "world", "variant", "dtype", "backend", "params_key", "stage"]


def _size_series(d, bench: str) -> list:
    """(key, legend label, rows sorted by size) of a collective's sized rows."""
    g = d[(d["benchmark"] == bench) & (d["nbytes"].astype(float) > 0)]
    if g.empty:
        return []
    label = _labeler(g, SERIES_KEYS)
    return [(key, label(dict(zip(SERIES_KEYS, key))), s.sort_values("nbytes"))
            for key, s in g.groupby(SERIES_KEYS, sort=True)]


def fig_busbw(d, bench: str, out_dir: Path) -> FigureInfo | None:
    lines = _size_series(d, bench)
    if not lines:
        return None
    fig, axes = _new()
    ax = axes[0][0]
    series, ceilings = [], {}
    for key, lab, s in lines:
        ax.plot(s["nbytes"].astype(float), s["busbw_gbps"].astype(float), marker="o", ms=3, lw=1.5, label=lab)
        series.append(lab)
        line = _ceiling_points(s, "ceiling_gbps")
        if not line:
            continue
        ach = _ceiling_points(s, "ceiling_achieved_gbps")
        bott = _text(s["bottleneck"].dropna().iloc[0]) if "bottleneck" in s.columns and s["bottleneck"].notna().any() \
            else ""
        ceilings.setdefault((line, ach, bott), set()).add(str(key[0]))
    runs = {str(key[0]) for key, _, _ in lines}
    for (line, ach, bott), crun in ceilings.items():
        who = f"{', '.join(sorted(crun))}: " if len(runs) > 1 and len(ceilings) > 1 else ""
        same = ach == line
        for pts, style, what, color in ((line, "--", "line rate" + (" = typical achieved" if same else ""), "0.3"),
                                        (None if same else ach, ":", "typical achieved", "0.5")):
            if not pts:
                continue
            vals = sorted({v for _, v in pts})
            tail = f" ({bott})" if bott else ""
            if len(vals) == 1:
                lab = f"{who}{what} {vals[0]:.4g} GB/s{tail}"
                ax.axhline(vals[0], color=color, ls=style, lw=1.2, label=lab)
            else:
                lab = f"{who}{what}{tail}, by size"
                ax.step([p[0] for p in pts], [p[1] for p in pts], where="mid", color=color, ls=style, lw=1.2,
                        label=lab)
            series.append(lab)
    _size_axis(ax)
    ax.set_ylabel("busbw (GB/s, 1 GB = 1e9 B)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{bench}: bus bandwidth vs message size")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    path = _save(fig, out_dir, f"busbw_{bench}")
    cap = "busbw = algbw x F (p50 time); dashed: the profile's line rate, dotted: its typical achieved rate"
    return FigureInfo(f"busbw_{bench}", path, f"{bench} busbw", cap, series)


def fig_latency(d, bench: str, out_dir: Path) -> FigureInfo | None:
    lines = _size_series(d, bench)
    if not lines:
        return None
    fig, axes = _new()
    ax = axes[0][0]
    series = []
    for _, lab, s in lines:
        x = s["nbytes"].astype(float).to_numpy()
        p50 = s["time_us_p50"].astype(float).to_numpy()
        p99 = s["time_us_p99"].astype(float).to_numpy() if "time_us_p99" in s.columns else p50
        (line,) = ax.plot(x, p50, marker="o", ms=3, lw=1.5, label=f"{lab} p50")
        ax.fill_between(x, p50, p99, color=line.get_color(), alpha=0.18, lw=0, label=f"{lab} p50..p99")
        series.append(f"{lab} p50")
    _size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("time per operation (us, log)")
    ax.set_title(f"{bench}: latency vs message size (p50, band to p99)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    path = _save(fig, out_dir, f"latency_{bench}")
    return FigureInfo(f"latency_{bench}", path, f"{bench} latency",
                      "line: p50 of the slowest rank per iteration; band: p50 to p99", series)


def _moe_frame(d):
    m = d[d["benchmark"] == "moe"].copy()
    if m.empty:
        return m
    p = m["params"].map(_params)
    m["tokens"] = p.map(lambda x: x.get("tokens"))
    m["routing"] = p.map(lambda x: x.get("routing", ""))
    for key, (pk, _) in SKEW_AXES.items():
        m[f"skew_{pk}"] = p.map(lambda x, pk=pk: x.get(pk))
    # Shape without tokens (tokens is the x axis of one figure) and without skew.
    drop_tokens = ("tokens",)
    m["shape_nt"] = p.map(lambda x: json.dumps({k: v for k, v in x.items() if k not in drop_tokens}, sort_keys=True))
    m["bw"] = m["remote_gbps"].astype(float) if "remote_gbps" in m.columns else m["busbw_gbps"].astype(float)
    m["load"] = m["load_max_over_mean"].astype(float) if "load_max_over_mean" in m.columns else math.nan
    return m


def _moe_group(axes, col, grp, xcol, lab, color):
    """One (run, world, shape) group: p50 time and bandwidth per stage (dispatch solid,
    combine dashed) in one colour; the load once (it does not depend on the stage)."""
    ax_t, ax_b, ax_l = (axes[r][col] for r in range(3))
    series = []
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


def _moe_decorate(axes, col, xlabel, title):
    ax_t, ax_b, ax_l = (axes[r][col] for r in range(3))
    ax_t.set_ylabel("p50 time (us)")
    ax_b.set_ylabel("remote GB/s (hottest rank)")
    ax_l.set_ylabel("load max/mean (hottest rank)")
    ax_l.axhline(1.0, color="0.6", lw=0.8)
    ax_t.set_title(title)
    for ax in (ax_t, ax_b, ax_l):
        ax.grid(True, alpha=0.3)
    ax_l.set_xlabel(xlabel)
    ax_t.legend(fontsize=7, loc="best")


def fig_moe_skew(d, out_dir: Path) -> FigureInfo | None:
    m = _moe_frame(d)
    if m.empty:
        return None
    fams = []
    for routing, (pk, xlabel) in SKEW_AXES.items():
        f = m[m["routing"] == routing]
        if f[f"skew_{pk}"].dropna().nunique() >= 2:
            fams.append((routing, pk, xlabel, f))
    if not fams:
        return None
    fig, axes = _new(3, len(fams), w=5.2 * len(fams) + 1, h=9.0, sharex="col")
    series = []
    for col, (routing, pk, xlabel, f) in enumerate(fams):
        f = f.copy()
        f["shape"] = f["params"].map(lambda p, pk=pk: json.dumps({k: v for k, v in _params(p).items() if k != pk},
                                                                 sort_keys=True))
        keys = ["run", "world", "shape"]
        label = _labeler(f, ["run", "world"])
        for key, grp in f.groupby(keys, sort=True):
            series += _moe_group(axes, col, grp, f"skew_{pk}", label(dict(zip(keys, key))), None)
        tokens = sorted({int(t) for t in f["tokens"].dropna()})
        _moe_decorate(axes, col, xlabel, f"moe {routing}: vs skew (T={','.join(map(str, tokens))})")
    fig.suptitle("MoE dispatch (solid) / combine (dashed) vs routing skew")
    path = _save(fig, out_dir, "moe_skew")
    return FigureInfo("moe_skew", path, "MoE vs skew",
                      "p50 time, bandwidth (the hottest rank's remote bytes / p50) and the hottest rank's load "
                      "(max/mean rows received) per skew parameter", series)


def fig_moe_tokens(d, out_dir: Path) -> FigureInfo | None:
    m = _moe_frame(d)
    if m.empty:
        return None
    keys = ["run", "world", "shape_nt"]
    groups = [(k, s) for k, s in m.groupby(keys, sort=True) if s["tokens"].dropna().nunique() >= 2]
    if not groups:
        return None
    fig, axes = _new(3, 1, w=8.0, h=9.0, sharex="col")
    sub = m[m.set_index(keys).index.isin([k for k, _ in groups])]
    label = _labeler(sub.assign(params_key=sub["shape_nt"]), ["run", "world", "params_key"])
    series, xs = [], set()
    for key, grp in groups:
        r = dict(zip(keys, key))
        r["params_key"] = r.pop("shape_nt")
        xs |= set(grp["tokens"].astype(float))
        series += _moe_group(axes, 0, grp, "tokens", label(r), None)
    _moe_decorate(axes, 0, "tokens per rank (log2)", "")
    for r_ in range(3):
        _int_log2_axis(axes[r_][0], xs, "tokens per rank (log2)" if r_ == 2 else "")
    fig.suptitle("MoE dispatch (solid) / combine (dashed) vs tokens")
    path = _save(fig, out_dir, "moe_tokens")
    return FigureInfo("moe_tokens", path, "MoE vs tokens",
                      "p50 time, bandwidth (the hottest rank's remote bytes / p50) and the hottest rank's load "
                      "per tokens-per-rank value", series)


def fig_scaling(d, out_dir: Path) -> FigureInfo | None:
    from .analysis import scaling_table

    try:
        sc = scaling_table(d.drop(columns=["params_key"], errors="ignore"))
    except Exception:  # noqa: BLE001 - a figure must not sink the report
        return None
    if sc.empty:
        return None
    sc = sc.copy()
    sc["params_key"] = sc["params"]
    # One line per group at the largest size measured at several worlds (collectives);
    # moe groups have no size key.
    gkeys = ["run", "benchmark", "backend", "dtype", "variant", "params_key", "stage"]
    sc["variant"] = sc["variant"].replace("", "default")
    pick = []
    for _, g in sc.groupby(gkeys, sort=True):
        if g["benchmark"].iloc[0] != "moe":
            g = g[g["nbytes"] == g["nbytes"].max()]
        pick.append(g)
    if not pick:
        return None
    import pandas as pd

    sel = pd.concat(pick)
    fig, axes = _new()
    ax = axes[0][0]
    label = _labeler(sel, ["run", "benchmark", "variant", "dtype", "stage"])
    series = []
    for key, s in sel.groupby(gkeys, sort=True):
        s = s.sort_values("world")
        r = dict(zip(gkeys, key))
        lab = label(r, always=("benchmark",))
        if r["benchmark"] != "moe":
            lab += f" @{fmt_size(int(s['nbytes'].iloc[0]))}"
        ax.plot(s["world"].astype(float), s["efficiency_pct"].astype(float), marker="o", ms=4, label=lab)
        series.append(lab)
    ax.axhline(100.0, color="0.5", ls="--", lw=1)
    _int_log2_axis(ax, sel["world"], "ranks (log2)")
    ax.set_ylabel("weak-scaling efficiency (% of the smallest world)")
    ax.set_title("scaling efficiency vs rank count (largest size per collective)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    path = _save(fig, out_dir, "scaling")
    return FigureInfo("scaling", path, "scaling efficiency",
                      "collectives: busbw at n / at the smallest n, at the largest size; moe: tokens/s per rank",
                      series)


def _inswitch_flag(r) -> bool:
    from .ceilings import INSWITCH_MARKERS

    v = r.get("inswitch")
    if v is not None and not (isinstance(v, float) and math.isnan(v)) and bool(v):
        return True
    return any(mk in str(r.get("variant") or "").lower() for mk in INSWITCH_MARKERS)


def _is_baseline(variant: str) -> int | None:
    """Preference of a baseline variant (lower first): a ring, else the library default."""
    v = variant.lower()
    if "ring" in v and not any(m in v for m in ("nvls", "sharp", "collnet")):
        return 0
    return 1 if v == "default" else None


def fig_inswitch(d, out_dir: Path) -> FigureInfo | None:
    if "variant" not in d.columns:
        return None
    flag = d.apply(_inswitch_flag, axis=1).astype(bool)
    sized = (d["nbytes"].astype(float) > 0) & (~d["benchmark"].isin(NOT_COLLECTIVE))
    ins = d[flag & sized]
    if ins.empty:
        return None
    keys = ["run", "benchmark", "world", "nbytes", "dtype", "params_key", "stage"]
    base = d[~flag & sized].copy()
    base["_pref"] = base["variant"].map(_is_baseline)
    base = base.dropna(subset=["_pref"]).sort_values("_pref").drop_duplicates(keys)
    m = ins.merge(base[keys + ["time_us_p50", "variant"]], on=keys, suffixes=("", "_base"))
    if m.empty:
        return None
    m["speedup"] = m["time_us_p50_base"].astype(float) / m["time_us_p50"].astype(float)
    fig, axes = _new()
    ax = axes[0][0]
    gk = ["run", "benchmark", "world", "variant", "variant_base", "dtype", "params_key", "stage"]
    label = _labeler(m, ["run", "benchmark", "world", "variant", "dtype", "stage"])
    series = []
    for key, s in m.groupby(gk, sort=True):
        s = s.sort_values("nbytes")
        r = dict(zip(gk, key))
        lab = f"{label(r, always=('benchmark', 'variant'))} vs {r['variant_base']}"
        ax.plot(s["nbytes"].astype(float), s["speedup"], marker="o", ms=3, label=lab)
        series.append(lab)
    ax.axhline(1.0, color="0.5", ls="--", lw=1)
    _size_axis(ax)
    ax.set_ylabel("speedup (baseline p50 / in-switch p50)")
    ax.set_title("in-switch reduction vs ring: speedup by message size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    path = _save(fig, out_dir, "inswitch_speedup")
    return FigureInfo("inswitch_speedup", path, "in-switch speedup",
                      "p50 of the ring variant (else the default) / p50 of the in-switch variant, same run, "
                      "collective, world and size; above 1: the switch is faster", series)


def fig_overlap(d, out_dir: Path) -> FigureInfo | None:
    o = d[d["benchmark"] == "overlap"]
    if o.empty:
        return None
    has = {c: c in o.columns and o[c].astype(float).notna().any()
           for c in ("overlap_osu_pct", "overlap_imb_pct", "compute_slowdown")}
    if not (has["overlap_osu_pct"] or has["overlap_imb_pct"]):
        return None
    o = o.copy()
    o["mode"] = o["mode"].map(_text) if "mode" in o.columns else ""
    nrows = 2 if has["compute_slowdown"] else 1
    fig, axes = _new(nrows, 1, w=8.0, h=4.2 * nrows, sharex="col")
    keys = ["run", "world", "mode", "params_key", "variant", "dtype"]
    label = _labeler(o, keys)
    series = []
    for key, s in o.groupby(keys, sort=True):
        s = s.sort_values("nbytes")
        lab = label(dict(zip(keys, key)))
        x = s["nbytes"].astype(float)
        color = None
        for col, style, what in (("overlap_osu_pct", "-", "OSU"), ("overlap_imb_pct", "--", "IMB")):
            if has[col] and s[col].astype(float).notna().any():
                (line,) = axes[0][0].plot(x, s[col].astype(float), ls=style, marker="o", ms=3, color=color,
                                          label=f"{lab} overlap ({what})")
                color = line.get_color()
                series.append(f"{lab} overlap ({what})")
        if nrows == 2 and s["compute_slowdown"].astype(float).notna().any():
            axes[1][0].plot(x, s["compute_slowdown"].astype(float), marker="s", ms=3, color=color,
                            label=f"{lab} compute slowdown")
    axes[0][0].set_ylabel("communication hidden (%)")
    axes[0][0].set_ylim(-2, 102)
    axes[0][0].set_title("overlap of communication with compute vs bucket size")
    axes[0][0].legend(fontsize=8, loc="best")
    axes[0][0].grid(True, alpha=0.3)
    if nrows == 2:
        axes[1][0].set_ylabel("compute slowdown (x, with comm / alone)")
        axes[1][0].axhline(1.0, color="0.5", ls="--", lw=1)
        axes[1][0].grid(True, alpha=0.3)
        axes[1][0].legend(fontsize=8, loc="best")
    _size_axis(axes[-1][0], "bucket size (bytes, log2)")
    path = _save(fig, out_dir, "overlap")
    return FigureInfo("overlap", path, "overlap",
                      "solid, OSU: 100 - 100 (overall - compute) / pure comm; dashed, IMB-NBC: 100 (pure comm + "
                      "compute - overall) / max(pure comm, compute)", series)


def make_figures(df, out_dir, profile=None) -> dict[str, FigureInfo]:
    """Every figure whose data exists, written as out_dir/<name>.png. df holds the rows
    (a `run` column names each run); rows already carry ceiling_gbps /
    ceiling_achieved_gbps from their run or from rejudging against a profile."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if df is None or len(df) == 0:
        return {}
    d = _prep(df)
    figs: dict[str, FigureInfo] = {}
    for bench in _collectives(d):
        for fn in (fig_busbw, fig_latency):
            f = fn(d, bench, out_dir)
            if f:
                figs[f.name] = f
    for fn in (fig_moe_tokens, fig_moe_skew, fig_scaling, fig_inswitch, fig_overlap):
        f = fn(d, out_dir)
        if f:
            figs[f.name] = f
    return figs
