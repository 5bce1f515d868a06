"""The pairs test's pure logic: the schedule (every pair of n members in n-1 rounds of
disjoint pairs, or K seeded partners each), the expected time of a schedule, the node x node
matrix and its CSV, and the verdict: which node or link is slow, judged against the cluster
itself.

The verdict never rests on a fixed GB/s: a pair is an outlier when its bandwidth (the
median over repeats) is below the median of the matrix - PAIRS_OUTLIER_MADS scaled MADs
AND below PAIRS_FLOOR_X x that median (analyse/thresholds.py says why those two). Nodes
are judged first, by their rows: a node whose row median is such an outlier against the
other nodes' rows is a candidate, and its pairs stay out of the reference the pairs are
judged against, so one bad node among few does not drag the median down with it. A
candidate whose pairs are mostly outliers is a slow node (not n-1 slow links); an outlier
pair low against both ends' other pairs is a slow link. Suspects are measured again alone:
one that is normal alone was slowed by the pairs beside it in its round (contention), not
by its link."""
from __future__ import annotations

import csv
import io
import math
import random
import re
from statistics import median

from commbench.analyse.thresholds import PAIRS_FLOOR_X, PAIRS_OUTLIER_MADS

# The scaled MAD: 1.4826 x MAD estimates the standard deviation of normal data.
MAD_SCALE = 1.4826
THRESHOLD_WORDS = (f"below the median - {PAIRS_OUTLIER_MADS:g} MAD and below {PAIRS_FLOOR_X:g}x the median")
# Findings the verdict line names one by one; the rest are in the detail lines.
NAMED = 3


# ------------------------------------------------------------------ the schedule

def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """The circle method: member 0 stays, the others turn one place a round. n even: n-1
    rounds of n/2 disjoint pairs; n odd: a ghost member makes it even, and whoever meets
    the ghost has the round off (a bye): n rounds of (n-1)/2 pairs. Every unordered pair
    exactly once; pairs as (low, high), sorted within a round. [] for n < 2."""
    if n < 2:
        return []
    m = n + n % 2
    ring = list(range(m))
    rounds = []
    for _ in range(m - 1):
        pairs = [(min(ring[i], ring[m - 1 - i]), max(ring[i], ring[m - 1 - i])) for i in range(m // 2)]
        rounds.append(sorted(p for p in pairs if p[1] < n))
        ring = [ring[0], ring[-1]] + ring[1:-1]
    return rounds


def partner_rounds(n: int, k: int, seed: int) -> list[list[tuple[int, int]]]:
    """K partners per member instead of all n-1: k rounds of a round robin over a seeded
    relabelling of the members, the rounds themselves a seeded choice, so each member meets
    k random others and the rounds stay disjoint pairs. n odd: the k members whose bye fell
    in a chosen round get their k-th partner in extra rounds. Deterministic for (n, k,
    seed); k = n-1 is the full round robin. ValueError when k is not 1 to n-1."""
    if n < 2:
        raise ValueError(f"partners: {n} member(s), no pair to measure")
    if not 1 <= k <= n - 1:
        raise ValueError(f"partners {k}: each of {n} members has 1 to {n - 1} possible partners")
    if k == n - 1:
        return round_robin(n)
    rng = random.Random(seed)  # the stdlib's generator: the same schedule whatever numpy is installed
    label = list(range(n))
    rng.shuffle(label)
    base = round_robin(n)
    picked = sorted(rng.sample(range(len(base)), k))
    rounds = [sorted((min(label[a], label[b]), max(label[a], label[b])) for a, b in base[i]) for i in picked]
    met: list[set] = [set() for _ in range(n)]
    for rnd in rounds:
        for a, b in rnd:
            met[a].add(b)
            met[b].add(a)
    while any(len(s) < k for s in met):
        rounds.append(_fill_round(met, k, rng))
    return rounds


def _fill_round(met: list[set], k: int, rng: random.Random) -> list[tuple[int, int]]:
    """One more round of disjoint new pairs for the members with fewer than k partners
    (another such member first, else anyone free). The first of them always finds one: it
    has met fewer than k <= n-2 of the others."""
    n = len(met)
    short = [x for x in range(n) if len(met[x]) < k]
    rng.shuffle(short)
    used: set = set()
    out = []
    for a in short:
        if a in used or len(met[a]) >= k:
            continue
        free = [b for b in range(n) if b != a and b not in used and b not in met[a]]
        if not free:
            continue
        also_short = [b for b in free if len(met[b]) < k]
        b = rng.choice(also_short or free)
        used |= {a, b}
        met[a].add(b)
        met[b].add(a)
        out.append((min(a, b), max(a, b)))
    return sorted(out)


def coverage(n: int, rounds) -> float:
    """The share of the n(n-1)/2 pairs the rounds measure (each counted once); 1.0 when
    there is no pair to measure."""
    total = n * (n - 1) // 2
    return len({(min(a, b), max(a, b)) for rnd in rounds for a, b in rnd}) / total if total else 1.0


def expected_seconds(rounds: int, repeats: int, iters: int, lat_nbytes: int, bw_nbytes: int,
                     link_gbps: float, latency_us: float) -> float:
    """The measuring time of a schedule: every round of every repeat, each pair `iters`
    bidirectional exchanges at each size, the pairs of a round at once; an exchange of S
    bytes each way takes latency + S / link rate (GB/s, 1e9 B, each direction: a duplex
    link carries both at once). Start-up, warm-up and the re-tests of suspects come on top."""
    if link_gbps <= 0 or latency_us < 0 or min(rounds, repeats, iters, lat_nbytes, bw_nbytes) < 0:
        raise ValueError("expected_seconds: a rate above 0 and no negative count, size or latency")
    one_s = 2 * latency_us * 1e-6 + (lat_nbytes + bw_nbytes) / (link_gbps * 1e9)
    return rounds * repeats * iters * one_s


# ------------------------------------------------------------------ the matrix

def natural_key(name: str) -> list:
    """h2 before h10: the digits in a name compared as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.findall(r"\d+|\D+", str(name))]


def finite_values(values) -> list[float]:
    """The values that are finite numbers (None, NaN, inf and text left out)."""
    out = []
    for v in values or []:
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append(x)
    return out


def _collect(pairs: list[dict], field: str = "bw_gbps") -> dict:
    """(a, b) in name order -> the finite values of `field` over every entry of that pair
    (an entry twice, or as (b, a), adds its values)."""
    out: dict = {}
    keys: dict = {}  # a name's natural key, made once (a matrix of 1,024 nodes has 523,776 pairs)
    for p in pairs:
        a, b = str(p["a"]), str(p["b"])
        if a == b:
            raise ValueError(f"pair {a}-{b}: a member paired with itself")
        ka = keys.get(a) or keys.setdefault(a, natural_key(a))
        kb = keys.get(b) or keys.setdefault(b, natural_key(b))
        out.setdefault((a, b) if (ka, a) <= (kb, b) else (b, a), []).extend(finite_values(p.get(field)))
    return out


def matrix(pairs: list[dict], names, field: str = "bw_gbps") -> list[list[float | None]]:
    """Node x node in the order of `names`, each cell the median over repeats of `field`
    (symmetric); None on the diagonal and where a pair was not measured or has no finite
    value."""
    index = {str(x): i for i, x in enumerate(names)}
    out: list[list] = [[None] * len(index) for _ in index]
    for (a, b), vals in _collect(pairs, field).items():
        if vals and a in index and b in index:
            out[index[a]][index[b]] = out[index[b]][index[a]] = median(vals)
    return out


def matrix_csv(pairs: list[dict], names, field: str = "bw_gbps") -> str:
    """The matrix as CSV text: a header `node,<names>`, then one line per node; cells are
    the median over repeats (GB/s for bw_gbps), empty on the diagonal and where nothing
    was measured."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["node"] + [str(x) for x in names])
    for name, row in zip(names, matrix(pairs, names, field)):
        w.writerow([str(name)] + ["" if v is None else f"{v:.6g}" for v in row])
    return buf.getvalue()


# ------------------------------------------------------------------ the verdict

def robust_bound(values) -> tuple[float, float, float]:
    """(median, scaled MAD, the outlier bound: below both the median - PAIRS_OUTLIER_MADS
    MAD and PAIRS_FLOOR_X x the median). The floor keeps a tight matrix on a quiet machine
    (a MAD near 0) from naming noise; the MAD keeps a noisy one from naming its tail."""
    med = median(values)
    mad = MAD_SCALE * median([abs(v - med) for v in values])
    return med, mad, min(med - PAIRS_OUTLIER_MADS * mad, PAIRS_FLOOR_X * med)


def _x(r: float) -> str:
    return f"{r:.2f}"


def _span(ratios) -> str:
    lo, hi = _x(min(ratios)), _x(max(ratios))
    return lo if lo == hi else f"{lo}-{hi}"


def _times(counts, provisional: bool) -> str:
    """How often the pairs behind a finding were measured again alone."""
    if provisional:
        return " (not yet re-tested)"
    lo, hi = min(counts), max(counts)
    if hi == 0:
        return " (not re-tested)"
    word = "once" if lo == hi == 1 else f"{lo if lo == hi else f'{lo}-{hi}'} times"
    return f" (re-tested {word})"


def _retest_values(retests, key) -> list[float] | None:
    if retests is None:
        return None
    a, b = key
    got = retests.get((a, b), retests.get((b, a)))
    return finite_values(got) if got is not None else []


def _result(line: str, lines: list, **kw) -> dict:
    out = {"suspects": [], "slow_nodes": [], "slow_links": [], "slow_pairs": [], "contention": [],
           "not_judged": [], "outlier": False, "final": True, "line": line, "lines": lines,
           "median_bw_gbps": None, "mad_gbps": None, "threshold_gbps": None, "threshold": THRESHOLD_WORDS,
           "coverage": 1.0, "members": 0, "pairs_judged": 0}
    out.update(kw)
    return out


def judge(pairs: list[dict], retests: dict | None = None, possible: int | None = None) -> dict:
    """The verdict over the measured pairs ({"a", "b", "bw_gbps": [per repeat], "lat_us":
    [per repeat]}); retests: (a, b) -> bw_gbps of each measurement of that pair alone.
    retests None: the suspects to re-test and a provisional line. Keys: suspects,
    slow_nodes, slow_links, slow_pairs (an outlier pair one of whose ends is low elsewhere
    too: neither one link nor one node), contention (suspects normal alone), not_judged
    (pairs with no finite value), outlier (any slow node, link or pair), final, line,
    lines, median_bw_gbps, mad_gbps, threshold_gbps, threshold (in words), coverage,
    members, pairs_judged. possible: the pairs the schedule could measure, for the coverage
    (rail mode pairs each rail with its own only); None: every pair of the members."""
    bw = _collect(pairs)
    lat = _collect(pairs, "lat_us")
    names = sorted({x for key in bw for x in key}, key=natural_key)
    n = len(names)
    total = n * (n - 1) // 2 if possible is None else possible
    med = {k: median(v) for k, v in bw.items() if v}
    not_judged = [k for k, v in bw.items() if not v]
    lines = [f"pair {a}-{b}: no finite bandwidth (not judged)" for a, b in not_judged]
    cov = len(med) / total if total else 1.0
    base = {"not_judged": not_judged, "coverage": cov, "members": n, "pairs_judged": len(med)}
    if n == 2:
        got = f": {next(iter(med))[0]}-{next(iter(med))[1]} at {next(iter(med.values())):.3g} GB/s" if med else ""
        return _result(f"2 nodes: one pair, a slow link and a slow node look alike; nothing to judge it "
                       f"against{got}", lines, **base)
    if len(med) < 3:
        return _result(f"{len(med)} pair(s) with a finite bandwidth among {n} members: too few to judge "
                       f"against each other (3 at least)", lines, **base)
    rows: dict = {x: [] for x in names}
    for k in med:
        rows[k[0]].append(k)
        rows[k[1]].append(k)
    row_med = {x: median([med[k] for k in ks]) for x, ks in rows.items() if ks}
    # Nodes first, each against the others' rows: their pairs stay out of the reference.
    candidates = []
    for x, r in row_med.items():
        others = [v for y, v in row_med.items() if y != x]
        if len(others) >= 2 and r < robust_bound(others)[2]:
            candidates.append(x)
    if 2 * len(candidates) >= n:
        # Judging against the cluster needs a healthy majority: half of it low is no reference.
        lines.append(f"{len(candidates)} of the {n} members' rows are low ({', '.join(candidates)}): no healthy "
                     f"majority to judge them against, judged against the whole matrix")
        candidates = []
    ref = [v for k, v in med.items() if k[0] not in candidates and k[1] not in candidates] or list(med.values())
    # Pairs far below the floor are no evidence of the spread of healthy ones: a slow link
    # among three pairs would otherwise widen the MAD enough to hide itself.
    ref_m = median(ref)
    clean = [v for v in ref if v >= PAIRS_FLOOR_X * ref_m] or ref
    m, mad, bound = robust_bound(clean)
    if m <= 0:
        return _result(f"the median bandwidth of the matrix is {m:g} GB/s: nothing to judge the pairs against",
                       lines, **base)
    ratio = {k: v / m for k, v in med.items()}
    suspects = sorted((k for k, v in med.items() if v < bound), key=lambda k: (med[k], k))
    provisional = retests is None
    alone = {k: _retest_values(retests, k) for k in suspects}
    # Normal alone: back above the floor, not merely above a bound a wide MAD put far below it.
    contention = [k for k in suspects if alone[k] and median(alone[k]) >= PAIRS_FLOOR_X * m]
    confirmed = [k for k in suspects if k not in contention]
    count = {k: len(alone[k] or []) for k in suspects}
    for k in contention:
        lines.append(f"pair {k[0]}-{k[1]}: {_x(ratio[k])}x the median in its round, "
                     f"{_x(median(alone[k]) / m)}x alone{_times([count[k]], False)}: "
                     f"contention, not the link")
    slow_nodes = [x for x in candidates if 2 * sum(x in k for k in confirmed) > len(rows[x])]
    lat_med = [median(v) for v in lat.values() if v]
    lat_m = median(lat_med) if lat_med else math.nan
    parts, slow_links, slow_pairs = [], [], []
    for x in slow_nodes:
        mine = [k for k in confirmed if x in k]
        said = (f"all {len(mine)} of its pairs" if len(mine) == len(rows[x])
                else f"{len(mine)} of its {len(rows[x])} pairs")
        parts.append(f"node {x}: {said} at {_span([ratio[k] for k in mine])}x the "
                     f"median{_times([count[k] for k in mine], provisional)}")
        lines.append(f"node {x}: its row {_x(row_med[x] / m)}x the median, the other nodes' rows "
                     f"{_span([row_med[y] / m for y in row_med if y != x])}x"
                     + _alone_words([k for k in mine], alone, m))
    for k in confirmed:
        if set(k) & set(slow_nodes):
            continue
        a, b = k
        ends = {x: _other_row(med, rows[x], k, m) for x in k}
        low = [x for x in k if med[k] < PAIRS_FLOOR_X * ends[x]]
        times = _times([count[k]], provisional)
        if len(low) == 2:
            slow_links.append(k)
            weak = [x for x in k if ends[x] < bound]
            others = ("its other pairs normal" if not weak else
                      ", ".join(f"{x}'s other pairs at {_x(ends[x] / m)}x" for x in weak))
            parts.append(f"link {a}-{b}: {_x(ratio[k])}x the median, {others}{times}")
        else:
            slow_pairs.append(k)
            also = [x for x in k if x not in low]
            parts.append(f"pair {a}-{b}: {_x(ratio[k])}x the median, "
                         + " and ".join(f"{x}'s other pairs low too ({_x(ends[x] / m)}x)" for x in also)
                         + f": neither one link nor one node{times}")
        lines.append(f"{'link' if len(low) == 2 else 'pair'} {a}-{b}: {_x(ratio[k])}x the median in its round; "
                     + ", ".join(f"{x}'s other pairs {_x(ends[x] / m)}x" for x in k)
                     + _alone_words([k], alone, m) + _lat_words(lat.get(k), lat_m))
    lines.insert(0, f"reference: the median {m:.4g} GB/s over {len(clean)} pairs"
                 + (f" (not those of {', '.join(candidates)}: {'its row is' if len(candidates) == 1 else 'their rows are'}"
                    f" low)" if candidates else "")
                 + f", scaled MAD {mad:.3g} GB/s: an outlier is {THRESHOLD_WORDS} (here < {bound:.4g} GB/s)")
    if cov < 1:
        lines.insert(1, f"{len(med)} of the {total} pairs measured ({100 * cov:.0f} %): judged over those")
    if parts:
        line = "; ".join(parts[:NAMED]) + (f"; and {len(parts) - NAMED} more" if len(parts) > NAMED else "")
        line = ("to re-test alone: " if provisional else "") + line
    else:
        normal = [r for k, r in ratio.items() if k not in contention]
        line = f"no outlier: every pair within {_span(normal)}x the median"
        if contention:
            named = (f"{contention[0][0]}-{contention[0][1]}" if len(contention) == 1
                     else f"{len(contention)} pairs")
            line += (f", {named} low in {'its round' if len(contention) == 1 else 'their rounds'} but normal alone"
                     f"{_times([count[k] for k in contention], False)}: contention, not the link")
        line += f" (outlier: {THRESHOLD_WORDS})"
    if cov < 1:
        line += f" [{len(med)} of {total} pairs measured, {100 * cov:.0f} %]"
    return _result(line, lines, suspects=suspects, slow_nodes=slow_nodes, slow_links=slow_links,
                   slow_pairs=slow_pairs, contention=contention, outlier=bool(slow_nodes or slow_links or slow_pairs),
                   final=not (provisional and suspects), median_bw_gbps=m, mad_gbps=mad, threshold_gbps=bound, **base)


def _other_row(med: dict, keys: list, k: tuple, m: float) -> float:
    """The median of a node's pairs but k; the matrix median when k is its only pair."""
    rest = [med[j] for j in keys if j != k]
    return median(rest) if rest else m


def _alone_words(keys: list, alone: dict, m: float) -> str:
    got = [median(alone[k]) / m for k in keys if alone.get(k)]
    return f"; alone {_span(got)}x" if got else ""


def _lat_words(mine, lat_m: float) -> str:
    if not mine or not lat_m > 0:
        return ""
    return f"; latency {_x(median(mine) / lat_m)}x the median"
