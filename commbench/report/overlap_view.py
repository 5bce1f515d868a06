"""How overlap rows (measured, or imported from OSU's non-blocking benchmarks) are shown:
the terminal table, the report section and the figure of overlap against bucket size.
Registered as the view "overlap" (report/views.py), the one the Overlap benchmark names."""
from __future__ import annotations

from pathlib import Path

from commbench.analyse.thresholds import OVERLAP_HIDDEN_PCT, OVERLAP_PARTLY_PCT
from commbench.analyse.verdicts import cannot_judge, excluded_note, rests_on, trusted_mask
from commbench.core.schema import has, params_dict
from commbench.core.units import fmt_size
from commbench.report.document import FigureInfo, Finding, Section
from commbench.report.figflags import flag_caption, flag_entry, flags, plot_flagged
from commbench.report.fmt import fmt, text
from commbench.report.order import varying_params
from commbench.report.plotkit import labeler, legend_beside, new_figure, save_figure, size_axis, size_ticks
from commbench.report.tables import ALWAYS, COMPACT, WIDE, add_column, table
from commbench.report.warnings_view import warning_cell


def _us(v) -> str:
    """Microseconds with one decimal, however large (no exponent beside plain numbers)."""
    return fmt(v, 1) if has(v) else "-"


def terminal_table(rows: list[dict], plain: bool):
    """t_comm, t_compute, t_overall (p50, slowest rank), overlap by OSU's and IMB-NBC's
    formulas, compute slowdown, exposed communication, GFLOP/s alone and overlapped, check."""
    first = rows[0] if rows else {}
    show_run = len({r.get("run") for r in rows}) > 1
    t = table(f"overlap: all_reduce beside a matmul  [{first.get('backend', '?')}/{first.get('device', '?')}, "
              f"compute {', '.join(sorted({str(r.get('compute_backend')) for r in rows}))}]",
              "p50 us, slowest rank per iteration. OSU % = max(0, 100 - 100 (t_overall - t_compute) / t_comm); "
              "IMB % = 100 max(0, min(1, (t_comm + t_compute - t_overall) / max(t_comm, t_compute))); "
              "slowdown = compute time while communicating / alone; exposed = t_overall - t_compute. "
              "sequence: t_comm = sum over the buckets, size = one bucket", plain)
    warn = any(warning_cell(r) for r in rows)
    # The point and its three times, OSU's overlap and the check always; the other
    # judgements while the table fits; the matmul's size and rates with --wide.
    # Two-line headers: the times' columns are as narrow as their numbers (100 columns hold
    # the point, its times and its warning).
    cols = [("run", True, ALWAYS, show_run), ("world", False, ALWAYS, True), ("size (B)", False, ALWAYS, True),
            ("mode", True, ALWAYS, True), ("polls/\nprogress", True, COMPACT, True), ("gemm (n)", False, WIDE, True),
            ("t_comm\n(us)", False, ALWAYS, True), ("t_compute\n(us)", False, ALWAYS, True),
            ("t_overall\n(us)", False, ALWAYS, True), ("OSU\n(%)", False, ALWAYS, True),
            ("IMB (%)", False, COMPACT, True), ("slowdown (x)", False, COMPACT, True),
            ("exposed (us)", False, COMPACT, True), ("GFLOP/s alone", False, WIDE, True),
            ("GFLOP/s overl.", False, WIDE, True), ("check", True, ALWAYS, True), ("warning", True, ALWAYS, warn)]
    cols = [c for c in cols if c[3]]
    for name, left, level, _ in cols:
        # The point's own settings tell its rows apart: kept at any width while they differ.
        add_column(t, name, left, level, wrap=name == "warning", key=name in ("mode", "polls/\nprogress"))
    for r in rows:
        mode = str(r.get("mode"))
        if mode == "sequence":
            mode += f" x{int(float(r['buckets']))}" if has(r.get("buckets")) else ""  # a count: "x8", never "x8.0"
        prog = "thread" if r.get("progress") == "thread" else f"polls {r.get('polls')}"
        cells = ([str(r.get("run"))] if show_run else []) + [
            str(r.get("world")), fmt_size(int(r.get("nbytes", 0))), mode, prog, str(r.get("gemm_n")),
            _us(r.get("t_comm_us")), _us(r.get("t_compute_us")), _us(r.get("t_overall_us")),
            # Imported OSU rows lack what OSU does not print (IMB %, slowdown, GFLOP/s): "-".
            fmt(r.get("overlap_osu_pct"), 0), fmt(r.get("overlap_imb_pct"), 0),
            fmt(r.get("compute_slowdown")), _us(r.get("exposed_us")),
            fmt(r.get("gflops_alone"), 1), fmt(r.get("gflops_overlapped"), 1), str(r.get("check"))]
        # What the row carries, by kind: the terminal ends with the tally, and --verbose or
        # the report gives each warning in full.
        cells += [warning_cell(r)] if warn else []
        t.add_row(*cells)
    return t


def section(o, figures: list) -> Section:
    """report.md/report.html: overlap by bucket size, one row per point; the summary's
    overlap findings."""
    multi_run = o["run"].nunique() > 1
    pk = [k for k in varying_params(o["params"]) if k != "mode"] if "params" in o.columns else []
    warn = "warning" in o.columns and o["warning"].map(has).any()
    heads = (["run"] if multi_run else []) + ["world", "mode"] + pk + [
        "bucket (B)", "time (us)", "overlap OSU (%)", "overlap IMB (%)", "compute slowdown (x)", "exposed (us)"] + \
        (["warning"] if warn else [])
    rows = []
    for r in o.sort_values([c for c in ("run", "world", "mode", "nbytes") if c in o.columns]).to_dict("records"):
        p = r.get("params") or {}
        rows.append(([text(r["run"])] if multi_run else []) + [str(r["world"]), text(r.get("mode"))] + [
            text(p.get(k)) for k in pk] + [fmt_size(int(r["nbytes"])), fmt(r["time_us_p50"]),
                                           fmt(r.get("overlap_osu_pct"), 1), fmt(r.get("overlap_imb_pct"), 1),
                                           fmt(r.get("compute_slowdown"), 3), fmt(r.get("exposed_us"))]
                    + ([text(r.get("warning"))] if warn else []))
    return Section("Overlap", "communication hidden behind compute, by bucket size", heads, rows, figures,
                   findings=findings(o))


def judge_overlap(pct: float) -> str:
    """OSU's overlap % in words."""
    if pct >= OVERLAP_HIDDEN_PCT:
        return "communication hidden behind the compute"
    if pct >= OVERLAP_PARTLY_PCT:
        return "partly hidden: the collective progresses only part of the time the compute runs"
    return "mostly exposed: the collective does not progress during the compute (try polls or a progress thread)"


def findings(o) -> list:
    """Per run, world and mode: the best OSU overlap among the rows a verdict may rest on
    (verdicts.untrusted_reason: no warning, not disturbed, not oversubscribed; and not a row
    whose overlapped run finished before its compute alone, which only noise can do), with
    what it rests on; "cannot judge" when no row qualifies."""
    out = []
    if "overlap_osu_pct" not in o.columns:
        return out
    o = o.copy()
    o["mode"] = o["mode"].map(text) if "mode" in o.columns else ""
    multi_run = o["run"].nunique() > 1
    for (run, world, mode), g in o.groupby([o["run"].map(text), "world", "mode"], sort=True):
        pct = g["overlap_osu_pct"].astype(float)
        if pct.notna().sum() == 0:
            continue
        ok = trusted_mask(g) & pct.notna()
        if "t_overall_us" in g.columns and "t_compute_us" in g.columns:
            impossible = g["t_overall_us"].astype(float) < g["t_compute_us"].astype(float)
            ok &= ~impossible
        else:
            impossible = pct.isna() & False
        who = f"{run + ' ' if multi_run else ''}n={int(world)}{' ' + mode if mode else ''}"
        note = excluded_note(g, ok)
        if impossible.any():
            note += f"; {int(impossible.sum())} row(s) finished before the compute alone (noise)"
        if not ok.any():
            out.append(Finding(text(g.iloc[0].get("benchmark")), f"OSU overlap ({who})",
                               f"{fmt(pct.min(), 0)}..{fmt(pct.max(), 0)}% over {len(g)} sizes{note}",
                               cannot_judge(g, "the overlap") + (" or finished before the compute alone"
                                                                 if impossible.any() else "")))
            continue
        good = g[ok]
        gp = pct[ok]
        if "repeat" in good.columns and good["repeat"].fillna(1).nunique() > 1:
            out.append(_repeated_finding(good, gp, who, note))
            continue
        best = good.loc[gp.idxmax()]
        out.append(Finding(text(best.get("benchmark")), f"OSU overlap ({who})",
                           f"best {fmt(gp.max(), 0)}% at {_point(best, good)}; "
                           f"{fmt(gp.min(), 0)}% at the worst of {len(good)} usable rows{note}",
                           f"{judge_overlap(float(gp.max()))} ({rests_on(good)}; noise between runs not measured)"))
    return out


def _point(row, rows) -> str:
    """A point as a finding names it: its size, and the parameters that vary among the rows
    judged with it ("1M polls=8"), so that a size measured several ways is not ambiguous."""
    p = params_dict(row.get("params"))
    vary = [k for k in varying_params(rows["params"]) if k in p] if "params" in rows.columns else []
    return " ".join([fmt_size(int(row["nbytes"]))] + [f"{k}={p[k]}" for k in vary])


def _repeated_finding(good, gp, who: str, note: str) -> Finding:
    """A run of `--repeat N`: each point (size and parameters) stands for the LOWEST overlap
    of its usable repeats -- what every repeat showed at least -- and the best point is the
    one whose lowest repeat is highest. When its repeats spread across the bounds of the
    words (80 %, 30 %), the spread between repeats is larger than what tells the words apart:
    cannot judge, and the range says why."""
    # A point is its size and the parameters that vary among these rows (_point's name).
    vals: dict = {}
    for r, pct in zip(good.to_dict("records"), gp.astype(float)):
        vals.setdefault(_point(r, good), []).append(pct)
    at = max(vals, key=lambda k: min(vals[k]))
    lo, hi, reps = min(vals[at]), max(vals[at]), len(vals[at])
    worst = min(min(v) for v in vals.values())
    bench = text(good.iloc[0].get("benchmark"))
    value = (f"best {fmt(lo, 0)}% at {at} (the lowest of {reps} repeats; they spread "
             f"{fmt(lo, 0)}..{fmt(hi, 0)}%); {fmt(worst, 0)}% at the worst of {len(vals)} points{note}")
    basis = f"rests on {len(good)} row(s): {len(vals)} point(s), the lowest of their interleaved repeats"
    if reps < 2:
        return Finding(bench, f"OSU overlap ({who})", value,
                       f"{judge_overlap(lo)} ({basis}; one usable repeat at the best point)")
    if judge_overlap(lo) != judge_overlap(hi):
        return Finding(bench, f"OSU overlap ({who})", value,
                       f"cannot judge the overlap: its repeats at {at} spread {fmt(lo, 0)}..{fmt(hi, 0)}%, "
                       f"across the bounds of the verdicts ({OVERLAP_PARTLY_PCT:g} %, {OVERLAP_HIDDEN_PCT:g} %) ({basis})")
    return Finding(bench, f"OSU overlap ({who})", value, f"{judge_overlap(lo)} ({basis})")


def figure(o, out_dir: Path, name: str) -> FigureInfo | None:
    """Overlap % (OSU solid, IMB-NBC dashed) against bucket size, and the compute slowdown
    below it when the rows have one."""
    has = {c: c in o.columns and o[c].astype(float).notna().any()
           for c in ("overlap_osu_pct", "overlap_imb_pct", "compute_slowdown")}
    if not (has["overlap_osu_pct"] or has["overlap_imb_pct"]):
        return None
    o = o.copy()
    o["mode"] = o["mode"].map(text) if "mode" in o.columns else ""
    nrows = 2 if has["compute_slowdown"] else 1
    fig, axes = new_figure(nrows, 1, w=8.0, h=4.2 * nrows, sharex="col")
    keys = ["run", "world", "mode", "params_key", "variant", "dtype"]
    label = labeler(o, keys)
    series = []
    for key, s in o.groupby(keys, sort=True):
        s = s.sort_values("nbytes")
        lab = label(dict(zip(keys, key)))
        x = s["nbytes"].astype(float)
        color = None
        bad = flags(s)  # a row that is not evidence (its % not comparable, a disturbed run): hollow
        for col, style, what in (("overlap_osu_pct", "-", "OSU"), ("overlap_imb_pct", "--", "IMB")):
            if has[col] and s[col].astype(float).notna().any():
                line = plot_flagged(axes[0][0], x, s[col].astype(float), bad, ls=style, marker="o", ms=3,
                                    color=color, label=f"{lab} overlap ({what})")
                color = line.get_color()
                series.append(f"{lab} overlap ({what})")
        if nrows == 2 and s["compute_slowdown"].astype(float).notna().any():
            plot_flagged(axes[1][0], x, s["compute_slowdown"].astype(float), bad, marker="s", ms=3, color=color,
                         label=f"{lab} compute slowdown")
    axes[0][0].set_ylabel("communication hidden (%)")
    axes[0][0].set_ylim(-2, 102)
    axes[0][0].set_title("overlap of communication with compute vs bucket size")
    axes[0][0].grid(True, alpha=0.3)
    # Beside the axes: inside, a legend covers the large buckets' lines whatever corner it takes.
    legend_beside(axes[0][0], extra=flag_entry(o))
    if nrows == 2:
        axes[1][0].set_ylabel("compute slowdown (x, with comm / alone)")
        axes[1][0].axhline(1.0, color="0.5", ls="--", lw=1)
        axes[1][0].grid(True, alpha=0.3)
        legend_beside(axes[1][0])
    size_axis(axes[-1][0], "bucket size (bytes, log2)")
    # Buckets are often no power of two (DDP's 25 MiB): tick each one plotted.
    size_ticks(axes[-1][0], o["nbytes"].astype(float))
    return FigureInfo(name, save_figure(fig, out_dir, name), "overlap",
                      "solid, OSU: 100 - 100 (overall - compute) / pure comm; dashed, IMB-NBC: 100 (pure comm + "
                      "compute - overall) / max(pure comm, compute)" + flag_caption(o), series)
