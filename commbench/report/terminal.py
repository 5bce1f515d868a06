"""Tables from rows (live at the end of a run, or from disk). No measurement here."""
from __future__ import annotations

import json
import os
import sys

from commbench.analyse.analysis import largest_size, presenters
from commbench.analyse.ceilings import WORLD_1_NOTE, ceiling_busbw
from commbench.benchmarks.base import for_rows
from commbench.core import hoststate
from commbench.core.hoststate import host_line
from commbench.core.schema import has, per_params
from commbench.core.units import fmt_size
from commbench.report import shootout_view
from commbench.report import views as bench_views
from commbench.report.fmt import fixed, is_number, num, records, size_cells, text
from commbench.report.order import params_order
from commbench.report.styles import nccl_tests_lines, osu_lines
from commbench.report.tables import ALWAYS, COMPACT, WIDE, add_column, print_table, table
from commbench.report.variants_view import variant_comparisons
from commbench.report.viewsettings import View
from commbench.report.warnings_view import say_warnings
from commbench.store.load import names_for


def stdout_is_tty() -> bool:
    """A rank started by `run --np` inherits the launcher's answer: mpirun hands ranks a
    pseudo-terminal even when its own output goes to a file."""
    forced = os.environ.get("COMMBENCH_TTY")
    return forced == "1" if forced in ("0", "1") else sys.stdout.isatty()


def make_console():
    from rich.console import Console

    tty = stdout_is_tty()
    return Console(force_terminal=tty, no_color=not tty, width=None if tty else pipe_width(), highlight=False)


def pipe_width() -> int:
    """The width of tables written to a file or a pipe, which has none: 240 columns, or
    COLUMNS when it is set (`COLUMNS=100 commbench run ... > out.txt`: the tables as a
    100-column terminal shows them)."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return 240
    return cols if 40 <= cols <= 1000 else 240


def print_tables(rows, console=None, wide: bool | None = None, view: View = View()) -> None:
    """Each benchmark's tables (its registered view's, report/views.py); by default one
    table per benchmark: size, p50, p99, algbw, busbw, check. No table cuts a number (tables.print_table)."""

    if hasattr(rows, "to_dict"):
        rows = records(rows)
    console = console or make_console()
    wide = view.wide if wide is None else wide
    plain = not stdout_is_tty()
    by_bench: dict[str, list] = {}
    for r in rows:
        by_bench.setdefault(r["benchmark"], []).append(r)
    styled = []
    for bench, rs in by_bench.items():
        b = for_rows(bench)
        # Another tool's layout for the sized collectives; moe, overlap, barrier keep their own.
        if view.style != "table" and b.collective_rows and b.sized:
            styled += rs
            continue
        own = bench_views.tables(b, rs, plain)
        for t in own if own is not None else [collective_table(bench, b, rs, plain)]:
            print_table(console, t, wide)
    if styled:
        # Plain lines, as the other tool writes them: no markup, no wrapping.
        for line in (nccl_tests_lines if view.style == "nccl-tests" else osu_lines)(styled):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _varies(rs, key, within: str | None = None) -> bool:
    """Does `key` take several values among the rows (within one value of `within`: the
    placement of all_reduce rows against send_recv's says nothing)?"""
    groups: dict = {}
    for r in rs:
        groups.setdefault(text(r.get(within)) if within else "", set()).add(text(r.get(key)))
    return any(len(v) > 1 for v in groups.values())


def time_caption(rs) -> str:
    """How the rows' time was measured: commbench's slowest rank per iteration, or, for
    imported rows, what the source tool measured (the row's time_measured)."""
    own = imported = False
    how: list[str] = []
    for r in rs:
        if r.get("timing") == "imported":
            imported = True
            m = r.get("time_measured")
            m = m if isinstance(m, str) and m else "the tool's own time (source unknown)"
            if m not in how:
                how.append(m)
        else:
            own = True
    if not imported:
        return "time = slowest rank per iteration"
    out = "time = " + "; ".join(how)
    return f"time = slowest rank per iteration (imported rows: {out[7:]})" if own else out


def collective_table(bench: str, b, rs: list[dict], plain: bool):
    """The generic table of one benchmark's rows. The point's identity (world, size, and
    run, variant, placement, dtype, params, stage where they vary), p50, busbw and the
    check always; p99, algbw, host time and % of the line rate while the table fits; the
    rest (iters, bound, ceiling, % achieved, a dtype that never changes) with --wide."""
    order = per_params(lambda p: params_order(p, b.params))
    describe = per_params(lambda p: b.describe(p or {}))
    rs = sorted(rs, key=lambda r: (text(r.get("run")), text(r.get("variant")), text(r.get("placement")),
                                  text(r.get("dtype")), order(r.get("params")), text(r.get("stage")),
                                  int(r["world"]), int(r["nbytes"])))
    show_params = len({describe(r.get("params")) for r in rs}) > 1
    show_stage = any(r.get("stage") for r in rs)
    show_run = _varies(rs, "run")
    show_variant = _varies(rs, "variant")
    show_ceiling = any(is_number(r.get("time_bound_us")) for r in rs)
    show_place = _varies(rs, "placement") or any(r.get("placement") == "in-place" for r in rs)
    # GPU rows: the device time per operation (p50) and, beside it, what the host paid to
    # enqueue one -- what an eager small-message workload pays.
    show_host = any(is_number(r.get("host_us_per_op")) for r in rs)
    sized = any(float(r.get("nbytes") or 0) > 0 for r in rs)
    note = b.formula or ("" if b.sized else "latency only")
    sample = next((r.get("sample") for r in rs if r.get("sample")), None)
    dtypes = sorted({text(r.get("dtype")) for r in rs})
    t = table(f"{bench}  [{rs[0]['backend']}/{rs[0]['device']}]",
              f"{note}; {time_caption(rs)}; GB = 1e9 B".lstrip("; ")
              + ("" if len(dtypes) > 1 else f"; dtype {dtypes[0]}")
              + (f"; sample = {sample}; host = host time to enqueue one operation" if show_host and sample else "")
              + (f"; {_ceiling_caption(rs)}" if show_ceiling else "")
              + (f"; {WORLD_1_NOTE} (busbw as the formula gives it, no % of line)"
                 if any(int(r["world"]) == 1 for r in rs) else ""), plain, nrows=len(rs))
    cols = [("run", True, ALWAYS, show_run), ("world", False, ALWAYS, True),
            ("variant", True, ALWAYS, show_variant), ("placement", True, ALWAYS, show_place),
            ("dtype", True, ALWAYS if len(dtypes) > 1 else WIDE, True), ("params", True, ALWAYS, show_params),
            ("stage", True, ALWAYS, show_stage), ("size (B)", False, ALWAYS, sized),
            ("iters", False, WIDE, True), ("min (us)", False, WIDE, True), ("p50 (us)", False, ALWAYS, True),
            ("p99 (us)", False, COMPACT, True), ("max (us)", False, WIDE, True),
            ("host (us/op)", False, COMPACT, show_host), ("algbw (GB/s)", False, COMPACT, sized),
            ("busbw (GB/s)", False, ALWAYS, sized), ("bound (us)", False, WIDE, show_ceiling),
            ("ceiling (GB/s)", False, WIDE, show_ceiling and sized), ("% line", False, COMPACT, show_ceiling and sized),
            ("% achieved", False, WIDE, show_ceiling and sized), ("check", True, ALWAYS, True)]
    cols = [c for c in cols if c[3]]
    for name, left, level, _ in cols:
        add_column(t, name, left, level, wrap=name == "params", words=name == "params", in_caption=name == "dtype" and len(dtypes) == 1)
    # Each shown column's cell of a row (only those: a table may hold 300k rows); sizes in
    # one format down the column.
    sizes = iter(size_cells(int(r["nbytes"]) for r in rs)) if any(c[0] == "size (B)" for c in cols) else iter(())
    cell = {"run": lambda r: text(r.get("run")), "world": lambda r: str(r["world"]),
            "variant": lambda r: text(r.get("variant")) or "default",
            "placement": lambda r: text(r.get("placement")) or "-", "dtype": lambda r: text(r.get("dtype")),
            "params": lambda r: describe(r.get("params")), "stage": lambda r: text(r.get("stage")),
            "size (B)": lambda r: next(sizes), "iters": lambda r: text(r.get("iters")),
            "p50 (us)": lambda r: f"{r['time_us_p50']:.2f}", "p99 (us)": lambda r: fixed(r.get("time_us_p99"), 2),
            "min (us)": lambda r: fixed(r.get("time_us_min"), 2), "max (us)": lambda r: fixed(r.get("time_us_max"), 2),
            "host (us/op)": lambda r: fixed(r.get("host_us_per_op"), 2),
            "algbw (GB/s)": lambda r: fixed(r.get("algbw_gbps"), 3),
            "busbw (GB/s)": lambda r: fixed(r.get("busbw_gbps"), 3),
            "bound (us)": lambda r: fixed(r.get("time_bound_us"), 2),
            "ceiling (GB/s)": lambda r: fixed(ceiling_busbw(r), 1),
            "% line": lambda r: fixed(r.get("pct_of_ceiling"), 1),
            "% achieved": lambda r: fixed(r.get("pct_of_achieved"), 1), "check": lambda r: text(r.get("check"))}
    shown = [cell[name] for name, *_ in cols]
    for r in rs:
        t.add_row(*[f(r) for f in shown])
    return t


def _ceiling_caption(rs) -> str:
    """The profile, the tier and link of each row, and what the % columns compare: the
    rows' own `compared_as` (busbw, wire rate, per-tier bytes), or, for rows with no bytes
    (a benchmark without sizes), that the bound is the profile's latency floor."""
    judged = [r for r in rs if is_number(r.get("time_bound_us"))]
    tiers = sorted({f"{x.get('tier')}: {x.get('bottleneck')}" for x in judged})
    compared = sorted({str(x["compared_as"]) for x in judged if has(x.get("compared_as"))})
    lines = sorted({float(x["ceiling_gbps"]) for x in judged if is_number(x.get("ceiling_gbps"))})
    out = f"profile {judged[0].get('profile')}; {', '.join(tiers)}"
    if lines:
        out += "; line rate " + ", ".join(f"{v:.4g}" for v in lines) + " GB/s"
    bases = sorted({f"{float(x['bound_busbw_gbps']):.4g} GB/s busbw that {x['bound_basis']}" for x in judged
                    if is_number(x.get("bound_busbw_gbps")) and has(x.get("bound_basis"))})
    if compared:
        # The ceiling in the rows' own unit, so a reader can check the %: busbw / the busbw the bound allows.
        out += (f"; % line = busbw / the busbw the line rate allows ({'; '.join(bases) if bases else 'the rate itself'})"
                f", and likewise of the typical achieved rate, comparing {' / '.join(compared)}; "
                "bound = the time at the line rate")
    else:
        out += "; bound = the profile's latency floor"
    doubts = sorted({str(x["ceiling_doubt"]) for x in judged if has(x.get("ceiling_doubt"))})
    if doubts:  # a loopback probe that was disturbed or spread: the % is shown, no verdict rests on it
        out += f"; no verdict on % line: {'; '.join(doubts)}"
    return out


def _scaling_rows(sc, wide: bool):
    """The weak-scaling rows to show, in order: every size with --wide, else each sized
    group at its largest size measured at several worlds (the size nearest the link's
    rate; busbw at small sizes is latency, not bandwidth)."""

    shown = sc if wide else largest_size(sc)
    views = presenters(shown)
    return sorted(shown.to_dict("records"), key=lambda r: (
        text(r.get("run")), r["benchmark"], text(r.get("variant")), text(r.get("placement")), text(r.get("dtype")),
        views[r["benchmark"]].sized and -int(r["nbytes"]), params_order(r.get("params"), views[r["benchmark"]].params),
        text(r.get("stage")),
        int(r["world"])))


METRIC_NAMES = {"busbw_gbps": "busbw GB/s", "tokens_per_s_per_rank": "tokens/s per rank"}


def own_metrics_caption(sc) -> str:
    """"; <benchmark>: <its metric>" for each benchmark whose scaling metric is its own
    (Benchmark.scaling_metric), not busbw."""
    own = sorted({(b, m) for b, m in zip(sc["benchmark"], sc["metric"]) if m != "busbw_gbps"})
    return "".join(f"; {b}: {METRIC_NAMES.get(m, m)} (its own per-rank rate)" for b, m in own)


def no_scaling_reason(df, cores: int) -> str | None:
    """Why a run has no weak-scaling table, when the reason is that it measured one rank
    count (a 2-core host launches 2 ranks, and weak scaling compares at least two worlds);
    None when it has several."""
    worlds = sorted({int(w) for w in df["world"]}) if "world" in df.columns else []
    if len(worlds) != 1:
        return None
    w = worlds[0]
    return (f"no scaling table: the run has one rank count ({w}); weak scaling needs at least two worlds: "
            f"--np {2 * w} on a host with {2 * w} cores (this one has {cores}), or a cluster")


def analysis_tables(rows, console=None, wide: bool | None = None, say_no_scaling: bool = False,
                    view: View = View()) -> None:
    """Scaling efficiency over rank counts, and the alpha-beta fit over sizes.
    say_no_scaling: a run that let the launch choose its worlds says why it has no
    scaling table when it measured one."""
    import pandas as pd

    from commbench.analyse.analysis import MIN_FIT_SIZES, fit_table, scaling_table

    df = rows if hasattr(rows, "columns") else pd.DataFrame(list(rows))
    if df.empty or view.style != "table":  # another tool's layout has no such tables
        return
    console = console or make_console()
    wide = view.wide if wide is None else wide
    plain = not stdout_is_tty()
    sc = scaling_table(df)
    why = no_scaling_reason(df, hoststate.cores()) if say_no_scaling and sc.empty else None
    if why:
        console.print(why, highlight=False, markup=False)
    if not sc.empty:
        rs = _scaling_rows(sc, wide)
        views = presenters(sc)
        t = table("weak-scaling efficiency (per-rank throughput at n / at the smallest n)",
                  "collectives: busbw, " + ("at every size" if wide else
                                             "at the largest size measured at several worlds (--wide: every size)")
                  + own_metrics_caption(sc), plain, nrows=len(rs))
        cols = [("run", True, _varies(rs, "run")), ("benchmark", True, True),
                ("variant", True, _varies(rs, "variant", "benchmark")),
                ("placement", True, _varies(rs, "placement", "benchmark")),
                ("stage", True, any(r.get("stage") for r in rs)),
                ("size (B)", False, any(views[r["benchmark"]].sized for r in rs)),
                ("dtype", True, _varies(rs, "dtype")),
                ("params", True, any(not views[r["benchmark"]].sized or json.loads(r["params"]) for r in rs)),
                ("world", False, True), ("metric", True, True), ("value\n(metric's unit)", False, True),
                ("efficiency\n(%)", False, True)]
        cols = [c for c in cols if c[2]]
        for name, left, _ in cols:
            add_column(t, name, left, wrap=name == "params", words=name == "params")
        sized_cells = iter(size_cells(int(r["nbytes"]) for r in rs if views[r["benchmark"]].sized))
        for r in rs:
            b = views[r["benchmark"]]
            cell = {"run": text(r.get("run")), "benchmark": r["benchmark"], "variant": text(r.get("variant")),
                    "placement": text(r.get("placement")), "stage": text(r.get("stage")),
                    "size (B)": next(sized_cells) if b.sized else "", "dtype": text(r.get("dtype")),
                    "params": b.describe(json.loads(r["params"])), "world": str(r["world"]),
                    "metric": METRIC_NAMES.get(r["metric"], r["metric"]), "value\n(metric's unit)": num(r["value"]),
                    "efficiency\n(%)": f"{r['efficiency_pct']:.1f}"}
            t.add_row(*[cell[c[0]] for c in cols])
        print_table(console, t, wide)
    thin: list[str] = []
    refused: list[str] = []
    ft = fit_table(df, thin=thin, refused=refused)
    if not ft.empty:
        fr = ft.to_dict("records")
        t = table("alpha-beta fit t = alpha + S/B over the size sweep (relative least squares)",
                  f"n_half = alpha*B: the size reaching half of B; busbw asymptote = B x F; sweeps of at least "
                  f"{MIN_FIT_SIZES} sizes" + ("" if _varies(fr, "dtype") else f"; dtype {text(fr[0]['dtype'])}"), plain,
                  nrows=len(fr))
        cols = [("run", True, ALWAYS, _varies(fr, "run")), ("benchmark", True, ALWAYS, True),
                ("world", False, ALWAYS, True), ("variant", True, ALWAYS, _varies(fr, "variant", "benchmark")),
                ("placement", True, ALWAYS, _varies(fr, "placement", "benchmark")),
                ("dtype", True, ALWAYS if _varies(fr, "dtype") else WIDE, True),
                ("stage", True, ALWAYS, any(r.get("stage") for r in fr)), ("sizes (B)", True, ALWAYS, True),
                ("alpha (us)", False, ALWAYS, True), ("B (GB/s)", False, ALWAYS, True),
                ("busbw asym (GB/s)", False, ALWAYS, True), ("n_half (B)", False, ALWAYS, True),
                ("rms err (%)", False, ALWAYS, True), ("max err (%)", False, COMPACT, True)]
        cols = [c for c in cols if c[3]]
        for name, left, level, _ in cols:
            add_column(t, name, left, level, in_caption=name == "dtype" and level == WIDE)
        for r in fr:
            nh = r["n_half_nbytes"]
            cell = {"run": text(r.get("run")), "benchmark": r["benchmark"], "world": str(r["world"]),
                    "variant": text(r.get("variant")) or "default", "placement": text(r.get("placement")) or "-",
                    "dtype": text(r["dtype"]), "stage": text(r.get("stage")),
                    "sizes (B)": f"{fmt_size(int(r['min_nbytes']))}..{fmt_size(int(r['max_nbytes']))} ({r['points']})",
                    "alpha (us)": f"{r['alpha_us']:.3f}", "B (GB/s)": fixed(r["bandwidth_gbps"], 3),
                    "busbw asym (GB/s)": fixed(r["busbw_asymptote_gbps"], 3),
                    "n_half (B)": fmt_size(int(nh)) if is_number(nh) and nh != float("inf") else "-",
                    "rms err (%)": f"{r['rms_rel_err_pct']:.1f}", "max err (%)": f"{r['max_rel_err_pct']:.1f}"}
            t.add_row(*[cell[c[0]] for c in cols])
        print_table(console, t, wide)
    if thin:
        console.print(f"no alpha-beta fit (fewer than {MIN_FIT_SIZES} sizes, where two parameters fit any two "
                      f"points exactly): {'; '.join(thin)}", highlight=False, markup=False)
    if refused:
        console.print(f"no alpha-beta fit (no link's rate to fit): {'; '.join(refused)}", highlight=False,
                      markup=False)


def planted_line(df) -> str | None:
    """The points the regression gate's test hook slowed on purpose (rows with
    planted_delay_pct), named in one line; None when no row was planted."""
    if df is None or "planted_delay_pct" not in df.columns:
        return None
    rows = df[df["planted_delay_pct"].map(has)]
    if rows.empty:
        return None
    named = list(dict.fromkeys(f"{r['benchmark']} {r['dtype']} {fmt_size(int(r['nbytes']))} B "
                               f"+{float(r['planted_delay_pct']):g} %" for _, r in rows.iterrows()))
    more = f" and {len(named) - 6} more" if len(named) > 6 else ""
    return (f"planted slowdown: {len(rows)} row(s) were slowed on purpose by the regression gate's test hook "
            f"(COMMBENCH_PLANT_POINTS): {', '.join(named[:6])}{more}; not measurements of the code")


def print_report(df, runs, view: View = View()) -> None:
    """`commbench report` in the terminal: a line per run (runs: (path, meta.json) pairs),
    then the tables of the rows (df, already judged against the profile asked for), the
    analysis and variant tables, and the warnings."""
    for p, meta in runs:
        if meta:
            print(f"run {p}: suite {meta.get('suite')} backend {meta.get('backend')} world {meta.get('world')} "
                  f"status {meta.get('status')} hosts {','.join(sorted(set(meta.get('hosts', []))))}; "
                  f"{host_line(meta)}")
    for line in skipped_point_lines(meta for _, meta in runs):
        print(line, flush=True)
    if df.empty:
        print("no rows")
        return
    print_tables(df, view=view)
    for line in shootout_view.terminal_lines(df, dict(zip(names_for([p for p, _ in runs]), (m for _, m in runs)))):
        print(line, flush=True)
    analysis_tables(df, view=view)
    if "variant" in df and df["variant"].nunique() > 1 and view.style == "table":
        variant_tables(df, None, skipped_variants(meta for _, meta in runs), view=view)
    planted = planted_line(df)
    if planted:
        print(f"warning: {planted}", flush=True)
    say_warnings(df, sys.stdout, verbose=view.verbose)


def skipped_point_lines(metas) -> list[str]:
    """A line per benchmark, dispatcher and reason of the points the runs skipped (meta.json
    `skipped_points`: they could not run on that backend, device or node count)."""
    counts: dict[tuple, int] = {}
    for meta in metas:
        for s in (meta or {}).get("skipped_points") or []:
            if isinstance(s, dict):
                d = (s.get("params") or {}).get("dispatcher")
                key = (f"{s.get('benchmark')}" + (f" dispatcher={d}" if d else ""), s.get("reason"))
                counts[key] = counts.get(key, 0) + 1
    return [f"skipped: {what} ({n} point{'s' if n != 1 else ''}): {why}" for (what, why), n in counts.items()]


def skipped_variants(metas) -> dict:
    """{variant: why} of the variants the runs' meta.json say were skipped."""
    out = {}
    for meta in metas:
        for name, v in ((meta or {}).get("variants") or {}).items():
            if v.get("status") == "skipped":
                out[name] = v.get("reason")
    return out


def variant_tables(df, baseline: str | None = None, skipped: dict | None = None, console=None,
                   wide: bool | None = None, view: View = View()) -> None:
    """The skipped variants, then variant_comparisons as tables, each followed by its
    variants' verdicts."""
    console = console or make_console()
    wide = view.wide if wide is None else wide
    plain = not stdout_is_tty()
    for name, why in (skipped or {}).items():
        console.print(f"variant {name}: skipped: {why}", highlight=False, markup=False)
    for c in variant_comparisons(df, baseline):
        t = table(c["title"], c["caption"], plain)
        for h, level in c["columns"]:
            if h not in getattr(t, "levels", {}):
                add_column(t, h, level=level)
            else:  # one column per variant under the same header: rich keeps each
                t.add_column(h, justify="right", no_wrap=True)
        for r in c["rows"]:
            t.add_row(*r)
        print_table(console, t, wide)
        for line in c["lines"]:
            console.print(f"  {line}", highlight=False, markup=False)
