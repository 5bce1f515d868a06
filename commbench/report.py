"""Tables from rows (live at the end of a run, or from disk). No measurement here."""
from __future__ import annotations

import json
import os
import sys

from .units import fmt_size

# Shown under each table so nobody has to guess which bandwidth a column is.
BUSBW_NOTE = {
    "all_reduce": "busbw = algbw x 2(n-1)/n",
    "reduce_scatter": "S = whole input; busbw = algbw x (n-1)/n",
    "all_gather": "S = whole output; busbw = algbw x (n-1)/n",
    "all_to_all": "S = bytes a rank sends; busbw = algbw x (n-1)/n",
    "broadcast": "busbw = algbw",
    "send_recv": "S per direction; busbw = algbw",
    "barrier": "latency only",
}


def stdout_is_tty() -> bool:
    """A rank started by `run --np` inherits the launcher's answer: mpirun hands ranks a
    pseudo-terminal even when its own output goes to a file."""
    forced = os.environ.get("COMMBENCH_TTY")
    return forced == "1" if forced in ("0", "1") else sys.stdout.isatty()


def _console():
    from rich.console import Console

    tty = stdout_is_tty()
    return Console(force_terminal=tty, no_color=not tty, width=240 if not tty else None, highlight=False)


def _params_text(p) -> str:
    if isinstance(p, str):
        try:
            p = json.loads(p)
        except ValueError:
            return p
    return " ".join(f"{k}={v}" for k, v in (p or {}).items())


def print_tables(rows, console=None) -> None:
    """One table per benchmark: size, p50, p99, algbw, busbw, check."""
    from rich import box
    from rich.table import Table

    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    console = console or _console()
    plain = not stdout_is_tty()
    by_bench: dict[str, list] = {}
    for r in rows:
        by_bench.setdefault(r["benchmark"], []).append(r)
    for bench, rs in by_bench.items():
        if bench == "moe":
            console.print(moe_table(rs, plain))
            continue
        show_params = len({_params_text(r.get("params")) for r in rs}) > 1
        show_stage = any(r.get("stage") for r in rs)
        show_run = len({r.get("run") for r in rs}) > 1
        t = Table(title=f"{bench}  [{rs[0]['backend']}/{rs[0]['device']}]",
                  caption=f"{BUSBW_NOTE.get(bench, '')}; time = slowest rank per iteration; GB = 1e9 B",
                  box=box.ASCII if plain else box.SIMPLE_HEAD)
        cols = (["run"] if show_run else []) + ["world", "size (B)", "dtype"] + (["params"] if show_params else []) \
            + (["stage"] if show_stage else []) + ["iters", "p50 (us)", "p99 (us)", "algbw (GB/s)", "busbw (GB/s)", "check"]
        for c in cols:
            t.add_column(c, justify="left" if c in ("run", "dtype", "params", "stage", "check") else "right",
                         no_wrap=c != "params")
        for r in rs:
            cells = ([str(r.get("run"))] if show_run else []) + [str(r["world"]), fmt_size(int(r["nbytes"])), r["dtype"]]
            cells += [_params_text(r.get("params"))] if show_params else []
            cells += [str(r.get("stage") or "")] if show_stage else []
            cells += [str(r["iters"]), f"{r['time_us_p50']:.2f}", f"{r['time_us_p99']:.2f}",
                      f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}", str(r["check"])]
            t.add_row(*cells)
        console.print(t)


def report_runs(paths) -> None:
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
    print_tables(df)


def _moe_params(p) -> str:
    if isinstance(p, str):
        p = json.loads(p)
    p = p or {}
    skew = {"zipf": f" a={p.get('alpha')}", "hot_rank": f" r={p.get('ratio')}",
            "group_limited": f" M={p.get('max_groups')}"}.get(p.get("routing"), "")
    return (f"T={p.get('tokens')} H={p.get('hidden')} E={p.get('experts')} K={p.get('topk')} "
            f"{p.get('copies')} {p.get('routing')}{skew}")


def moe_table(rs, plain: bool):
    """Dispatch and combine side by side with the three byte counts and the stages."""
    from rich import box
    from rich.table import Table

    t = Table(title=f"moe dispatch/combine  [{rs[0]['backend']}/{rs[0]['device']}]", box=box.ASCII if plain else box.SIMPLE_HEAD,
              caption="GB/s = the most loaded rank's bytes / slowest-rank p50. logical: rows received incl. "
                      "from itself (DeepEP); remote: from other ranks; up/out: from the same / other nodes. "
                      "load = max/mean rows received (hottest rank). stages: p50 us, slowest rank")
    show_run = len({r.get("run") for r in rs}) > 1
    cols = (["run"] if show_run else []) + ["world", "shape", "stage", "dtype", "p50 (us)", "p99 (us)", "max (us)",
                                            "logical", "remote", "scale-up", "scale-out", "load (hot)",
                                            "stages (us)", "outside a2a", "check"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("run", "shape", "stage", "dtype", "stages (us)", "check") else "right",
                     no_wrap=True)
    for r in rs:
        stages = " ".join(f"{k[9:]}={r[k]:.0f}" for k in r if k.startswith("stage_us_") and r[k] == r[k])
        cells = ([str(r.get("run"))] if show_run else []) + [
            str(r["world"]), _moe_params(r.get("params")), str(r.get("stage")), str(r["dtype"]),
            f"{r['time_us_p50']:.1f}", f"{r['time_us_p99']:.1f}", f"{r['time_us_max']:.1f}",
            f"{r['logical_gbps']:.2f}", f"{r['remote_gbps']:.2f}", f"{r['scaleup_gbps']:.2f}",
            f"{r['scaleout_gbps']:.2f}", f"{r['load_max_over_mean']:.2f} (r{int(r['hottest_rank'])})",
            stages, f"{r['outside_a2a_pct']:.0f}%", str(r["check"])]
        t.add_row(*cells)
    return t
