"""The pairs test's pure logic (analyse/pairs.py): the round-robin schedule, K partners, the
expected time, the matrix and its CSV, and the verdict on synthetic matrices: one slow link,
one slow node, nothing, contention, partners, odd inputs."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from commbench.analyse import pairs as P

OUTLIER = "(outlier: below the median - 3.5 MAD and below 0.7x the median)"


def all_pairs(rounds) -> list:
    return [p for rnd in rounds for p in rnd]


@pytest.mark.parametrize("n", range(2, 34))
def test_round_robin_every_pair_once_in_disjoint_rounds(n):
    rounds = P.round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    got = all_pairs(rounds)
    assert sorted(got) == list(itertools.combinations(range(n), 2))  # every pair exactly once, as (low, high)
    for rnd in rounds:
        members = [x for p in rnd for x in p]
        assert len(members) == len(set(members))  # disjoint: nobody twice in a round
        assert len(rnd) == n // 2  # n odd: one member has the round off
    if n % 2:
        byes = [set(range(n)) - {x for p in rnd for x in p} for rnd in rounds]
        assert sorted(x for b in byes for x in b) == list(range(n))  # each member's bye exactly once


def test_round_robin_of_fewer_than_two_is_empty():
    assert P.round_robin(0) == [] and P.round_robin(1) == []


@pytest.mark.parametrize("n,k", [(8, 1), (8, 3), (9, 2), (9, 4), (16, 5), (33, 3), (33, 8), (64, 7), (5, 3)])
def test_partner_rounds_k_partners_each_in_disjoint_rounds(n, k):
    rounds = P.partner_rounds(n, k, seed=7)
    got = all_pairs(rounds)
    assert len(got) == len(set(got))  # no pair twice
    partners = {x: set() for x in range(n)}
    for a, b in got:
        assert 0 <= a < b < n
        partners[a].add(b)
        partners[b].add(a)
    assert all(len(s) >= k for s in partners.values())
    if n % 2 == 0:  # k rounds of perfect matchings: exactly k each
        assert len(rounds) == k and all(len(s) == k for s in partners.values())
    for rnd in rounds:
        members = [x for p in rnd for x in p]
        assert len(members) == len(set(members))
    assert P.coverage(n, rounds) == pytest.approx(len(got) / (n * (n - 1) / 2))


def test_partner_rounds_are_deterministic_and_the_seed_matters():
    a, b, c = P.partner_rounds(32, 4, 1), P.partner_rounds(32, 4, 1), P.partner_rounds(32, 4, 2)
    assert a == b
    assert a != c


def test_partner_rounds_of_every_partner_is_the_round_robin():
    assert P.partner_rounds(7, 6, 3) == P.round_robin(7)
    assert P.coverage(7, P.partner_rounds(7, 6, 3)) == 1.0


@pytest.mark.parametrize("n,k", [(8, 8), (8, 0), (8, -1), (2, 2), (1, 1)])
def test_partner_rounds_refuse_k_outside_one_to_n_minus_one(n, k):
    with pytest.raises(ValueError, match="partners"):
        P.partner_rounds(n, k, 0)


def test_coverage_counts_each_pair_once():
    assert P.coverage(4, [[(0, 1)], [(1, 0), (2, 3)]]) == pytest.approx(2 / 6)
    assert P.coverage(4, P.round_robin(4)) == 1.0
    assert P.coverage(1, []) == 1.0


def test_expected_seconds_is_rounds_repeats_iters_exchanges():
    # 1 MB at 50 GB/s = 20 us + 2 x 5 us latency (the small and the large exchange) = 30 us an
    # exchange pair; 10 rounds x 3 repeats x 20 iters = 600 of them.
    got = P.expected_seconds(10, 3, 20, 0, 1_000_000, 50.0, 5.0)
    assert got == pytest.approx(600 * 30e-6)
    assert P.expected_seconds(1023, 3, 20, 8, 4 << 20, 50.0, 3.0) == pytest.approx(
        1023 * 3 * 20 * (6e-6 + (8 + (4 << 20)) / 50e9))
    with pytest.raises(ValueError):
        P.expected_seconds(1, 1, 1, 8, 8, 0.0, 1.0)


# ------------------------------------------------------------------ synthetic matrices

def quiet(n: int, slow_link=None, slow_node=None, factor=1 / 3, repeats=3) -> list[dict]:
    """A matrix at 10 GB/s (its median) with a fixed pattern: 10.2 where a + b is 0 mod 4,
    9.8 where it is 1, else 10; one link or one node's links slowed by `factor`."""
    out = []
    for a, b in itertools.combinations(range(n), 2):
        v = {0: 10.2, 1: 9.8}.get((a + b) % 4, 10.0)
        if (a, b) == slow_link or slow_node in (a, b):
            v *= factor
        out.append({"a": f"h{a}", "b": f"h{b}", "bw_gbps": [v] * repeats, "lat_us": [5.0] * repeats})
    return out


def noisy(n: int, seed: int, kind=None):
    """A matrix with realistic noise: a spread s drawn in 5-15 %; each pair's own rate
    off by N(0, s/2) (cables, ports), each repeat off by N(0, s) on top; kind "link": h0-h1
    at a third, "node": every link of h0 at a third. Returns (pairs, re-test of a pair: 3
    draws of it alone, from its own rate)."""
    rng = random.Random(seed)
    s = rng.uniform(0.05, 0.15)
    rate, pairs = {}, []
    for a, b in itertools.combinations(range(n), 2):
        r = 10.0 * (1 + rng.gauss(0, s / 2))
        if (kind == "link" and (a, b) == (0, 1)) or (kind == "node" and 0 in (a, b)):
            r /= 3
        rate[(f"h{a}", f"h{b}")] = r
        pairs.append({"a": f"h{a}", "b": f"h{b}", "bw_gbps": [r * (1 + rng.gauss(0, s)) for _ in range(3)]})

    def retest(keys):
        return {k: [rate[k] * (1 + rng.gauss(0, s)) for _ in range(3)] for k in keys}
    return pairs, retest


def verdict(pairs, retest) -> dict:
    first = P.judge(pairs)
    return P.judge(pairs, retest(first["suspects"]))


def test_one_slow_link_is_that_link_and_no_node():
    first = P.judge(quiet(8, slow_link=(2, 6)))
    assert first["suspects"] == [("h2", "h6")]
    assert first["line"] == ("to re-test alone: link h2-h6: 0.34x the median, its other pairs normal "
                             "(not yet re-tested)")
    assert not first["final"]
    v = P.judge(quiet(8, slow_link=(2, 6)), {("h2", "h6"): [3.3, 3.4, 3.2]})
    assert v["slow_links"] == [("h2", "h6")] and v["slow_nodes"] == [] and v["outlier"] and v["final"]
    assert v["line"] == "link h2-h6: 0.34x the median, its other pairs normal (re-tested 3 times)"
    assert v["median_bw_gbps"] == pytest.approx(10.0)


def test_one_slow_node_is_that_node_not_its_links():
    v = P.judge(quiet(8, slow_node=5), {(f"h{min(5, x)}", f"h{max(5, x)}"): [3.0] * 3 for x in range(8) if x != 5})
    assert v["slow_nodes"] == ["h5"] and v["slow_links"] == [] and v["slow_pairs"] == []
    assert v["line"] == "node h5: all 7 of its pairs at 0.33-0.34x the median (re-tested 3 times)"
    assert len(v["suspects"]) == 7


def test_a_slow_node_among_four_does_not_poison_the_reference():
    # Half of the six pairs touch h0: the matrix median would sit among them.
    v = P.judge(quiet(4, slow_node=0), {})
    assert v["slow_nodes"] == ["h0"] and v["slow_links"] == []
    assert v["line"] == "node h0: all 3 of its pairs at 0.33x the median (not re-tested)"


def test_nothing_is_no_outlier_and_says_the_range_and_the_bound():
    v = P.judge(quiet(8))
    assert v["suspects"] == [] and not v["outlier"] and v["final"]
    assert v["line"] == f"no outlier: every pair within 0.98-1.02x the median {OUTLIER}"


def test_a_suspect_normal_alone_is_contention_not_the_link():
    v = P.judge(quiet(8, slow_link=(2, 6), factor=0.5), {("h6", "h2"): [9.8, 10.1, 9.9]})
    assert v["contention"] == [("h2", "h6")] and not v["outlier"] and v["slow_links"] == []
    assert v["line"] == (f"no outlier: every pair within 0.98-1.02x the median, h2-h6 low in its round but normal "
                         f"alone (re-tested 3 times): contention, not the link {OUTLIER}")
    assert any("contention, not the link" in line for line in v["lines"])


def test_a_suspect_still_low_alone_stays_a_link():
    v = P.judge(quiet(8, slow_link=(2, 6), factor=0.5), {("h2", "h6"): [6.0]})
    assert v["slow_links"] == [("h2", "h6")]
    assert v["line"] == "link h2-h6: 0.51x the median, its other pairs normal (re-tested once)"


def test_two_nodes_cannot_tell_a_link_from_a_node():
    v = P.judge(quiet(2, slow_link=(0, 1)))
    assert v["line"].startswith("2 nodes: one pair, a slow link and a slow node look alike")
    assert not v["outlier"] and v["suspects"] == []


def test_three_nodes_tell_a_link_from_a_node():
    assert P.judge(quiet(3, slow_link=(0, 2)), {})["slow_links"] == [("h0", "h2")]
    assert P.judge(quiet(3, slow_node=1), {})["slow_nodes"] == ["h1"]


def test_fewer_than_three_judged_pairs_are_too_few():
    pairs = quiet(3)
    pairs[0]["bw_gbps"] = [math.nan, None]
    v = P.judge(pairs)
    assert v["line"].startswith("2 pair(s) with a finite bandwidth among 3 members: too few")
    assert v["not_judged"] == [("h0", "h1")]
    assert P.judge([])["line"].startswith("0 pair(s)")


def test_nan_repeats_are_left_out_and_a_pair_without_any_is_named():
    pairs = quiet(6, slow_link=(1, 4))
    pairs[0]["bw_gbps"] = [math.nan, float("inf"), None]
    pairs[5]["bw_gbps"] = [pairs[5]["bw_gbps"][0], math.nan, math.nan]
    v = P.judge(pairs, {})
    assert v["slow_links"] == [("h1", "h4")]
    assert v["not_judged"] == [("h0", "h1")]
    assert "pair h0-h1: no finite bandwidth (not judged)" in v["lines"]
    assert v["line"].endswith("[14 of 15 pairs measured, 93 %]")


def test_partners_judge_the_measured_pairs_and_say_the_coverage():
    n = 16
    rounds = P.partner_rounds(n, 4, seed=3)
    keep = set(all_pairs(rounds))
    slow = sorted(keep)[5]
    pairs = [p for p in quiet(n, slow_link=slow) if (int(p["a"][1:]), int(p["b"][1:])) in keep]
    v = P.judge(pairs, {})
    assert v["slow_links"] == [(f"h{slow[0]}", f"h{slow[1]}")] and v["slow_nodes"] == []
    assert v["coverage"] == pytest.approx(32 / 120)
    assert v["line"].endswith("[32 of 120 pairs measured, 27 %]")
    assert "32 of the 120 pairs measured (27 %): judged over those" in v["lines"]


def test_a_member_paired_with_itself_is_refused():
    with pytest.raises(ValueError, match="itself"):
        P.judge([{"a": "h1", "b": "h1", "bw_gbps": [1.0]}])


def test_matrix_and_its_csv():
    pairs = quiet(3) + [{"a": "h2", "b": "h0", "bw_gbps": [7.0]}]
    pairs[1]["bw_gbps"] = [math.nan]  # h0-h2's own repeats gone: the extra (b, a) entry is all it has
    m = P.matrix(pairs, ["h0", "h1", "h2"])
    assert m[0][0] is None and m[0][1] == m[1][0] == pytest.approx(9.8)
    assert m[0][2] == m[2][0] == 7.0
    assert P.matrix_csv(pairs, ["h0", "h1", "h2", "h9"]) == (
        "node,h0,h1,h2,h9\nh0,,9.8,7,\nh1,9.8,,10,\nh2,7,10,,\nh9,,,,\n")


def test_names_sort_naturally():
    assert sorted(["h10", "h2", "h1"], key=P.natural_key) == ["h1", "h2", "h10"]
    v = P.judge(quiet(12, slow_link=(2, 10)), {})
    assert v["slow_links"] == [("h2", "h10")]


# ------------------------------------------------------------------ noise: 200 seeded matrices each

@pytest.mark.parametrize("n", [5, 8])
def test_nothing_is_no_outlier_in_19_of_20_noisy_matrices(n):
    got = [verdict(*noisy(n, seed)) for seed in range(200)]
    assert sum(not v["outlier"] for v in got) >= 190
    # Before the re-test too: noise rarely makes a suspect, so re-tests are few.
    assert sum(bool(P.judge(noisy(n, seed)[0])["suspects"]) for seed in range(200)) <= 10


@pytest.mark.parametrize("n", [5, 8])
def test_one_slow_link_is_named_in_19_of_20_noisy_matrices(n):
    got = [verdict(*noisy(n, seed, "link")) for seed in range(200)]
    assert sum(v["slow_links"] == [("h0", "h1")] and not v["slow_nodes"] for v in got) >= 190
    assert not any(v["slow_nodes"] for v in got)  # never a node for one link


@pytest.mark.parametrize("n", [5, 8])
def test_one_slow_node_is_named_in_19_of_20_noisy_matrices(n):
    got = [verdict(*noisy(n, seed, "node")) for seed in range(200)]
    assert sum(v["slow_nodes"] == ["h0"] and not v["slow_links"] for v in got) >= 190
    assert not any(len(v["slow_links"]) >= n - 2 for v in got)  # never its n-1 links one by one


def test_the_coverage_is_of_the_pairs_the_schedule_could_measure():
    v = P.judge(quiet(6)[:12], {}, possible=12)
    assert v["coverage"] == 1.0 and "measured" not in v["line"]
    assert P.judge(quiet(6)[:12], {})["coverage"] == pytest.approx(12 / 15)


def test_half_the_members_low_is_no_reference_for_nodes():
    # h2's and h3's rows low (h1-h2, h2-h3, h0-h3 at a third), h0's and h1's normal: half
    # the members are no minority to set aside, and the one pair left (h0-h1) is no reference.
    slow = {("h1", "h2"), ("h2", "h3"), ("h0", "h3")}
    pairs = [dict(p, bw_gbps=[10.0 / 3 if (p["a"], p["b"]) in slow else 10.0] * 3) for p in quiet(4)]
    v = P.judge(pairs, {})
    # Not two slow nodes (h0-h2 and h1-h3 are normal): the three links, each end's other pairs said.
    assert v["slow_nodes"] == [] and v["slow_links"] == [("h0", "h3"), ("h1", "h2"), ("h2", "h3")]
    assert v["line"].startswith("link h0-h3: 0.33x the median, h3's other pairs at 0.67x (not re-tested); ")
    assert "2 of the 4 members' rows are low (h2, h3): no healthy majority to judge them against, judged against " \
           "the whole matrix" in v["lines"]


def test_a_matrix_at_zero_has_nothing_to_judge_against():
    v = P.judge([dict(p, bw_gbps=[0.0]) for p in quiet(4)])
    assert v["line"] == "the median bandwidth of the matrix is 0 GB/s: nothing to judge the pairs against"
    assert not v["outlier"]
