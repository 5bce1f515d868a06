"""Tables from rows (live at the end of a run, or from disk). No measurement here."""
from __future__ import annotations

import json
import os
import sys

from .units import fmt_size
from .viewkit import table


def stdout_is_tty() -> bool:
    """A rank started by `run --np` inherits the launcher's answer: mpirun hands ranks a
    pseudo-terminal even when its own output goes to a file."""
    forced = os.environ.get("COMMBENCH_TTY")
    return forced == "1" if forced in ("0", "1") else sys.stdout.isatty()


def _console():
    from rich.console import Console

    tty = stdout_is_tty()
    return Console(force_terminal=tty, no_color=not tty, width=240 if not tty else None, highlight=False)


def print_tables(rows, console=None) -> None:
    """Each benchmark's tables (Benchmark.tables); by default one table per benchmark:
    size, p50, p99, algbw, busbw, check."""
    from .benchmarks.base import for_rows

    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    console = console or _console()
    plain = not stdout_is_tty()
    by_bench: dict[str, list] = {}
    for r in rows:
        by_bench.setdefault(r["benchmark"], []).append(r)
    for bench, rs in by_bench.items():
        b = for_rows(bench)
        own = b.tables(rs, plain)
        for t in own if own is not None else [collective_table(bench, b, rs, plain)]:
            console.print(t)


def collective_table(bench: str, b, rs: list[dict], plain: bool):
    """The generic table of one benchmark's rows."""
    show_params = len({b.describe(r.get("params") or {}) for r in rs}) > 1
    show_stage = any(r.get("stage") for r in rs)
    show_run = len({r.get("run") for r in rs}) > 1
    show_ceiling = any(_has(r.get("time_bound_us")) for r in rs)
    show_place = len({r.get("placement") for r in rs}) > 1 or any(r.get("placement") == "in-place" for r in rs)
    # GPU rows: the device time per operation (p50) and, beside it, what the host paid to
    # enqueue one -- what an eager small-message workload pays.
    show_host = any(_has(r.get("host_us_per_op")) for r in rs)
    note = b.formula or ("" if b.sized else "latency only")
    sample = next((r.get("sample") for r in rs if r.get("sample")), None)
    t = table(f"{bench}  [{rs[0]['backend']}/{rs[0]['device']}]",
              f"{note}; time = slowest rank per iteration; GB = 1e9 B".lstrip("; ")
              + (f"; sample = {sample}; host = host time to enqueue one operation" if show_host and sample else "")
              + (f"; {_ceiling_caption(rs)}" if show_ceiling else ""), plain)
    cols = (["run"] if show_run else []) + ["world", "size (B)", "dtype"] + (["placement"] if show_place else []) \
        + (["params"] if show_params else []) \
        + (["stage"] if show_stage else []) + ["iters", "p50 (us)", "p99 (us)"] + (["host (us/op)"] if show_host else []) \
        + ["algbw (GB/s)", "busbw (GB/s)"] \
        + (["bound (us)", "ceiling (GB/s)", "% line", "% achieved"] if show_ceiling else []) + ["check"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("run", "dtype", "placement", "params", "stage", "check") else "right",
                     no_wrap=c != "params")
    for r in rs:
        cells = ([str(r.get("run"))] if show_run else []) + [str(r["world"]), fmt_size(int(r["nbytes"])), r["dtype"]]
        cells += [str(r.get("placement") or "-")] if show_place else []
        cells += [b.describe(r.get("params") or {})] if show_params else []
        cells += [str(r.get("stage") or "")] if show_stage else []
        cells += [str(r["iters"]), f"{r['time_us_p50']:.2f}", f"{r['time_us_p99']:.2f}"]
        cells += [_num(r.get("host_us_per_op"), 2)] if show_host else []
        cells += [f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"]
        if show_ceiling:
            cells += [_num(r.get("time_bound_us"), 2), _num(r.get("ceiling_gbps"), 1),
                      _num(r.get("pct_of_ceiling"), 1), _num(r.get("pct_of_achieved"), 1)]
        cells += [str(r["check"])]
        t.add_row(*cells)
    return t


def _has(v) -> bool:
    return v is not None and v == v


def _num(v, digits: int) -> str:
    return f"{v:.{digits}f}" if _has(v) else "-"


def _ceiling_caption(rs) -> str:
    r = next(r for r in rs if _has(r.get("time_bound_us")))
    tiers = sorted({f"{x.get('tier')}: {x.get('bottleneck')}" for x in rs if _has(x.get("time_bound_us"))})
    return (f"profile {r.get('profile')}; {', '.join(tiers)}; % of the link's line and typical achieved rate, "
            f"comparing {r.get('compared_as')}; bound = the time at the line rate")


def analysis_tables(rows, console=None) -> None:
    """Scaling efficiency over rank counts, and the alpha-beta fit over sizes."""
    import pandas as pd

    from .analysis import fit_table, presenters, scaling_table

    df = rows if hasattr(rows, "columns") else pd.DataFrame(list(rows))
    if df.empty:
        return
    console = console or _console()
    plain = not stdout_is_tty()
    sc = scaling_table(df)
    if not sc.empty:
        t = table("weak-scaling efficiency (per-rank throughput at n / at the smallest n)",
                  "collectives: busbw; moe: tokens per second per rank (bytes per rank grow with n)", plain)
        for c in ("benchmark", "stage", "size", "dtype", "params", "world", "metric", "value", "efficiency"):
            t.add_column(c, justify="right" if c in ("size", "world", "value", "efficiency") else "left")
        views = presenters(sc)
        for r in sc.to_dict("records"):
            b = views[r["benchmark"]]
            # An unsized benchmark's rows show their params (its point) in place of a size.
            t.add_row(r["benchmark"], str(r.get("stage") or ""), fmt_size(int(r["nbytes"])) if b.sized else "",
                      str(r["dtype"]), "" if b.sized else b.describe(json.loads(r["params"])), str(r["world"]),
                      r["metric"], f"{r['value']:.4g}", f"{r['efficiency_pct']:.1f}%")
        console.print(t)
    ft = fit_table(df)
    if not ft.empty:
        t = table("alpha-beta fit t = alpha + S/B over the size sweep (relative least squares)",
                  "n_half = alpha*B: the size reaching half of B; busbw asymptote = B x F", plain)
        for c in ("benchmark", "world", "dtype", "sizes", "alpha (us)", "B (GB/s)", "busbw asym (GB/s)", "n_half",
                  "rms err", "max err"):
            t.add_column(c, justify="left" if c in ("benchmark", "dtype", "sizes") else "right")
        for r in ft.to_dict("records"):
            nh = r["n_half_nbytes"]
            t.add_row(r["benchmark"], str(r["world"]), str(r["dtype"]),
                      f"{fmt_size(int(r['min_nbytes']))}..{fmt_size(int(r['max_nbytes']))} ({r['points']})",
                      f"{r['alpha_us']:.3f}", _num(r["bandwidth_gbps"], 3), _num(r["busbw_asymptote_gbps"], 3),
                      fmt_size(int(nh)) if _has(nh) and nh != float("inf") else "-",
                      f"{r['rms_rel_err_pct']:.1f}%", f"{r['max_rel_err_pct']:.1f}%")
        console.print(t)


def report_runs(paths, profile=None) -> None:
    from .results import load, load_meta

    for p in paths:
        meta = load_meta(p)
        if meta:
            print(f"run {p}: suite {meta.get('suite')} backend {meta.get('backend')} world {meta.get('world')} "
                  f"status {meta.get('status')} hosts {','.join(sorted(set(meta.get('hosts', []))))}")
    df = load(paths)
    if df.empty:
        print("no rows")
        return
    if profile is not None:  # judge the rows against another profile
        df = rejudge(df, paths, profile)
    print_tables(df)
    analysis_tables(df)
    if "variant" in df and df["variant"].nunique() > 1:
        skipped = {}
        for p in paths:
            for name, v in ((load_meta(p) or {}).get("variants") or {}).items():
                if v.get("status") == "skipped":
                    skipped[name] = v.get("reason")
        variant_tables(df, None, skipped)


def rejudge(df, paths, profile):
    """Recompute every row's ceiling fields against `profile`, with each run's node map."""
    from pathlib import Path

    from .results import load_meta

    nodes = {(Path(p).name if Path(p).is_dir() else Path(p).parent.name): (load_meta(p) or {}).get("nodes")
             for p in paths}
    return rejudge_rows(df, nodes, profile)


def rejudge_rows(df, nodes: dict, profile):
    """rejudge with the node map of each run given (run name -> node of each rank)."""
    import pandas as pd

    from .ceilings import ceiling_for_row

    out = []
    for r in df.to_dict("records"):
        nm = nodes.get(str(r.get("run"))) or [0] * int(r["world"])
        out.append({**r, **ceiling_for_row(profile, r, nm), "profile": profile.name})
    return pd.DataFrame(out)


def variant_tables(df, baseline: str | None = None, skipped: dict | None = None, console=None) -> None:
    """Side by side per collective, world and size: each variant's p50, algbw, busbw, wire
    bandwidth (algbw*(n+1)/n for in-switch variants, else busbw) and % of the scale-up
    ceiling; then each variant's speedup over the baseline and the size from which it wins."""
    from .analysis import presenters
    from .variants import crossover_nbytes, pick_baseline, wire_gbps

    console = console or _console()
    plain = not stdout_is_tty()
    for name, why in (skipped or {}).items():
        console.print(f"variant {name}: skipped: {why}")
    if df.empty or "variant" not in df:
        return
    names = list(dict.fromkeys(df["variant"]))
    if len(names) < 2:
        return
    base = pick_baseline(names, baseline)
    views = presenters(df)
    for (bench, world, dtype), g in df.groupby(["benchmark", "world", "dtype"], sort=False):
        if not (views[bench].sized and views[bench].collective_rows) or g["variant"].nunique() < 2:
            continue
        here = [n for n in names if n in set(g["variant"])]
        t = table(f"{bench} world {world} {dtype}: variants side by side (baseline {base})",
                  "wire = algbw*(n+1)/n for in-switch variants (what each link carries), busbw otherwise; "
                  "% = wire or busbw of the scale-up ceiling's line rate; x = speedup of p50 over the baseline", plain)
        t.add_column("size", justify="right")
        for n in here:
            for c in ("p50 us", "algbw", "busbw", "wire", "%", "x"):
                t.add_column(f"{n} {c}" if c == "p50 us" else c, justify="right")
        speed = {n: [] for n in here}
        sizes = sorted(set(g["nbytes"]))
        for s in sizes:
            cells = [fmt_size(int(s))]
            at = {r["variant"]: r for r in g[g["nbytes"] == s].to_dict("records")}
            b = at.get(base)
            for n in here:
                r = at.get(n)
                if r is None:
                    cells += ["-"] * 6
                    continue
                wire = wire_gbps(r["algbw_gbps"], int(world), bool(r.get("inswitch")), r["busbw_gbps"])
                x = b["time_us_p50"] / r["time_us_p50"] if b is not None and r["time_us_p50"] > 0 else None
                if x is not None:
                    speed[n].append((s, x))
                cells += [f"{r['time_us_p50']:.2f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}",
                          f"{wire:.3f}", _num(r.get("pct_of_ceiling"), 1), f"{x:.2f}" if x is not None else "-"]
            t.add_row(*cells)
        console.print(t)
        for n in here:
            if n == base or not speed[n]:
                continue
            cross = crossover_nbytes([s for s, _ in speed[n]], [x for _, x in speed[n]])
            best = max(speed[n], key=lambda p: p[1])
            console.print(f"  {bench} w{world}: {n} vs {base}: best {best[1]:.2f}x at {fmt_size(int(best[0]))}; "
                          + (f"faster from {fmt_size(int(cross))} up" if cross is not None else "never faster at the "
                             "largest sizes"))
