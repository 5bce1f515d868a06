"""How a dispatcher shoot-out is shown (the analysis is analyse/shootout.py): the verdict
lines first, then per run, backend and table (prefill, decode) the dispatchers of each
workload ranked by dispatch + combine time, both GB/s and the stage that decides, the
dispatchers that were skipped and why, and a heatmap workload x dispatcher of time relative
to the best. Shown where a run's moe rows hold more than one dispatcher: in report.md /
report.html (html.render_report) and as a compact block in `commbench report`'s terminal
output (terminal.print_report)."""
from __future__ import annotations

import math
import re

from commbench.analyse import shootout as S
from commbench.core.safe_write import make_dir
from commbench.report.document import FigureInfo, Finding, Section
from commbench.report.fmt import fmt, records
from commbench.report.plotkit import new_figure, save_figure

TITLE = "Dispatcher shoot-out"
FIGURE = "moe_shootout"
HEADERS = ["workload", "dispatcher", "dispatch (us)", "combine (us)", "total (us)", "x best",
           "algorithmic (GB/s)", "physical (GB/s)", "deciding stage"]
NOTE = ("per workload, the dispatchers ranked by dispatch + combine time: each stage's p50 (slowest rank), summed "
        "per repeat, the median over repeats; x best = total / the fastest's total. The fastest is named clearly "
        "only with at least 3 repeats, each a fresh launch that ran every dispatcher, and its dispatch + combine p90 "
        "below the runner-up's p50 in every one; disturbed or warned rows are not evidence, rows that failed the "
        "exact check are not ranked. algorithmic GB/s = the bytes the (most loaded) rank is responsible for, its "
        "own tokens included (DeepEP's own figure counts them) / total; physical GB/s = the bytes that left the "
        "rank / total "
        "(GB = 1e9 B). deciding stage: where the fastest gains most over the runner-up (its row), where each other "
        "loses most to the fastest (theirs): the stage, and its sub-stage lap with the largest gap")
TABLE_WORDS = {"prefill": "prefill (normal mode)", "decode": "decode (low-latency mode)"}


def _frame_rows(rows) -> list[dict]:
    return records(rows) if hasattr(rows, "to_dict") else list(rows)


def groups(contests: list) -> dict[tuple, list]:
    """(run, backend, world, table) -> its contests, in order."""
    out: dict[tuple, list] = {}
    for c in contests:
        out.setdefault((c.run, c.backend, c.world, c.table), []).append(c)
    return out


def _where(key: tuple, many_runs: bool, short: bool = False) -> str:
    """'prefill (normal mode), mpi, 2 ranks' ('prefill, mpi n=2' short); the run where
    two runs share a backend."""
    run, backend, world, table = key
    head = f"{table}, {backend} n={world}" if short else f"{TABLE_WORDS.get(table, table)}, {backend}, {world} ranks"
    return head + (f", run {run}" if many_runs else "")


def _many_runs(keys) -> bool:
    """Do two runs of one backend show? (a run per backend is told apart by its backend)"""
    runs: dict = {}
    for run, backend, *_ in keys:
        runs.setdefault(backend, set()).add(run)
    return any(len(v) > 1 for v in runs.values())


def _skipped_for(key: tuple, skips: list) -> list[str]:
    run, backend, _, table = key
    return [f"{s['dispatcher']}: skipped ({s['points']} point{'s' if s['points'] != 1 else ''}): {s['reason']}"
            for s in skips if s["run"] == run and s["backend"] == backend and s["table"] == table]


def _not_ranked(c) -> list[str]:
    return [f"{c.workload}: {name} not ranked: {why}" for name, why in c.failed]


def table_rows(cs: list) -> list[list[str]]:
    out = []
    for c in cs:
        for i, e in enumerate(c.entries):
            out.append([c.workload if i == 0 else "", e.dispatcher, fmt(e.dispatch_us, 1), fmt(e.combine_us, 1),
                        fmt(e.total_us, 1), "1.00" if i == 0 else f"{e.x_best:.2f}x", fmt(e.algorithmic_gbps, 3),
                        fmt(e.physical_gbps, 3), e.deciding or "-"])
    return out


# Workloads a summary line names one by one.
NAMED = 3


def summary_finding(key: tuple, cs: list, many_runs: bool) -> Finding:
    """The report summary's line of one table: which dispatcher was fastest at how many
    workloads (by the medians), and where that was clearly so."""
    ranked = [c for c in cs if len(c.entries) > 1]
    wins: dict = {}
    for c in ranked:
        wins[c.entries[0].dispatcher] = wins.get(c.entries[0].dispatcher, 0) + 1
    order = sorted(wins.items(), key=lambda kv: -kv[1])
    value = (", ".join(f"{d} lowest median at {n} of {len(ranked)}" for d, n in order)
             if ranked else "one dispatcher ran at each workload") + " workload(s)" * bool(ranked)
    clear = [c for c in ranked if c.clearly]
    named = "; ".join(f"{c.workload}: {c.winner}" for c in clear[:NAMED]) + ("; ..." if len(clear) > NAMED else "")
    verdict = (f"clearly at {len(clear)} of {len(ranked)} workload(s) ({named})" if clear else
               f"{S.CANNOT_JUDGE} at any workload" + (f": {_most_common_why(ranked)}" if ranked else ""))
    return Finding("moe", f"shoot-out, {_where(key, many_runs)}", value, verdict)


def _most_common_why(cs: list) -> str:
    # Without the rows left out: their counts differ from workload to workload.
    whys = [re.sub(r"; \d+ row\(s\) not used: [^;]*", "", c.why.split(": ", 1)[-1]) for c in cs]
    top = max(dict.fromkeys(whys), key=whys.count)
    return top + (f" (at {whys.count(top)} of {len(whys)})" if whys.count(top) < len(whys) else "")


def _contests(rows, metas: dict):
    """What both views start from, or None without a shoot-out in the rows: the contests,
    the skipped dispatchers, the contests grouped by run, backend and table, and whether
    there are several runs."""
    rs = _frame_rows(rows)
    if not S.has_shootout(rs):
        return None
    cs = S.contests(rs)
    by = groups(cs)
    return cs, S.skipped(metas), by, _many_runs(by)


def sections(rows, metas: dict, fig_dir=None) -> list[Section]:
    """The report's sections ([] without a shoot-out in the rows): the verdict lines first
    with the heatmap (drawn into fig_dir when given), then one ranked table per run,
    backend and table, each followed by what was not ranked or skipped there, then how to
    read them (both GB/s). metas: run name -> meta.json."""
    got = _contests(rows, metas)
    if got is None:
        return []
    cs, skips, by, many = got
    bullets = [f"{_where(k, many, short=True)}: {c.verdict()}" for k, v in by.items() for c in v]
    figs = [f for f in (figure(cs, fig_dir),) if f is not None] if fig_dir is not None else []
    findings = [summary_finding(k, v, many) for k, v in by.items()]
    out = [Section(TITLE, "", figures=figs, fold=False, bullets=bullets, findings=findings)]
    for k, v in by.items():
        notes = [line for c in v for line in _not_ranked(c)] + _skipped_for(k, skips)
        out.append(Section(_where(k, many), "", HEADERS, table_rows(v), level=3, fold=False))
        if notes:  # under its table: what ran there but is not ranked, what could not run
            out.append(Section(f"Not ranked at {_where(k, many, short=True)}", "", level=4, bullets=notes))
    out.append(Section("Reading the shoot-out", NOTE, level=3))
    return out


def terminal_lines(rows, metas: dict) -> list[str]:
    """The compact block of `commbench report`: per run, backend and table, each
    workload's verdict line, then what was not ranked or was skipped; [] without a
    shoot-out."""
    got = _contests(rows, metas)
    if got is None:
        return []
    cs, skips, by, many = got
    out = ["dispatcher shoot-out: dispatch + combine p50 (median of repeats) relative to the fastest; "
           "`report --out` has the table, both GB/s and the heatmap"]
    for k, v in by.items():
        out.append(f"  {_where(k, many)}:")
        out += [f"    {c.verdict()}" for c in v]
        out += [f"    {line}" for c in v for line in _not_ranked(c)] + [f"    {s}" for s in _skipped_for(k, skips)]
    return out


def figure(contests: list, out_dir) -> FigureInfo | None:
    """A heatmap: a row per workload (and table, and backend where several ran), a column
    per dispatcher, each cell the dispatcher's total relative to the row's fastest; blank
    where a dispatcher did not run. None without two dispatchers anywhere."""
    names = sorted({e.dispatcher for c in contests for e in c.entries})
    cs = [c for c in contests if c.entries]
    if len(names) < 2 or not cs:
        return None
    import numpy as np

    many = len({(c.run, c.backend, c.world) for c in cs}) > 1
    labels = [f"{c.workload} [{c.table}" + (f", {c.backend} n={c.world}" if many else "") + "]" for c in cs]
    grid = np.full((len(cs), len(names)), math.nan)
    for i, c in enumerate(cs):
        for e in c.entries:
            grid[i, names.index(e.dispatcher)] = e.x_best
    # Columns by how close to the best each dispatcher is on average, the best overall left.
    order = sorted(range(len(names)), key=lambda j: (np.nanmean(grid[:, j]), names[j]))
    grid, names = grid[:, order], [names[j] for j in order]
    from matplotlib.colors import LogNorm

    fig, axes = new_figure(1, 1, w=max(8.0, 4.5 + 1.0 * len(names)), h=1.6 + 0.38 * len(cs))
    ax = axes[0][0]
    finite = grid[np.isfinite(grid)]
    top = max(2.0, float(finite.max())) if finite.size else 2.0
    # Log colours: 1.3x and 30x both stay readable in one map.
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="YlOrRd", norm=LogNorm(vmin=1.0, vmax=top), aspect="auto")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if math.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if math.log(grid[i, j]) > 0.6 * math.log(top) else "black")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(cs)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_facecolor("0.93")  # grey: did not run there
    ax.set_title("dispatch + combine time / the fastest's", fontsize=10)
    bar = fig.colorbar(im, ax=ax, label="x the fastest")
    ticks = [t for t in (1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100) if t <= top]
    bar.set_ticks(ticks, labels=[f"{t:g}x" for t in ticks])
    bar.ax.minorticks_off()
    path = save_figure(fig, make_dir(out_dir), FIGURE)  # a link named figures/ is refused
    return FigureInfo(FIGURE, path, "MoE dispatcher shoot-out: time relative to the fastest",
                      "each row one workload; each cell the median over repeats; grey: the dispatcher did not "
                      "run there; which leads are clear the verdict lines say", names,
                      # "": the shoot-out's own section shows it, not the moe table's
                      "", fig)
