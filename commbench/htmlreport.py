"""`commbench report --out DIR`: report.md (tables + relative PNG links) and a
self-contained report.html (the same tables as HTML, the PNGs embedded as base64 data
URIs) from one or more result directories, measured or imported.
"""
from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path

from .analysis import fit_table, presenters, scaling_table
from .units import fmt_size
from .viewkit import Section, fmt, has, text

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


# ---------------------------------------------------------------------------------------
# small helpers

def _run_name(p) -> str:
    p = Path(p)
    return p.name if p.is_dir() else p.parent.name


def _rejudge(df, metas: dict, profile):
    """Every row's ceiling fields against `profile`, with each run's node map."""
    from .report import rejudge_rows

    return rejudge_rows(df, {run: (m or {}).get("nodes") for run, m in metas.items()}, profile)


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
    if meta.get("command"):
        out.append(("command", " ".join(map(str, meta["command"]))))
    return out


def benchmark_sections(df, figures: dict) -> list[Section]:
    """Each benchmark's sections (Benchmark.report_sections), with the figures drawn for
    it; the generic table for those that have none of their own, and those first."""
    generic, own = [], []
    multi_run = df["run"].nunique() > 1
    for bench, b in sorted(presenters(df).items()):
        g = df[df["benchmark"] == bench]
        figs = [f for f in figures.values() if f.benchmark == bench]
        mine = b.report_sections(g, figs)
        if mine is None:
            generic.append(collective_section(bench, b, g, figs, multi_run))
        else:
            own += mine
    return generic + own


def collective_section(bench: str, b, g, figs: list, multi_run: bool) -> Section:
    """The generic table: by size (variant, dtype, params and stage when they vary), or
    latency only for a benchmark without sizes (barrier)."""
    if not b.sized or (g["nbytes"].astype(float) <= 0).all():
        heads = (["run"] if multi_run else []) + ["world", "p50 (us)", "p99 (us)", "iters", "check"]
        rows = [([text(r["run"])] if multi_run else []) +
                [str(r["world"]), fmt(r["time_us_p50"]), fmt(r["time_us_p99"]), text(r.get("iters")),
                 text(r.get("check"))] for r in g.sort_values(["run", "world"]).to_dict("records")]
        return Section(f"{bench}", b.formula or "latency only", heads, rows, figs)
    g = g.copy()
    g["variant"] = g["variant"].map(text).replace("", "default") if "variant" in g.columns else "default"
    vary = {c: c in g.columns and g[c].map(text).nunique() > 1 for c in ("variant", "dtype", "params", "stage")}
    ceil = "pct_of_ceiling" in g.columns and g["pct_of_ceiling"].astype(float).notna().any()
    heads = (["run"] if multi_run else []) + ["world"] + [c for c in ("variant", "dtype", "params", "stage")
                                                         if vary[c]] + \
        ["size", "p50 (us)", "p99 (us)", "algbw (GB/s)", "busbw (GB/s)"] + \
        (["ceiling (GB/s)", "% of ceiling"] if ceil else []) + ["check"]
    rows = []
    sort = [c for c in ("run", "world", "variant", "dtype", "stage", "nbytes") if c in g.columns]
    for r in g.sort_values(sort).to_dict("records"):
        cells = ([text(r["run"])] if multi_run else []) + [str(r["world"])]
        cells += [(b.describe(r.get("params") or {}) if c == "params" else text(r.get(c))) for c in
                  ("variant", "dtype", "params", "stage") if vary[c]]
        cells += [fmt_size(int(r["nbytes"])), fmt(r["time_us_p50"]), fmt(r["time_us_p99"]), fmt(r["algbw_gbps"], 3),
                  fmt(r["busbw_gbps"], 3)]
        if ceil:
            cells += [fmt(r.get("ceiling_gbps"), 1), fmt(r.get("pct_of_ceiling"), 1)]
        cells.append(text(r.get("check")))
        rows.append(cells)
    note = f"{b.formula}; p50/p99 of the slowest rank per iteration; GB = 1e9 B".lstrip("; ")
    if "source" in g.columns and g["source"].map(has).any():
        note += "; imported rows: p50 is the tool's mean time"
    return Section(bench, note, heads, rows, figs)


def scaling_section(df, figures: dict) -> Section | None:
    try:
        sc = scaling_table(df)
    except Exception:  # noqa: BLE001 - a table must not sink the report
        return None
    if sc.empty:
        return None
    multi_run = "run" in sc.columns and sc["run"].nunique() > 1
    # The largest size of each collective group (all sizes: `commbench report` in a terminal).
    keys = [k for k in ("run", "benchmark", "backend", "dtype", "variant", "params", "stage") if k in sc.columns]
    sized = {b: v.sized for b, v in presenters(sc).items()}
    parts = []
    for _, g in sc.groupby(keys, sort=True):
        if sized[g["benchmark"].iloc[0]]:
            g = g[g["nbytes"] == g["nbytes"].max()]
        parts.append(g)
    import pandas as pd

    sc = pd.concat(parts)
    heads = (["run"] if multi_run else []) + ["benchmark", "stage", "size", "world", "metric", "value", "efficiency"]
    rows = []
    for r in sc.to_dict("records"):
        rows.append(([text(r["run"])] if multi_run else []) + [
            r["benchmark"], text(r.get("stage")), fmt_size(int(r["nbytes"])) if sized[r["benchmark"]] else "",
            str(r["world"]), r["metric"], f"{r['value']:.4g}", f"{r['efficiency_pct']:.1f}%"])
    figs = [figures["scaling"]] if "scaling" in figures else []
    return Section("Scaling", "weak-scaling efficiency: per-rank throughput at n / at the smallest n (collectives: "
                   "busbw at the largest size measured at several worlds; moe: tokens/s per rank)", heads, rows, figs)


def fit_section(df) -> Section | None:
    try:
        ft = fit_table(df)
    except Exception:  # noqa: BLE001
        return None
    if ft.empty:
        return None
    multi_run = "run" in ft.columns and ft["run"].nunique() > 1
    heads = (["run"] if multi_run else []) + ["benchmark", "world", "variant", "dtype", "sizes", "alpha (us)",
                                               "B (GB/s)", "busbw asym (GB/s)", "n_half", "rms err"]
    rows = []
    for r in ft.to_dict("records"):
        nh = r["n_half_nbytes"]
        rows.append(([text(r["run"])] if multi_run else []) + [
            r["benchmark"], str(r["world"]), text(r.get("variant")) or "default", text(r["dtype"]),
            f"{fmt_size(int(r['min_nbytes']))}..{fmt_size(int(r['max_nbytes']))} ({r['points']})",
            fmt(r["alpha_us"], 3), fmt(r["bandwidth_gbps"], 3), fmt(r["busbw_asymptote_gbps"], 3),
            fmt_size(int(nh)) if has(nh) and math.isfinite(float(nh)) else "-", f"{r['rms_rel_err_pct']:.1f}%"])
    return Section("Alpha-beta fits", "t = alpha + S/B over each size sweep (relative least squares); n_half = "
                   "alpha x B, the size reaching half of B", heads, rows)


# ---------------------------------------------------------------------------------------
# rendering

def _md_cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_table(headers, rows) -> str:
    if not headers:
        return ""
    out = ["| " + " | ".join(map(_md_cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _html_table(headers, rows) -> str:
    if not headers:
        return ""
    num = [all(_numeric(r[i]) for r in rows if i < len(r) and r[i] not in ("", "-")) for i in range(len(headers))]
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if num[i] else ''}>{html.escape(str(c))}</td>"
                                    for i, c in enumerate(r)) + "</tr>\n" for r in rows)
    return f"<table>\n<thead><tr>{h}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n"


def _numeric(s) -> bool:
    t = str(s).rstrip("%KMGx")
    try:
        float(t)
        return True
    except ValueError:
        return False


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.86em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.note{color:#555;font-size:.9em}dl.run{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;
font-size:.9em}dl.run dt{font-weight:600}dl.run dd{margin:0;word-break:break-word}
"""


def _render_md(title, runs, sections, fig_rel) -> str:
    out = [f"# {title}", ""]
    out.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by commbench.")
    out.append("")
    out.append("## Runs")
    for name, pairs in runs:
        out += ["", f"### {name}", ""]
        out += [f"- **{k}**: {v}" for k, v in pairs]
    for s in sections:
        out += ["", "#" * s.level + f" {s.title}", ""]
        if s.note:
            out += [f"_{s.note}_", ""]
        for f in s.figures:
            out += [f"![{f.title}]({fig_rel[f.name]})", ""] + ([f"_{f.caption}_", ""] if f.caption else [])
        if s.headers:
            out.append(_md_table(s.headers, s.rows))
    return "\n".join(out).rstrip() + "\n"


def _render_html(title, runs, sections) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>",
           f"<title>{e(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           f"<p class=note>Generated {e(time.strftime('%Y-%m-%d %H:%M:%S'))} by commbench.</p>", "<h2>Runs</h2>"]
    for name, pairs in runs:
        out.append(f"<h3>{e(name)}</h3><dl class=run>")
        out += [f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in pairs]
        out.append("</dl>")
    for s in sections:
        out.append(f"<h{s.level}>{e(s.title)}</h{s.level}>")
        if s.note:
            out.append(f"<p class=note>{e(s.note)}</p>")
        for f in s.figures:
            data = base64.b64encode(Path(f.path).read_bytes()).decode("ascii")
            out.append(f"<figure><img alt=\"{e(f.title)}\" src=\"data:image/png;base64,{data}\">"
                       f"<figcaption>{e(f.caption)}</figcaption></figure>")
        if s.headers:
            out.append(_html_table(s.headers, s.rows))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(paths, out_dir, profile=None, title: str = "commbench report") -> dict:
    """Load the runs, draw the figures (when matplotlib is installed), write
    out_dir/report.md, out_dir/report.html and out_dir/figures/*.png.

    profile: a ceilings.Profile (or a profile name / .toml path) to judge every row
    against; None keeps each row's own ceiling fields.

    Returns {"markdown": Path, "html": Path, "figures": {name: Path}, "series": {name:
    [legend labels]}, "notes": [str]}.
    """
    from .errors import UsageError
    from .results import load, load_meta

    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise UsageError("report needs at least one result directory")
    df = load(paths)
    metas = {_run_name(p): load_meta(p if p.is_dir() else p.parent) for p in paths}
    notes = []
    if df.empty:
        raise UsageError(f"{', '.join(map(str, paths))}: no rows to report")
    if profile is not None:
        if not hasattr(profile, "scaleup_line_gbps"):
            from .ceilings import load_profile

            profile = load_profile(profile)
        df = _rejudge(df, metas, profile)
    out = Path(out_dir)
    fig_dir = out / "figures"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"report --out {out}: {e.strerror or e}") from None
    from . import plots

    figures = {}
    if plots.have_matplotlib():
        figures = plots.make_figures(df, fig_dir, profile)
    else:
        notes.append("matplotlib is not installed: no figures (pip install 'commbench[plot]')")
    sections = benchmark_sections(df, figures)
    for s in (scaling_section(df, figures), fit_section(df)):
        if s is not None:
            sections.append(s)
    # In-switch speedup has no table of its own: its figure goes with the sections.
    if "inswitch_speedup" in figures:
        sections.append(Section("In-switch vs ring", "", figures=[figures["inswitch_speedup"]]))
    if notes:
        sections.insert(0, Section("Notes", "; ".join(notes)))
    runs = [(name, run_header(name, meta)) for name, meta in metas.items()]
    if profile is not None:
        runs.append(("ceilings", [("profile", f"{profile.name}: every row judged against it")]))
    fig_rel = {n: f"figures/{Path(f.path).name}" for n, f in figures.items()}
    md = out / "report.md"
    md.write_text(_render_md(title, runs, sections, fig_rel))
    hp = out / "report.html"
    hp.write_text(_render_html(title, runs, sections))
    return {"markdown": md, "html": hp, "figures": {n: Path(f.path) for n, f in figures.items()},
            "series": {n: list(f.series) for n, f in figures.items()}, "notes": notes}
