"""The pairs benchmark around its run: the schedule --dry-run prints (rounds, the pairs of
each, the expected time), and what --fail-on-outlier reads back from the run directory."""
from __future__ import annotations

import sys

from commbench.analyse import pairs as pairs_analysis
from commbench.benchmarks.pairs import WARMUP_ITERS, lanes_of, schedule
from commbench.core.errors import UsageError
from commbench.core.units import fmt_size
from commbench.store.results import load_meta

from .plan import PLAN_ALPHA_S, PLAN_GBPS, PLAN_SETUP_S

# --dry-run shows this many rounds, and this many pairs of each; a count says the rest.
SHOWN_ROUNDS = 4
SHOWN_PAIRS = 8


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def planned(p, node_count: int | None) -> tuple[list, list] | None:
    """A pairs point's lanes and rounds as the launcher can know them (None: node mode
    under mpirun/srun, whose nodes the hostnames tell only once the ranks start)."""
    mode = p.params["mode"]
    if mode == "rank":
        nodes = list(range(p.world))
    elif node_count is None:
        return None
    else:  # the launcher's grouping: rank // ranks per node
        per = -(-p.world // node_count)
        nodes = [r // per for r in range(p.world)]
    lanes = lanes_of(mode, nodes)
    return lanes, schedule(pairs_analysis, len(lanes[0]), p.params)


def expected_s(p, rounds: list) -> float:
    """The measuring time of a pairs point at plan.py's rough rates (no re-tests)."""
    q = p.params
    return pairs_analysis.expected_seconds(len(rounds), q["repeats"], q["iters"] + WARMUP_ITERS, q["lat_nbytes"],
                                           q["bw_nbytes"], PLAN_GBPS, PLAN_ALPHA_S * 1e6)


def with_pairs_times(plan_rows: list[dict], node_count: int | None) -> list[dict]:
    """The plan's rows with each pairs point's time from its schedule (the generic estimate
    knows one operation per iteration, not rounds of pairs)."""
    for r in plan_rows:
        got = planned(r["point"], node_count) if r["point"].benchmark == "pairs" else None
        if got is not None:
            r["est_s"] = expected_s(r["point"], got[1]) + PLAN_SETUP_S
    return plan_rows


def dry_run_lines(points: list, node_count: int | None) -> list[str]:
    """Per pairs point: its members, rounds and pairs (the first few of a large schedule),
    the coverage of --partners, and the expected time at plan.py's rough rates."""
    out = []
    for p in (p for p in points if p.benchmark == "pairs"):
        params, mode = p.params, p.params["mode"]
        head = f"pairs {' '.join(f'{k}={v}' for k, v in params.items())} world {p.world}"
        got = planned(p, node_count)
        if got is None:
            out.append(f"{head}: nodes are known from the hostnames once the ranks start: no schedule here "
                       f"(give --ranks-per-node to see one)")
            continue
        lanes, rounds = got
        n = len(lanes[0])
        npairs = sum(len(r) for r in rounds)
        lane_note = f", {len(lanes)} rails in the same rounds" if mode == "rail" else ""
        cover = (f"{_plural(params['partners'], 'partner')} per member: {npairs} of {n * (n - 1) // 2} pairs, coverage "
                 f"{100 * pairs_analysis.coverage(n, rounds):.3g} %" if params.get("partners") else "every pair")
        out.append(f"{head}: {_plural(n, 'rank' if mode == 'rank' else 'node')}{lane_note}, "
                   f"{_plural(len(rounds), 'round')}, {_plural(npairs, 'pair')} ({cover}), "
                   f"{_plural(params['repeats'], 'repeat')}")
        prefix = "r" if mode == "rank" else "n"
        for i, r in enumerate(rounds[:SHOWN_ROUNDS], 1):
            shown = " ".join(f"{prefix}{a}-{prefix}{b}" for a, b in r[:SHOWN_PAIRS])
            more = f" and {len(r) - SHOWN_PAIRS} more" if len(r) > SHOWN_PAIRS else ""
            out.append(f"  round {i}: {shown}{more}")
        if len(rounds) > SHOWN_ROUNDS:
            out.append(f"  ... and {len(rounds) - SHOWN_ROUNDS} more rounds")
        out.append(f"  expected: about {expected_s(p, rounds):.2g} s ({_plural(params['repeats'], 'repeat')} x "
                   f"{_plural(len(rounds), 'round')} x {params['iters']} + {WARMUP_ITERS} exchanges at "
                   f"{fmt_size(params['lat_nbytes'])} and {fmt_size(params['bw_nbytes'])} a pair, at a rough "
                   f"{PLAN_GBPS:g} GB/s and {PLAN_ALPHA_S * 1e6:g} us an exchange; start-up and the re-tests "
                   f"of suspects come on top)")
    return out


def outlier_lines(run_dir) -> list[str]:
    """The verdict lines of the run's pairs points that name a slow node or link."""
    try:
        meta = load_meta(run_dir)
    except (OSError, UsageError):  # a run that left no record (or a damaged one) has no verdict to read
        return []
    return [v.get("line", "") for v in meta.get("pairs_verdicts") or []
            if isinstance(v, dict) and (v.get("outlier") or v.get("slow_nodes") or v.get("slow_links"))]


def fail_on_outlier(rc: int, run_dir) -> int:
    """--fail-on-outlier: exit 1 when a verdict of the run names a slow node or link (a
    run that failed keeps its own status)."""
    if rc != 0:
        return rc
    lines = outlier_lines(run_dir)
    for line in lines:
        print(f"commbench: --fail-on-outlier: {line}", file=sys.stderr, flush=True)
    return 1 if lines else 0
