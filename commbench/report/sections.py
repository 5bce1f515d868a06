"""The report's sections, built from rows: the run line, each benchmark's section, the
checks, weak scaling, alpha-beta fits, variants, and the Summary that leads with one
line of judgement per finding. html.py renders them as report.md and report.html."""
from __future__ import annotations

import math

from commbench.analyse.analysis import MIN_FIT_SIZES, fit_table, largest_size, presenters, scaling_table
from commbench.analyse.ceilings import CEILING_COLUMN_NOTE, WORLD_1_NOTE, ceiling_busbw, share_of_ceiling
from commbench.analyse.verdicts import (
    CANNOT_JUDGE,
    cannot_judge,
    excluded_note,
    rests_on,
    trusted_mask,
    untrusted_reason,
)
from commbench.core.hoststate import host_line
from commbench.core.schema import has, params_dict
from commbench.core.units import fmt_size
from commbench.report import views as bench_views
from commbench.report.document import Finding, Section
from commbench.report.fmt import fmt, num, size_cells, text
from commbench.report.judgements import judge_ceiling, judge_efficiency, judge_latency
from commbench.report.order import params_order
from commbench.report.repeat_findings import fastest_repeat, per_repeat, repeat_medians
from commbench.report.terminal import (
    METRIC_NAMES,
    own_metrics_caption,
    planted_line,
    skipped_point_lines,
    time_caption,
)
from commbench.report.variants_view import variant_comparisons

# ---------------------------------------------------------------------------------------
# tables

def run_header(name: str, meta: dict) -> list[tuple[str, str]]:
    """(label, value) pairs describing one run: hosts, GPUs, versions, chosen env."""
    out = []
    if meta.get("imported_from"):
        out.append(("imported from", f"{meta['imported_from']} ({meta.get('source', meta.get('source_format'))})"))
    out.append(("suite", text(meta.get("suite")) or "-"))
    out.append(("status", f"{meta.get('status', '-')}" + (f" ({meta['reason']})" if meta.get("reason") else "")))
    if meta.get("started"):
        out.append(("started", str(meta["started"])))
    out.append(("backend / device", f"{meta.get('backend', '-')} / {meta.get('device', '-')}"))
    out.append(("ranks", str(meta.get("world", "-"))))
    hosts = meta.get("hosts") or []
    if hosts:
        counts: dict[str, int] = {}
        for h in hosts:
            counts[h] = counts.get(h, 0) + 1
        out.append(("hosts", ", ".join(f"{h} x{n}" for h, n in counts.items())))
    gpus = meta.get("gpus") or []
    out.append(("GPUs", ", ".join(sorted(set(map(str, gpus)))) if gpus else "none (CPU ranks)"))
    vers = {k: v for k, v in (meta.get("versions") or {}).items() if v}
    if vers:
        out.append(("versions", ", ".join(f"{k} {str(v).strip(chr(0))}" for k, v in vers.items())))
    env = chosen_env(meta.get("env"))
    out.append(("environment", ", ".join(f"{k}={v}" for k, v in env.items()) if env else
                "no NCCL_/UCX_/MPI/TORCH_ variables set"))
    ceil = meta.get("ceilings") or {}
    if ceil.get("profile"):
        out.append(("ceiling profile", str(ceil["profile"])))
    if meta.get("import_notes"):
        out.append(("import notes", "; ".join(meta["import_notes"])))
    skipped = skipped_point_lines([meta])
    if skipped:
        out.append(("skipped points", "; ".join(line.removeprefix("skipped: ") for line in skipped)))
    if meta.get("command"):
        out.append(("command", command_line(meta["command"])))
    return out


def command_line(command) -> str:
    """The command a run was started with, as the user types it: a record that kept the
    interpreter's view (".../commbench/__main__.py run ...", "python -m commbench run ...")
    reads "commbench run ..."."""
    words = [str(w) for w in (command if isinstance(command, (list, tuple)) else str(command).split())]
    for i, w in enumerate(words):
        if w.endswith("__main__.py") or (w == "commbench" and (i == 0 or words[i - 1] == "-m")):
            return " ".join(["commbench"] + words[i + 1:])
    return " ".join(words)


def run_line(name: str, meta: dict) -> str:
    """One line saying what a run was: the first thing under the report's title."""
    hosts = sorted(set(meta.get("hosts") or []))
    parts = [f"suite {text(meta.get('suite')) or '-'}", f"{meta.get('backend', '-')}/{meta.get('device', '-')}",
             f"{meta.get('world', '-')} ranks" + (f" on {', '.join(hosts)}" if hosts else ""),
             str(meta.get("status", "-"))]
    if meta.get("imported_from"):
        parts.insert(0, f"imported from {meta['imported_from']}")
    if not meta.get("imported_from"):
        parts.append(host_line(meta))
    if meta.get("command"):
        parts.append("command: " + command_line(meta["command"]))
    return f"{name}: " + "; ".join(parts)


def benchmark_sections(df, figures: dict, floors: dict | None = None) -> list[Section]:
    """Each benchmark's sections (its registered view's, report/views.py), with the figures
    drawn for it; the generic table for those that have none of their own, and those first.
    floors: run name -> the profile's latency floor (us), for the latency findings."""
    generic, own = [], []
    multi_run = df["run"].nunique() > 1
    for bench, b in sorted(presenters(df).items()):
        g = df[df["benchmark"] == bench]
        figs = [f for f in figures.values() if f.benchmark == bench]
        mine = bench_views.report_sections(b, g, figs)
        if mine is None:
            generic.append(collective_section(bench, b, g, figs, multi_run, floors or {}))
        else:
            own += mine
    return generic + own


def collective_section(bench: str, b, g, figs: list, multi_run: bool, floors: dict | None = None) -> Section:
    """The generic table: by size (variant, placement, dtype, params and stage when they
    vary), or latency only for a benchmark without sizes; with its summary findings."""
    found = collective_findings(bench, g, multi_run, floors or {})
    if not b.sized or (g["nbytes"].astype(float) <= 0).all():
        heads = (["run"] if multi_run else []) + ["world", "p50 (us)", "p99 (us)", "iters", "check"]
        rows = [([text(r["run"])] if multi_run else []) +
                [str(r["world"]), fmt(r["time_us_p50"]), fmt(r["time_us_p99"]), text(r.get("iters")),
                 text(r.get("check"))] for r in g.sort_values(["run", "world"]).to_dict("records")]
        return Section(f"{bench}", b.formula or "latency only", heads, rows, figs, findings=found)
    g = g.copy()
    g["variant"] = g["variant"].map(text).replace("", "default") if "variant" in g.columns else "default"
    g["placement"] = g["placement"].map(text) if "placement" in g.columns else ""
    keys = ("variant", "placement", "dtype", "params", "stage")
    vary = {c: c in g.columns and g[c].map(text).nunique() > 1 for c in keys}
    ceil = "pct_of_ceiling" in g.columns and g["pct_of_ceiling"].astype(float).notna().any()
    heads = (["run"] if multi_run else []) + ["world"] + [c for c in keys if vary[c]] + \
        ["size (B)", "p50 (us)", "p99 (us)", "algbw (GB/s)", "busbw (GB/s)"] + \
        (["ceiling (GB/s)", "% of ceiling"] if ceil else []) + ["check"]
    rows = []
    sort = [c for c in ("run", "world", "variant", "placement", "dtype", "stage", "nbytes") if c in g.columns]
    records = g.sort_values(sort).to_dict("records")
    for r, size in zip(records, size_cells(int(r["nbytes"]) for r in records)):
        cells = ([text(r["run"])] if multi_run else []) + [str(r["world"])]
        cells += [(b.describe(r.get("params") or {}) if c == "params" else text(r.get(c))) for c in keys if vary[c]]
        cells += [size, fmt(r["time_us_p50"]), fmt(r["time_us_p99"]), fmt(r["algbw_gbps"], 3),
                  fmt(r["busbw_gbps"], 3)]
        if ceil:
            cells += [fmt(ceiling_busbw(r), 1), fmt(r.get("pct_of_ceiling"), 1)]
        cells.append(text(r.get("check")))
        rows.append(cells)
    caption = time_caption(g.to_dict("records")).replace("time = slowest rank", "p50/p99 of the slowest rank")
    note = f"{b.formula}; {caption}; GB = 1e9 B".lstrip("; ")
    if ceil:
        note += f"; {CEILING_COLUMN_NOTE}"
    if "source" in g.columns and g["source"].map(has).any():
        note += "; imported rows: p50 is the tool's mean time"
    return Section(bench, note, heads, rows, figs, findings=found)


def _varies(df, key: str) -> bool:
    """Does `key` take several values within one benchmark's rows?"""
    return key in df.columns and bool((df[key].map(text).groupby(df["benchmark"]).nunique() > 1).any())


def _bytes(n) -> str:
    """A size in a sentence: "8 B", "64K"."""
    t = fmt_size(int(n))
    return f"{t} B" if t.isdigit() else t


def _where(r: dict, multi_run: bool, varies: dict) -> str:
    """A row's point in a finding: run (several), world, and variant/placement/dtype where
    they vary."""
    parts = ([text(r.get("run"))] if multi_run else []) + [f"n={int(r['world'])}"]
    parts += [text(r.get(k)) for k in ("variant", "placement", "dtype") if varies.get(k) and text(r.get(k))]
    return " ".join(parts)


def collective_findings(bench: str, g, multi_run: bool, floors: dict) -> list[Finding]:
    """A collective's summary lines: its peak busbw against the ceiling, and its
    small-message latency (p50 at the smallest size, each world) against the latency
    floor; a benchmark without sizes: its latency."""
    out = []
    g = g.copy()
    g["run"] = g["run"].map(text)
    varies = {k: k in g.columns and g[k].map(text).nunique() > 1 for k in ("variant", "placement", "dtype")}
    sized = g[g["nbytes"].astype(float) > 0]
    one = sized[sized["world"].astype(int) == 1]  # nothing crosses a link: no peak, no bandwidth verdict
    if len(one) and "busbw_gbps" in one.columns and len(one) == len(sized):
        out.append(Finding(bench, "peak busbw", f"{num(one['busbw_gbps'].astype(float).max())} GB/s, the formula's "
                           f"busbw at world 1", WORLD_1_NOTE))
    linked = sized[sized["world"].astype(int) > 1]
    if len(linked) and "busbw_gbps" in linked.columns:
        bw = linked["busbw_gbps"].astype(float)
        ok = trusted_mask(linked) & bw.notna()
        if bw.notna().any() and not ok.any():
            out.append(Finding(bench, "peak busbw", f"{num(bw.max())} GB/s over {len(linked)} rows, not used",
                               cannot_judge(linked, "the peak")))
        elif ok.any():  # never a row that carries a warning, ran disturbed or oversubscribed
            r = linked.loc[bw[ok].idxmax()].to_dict()
            share = share_of_ceiling(r)  # the ceiling named in busbw, as the row's own unit
            out.append(Finding(bench, "peak busbw", f"{num(bw[ok].max())} GB/s at {_bytes(r['nbytes'])}, "
                               f"{_where(r, multi_run, varies)}" + (f" = {share}" if share else "")
                               + excluded_note(linked, ok) + ("; world-1 rows left out" if len(one) else ""),
                               judge_ceiling(r.get("pct_of_ceiling"), r.get("ceiling_doubt"))))
    lat = sized if len(sized) else g
    if len(lat):
        # Each world's smallest size (a blocked collective's smallest differs with n).
        n = lat["nbytes"].astype(float)
        small = lat[n == n.groupby([lat["run"], lat["world"]]).transform("min")]
        what = "p50 at the smallest size" if len(sized) else "p50"
        usable = trusted_mask(small)
        name = "small-message latency" if len(sized) else "latency"
        if not usable.any():
            out.append(Finding(bench, name, f"{what}: {len(small)} rows, not used", cannot_judge(small, "the latency")))
            return out
        note = excluded_note(small, usable)
        small = small[usable]
        small, repeated = fastest_repeat(small)
        by = small.sort_values(["run", "world"]).to_dict("records")
        vals = ", ".join(f"{num(r['time_us_p50'])} us" + (f" at {_bytes(r['nbytes'])}" if len(sized) else "")
                         + f" ({_where(r, multi_run, varies)}{r['_spread']})" for r in by[:6]) + \
            (f" and {len(by) - 6} more" if len(by) > 6 else "")
        first = min(by, key=lambda r: int(r["world"]))
        floor = floors.get(first["run"])
        basis = (f"rests on the fastest of each point's interleaved repeats ({rests_on(small)[9:]})" if repeated else
                 f"{rests_on(small)}; noise between runs not measured")
        out.append(Finding(bench, name, f"{what}: {vals}{note}",
                           f"{judge_latency(float(first['time_us_p50']), floor)} ({basis})"))
    return out



def check_findings(df) -> list[Finding]:
    """Did every point pass its data check, and which rows carry a warning."""
    out = []
    checks = df["check"].map(text) if "check" in df.columns else None
    if checks is not None:
        failed = int((checks == "fail").sum())
        ok = int((checks == "ok").sum())
        if failed:
            names = ", ".join(sorted(set(df.loc[checks == "fail", "benchmark"])))
            out.append(Finding("checks", "data check", f"{failed} of {len(df)} points FAILED ({names})",
                               "their figures are not valid: a wrong result was measured"))
        elif ok:
            out.append(Finding("checks", "data check", f"{ok} points verified, {len(df) - ok} without a check",
                               "every checked result was exact"))
        else:
            out.append(Finding("checks", "data check", f"none of {len(df)} points checked (imported, or --no-check)",
                               "the results are unverified"))
    planted = planted_line(df)
    if planted:
        out.append(Finding("checks", "planted slowdown", planted.split(": ", 1)[1],
                           "those points were slowed on purpose: read no verdict from them"))
    if "warning" in df.columns and df["warning"].map(has).any():
        w = df[df["warning"].map(has)]
        out.append(Finding("checks", "warnings", f"{len(w)} rows ({', '.join(sorted(set(w['benchmark'])))}): "
                           + "; ".join(sorted(set(w["warning"].map(text)))[:3]),
                           "read those rows with their warning"))
    return out


def scaling_section(df, figures: dict) -> Section | None:
    try:
        sc = scaling_table(df)
    except Exception:  # noqa: BLE001 - a table must not sink the report
        return None
    if sc.empty:
        return None
    multi_run = "run" in sc.columns and sc["run"].nunique() > 1
    views = presenters(sc)
    # The largest size of each collective group (all sizes: `commbench report --wide`).
    sc = largest_size(sc)
    rs = sorted(sc.to_dict("records"), key=lambda r: (
        text(r.get("run")), r["benchmark"], text(r.get("variant")), text(r.get("placement")), text(r.get("dtype")),
        params_order(r.get("params"), views[r["benchmark"]].params), text(r.get("stage")), int(r["world"])))
    vary = {k: _varies(sc, k) for k in ("variant", "placement", "dtype")}
    show_params = any(not views[r["benchmark"]].sized or params_dict(r["params"]) for r in rs)
    heads = (["run"] if multi_run else []) + ["benchmark"] + [k for k in ("variant", "placement", "dtype") if vary[k]] \
        + (["params"] if show_params else []) + ["stage", "size (B)", "world", "metric", "value (metric's unit)",
                                                  "efficiency (%)"]
    rows = []
    sized_cells = iter(size_cells(int(r["nbytes"]) for r in rs if views[r["benchmark"]].sized))
    for r in rs:
        b = views[r["benchmark"]]
        rows.append(([text(r["run"])] if multi_run else []) + [r["benchmark"]]
                    + [text(r.get(k)) for k in ("variant", "placement", "dtype") if vary[k]]
                    + ([b.describe(params_dict(r["params"]))] if show_params else [])
                    + [text(r.get("stage")), next(sized_cells) if b.sized else "", str(r["world"]),
                       METRIC_NAMES.get(r["metric"], r["metric"]), num(r["value"]), f"{r['efficiency_pct']:.1f}"])
    figs = [figures["scaling"]] if "scaling" in figures else []
    return Section("Scaling", "weak-scaling efficiency: per-rank throughput at n / at the smallest n (collectives: "
                   "busbw at the largest size measured at several worlds)" + own_metrics_caption(sc), heads, rows, figs,
                   findings=scaling_findings(sc, views, untrusted_points(df), per_repeat(df)))



def untrusted_points(df) -> dict:
    """(run, benchmark, world, nbytes) and (run, benchmark, world, None) -> why rows there
    cannot be evidence (verdicts.untrusted_reason); nbytes None stands for any size."""
    out: dict = {}
    if df is None or not len(df):
        return out
    for r in df.to_dict("records"):
        why = untrusted_reason(r)
        if why:
            run = text(r.get("run"))
            out.setdefault((run, r["benchmark"], int(r["world"]), int(r.get("nbytes") or 0)), why)
            out.setdefault((run, r["benchmark"], int(r["world"]), None), why)
    return out


def scaling_findings(sc, views, untrusted: dict | None = None, repeats: dict | None = None) -> list[Finding]:
    """Per benchmark: the efficiency at its largest world, against its smallest, over the
    groups at their largest size; the median judged, the worst named. A group whose rows at
    either world cannot be evidence (oversubscribed, disturbed, warned: untrusted_points)
    is left out, and said; "cannot judge" when none is left. With repeats (repeats: each
    repeat's own table), the same median is taken in each repeat: when the repeats' medians
    fall under different words, the spread between repeats is larger than what tells the
    words apart, and the verdict is "cannot judge"."""
    out = []
    untrusted = untrusted or {}
    for bench, g in sc.groupby("benchmark", sort=True):
        g = g.assign(_run=g["run"].map(text) if "run" in g.columns else "")
        top = g[g["world"] == g.groupby("_run")["world"].transform("max")]
        top = top[top["world"] > top["base_world"]]
        if top.empty:
            continue
        b = views[bench]

        def why(r):
            for w in (int(r["world"]), int(r["base_world"])):
                k = (r["_run"], bench, w, int(r["nbytes"]) if b.sized else None)
                if k in untrusted:
                    return f"n={w} {untrusted[k]}"
            return ""
        reasons = top.apply(why, axis=1)
        span = f"n={int(top['base_world'].min())} to n={int(top['world'].max())}"
        metric = f"weak scaling ({METRIC_NAMES.get(top.iloc[0]['metric'], top.iloc[0]['metric'])})"
        if (reasons != "").all():
            eff = top["efficiency_pct"].astype(float)
            out.append(Finding(bench, metric, f"median {eff.median():.0f}% over {len(top)} points ({span}), not used",
                               f"{CANNOT_JUDGE}: {'; '.join(sorted(set(reasons)))}"))
            continue
        left = (f"; {int((reasons != '').sum())} of {len(top)} points left out ({'; '.join(sorted(set(reasons) - {''}))})"
                if (reasons != "").any() else "")
        top = top[reasons == ""]
        eff = top["efficiency_pct"].astype(float)
        worst = top.loc[eff.idxmin()]
        at = fmt_size(int(worst["nbytes"])) if b.sized else b.describe(params_dict(worst["params"]))
        stage = f" {worst['stage']}" if text(worst.get("stage")) else ""
        span = f"n={int(top['base_world'].min())} to n={int(top['world'].max())}"
        val = (f"{eff.iloc[0]:.0f}% ({span}, {at})" if len(top) == 1 else
               f"median {eff.median():.0f}% over {len(top)} points ({span}); worst {eff.min():.0f}% at {at}{stage}")
        reps = repeat_medians(top, bench, repeats or {})
        if len(reps) >= 2:
            lo, hi = min(reps), max(reps)
            basis = (f"{rests_on(top)}, each the median of {len(reps)} interleaved repeats; the repeats' medians "
                     f"{lo:.0f}..{hi:.0f}%")
            if judge_efficiency(lo) != judge_efficiency(hi):
                out.append(Finding(bench, metric, val + left, f"{CANNOT_JUDGE}: the repeats disagree ({basis})"))
            else:
                out.append(Finding(bench, metric, val + left, f"{judge_efficiency(float(eff.median()))} ({basis})"))
            continue
        out.append(Finding(bench, metric, val + left,
                           f"{judge_efficiency(float(eff.median()))} ({rests_on(top)}; noise between runs not "
                           f"measured)"))
    return out



def fit_section(df) -> Section | None:
    thin: list[str] = []
    refused: list[str] = []
    try:
        ft = fit_table(df, thin=thin, refused=refused)
    except Exception:  # noqa: BLE001
        return None
    if ft.empty and not thin and not refused:
        return None
    multi_run = "run" in ft.columns and ft["run"].nunique() > 1
    vary = {k: _varies(ft, k) for k in ("variant", "placement")}
    heads = (["run"] if multi_run else []) + ["benchmark", "world"] + [k for k in ("variant", "placement") if vary[k]] \
        + ["dtype", "sizes (B)", "alpha (us)", "B (GB/s)", "busbw asym (GB/s)", "n_half (B)", "rms err (%)"]
    rows = []
    for r in ft.to_dict("records"):
        nh = r["n_half_nbytes"]
        rows.append(([text(r["run"])] if multi_run else []) + [r["benchmark"], str(r["world"])]
                    + [text(r.get(k)) or ("default" if k == "variant" else "-") for k in ("variant", "placement")
                       if vary[k]] + [
            text(r["dtype"]), f"{fmt_size(int(r['min_nbytes']))}..{fmt_size(int(r['max_nbytes']))} ({r['points']})",
            fmt(r["alpha_us"], 3), fmt(r["bandwidth_gbps"], 3), fmt(r["busbw_asymptote_gbps"], 3),
            fmt_size(int(nh)) if has(nh) and math.isfinite(float(nh)) else "-", f"{r['rms_rel_err_pct']:.1f}"])
    note = ("t = alpha + S/B over each size sweep (relative least squares); n_half = alpha x B, the size reaching "
            f"half of B; sweeps of at least {MIN_FIT_SIZES} sizes (two parameters pass through any two points)")
    if thin:
        note += f"; not fitted, too few sizes: {'; '.join(thin)}"
    if refused:
        note += f"; not fitted, no link's rate to fit: {'; '.join(refused)}"
    return Section("Alpha-beta fits", note, heads, rows)


def variant_sections(df, skipped: dict) -> list[Section]:
    """What the terminal prints after a variants run: the skipped variants, each group's
    side-by-side table and each variant's verdict against the baseline; the verdicts and
    the skipped ones are summary findings too."""

    comps = variant_comparisons(df) if "variant" in df.columns else []
    if not comps and not skipped:
        return []
    found = [Finding("variants", f"{n} skipped", text(why), "not measured: no verdict")
             for n, why in skipped.items()]
    out = []
    for c in comps:
        for n, best, at, cross, judged in c["verdicts"]:
            found.append(Finding("variants", f"{n} vs {c['baseline']} ({c['benchmark']} n={c['world']})",
                                 f"best {best:.2f}x at {fmt_size(at)}" if best is not None else
                                 f"clearly slower at {len(c['claims'][n]['slower'])} size(s)"
                                 if c["claims"].get(n, {}).get("slower") else "no speedup claimed",
                                 judged))
        out.append(Section(c["title"], c["caption"], c["headers"], c["rows"], level=3, bullets=c["lines"]))
    head = Section("Variants", "each variant a launch of its own; x = the baseline's p50 / the variant's",
                   findings=found, bullets=[f"variant {n}: skipped: {why}" for n, why in skipped.items()])
    return [head] + out


def summary_section(sections: list[Section], first: list[Finding]) -> Section:
    """The findings of every section, in the report's order, as one table at the top."""
    found = list(first) + [f for s in sections for f in s.findings]
    # One block per topic (a benchmark's scaling line joins its peak and latency lines),
    # topics in the order the report's sections take; the topic named once per block.
    order = list(dict.fromkeys(f.topic for f in found))
    # MoE, the workload the tool is for, right after the checks: on the report's first screen.
    order.sort(key=lambda t: (t != "checks", t != "moe"))
    rows = []
    for topic in order:
        rows += [[topic if i == 0 else "", f.measure, f.value, f.verdict]
                 for i, f in enumerate(f for f in found if f.topic == topic)]
    return Section("Summary", "each measure with one line of judgement; the figures and the raw tables follow",
                   ["", "measure", "value", "judgement"], rows, fold=False, findings=found)


# Variables a launcher sets for every job: not a setting anybody chose.
_LAUNCHER_ENV = ("OMPI_COMM_WORLD_", "OMPI_WORLD_", "OMPI_ARGV", "OMPI_COMMAND", "OMPI_FILE_LOCATION",
                 "OMPI_LIBDIR_LOC", "OMPI_MCA_PREFIXES", "OMPI_MCA_cpu_type", "OMPI_MCA_initial_wdir",
                 "OMPI_MCA_num_procs", "OMPI_NUM_APP_CTX", "OMPI_APP_CTX_", "OMPI_FIRST_RANKS", "OMPI_TOOL_NAME",
                 "OMPI_UNIVERSE_SIZE", "OMPI_VERSION", "OMPI_MCA_ess_", "OMPI_MCA_orte_", "OMPI_MCA_pmix",
                 "OMPI_MCA_prte_", "OMPI_MCA_ompi_", "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_HOME",
                 "OMPI_NODE_RANK", "OMPI_LOCAL_", "TORCH_NCCL_ASYNC_ERROR_HANDLING_DEFAULT")


def chosen_env(env: dict | None) -> dict:
    """meta env without what the launcher sets for every job (rank numbers, paths)."""
    return {k: v for k, v in sorted((env or {}).items()) if not k.startswith(_LAUNCHER_ENV)}
