"""Report figures (PNG) from measured or imported rows. matplotlib is optional and
imported lazily (commbench.report.plotkit draws without pyplot).

make_figures(df, out_dir, profile=None) draws each figure only when its data exists and
returns {name: FigureInfo (path, title, caption, series labels)}: each benchmark's own
(its registered view's, report/views.py; by default busbw and latency against size), then the scaling and
in-switch figures across benchmarks. Several runs overlay on the same axes, labelled by
run name.
"""
from __future__ import annotations

from pathlib import Path

from commbench.analyse.analysis import collective_mask, largest_size, params_key, presenters, scaling_table
from commbench.analyse.ceilings import ceiling_busbw, is_inswitch
from commbench.core.safe_write import make_dir
from commbench.core.schema import params_dict
from commbench.core.units import fmt_size
from commbench.report import views as bench_views
from commbench.report.document import FigureInfo
from commbench.report.fmt import text
from commbench.report.plotkit import (
    capturing,
    int_log2_axis,
    labeler,
    legend_beside,
    new_figure,
    save_figure,
    size_axis,
)
from commbench.report.terminal import own_metrics_caption

from .figflags import flag_caption, flag_entry, flags, plot_flagged, with_flags


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _prep(df):
    """Text keys filled, params as dicts and as their canonical JSON (params_key)."""
    d = df.copy()
    for c in ("variant", "stage", "run", "dtype", "backend", "placement"):
        d[c] = d[c].map(text) if c in d.columns else ""
    d["variant"] = d["variant"].replace("", "default")
    d["params"] = d["params"].map(params_dict) if "params" in d.columns else [{} for _ in range(len(d))]
    d["params_key"] = d["params"].map(params_key)
    return with_flags(d)  # which rows are not evidence: every figure draws them hollow


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


# One line per run, rank count, variant, placement, dtype, backend, params and stage.
SERIES_KEYS = ["run", "world", "variant", "placement", "dtype", "backend", "params_key", "stage"]


def _size_series(d, bench: str) -> list:
    """(key, legend label, rows sorted by size) of a collective's sized rows."""
    g = d[(d["benchmark"] == bench) & (d["nbytes"].astype(float) > 0)]
    if g.empty:
        return []
    label = labeler(g, SERIES_KEYS)
    return [(key, label(dict(zip(SERIES_KEYS, key))), s.sort_values("nbytes"))
            for key, s in g.groupby(SERIES_KEYS, sort=True)]


def _size_figure(d, bench: str):
    """(series of _size_series, figure, its one axes), or None when there is nothing to draw."""
    lines = _size_series(d, bench)
    if not lines:
        return None
    fig, axes = new_figure()
    return lines, fig, axes[0][0]


def fig_busbw(d, bench: str, out_dir: Path) -> FigureInfo | None:
    got = _size_figure(d, bench)
    if got is None:
        return None
    lines, fig, ax = got
    series, ceilings = [], {}
    for key, lab, s in lines:
        # A log axis: a sweep spans decades of busbw, and a linear one from 0 to the ceiling
        # squashes every size below the large ones onto zero. Zero (a size too small to
        # time) has no place on it.
        s = s[s["busbw_gbps"].astype(float) > 0]
        if s.empty:  # all_reduce at world 1: busbw 0 at every size, nothing to draw on a log axis
            continue
        plot_flagged(ax, s["nbytes"], s["busbw_gbps"], flags(s), marker="o", ms=3, lw=1.5, label=lab)
        series.append(lab)
        # The ceiling in busbw, as the rows were judged by it: across nodes the busbw the NICs
        # allow (8 NICs of 50 GB/s: 400 GB/s), not one NIC's rate under a curve that passes it.
        recs = s.to_dict("records")
        s = s.assign(_line=[ceiling_busbw(r) for r in recs], _ach=[ceiling_busbw(r, achieved=True) for r in recs])
        line = _ceiling_points(s, "_line")
        if not line:
            continue
        ach = _ceiling_points(s, "_ach")
        basis = {text(b) for b in s["bound_basis"].dropna()} if "bound_basis" in s.columns else set()
        bott = "; ".join(sorted(basis)) if basis else text(s["bottleneck"].dropna().iloc[0]) \
            if "bottleneck" in s.columns and s["bottleneck"].notna().any() else ""
        ceilings.setdefault((line, ach, bott, bool(basis)), set()).add(str(key[0]))
    if not series:
        return None
    runs = {str(key[0]) for key, _, _ in lines}
    for (line, ach, bott, bound), crun in ceilings.items():
        who = f"{', '.join(sorted(crun))}: " if len(runs) > 1 and len(ceilings) > 1 else ""
        same = ach == line
        rate = "busbw at line rate" if bound else "line rate"
        for pts, style, what, color in ((line, "--", rate + (" = typical achieved" if same else ""), "0.3"),
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
    size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("busbw (GB/s, 1 GB = 1e9 B, log)")
    ax.set_title(f"{bench}: bus bandwidth vs message size")
    ax.grid(True, which="major", alpha=0.3)
    legend_beside(ax, extra=flag_entry(d[d["benchmark"] == bench]))
    path = save_figure(fig, out_dir, f"busbw_{bench}")
    cap = ("busbw = algbw x F (p50 time), log scale; dashed: the busbw the profile's line rate allows (across "
           "nodes, the NICs that carry the inter-node share), dotted: the same at its typical achieved rate")
    return FigureInfo(f"busbw_{bench}", path, f"{bench} busbw", cap + flag_caption(d[d["benchmark"] == bench]),
                      series)


def fig_latency(d, bench: str, out_dir: Path) -> FigureInfo | None:
    got = _size_figure(d, bench)
    if got is None:
        return None
    lines, fig, ax = got
    series = []
    for _, lab, s in lines:
        x = s["nbytes"].astype(float).to_numpy()
        p50 = s["time_us_p50"].astype(float).to_numpy()
        p99 = s["time_us_p99"].astype(float).to_numpy() if "time_us_p99" in s.columns else p50
        bad = flags(s)
        line = plot_flagged(ax, x, p50, bad, marker="o", ms=3, lw=1.5, label=f"{lab} p50")
        ax.fill_between(x[~bad], p50[~bad], p99[~bad], color=line.get_color(), alpha=0.18, lw=0,
                        label=f"{lab} p50..p99")
        series.append(f"{lab} p50")
    size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("time per operation (us, log)")
    ax.set_title(f"{bench}: latency vs message size (p50, band to p99)")
    ax.grid(True, which="major", alpha=0.3)
    rows = d[d["benchmark"] == bench]
    legend_beside(ax, extra=flag_entry(rows))
    path = save_figure(fig, out_dir, f"latency_{bench}")
    return FigureInfo(f"latency_{bench}", path, f"{bench} latency",
                      "line: p50 of the slowest rank per iteration; band: p50 to p99" + flag_caption(rows), series)


def _save_against(fig, ax, ref: float, ylabel: str, title: str, out_dir: Path, name: str, extra=()) -> Path:
    """A ratio figure's finish: the dashed reference at `ref`, labels, grid, the legend
    beside the axes (extra: its entries for what is drawn hollow); written."""
    ax.axhline(ref, color="0.5", ls="--", lw=1)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    legend_beside(ax, extra=extra)
    return save_figure(fig, out_dir, name)


def fig_scaling(d, out_dir: Path) -> FigureInfo | None:
    try:
        sc = scaling_table(d.drop(columns=["params_key", "_flag", "_why"], errors="ignore"))
    except Exception:  # noqa: BLE001 - a figure must not sink the report
        return None
    if sc.empty:
        return None
    sc = sc.copy()
    sc["params_key"] = sc["params"]
    # One line per group at the largest size measured at several worlds; an unsized
    # benchmark's groups have no size key.
    views = presenters(sc)
    gkeys = ["run", "benchmark", "backend", "dtype", "variant", "placement", "params_key", "stage"]
    sc["variant"] = sc["variant"].replace("", "default")
    sel = largest_size(sc)
    lines = []
    for key, s in sel.groupby(gkeys, sort=True):
        lines.append((dict(zip(gkeys, key)), s.sort_values("world")))
    labels = _scaling_labels(sel, [r for r, _ in lines], views)
    # The legend goes beside the axes (save_figure widens the figure to hold it).
    fig, axes = new_figure(w=8.0, h=4.8)
    ax = axes[0][0]
    series = []
    bad = _scaling_flagged(d)
    for (r, s), lab in zip(lines, labels):
        sized = views[r["benchmark"]].sized
        if sized:
            lab += f" @{fmt_size(int(s['nbytes'].iloc[0]))}"
        # A point rests on the rows at its world and at the base world: either flagged, it is.
        marks = [any((text(x["run"]), x["benchmark"], int(w), int(x["nbytes"]) if sized else None) in bad
                     for w in (x["world"], x["base_world"])) for x in s.to_dict("records")]
        plot_flagged(ax, s["world"], s["efficiency_pct"], marks, marker="o", ms=4, label=lab)
        series.append(lab)
    int_log2_axis(ax, sel["world"], "ranks (log2)")
    ax.axhline(100.0, color="0.5", ls="--", lw=1)
    ax.set_ylabel("weak-scaling efficiency (% of the smallest world)")
    ax.set_title("scaling efficiency vs rank count (largest size per collective)")
    ax.grid(True, alpha=0.3)
    flagged = d[d["_flag"]] if bad else d.iloc[:0]
    legend_beside(ax, fontsize=7 if len(lines) > 6 else 8, extra=flag_entry(flagged))
    path = save_figure(fig, out_dir, "scaling")
    return FigureInfo("scaling", path, "scaling efficiency",
                      "collectives: busbw at n / at the smallest n, at the largest size" + own_metrics_caption(sc)
                      + (flag_caption(flagged) if bad else ""), series)


def _scaling_flagged(d) -> set:
    """(run, benchmark, world, nbytes) of each flagged row, and (run, benchmark, world, None)
    for any size (a benchmark whose scaling groups have no size: moe)."""
    out = set()
    for r in d[d["_flag"]].to_dict("records"):
        key = (text(r["run"]), r["benchmark"], int(r["world"]))
        out |= {key + (int(r.get("nbytes") or 0),), key + (None,)}
    return out


def _scaling_labels(sel, keys: list[dict], views) -> list[str]:
    """One legend label per scaling line: the benchmark, then only what tells two lines of
    one benchmark apart (a key that differs only between benchmarks, as all_reduce's
    in-place against send_recv's out-of-place, says nothing): run, backend, variant,
    placement, the params as the benchmark describes them, the stage, and the dtype where
    the stage does not already decide it (a stage with a dtype of its own). Every group key
    is there, so no two entries are alike."""
    def varies(g, key, by=()) -> bool:
        return bool((g[key].astype(str).groupby([g[c] for c in by]).nunique() > 1).any()) if by else \
            g[key].astype(str).nunique() > 1

    multi_run = sel["run"].astype(str).nunique() > 1
    shows = {}
    for bench, g in sel.groupby("benchmark"):
        shows[bench] = {k: varies(g, k) for k in ("backend", "variant", "placement", "params_key", "stage")}
        shows[bench]["dtype"] = varies(g, "dtype", ["stage"])
    out = []
    for r in keys:
        b, show = views[r["benchmark"]], shows[r["benchmark"]]
        parts = ([str(r["run"])] if multi_run else []) + [r["benchmark"]]
        parts += [str(r[k]) for k in ("backend", "variant", "placement") if show[k] and r[k]]
        if show["params_key"]:
            parts.append(b.describe(params_dict(r["params_key"])))
        parts += [str(r[k]) for k in ("stage", "dtype") if show[k] and r[k]]
        out.append(" ".join(parts))
    if len(set(out)) < len(out):  # a param the benchmark's describe() leaves out: name every key that varies
        label = labeler(sel, ["run", "benchmark", "backend", "variant", "placement", "dtype", "params_key", "stage"])
        out = [label(r, always=("benchmark",)) for r in keys]
    return out


def _is_baseline(variant: str) -> int | None:
    """Preference of a baseline variant (lower first): a ring, else the library default."""
    v = variant.lower()
    if "ring" in v and not any(m in v for m in ("nvls", "sharp", "collnet")):
        return 0
    return 1 if v == "default" else None


def fig_inswitch(d, out_dir: Path) -> FigureInfo | None:
    if "variant" not in d.columns:
        return None

    flag = d.apply(is_inswitch, axis=1).astype(bool)
    sized = collective_mask(d)
    ins = d[flag & sized]
    if ins.empty:
        return None
    keys = ["run", "benchmark", "world", "nbytes", "dtype", "params_key", "stage"]
    base = d[~flag & sized].copy()
    base["_pref"] = base["variant"].map(_is_baseline)
    base = base.dropna(subset=["_pref"]).sort_values("_pref").drop_duplicates(keys)
    m = ins.merge(base[keys + ["time_us_p50", "variant", "_flag", "_why"]], on=keys, suffixes=("", "_base"))
    if m.empty:
        return None
    m["speedup"] = m["time_us_p50_base"].astype(float) / m["time_us_p50"].astype(float)
    # A speedup rests on both rows: either flagged, so is the point.
    m["_flag"] = m["_flag"].astype(bool) | m["_flag_base"].astype(bool)
    m["_why"] = m["_why"].where(m["_why"] != "", m["_why_base"])
    fig, axes = new_figure()
    ax = axes[0][0]
    gk = ["run", "benchmark", "world", "variant", "variant_base", "dtype", "params_key", "stage"]
    label = labeler(m, ["run", "benchmark", "world", "variant", "dtype", "stage"])
    series = []
    for key, s in m.groupby(gk, sort=True):
        s = s.sort_values("nbytes")
        r = dict(zip(gk, key))
        lab = f"{label(r, always=('benchmark', 'variant'))} vs {r['variant_base']}"
        plot_flagged(ax, s["nbytes"], s["speedup"], s["_flag"], marker="o", ms=3, label=lab)
        series.append(lab)
    size_axis(ax)
    path = _save_against(fig, ax, 1.0, "speedup (baseline p50 / in-switch p50)",
                         "in-switch reduction vs ring: speedup by message size", out_dir, "inswitch_speedup",
                         flag_entry(m))
    return FigureInfo("inswitch_speedup", path, "in-switch speedup",
                      "p50 of the ring variant (else the default) / p50 of the in-switch variant, same run, "
                      "collective, world and size; above 1: the switch is faster"
                      + flag_caption(m), series)


def make_figures(df, out_dir, profile=None) -> dict[str, FigureInfo]:
    """Every figure whose data exists, written as out_dir/<name>.png. df holds the rows
    (a `run` column names each run); rows already carry ceiling_gbps /
    ceiling_achieved_gbps from their run or from rejudging against a profile."""
    out_dir = make_dir(out_dir)  # a link named figures/: refused, nothing drawn where it points
    if df is None or len(df) == 0:
        return {}
    d = _prep(df)
    figs: dict[str, FigureInfo] = {}
    views = presenters(d)
    with capturing() as drawn:
        for bench in sorted(views):
            rows = d[d["benchmark"] == bench]
            own = bench_views.figures(views[bench], rows, out_dir)
            if own is None:
                own = [fn(rows, bench, out_dir) for fn in (fig_busbw, fig_latency)] \
                    if views[bench].collective_rows else []
            for f in own:
                if f:
                    f.benchmark = bench
                    figs[f.name] = f
        for fn in (fig_scaling, fig_inswitch):
            f = fn(d, out_dir)
            if f:
                figs[f.name] = f
    for f in figs.values():
        f.figure = f.figure or drawn.get(Path(f.path))
    return figs
