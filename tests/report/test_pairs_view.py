"""The pairs test in the terminal and the report (report/pairs_view.py): the verdict first,
the heatmap written with its outliers marked, the matrix and its CSV, from synthetic rows."""
from __future__ import annotations

import itertools

import pandas as pd

from commbench.analyse import pairs as P
from commbench.report import pairs_view as V
from commbench.report.html import render_report
from conftest import make_row

LINK_LINE = "link h1-h4: 0.33x the median, its other pairs normal (re-tested 3 times)"


def rows(n=6, slow=(1, 4), node=None, alone=3.3, run="r1") -> list[dict]:
    """Rows as the pairs benchmark writes them: a pair and repeat each at 10 GB/s (9.8 or
    10.2 for some), `slow` or every link of `node` at a third, and 3 re-tests of `slow`
    alone at `alone` GB/s."""
    out = []

    def row(a, b, rep, bw, retest):
        return make_row("pairs", n, 4 << 20, 400.0, run=run, pair_a=f"h{a}", pair_b=f"h{b}", host_a=f"n{a}",
                        host_b=f"n{b}", rank_a=a, rank_b=b, round=0, repeat=rep, lat_us=5.0, bw_gbps=bw,
                        retest=retest, pct_of_ceiling=bw * 8)
    for rep in range(3):
        for a, b in itertools.combinations(range(n), 2):
            bw = {0: 10.2, 1: 9.8}.get((a + b) % 4, 10.0)
            out.append(row(a, b, rep, bw / 3 if (a, b) == slow or node in (a, b) else bw, False))
    if slow:
        out += [row(*slow, 0, alone, True) for _ in range(3)]
    return out


def cells(t, col: int = 0) -> list:
    return list(t.columns[col]._cells)


def test_terminal_puts_the_verdict_first_then_the_lowest_pairs_and_the_matrix():
    tables = V.terminal_tables(rows(), plain=True)
    assert cells(tables[0])[0] == LINK_LINE
    assert "never a fixed GB/s" in tables[0].caption
    assert cells(tables[1])[0] == "h1-h4" and cells(tables[1], 9)[0] == "slow link"
    assert cells(tables[1], 8)[0] == "3.300"  # the re-test alone
    assert cells(tables[1], 7)[0] == "26"  # % of the ceiling, shown
    assert len(tables) == 3 and cells(tables[2], 5)[1] == "0.33"  # h1's row, h4's column


def test_a_pair_normal_alone_is_shown_as_contention():
    tables = V.terminal_tables(rows(alone=10.0), plain=True)
    assert cells(tables[0])[0].startswith("no outlier: every pair within 0.98-1.02x the median, h1-h4 low in its "
                                          "round but normal alone (re-tested 3 times): contention, not the link")
    assert cells(tables[1], 9)[0] == "contention (normal alone)"


def test_the_section_starts_with_the_verdict_and_draws_the_heatmap(tmp_path):
    figs = V.figures(pd.DataFrame(rows()), tmp_path)
    assert [f.name for f in figs] == ["pairs_heatmap"]
    assert figs[0].path == tmp_path / "pairs_heatmap.png" and figs[0].path.read_bytes()[:4] == b"\x89PNG"
    ax = figs[0].figure.axes[0]
    outlined = [p for p in ax.patches if p.get_linestyle() == "-"]
    assert sorted((round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in outlined) == [(1, 4), (4, 1)]
    secs = V.sections(pd.DataFrame(rows()), figs)
    head = secs[0]
    assert head.bullets[0] == LINK_LINE and head.figures == figs
    assert head.findings[0].verdict == LINK_LINE and head.findings[0].value == "outlier"
    assert head.headers == ["", "h0", "h1", "h2", "h3", "h4", "h5"]
    assert head.rows[1][5] == "0.33"
    assert secs[1].rows[0][:3] == ["h1-h4", "n1 n4", "1 4"]


def test_a_slow_node_is_named_red_in_the_heatmap(tmp_path):
    figs = V.figures(rows(slow=None, node=2), tmp_path)
    ax = figs[0].figure.axes[0]
    red = [lab.get_text() for lab in ax.get_xticklabels() + ax.get_yticklabels() if lab.get_color() == "red"]
    assert red == ["h2", "h2"]
    assert ax.get_title().startswith("node h2: all 5 of its pairs at 0.33x the median (not re-tested)")


def test_two_runs_each_get_their_verdict_and_heatmap(tmp_path):
    both = rows(run="a") + rows(slow=None, node=3, run="b")
    figs = V.figures(both, tmp_path)
    assert sorted(f.name for f in figs) == ["pairs_heatmap_a", "pairs_heatmap_b"]
    secs = V.sections(pd.DataFrame(both), figs)
    assert [s.title for s in secs] == [V.TITLE + ", run a", "Every pair, run a", V.TITLE + ", run b",
                                       "Every pair, run b"]
    assert secs[2].bullets[0].startswith("node h3: all 5 of its pairs")


def test_the_matrix_csv_from_the_rows():
    run = V.runs_of(rows(n=3, slow=None))["r1"]
    assert P.matrix_csv(run["pairs"], run["names"]) == "node,h0,h1,h2\nh0,,9.8,10\nh1,9.8,,10\nh2,10,10,\n"


def test_the_report_opens_with_the_verdict(tmp_path):
    got = render_report(pd.DataFrame(rows()), {"r1": {"suite": "pairs", "backend": "mpi", "world": 6}}, tmp_path)
    md = got["markdown"].read_text()
    assert "pairs_heatmap" in got["figures"] and got["figures"]["pairs_heatmap"].exists()
    assert f"| pairs | verdict (6 members, 15 pairs) | outlier | {LINK_LINE} |" in md
    section = md.split("## Pairs: the slow node or link", 1)[1]
    assert section.split("\n- ", 1)[1].startswith(LINK_LINE)  # the first bullet, ahead of the heatmap
    assert section.index(LINK_LINE) < section.index("![Pairs") < section.index("| h0 |")
    assert LINK_LINE in got["html"].read_text()


def test_rail_mode_judges_each_rail_among_itself_and_shows_rails_as_blocks():
    out = []
    for lane in (0, 1):
        for a, b in itertools.combinations(range(4), 2):
            bw = 10.0 / 3 if (lane, a, b) == (1, 0, 2) else 10.0
            out += [make_row("pairs", 8, 4 << 20, 400.0, run="r", pair_a=f"n{a}/{lane}", pair_b=f"n{b}/{lane}",
                             lane=lane, repeat=rep, lat_us=5.0, bw_gbps=bw, retest=False) for rep in range(3)]
    run = V.runs_of(pd.DataFrame(out))["r"]
    assert run["names"] == ["n0/0", "n1/0", "n2/0", "n3/0", "n0/1", "n1/1", "n2/1", "n3/1"]
    v = run["verdict"]
    assert v["coverage"] == 1.0 and "pairs measured" not in v["line"]  # 12 of the 12 pairs within rails
    assert v["slow_links"] == [("n0/1", "n2/1")]


def test_the_report_lists_the_lowest_pairs_of_a_large_matrix(monkeypatch):
    monkeypatch.setattr(V, "REPORT_PAIRS_MAX", 5)
    secs = V.sections(pd.DataFrame(rows()), [])
    assert secs[1].title == "The lowest pairs" and len(secs[1].rows) == 5 and secs[1].rows[0][0] == "h1-h4"
    assert secs[1].note.startswith("the lowest 5 of the 15 pairs")
