"""How the pairs test is shown (the analysis is analyse/pairs.py): the verdict first, then
the pairs from the lowest, the node x node matrix relative to its median, and a heatmap of
it with the outliers marked. The verdict is judged again from the rows (the measured pairs
and their re-tests alone), so `commbench report` of a run on disk says what the run said.
Registered as the view "pairs" (report/views.py), the one the pairs benchmark names."""
from __future__ import annotations

import math
import textwrap
from statistics import median

from commbench.analyse import pairs as P
from commbench.core.safe_write import make_dir
from commbench.report.document import FigureInfo, Finding, Section
from commbench.report.fmt import fmt, records
from commbench.report.plotkit import new_figure, save_figure
from commbench.report.tables import ALWAYS, COMPACT, WIDE, add_column, table

TITLE = "Pairs: the slow node or link"
FIGURE = "pairs_heatmap"
# The terminal shows the matrix up to this many members (wider ones are for the report's
# heatmap and the run's pairs_matrix.csv), and the pairs up to this many, from the lowest.
TERMINAL_MATRIX_MAX = 12
TERMINAL_PAIRS_MAX = 30
# The report lists the pairs up to this many, from the lowest (1,024 nodes have 523,776:
# pairs_matrix.csv and rows.jsonl have every one).
REPORT_PAIRS_MAX = 1000
# Cells carry their ratio as text up to this many members.
CELL_TEXT_MAX = 16
NOTE = ("each pair measured in its round beside the other pairs of the round (bidirectional send/recv, the bandwidth "
        "of one direction, GB = 1e9 B), the median over repeats; x median = that / the median of the matrix. Judged "
        "against the matrix itself, never a fixed GB/s: an outlier is " + P.THRESHOLD_WORDS + ", measured again "
        "alone to tell a slow link from contention; a node is slow when its row is low against the other nodes' "
        "rows and most of its pairs are outliers. % ceiling: of the profile's link rate, shown, never judged on")


def _is_retest(r: dict) -> bool:
    return r.get("retest") is True or r.get("retest") == 1


def _name(r: dict, end: str) -> str:
    v = r.get(f"pair_{end}")
    return str(v if v is not None else r.get(f"host_{end}"))


def runs_of(rows) -> dict:
    """run -> {"pairs": judge's input, "retests": {(a, b): [bw alone]}, "rows": the run's
    rows}; in the order the runs come."""
    rs = records(rows) if hasattr(rows, "to_dict") else list(rows)
    out: dict = {}
    for r in rs:
        run = out.setdefault(str(r.get("run") or ""), {"pairs": {}, "retests": {}, "rows": [], "lanes": {}})
        run["rows"].append(r)
        key = (_name(r, "a"), _name(r, "b"))
        if isinstance(r.get("lane"), (int, float)) and r["lane"] == r["lane"]:  # rail mode: a pair within a rail
            run["lanes"].update({key[0]: int(r["lane"]), key[1]: int(r["lane"])})
        if _is_retest(r):
            run["retests"].setdefault(key, []).append(r.get("bw_gbps"))
            continue
        p = run["pairs"].setdefault(key, {"a": key[0], "b": key[1], "bw_gbps": [], "lat_us": [], "pct": [],
                                          "hosts": (r.get("host_a"), r.get("host_b")),
                                          "ranks": (r.get("rank_a"), r.get("rank_b"))})
        p["bw_gbps"].append(r.get("bw_gbps"))
        p["lat_us"].append(r.get("lat_us"))
        p["pct"].append(r.get("pct_of_ceiling"))
    for run in out.values():
        run["pairs"] = list(run["pairs"].values())
        lanes = run["lanes"]
        # Rail mode measures each rail's members among themselves: the coverage is of those.
        per_lane = [sum(1 for x in lanes if lanes[x] == lane) for lane in set(lanes.values())]
        run["verdict"] = P.judge(run["pairs"], run["retests"], sum(m * (m - 1) // 2 for m in per_lane) if lanes else None)
        # Rails one after the other: the heatmap shows each rail as a block on the diagonal.
        run["names"] = sorted({x for p in run["pairs"] for x in (p["a"], p["b"])},
                              key=lambda x: (lanes.get(x, 0), P.natural_key(x)))
    return out


def _key(p: dict) -> tuple:
    return tuple(sorted((p["a"], p["b"]), key=P.natural_key))


def _median(values) -> float:
    got = P.finite_values(values)
    return float(median(got)) if got else math.nan


def _state(k: tuple, v: dict) -> str:
    """What the verdict says of one pair."""
    if any(k == (x, y) or k == (y, x) for x, y in v["contention"]):
        return "contention (normal alone)"
    if any(x in k for x in v["slow_nodes"]) and k in v["suspects"]:
        return "slow node " + " ".join(x for x in k if x in v["slow_nodes"])
    if k in v["slow_links"]:
        return "slow link"
    if k in v["slow_pairs"]:
        return "outlier"
    return "suspect" if k in v["suspects"] else ""


def pair_rows(run: dict) -> list[list[str]]:
    """One line per pair, the lowest first: pair, hosts, ranks, GB/s (median, min-max over
    repeats), x median, latency, % of the ceiling, GB/s alone, what the verdict says."""
    v, m = run["verdict"], run["verdict"]["median_bw_gbps"]
    out = []
    for p in sorted(run["pairs"], key=lambda p: (_finite_or_inf(_median(p["bw_gbps"])), _key(p))):
        k = _key(p)
        bw = P.finite_values(p["bw_gbps"])
        alone = P.finite_values(run["retests"].get(k, run["retests"].get(k[::-1], [])))
        out.append([f"{k[0]}-{k[1]}", " ".join(str(h) for h in p["hosts"]),
                    " ".join(str(x) for x in p["ranks"]), fmt(_median(bw), 3),
                    f"{min(bw):.3g}-{max(bw):.3g}" if bw else "-",
                    fmt(_median(bw) / m, 2) if m else "-", fmt(_median(p["lat_us"]), 1),
                    fmt(_median(p["pct"]), 0), fmt(_median(alone), 3) if alone else "-", _state(k, v)])
    return out


def _finite_or_inf(x: float) -> float:
    return x if math.isfinite(x) else math.inf


PAIR_HEADERS = ["pair", "hosts", "ranks", "GB/s", "min-max", "x median", "latency (us)", "% ceiling",
                "alone (GB/s)", "verdict"]


def ratio_matrix(run: dict) -> list[list[float | None]]:
    m = run["verdict"]["median_bw_gbps"]
    return [[None if c is None or not m else c / m for c in row] for row in P.matrix(run["pairs"], run["names"])]


def matrix_rows(run: dict) -> list[list[str]]:
    return [[x] + ["" if c is None else f"{c:.2f}" for c in row] for x, row in zip(run["names"], ratio_matrix(run))]


def _where(run_name: str, many: bool) -> str:
    return f", run {run_name}" if many and run_name else ""


def terminal_tables(rows, plain: bool) -> list:
    """The run's end and `commbench report`: per run the verdict (its line first, then the
    details), the pairs from the lowest (the first TERMINAL_PAIRS_MAX), the matrix in x the
    median (up to TERMINAL_MATRIX_MAX members)."""
    runs = runs_of(rows)
    out = []
    for name, run in runs.items():
        v = run["verdict"]
        t = table(f"pairs verdict{_where(name, len(runs) > 1)}: {len(run['names'])} members, "
                  f"{v['pairs_judged']} pairs", f"outlier: {v['threshold']}; judged against the matrix itself, "
                  f"never a fixed GB/s", plain)
        add_column(t, "verdict", left=True, wrap=True)
        for line in [v["line"]] + v["lines"]:
            t.add_row(line)
        out.append(t)
        shown = pair_rows(run)
        more = len(shown) - TERMINAL_PAIRS_MAX
        t = table(f"pairs, the lowest first{_where(name, len(runs) > 1)}",
                  "GB/s: one direction of a bidirectional send/recv, median over repeats (GB = 1e9 B); x median: "
                  "of the matrix; alone: the re-test with every other pair waiting"
                  + (f"; {more} more pairs in the report and pairs_matrix.csv" if more > 0 else ""), plain)
        levels = [ALWAYS, WIDE, WIDE, ALWAYS, COMPACT, ALWAYS, COMPACT, COMPACT, ALWAYS, ALWAYS]
        for h, level in zip(PAIR_HEADERS, levels):
            add_column(t, h, left=h in ("pair", "hosts", "ranks", "verdict"), level=level)
        for r in shown[:TERMINAL_PAIRS_MAX]:
            t.add_row(*r)
        out.append(t)
        if 2 < len(run["names"]) <= TERMINAL_MATRIX_MAX:
            t = table(f"pairs matrix, x the median ({fmt(v['median_bw_gbps'], 3)} GB/s)"
                      f"{_where(name, len(runs) > 1)}", "", plain)
            for h in [""] + run["names"]:
                add_column(t, h, left=h == "")
            for r in matrix_rows(run):
                t.add_row(*r)
            out.append(t)
    return out


def figures(rows, out_dir, bench: str = "pairs") -> list[FigureInfo]:
    """A heatmap per run of 3 members or more (matplotlib imported here)."""
    runs = runs_of(rows)
    out = []
    for name, run in runs.items():
        f = heatmap(run, out_dir, FIGURE + (f"_{name}" if len(runs) > 1 else ""), bench)
        if f is not None:
            out.append(f)
    return out


def heatmap(run: dict, out_dir, fig_name: str = FIGURE, bench: str = "pairs") -> FigureInfo | None:
    """Node x node, each cell the pair's bandwidth / the matrix median: red below 1, blue
    above, white at 1; outlined black: an outlier after the re-test (a slow node's name in
    red); dashed: low in its round but normal alone; grey: not measured."""
    names, v = run["names"], run["verdict"]
    if len(names) < 3 or not v["median_bw_gbps"]:
        return None
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    n = len(names)
    grid = np.array([[math.nan if c is None else c for c in row] for row in ratio_matrix(run)], dtype=float)
    finite = grid[np.isfinite(grid)]
    lo = min(0.3, float(finite.min())) if finite.size else 0.3
    hi = max(1.3, float(finite.max())) if finite.size else 1.3
    side = min(14.0, 3.0 + 0.45 * n)
    fig, axes = new_figure(1, 1, w=side + 1.5, h=side + 0.8)
    ax = axes[0][0]
    ax.set_facecolor("0.85")  # grey: the diagonal and pairs not measured
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu", norm=TwoSlopeNorm(1.0, lo, hi), interpolation="nearest")
    index = {x: i for i, x in enumerate(names)}
    if n <= CELL_TEXT_MAX:
        for i in range(n):
            for j in range(n):
                if math.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if abs(grid[i, j] - 1) > 0.45 else "black")
    outliers = [k for k in v["suspects"] if k not in v["contention"]] if v["final"] else []
    width = 2.0 if n <= 64 else 0.8
    for keys, style in ((outliers, "-"), (v["contention"], "--")):
        for a, b in keys:
            for i, j in ((index[a], index[b]), (index[b], index[a])):
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=width, ls=style,
                                       ec="black" if style == "-" else "0.35"))
    if n <= 64:
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(names, rotation=90, fontsize=7)
        ax.set_yticklabels(names, fontsize=7)
        for lab in list(ax.get_xticklabels()) + list(ax.get_yticklabels()):
            if lab.get_text() in v["slow_nodes"]:
                lab.set_color("red")
                lab.set_fontweight("bold")
    ax.set_title(textwrap.fill(v["line"], 90), fontsize=9)
    fig.colorbar(im, ax=ax, label=f"x the median ({v['median_bw_gbps']:.3g} GB/s)", shrink=0.8)
    path = save_figure(fig, make_dir(out_dir), fig_name)
    return FigureInfo(fig_name, path, "Pairs: bandwidth relative to the matrix median",
                      "each cell one pair's bandwidth (median over repeats) / the matrix median; red below 1, blue "
                      "above; outlined: an outlier after the re-test alone (a slow node's name in red); dashed: low "
                      "in its round, normal alone (contention); grey: not measured", [], bench, fig)


def sections(rows, figs: list) -> list[Section]:
    """report.md / report.html: per run the verdict first (its line, the details), the
    heatmap, the matrix in x the median, then every pair (folded); the summary's line."""
    runs = runs_of(rows)
    many = len(runs) > 1
    out = []
    for name, run in runs.items():
        v = run["verdict"]
        mine = [f for f in figs if f.name == FIGURE + (f"_{name}" if many else "")]
        where = _where(name, many)
        finding = Finding("pairs", f"verdict ({len(run['names'])} members, {v['pairs_judged']} pairs{where})",
                          "outlier" if v["outlier"] else "no outlier", v["line"])
        small = len(run["names"]) <= CELL_TEXT_MAX
        out.append(Section(TITLE + where, NOTE, ["", *run["names"]] if small else [],
                           matrix_rows(run) if small else [], figures=mine, fold=False, findings=[finding],
                           bullets=[v["line"]] + v["lines"]))
        every = pair_rows(run)
        cut = (f"the lowest {REPORT_PAIRS_MAX} of the {len(every)} pairs; the run's pairs_matrix.csv and rows.jsonl "
               f"have them all" if len(every) > REPORT_PAIRS_MAX else "")
        out.append(Section(f"Every pair{where}" if not cut else f"The lowest pairs{where}", cut, PAIR_HEADERS,
                           every[:REPORT_PAIRS_MAX], level=3))
    return out
