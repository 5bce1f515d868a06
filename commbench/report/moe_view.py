"""How moe rows are shown: the terminal table, the report section (the figures against
tokens, skew and by sub-stage are moe_figures.py's), and weak scaling in tokens per second
per rank. Registered as the view "moe" (report/views.py), the one the MoE benchmark
names; its shape in words and scaling measure are the benchmark's own (benchmarks/moe/)."""
from __future__ import annotations

import json
import math

from commbench.analyse.thresholds import LOAD_BALANCED, LOAD_MODERATE, PADDING_SHOWN, STAGE_CLOSE_RATIO
from commbench.analyse.verdicts import cannot_judge, excluded_note, trusted_mask
from commbench.benchmarks.base import for_rows
from commbench.benchmarks.moe import _IN_SHAPE, SKEW_AXES, shape  # noqa: F401 (shape: this view's cells)
from commbench.core.schema import has
from commbench.report.document import Finding, Section
from commbench.report.fmt import fmt, num, text
from commbench.report.judgements import judge_ceiling
from commbench.report.moe_sent import SENT_NOTE, bytes_as_sent, mb_cell, padding_cell, sent_words
from commbench.report.order import params_order, varying_params
from commbench.report.tables import ALWAYS, COMPACT, WIDE, add_column, table

# Sub-stages in the order a step runs them (every path's names: host, device, hierarchical,
# low-latency); the exchange itself is every stage named a2a*.
STAGE_ORDER = ("layout", "counts", "sync", "pack", "a2a", "a2a_out", "forward", "a2a_in", "unpack", "reduce")


def stage_times(r: dict) -> list[tuple[str, float]]:
    """[(sub-stage, p50 us of the slowest rank)] of one row, in STAGE_ORDER."""
    got = {k[len("stage_us_"):]: float(v) for k, v in r.items() if k.startswith("stage_us_") and has(v)
           and math.isfinite(float(v))}
    return sorted(got.items(), key=lambda kv: (STAGE_ORDER.index(kv[0]) if kv[0] in STAGE_ORDER else 99, kv[0]))


def deciding(r: dict) -> tuple[list[str], float] | None:
    """The sub-stage(s) that decide a row's time: the longest, with any other within
    STAGE_CLOSE_RATIO of it; and their share of the step in per cent: of p50, or of the
    sub-stages' sum where their medians add up to more than p50 (never over 100 %). None
    without stages."""
    st = [(k, v) for k, v in stage_times(r) if v > 0]
    p50 = float(r.get("time_us_p50") or 0)
    if not st or p50 <= 0:
        return None
    top = max(v for _, v in st)
    names = [k for k, v in sorted(st, key=lambda kv: -kv[1]) if v * STAGE_CLOSE_RATIO >= top]
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
    near the link it is. Rests on the per-stage p50s of the slowest rank; stages within STAGE_CLOSE_RATIO are named
    together, since a shared host moves them by that much."""
    dec = [(r, deciding(r)) for r in rs]
    dec = [(r, d) for r, d in dec if d is not None]
    if not dec:
        pcts = [r.get("pct_of_ceiling") for r in rs if has(r.get("pct_of_ceiling"))]
        doubt = next((r.get("ceiling_doubt") for r in rs if has(r.get("ceiling_doubt"))), None)
        return judge_ceiling(max(pcts) if pcts else None, doubt) + " (no per-stage times in the rows)"
    names = list(dict.fromkeys(n for _, d in dec for n in d[0]))
    shares = [d[1] for _, d in dec]
    share = f"{min(shares):.0f}%" if len(shares) == 1 or round(min(shares)) == round(max(shares)) else \
        f"{min(shares):.0f}-{max(shares):.0f}%"
    words = _in_words(names)
    out = f"{words} {'decide' if ' and ' in words else 'decides'}: {share} of the step (per-stage p50s, slowest rank)"
    if any(n.startswith("a2a") for n in names) and not all(n.startswith("a2a") for n in names):
        out += "; the exchange and work outside it both set the time"
    elif all(n.startswith("a2a") for n in names):
        judged = [r for r, _ in dec if has(r.get("pct_of_ceiling"))]
        if judged:  # the ceiling named in the row's own unit, time: the per-tier bound at the line rate
            top = max(judged, key=lambda r: float(r["pct_of_ceiling"]))
            out += (f"; the step runs at {fmt(top['pct_of_ceiling'], 1)}% of the link's line rate at best (its "
                    f"{fmt(top.get('time_bound_us'))} us time bound at the line rate / {fmt(top.get('time_us_p50'))} "
                    f"us p50)")
            out += "; the % counts the routed bytes to other ranks" if any(bytes_as_sent(r) for r, _ in dec) else ""
            if has(top.get("ceiling_doubt")):
                out += f"; cannot judge against the line rate: {top['ceiling_doubt']}"
    else:
        out += "; work outside the exchange, not the link, sets the time"
    return out + sent_words([r for r, _ in dec])


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
    sent = [b for b in map(bytes_as_sent, rs) if b]
    t = table(f"moe dispatch/combine  [{rs[0]['backend']}/{rs[0]['device']}]",
              GBPS_NOTE + "; stages (us): p50 of each sub-stage, slowest rank; % line: per-tier time bound at the "
              "profile's line rate / p50" + (SENT_NOTE if sent else ""), plain)
    rs = ordered(rs)
    # The padding by default where the exchange sends more than the routed rows; bytes with --wide.
    pad_level = ALWAYS if any(b[2] > PADDING_SHOWN for b in sent) else WIDE
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
            ("scale-out\n(GB/s)", False, ALWAYS, True), ("routed\n(MB)", False, WIDE, bool(sent)),
            ("sent\n(MB)", False, WIDE, bool(sent)), ("sent/\nrouted", False, pad_level, bool(sent)),
            ("decided\nby", True, ALWAYS, True),
            ("load\n(max/mean)", False, COMPACT, True), ("stages (us)", True, WIDE, True),
            ("outside\na2a (%)", False, WIDE, True), ("% line", False, COMPACT, True), ("check", True, ALWAYS, True)]
    cols = [c for c in cols if c[3]]
    for name, left, level, _ in cols:
        add_column(t, name, left, level, wrap=name in ("shape", "stages (us)"), words=name == "shape")
    for r in rs:
        stages = " ".join(f"{k}={v:.0f}" for k, v in stage_times(r))
        hot = f"{fmt(r.get('load_max_over_mean'))} (r{int(r['hottest_rank'])})" if has(r.get("hottest_rank")) else "-"
        cell = {"run": text(r.get("run")), "world": str(r["world"]), "shape": shape(r.get("params") or {}, vary=vary),
                "stage": text(r.get("stage")), "dtype": text(r.get("dtype")), "p50 (us)": fmt(r["time_us_p50"], 1),
                "p99 (us)": fmt(r["time_us_p99"], 1), "max (us)": fmt(r.get("time_us_max"), 1),
                "tokens/s": fmt(tokens_per_s(r), 0), "ours\n(GB/s)": fmt(r.get("remote_gbps")),
                "DeepEP\n(GB/s)": fmt(r.get("logical_gbps")), "scale-up\n(GB/s)": fmt(r.get("scaleup_gbps")),
                "scale-out\n(GB/s)": fmt(r.get("scaleout_gbps")), "routed\n(MB)": mb_cell(r, 0),
                "sent\n(MB)": mb_cell(r, 1), "sent/\nrouted": padding_cell(r), "decided\nby": decided_cell(r),
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
    sent = any(bytes_as_sent(r) for r in rows_in)
    heads = (["run"] if multi_run else []) + ["world", "shape", "stage", "p50 (us)", "p99 (us)", "tokens/s",
                                               "ours (GB/s)", "DeepEP (GB/s)", "scale-up (GB/s)", "scale-out (GB/s)"] + \
        (["routed (MB)", "sent (MB)", "sent/routed"] if sent else []) + ["decided by", "load (max/mean)"] + \
        (["% line"] if ceil else []) + ["check"]
    rows = []
    for r in rows_in:
        hot = r.get("hottest_rank")
        hot = str(int(hot)) if has(hot) and fmt(hot) != "-" else text(hot)
        load = f"{fmt(r.get('load_max_over_mean'))} (r{hot})" if has(r.get("load_max_over_mean")) else "-"
        cells = ([text(r["run"])] if multi_run else []) + [
            str(r["world"]), shape(r.get("params") or {}, terminal=False, vary=vary), text(r.get("stage")),
            fmt(r["time_us_p50"], 1), fmt(r["time_us_p99"], 1), fmt(tokens_per_s(r), 0), fmt(r.get("remote_gbps")),
            fmt(r.get("logical_gbps")), fmt(r.get("scaleup_gbps")), fmt(r.get("scaleout_gbps"))] + \
            ([mb_cell(r, 0), mb_cell(r, 1), padding_cell(r)] if sent else []) + [decided_cell(r), load]
        if ceil:
            cells.append(fmt(r.get("pct_of_ceiling"), 1))
        cells.append(text(r.get("check")))
        rows.append(cells)
    note = GBPS_NOTE + (SENT_NOTE if sent else "")
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
    if load <= LOAD_BALANCED:
        return "balanced: every rank receives about the mean"
    if load <= LOAD_MODERATE:
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
                f"GB/s DeepEP, {num(tokens_per_s(r))} tokens/s, {decided_cell(r)}"
                + (f", sends {padding_cell(r)} the routed bytes" if bytes_as_sent(r) else ""))
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


# What the MoE figures (moe_figures.py) and the report's no-figure reason read of the rows.
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
