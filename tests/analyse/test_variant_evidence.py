"""A variant is "clearly" faster or slower only on evidence: at least three repeats in fresh
launches, interleaved with the baseline's, every pair agreeing at a size. One run each (or
two, or repeats sharing one launch, or run in blocks) says "cannot judge" and what would
judge it; two identical runs back to back never make opposite claims."""
from __future__ import annotations

import random

import pandas as pd
import pytest

import commbench
from commbench.analyse.verdicts import untrusted_reason
from commbench.report.variants_view import variant_comparisons
from conftest import fixture_path, make_row, needs_mpi, run_cli

SIZES = [8, 65536, 4 << 20]
BASE, VAR = "ompi-ring", "ompi-recursive-doubling"


def _rows(p50s: dict, repeats=1, launch=lambda v, rep: f"7-{rep * 10 + (v == VAR)}", spread_pct=5.0, **kw) -> list:
    """Rows of two variants at SIZES: p50s[variant] -> [(repeat 1's p50 at each size), ...],
    or one tuple for every repeat alike. launch(variant, repeat): the launch id ('' for
    none); by default each repeat of each variant a launch of its own, alternating."""
    rows = []
    for rep in range(1, repeats + 1):
        for v in (BASE, VAR):
            at = p50s[v][rep - 1] if isinstance(p50s[v], list) else p50s[v]
            for s, p in zip(SIZES, at):
                lid = launch(v, rep)
                rows.append(make_row("all_gather", 2, s, p, variant=v, repeat=rep, spread_pct=spread_pct, run="r",
                                     **({"launch": lid} if lid else {}), **kw))
    return rows


def _judge(rows):
    (c,) = variant_comparisons(pd.DataFrame(rows), BASE)
    ((name, best, at, cross, line),) = c["verdicts"]
    assert name == VAR
    return line, best, cross, c.get("claims", {}).get(VAR)


SLOW = {BASE: (1.0, 10.0, 1000.0), VAR: (2.2, 22.0, 2200.0)}  # the variant 2.2x slower at every size


def test_one_run_each_never_says_clearly():
    fast = {BASE: (2.0, 20.0, 2000.0), VAR: (1.0, 10.0, 1000.0)}  # 2x faster, p90 5 % above p50
    for p50s in (fast, SLOW):
        line, best, cross, claims = _judge(_rows(p50s))
        assert line.startswith("cannot judge: one run each (--repeat 3 to judge)"), line
        assert "clearly" not in line and "faster from" not in line and best is None and cross is None
        assert claims == {"faster": [], "slower": []}
    line, best, _, _ = _judge(_rows(fast, repeats=2))
    assert line.startswith("cannot judge: two runs each (--repeat 3 to judge)") and best is None, line


def test_repeats_that_are_not_fresh_interleaved_launches_cannot_judge():
    fast = {BASE: (2.0, 20.0, 2000.0), VAR: (1.0, 10.0, 1000.0)}
    # An external launcher runs every repeat of a variant in one launch: they share its speed.
    line, best, _, _ = _judge(_rows(fast, 3, launch=lambda v, rep: f"7-{v == VAR}"))
    assert line.startswith("cannot judge: 3 repeats each, but not each in a fresh launch") and best is None, line
    # Fresh launches, but every repeat of the baseline before any of the variant's.
    line, best, _, _ = _judge(_rows(fast, 3, launch=lambda v, rep: f"7-{rep + 10 * (v == VAR)}"))
    assert line.startswith("cannot judge: 3 repeats each, not interleaved") and best is None, line
    # Rows that do not say which launch measured them.
    line, best, _, _ = _judge(_rows(fast, 3, launch=lambda v, rep: ""))
    assert line.startswith("cannot judge: 3 repeats each, not recorded as launches of their own"), line
    assert "clearly" not in line


def test_three_interleaved_fresh_repeats_judge_faster_and_slower():
    fast = {BASE: (2.0, 20.0, 2000.0), VAR: (1.0, 10.0, 1000.0)}
    line, best, cross, claims = _judge(_rows(fast, 3))
    assert line.startswith("clearly faster at 3 of 3 sizes (3 interleaved repeats in fresh launches, every pair "
                           "agrees: 8, 64K, 4M); best 2.00x"), line
    assert "faster from 8 up" in line and best == 2.0 and cross == 8 and claims == {"faster": SIZES, "slower": []}
    line, best, cross, claims = _judge(_rows(SLOW, 3))
    assert line.startswith("clearly slower at 3 of 3 sizes (3 interleaved repeats in fresh launches, every pair "
                           "agrees: 8, 64K, 4M); at worst 0.45x"), line
    assert "slower from 8 up" in line and best is None and claims == {"faster": [], "slower": SIZES}
    # Faster at the small sizes, slower at the largest: both said, and from where it wins none.
    mixed = {BASE: (2.0, 20.0, 1000.0), VAR: (1.0, 10.0, 2200.0)}
    line, best, cross, claims = _judge(_rows(mixed, 3))
    assert "clearly faster at 2 of 3 sizes" in line and "not clearly faster at the largest size" in line, line
    assert "clearly slower at 1 of 3 sizes: 4M" in line and cross is None and claims["slower"] == [4 << 20]


def test_a_size_needs_three_agreeing_pairs_of_usable_rows():
    # Two pairs say 2x faster; the third's variant launch was slow: the pairs disagree.
    p50s = {BASE: (2.0, 20.0, 2000.0), VAR: [(1.0, 10.0, 1000.0), (1.0, 10.0, 1000.0), (2.1, 21.0, 2100.0)]}
    line, best, _, _ = _judge(_rows(p50s, 3))
    assert line.startswith("cannot judge: at no size clearly faster or slower in every pair"), line
    assert "at 3 size(s) the pairs disagree" in line and best is None
    # One disturbed row leaves two usable pairs at that size: it does not count, the others do.
    rows = _rows({BASE: (2.0, 20.0, 2000.0), VAR: (1.0, 10.0, 1000.0)}, 3)
    bad = next(r for r in rows if r["variant"] == VAR and r["nbytes"] == 8 and r["repeat"] == 2)
    bad.update(disturbed=True, warning="disturbed: a rank waited for a CPU 50 % of the point's time")
    line, best, cross, claims = _judge(rows)
    assert line.startswith("clearly faster at 2 of 3 sizes") and claims["faster"] == SIZES[1:] and cross == 65536
    assert "at 1 size(s) fewer than 3 pairs had both rows usable" in line and "1 row(s) not usable" in line
    # Pairs are matched by repeat number, not by position once a row is left out.
    from commbench.analyse.speedups import MIN_PAIRS, size_verdict, usable_pairs

    b = [make_row(nbytes=8, p50=p, repeat=k, spread_pct=5.0) for k, p in ((1, 2.0), (2, 1.0), (3, 2.0), (4, 2.0))]
    v = [make_row(nbytes=8, p50=p, repeat=k, spread_pct=5.0) for k, p in ((1, 1.0), (2, 0.5), (3, 1.0), (4, 1.0))]
    b[0]["disturbed"] = True
    pairs = usable_pairs(b, v, untrusted_reason)
    assert [x["repeat"] for x, _ in pairs] == [2, 3, 4] and size_verdict(pairs) is True
    assert size_verdict(pairs[:MIN_PAIRS - 1]) is None


def test_pairing_counts_fresh_interleaved_launches():
    from commbench.analyse.speedups import pairing

    def rows(v, ids):
        return [make_row(nbytes=8, variant=v, repeat=k + 1, launch=i) for k, i in enumerate(ids)]
    assert pairing(rows(BASE, ["1-10"]), rows(VAR, ["1-11"])) == (1, "one run each", "--repeat 3 to judge")
    assert pairing(rows(BASE, ["1-10", "1-20", "1-30"]), rows(VAR, ["1-11", "1-21", "1-31"]))[1] == ""
    # Repeat 2 of the variant started after repeat 3 of the baseline: not next to each other.
    assert "not interleaved" in pairing(rows(BASE, ["1-10", "1-20", "1-30"]), rows(VAR, ["1-11", "1-35", "1-36"]))[1]
    # A resume ran the variant's repeats 2 and 3 in one launch.
    assert "not each in a fresh launch" in pairing(rows(BASE, ["1-10", "1-20", "1-30"]),
                                                   rows(VAR, ["1-11", "1-21", "1-21"]))[1]


def _noisy_run(rng: random.Random, repeats: int, t0: int) -> list:
    """One run of identical settings, as this loopback gives them: each launch holds one of
    two speeds for its life (30 % of launches 1.31x slower, as a 16 KiB all_reduce ran at
    7.8 or 10.2 us), each point moves a few % more, and p90 sits 4-15 % above p50."""
    rows, t = [], t0
    for rep in range(1, repeats + 1):
        for v in (BASE, VAR):
            mode = 1.31 if rng.random() < 0.3 else 1.0
            t += 1
            for s, p in zip(SIZES, (0.5, 9.0, 900.0)):
                p50 = p * mode * rng.lognormvariate(0.0, 0.03)
                rows.append(make_row("all_gather", 2, s, p50, variant=v, repeat=rep, run="r", launch=f"9-{t}",
                                     spread_pct=rng.uniform(4.0, 15.0)))
    return rows


def _directions(rows) -> dict:
    """The variant's claims in one run: {"faster"/"slower": sizes} from the line's words
    (a variant line that says it is clearly faster, clearly slower, or slower at every size)."""
    (c,) = variant_comparisons(pd.DataFrame(rows), BASE)
    line = c["lines"][0]
    got = {"faster": set(), "slower": set()}
    if "clearly faster" in line or "faster from" in line:
        got["faster"] |= set(c.get("claims", {}).get(VAR, {}).get("faster", SIZES))
    if "clearly slower" in line or "slower at every size" in line:
        got["slower"] |= set(c.get("claims", {}).get(VAR, {}).get("slower", SIZES))
    return got


def test_identical_runs_back_to_back_make_no_opposite_claims():
    rng = random.Random(20240601)
    for repeats in (1, 3):
        claimed, flips = 0, []
        for trial in range(60):
            a, b = (_directions(_noisy_run(rng, repeats, 1000 * (2 * trial + k))) for k in (0, 1))
            claimed += any(a.values()) + any(b.values())
            if (a["faster"] & b["slower"]) or (a["slower"] & b["faster"]):
                flips.append((trial, a, b))
        assert not flips, f"{len(flips)} of 60 identical pairs of runs ({repeats} repeat(s)) flipped: {flips[:2]}"
        if repeats == 1:  # one run each: nothing may be claimed at all
            assert claimed == 0
        else:  # a run whose three baseline launches all drew the slow speed, and no variant one did: rare
            assert claimed <= 12, f"{claimed} of 120 runs of identical settings claimed a change"


@needs_mpi
@pytest.mark.multirank
def test_run_repeat_records_a_fresh_launch_per_repeat(tmp_path):
    """`run --np 2 --repeat 3` over two variants: each repeat of each its own launch id, in
    the alternating order, so the line judges (or cannot, for the rows) on 3 interleaved
    repeats in fresh launches, never 'one run each' or 'not each in a fresh launch'."""
    from commbench.analyse.speedups import pairing

    out = tmp_path / "run"
    r = run_cli("run", fixture_path("variant_slower.toml"), "--np", "2", "--repeat", "3",
                "--sizes", "8", "--iters", "20", "--out", out, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    df = commbench.load(out)
    assert df.groupby("variant")["launch"].nunique().to_dict() == {"ompi-linear": 3, "ompi-ring": 3}
    rows = df.to_dict("records")
    assert pairing([x for x in rows if x["variant"] == "ompi-ring"], [x for x in rows if x["variant"] == "ompi-linear"]) \
        == (3, "", "")
    line = next(ln for ln in r.stdout.splitlines() if "ompi-linear vs ompi-ring:" in ln)
    assert "3 interleaved repeats in fresh launches" in line, line
