"""Pairwise bandwidth and latency: every pair of nodes (or ranks, or rails) measured on its
own, so one slow node or link shows as its own number instead of hiding in a collective's
aggregate (where a straggler even shows the *lowest* time: it arrives last and waits least).

Members (`mode`): node, the lowest rank of each node (comm.node_of_rank: hostnames, or
--ranks-per-node) measures and the node's other ranks wait; rank, every rank; rail, the rank
with local index i of each node pairs with local index i of the others (GPU i with GPU i, as
rail-optimised fabrics are wired), every rail in the same rounds. The members of one lane
(node mode and rank mode have one, rail mode one per local index) are paired by a schedule
of rounds of disjoint pairs: the circle method (analyse/pairs.py round_robin: n-1 rounds of
n/2 pairs, n rounds with one bye each for odd n), or `partners` seeded partners per member
(partner_rounds). Every round of the schedule runs `repeats` times.

How time is taken. A round starts with a barrier over every rank (an idle one: the ranks
with no partner this round, a bye or the waiting ranks of a node, sleep rather than poll, so
they take no core from the measuring ranks). Then every member with a partner runs
WARMUP_ITERS and then `iters` bidirectional exchanges with it (comm.send_recv: MPI_Sendrecv
of S each way) at lat_nbytes, then the same at bw_nbytes, timed by the backend's loop
(comm.time_ops: one clock read per iteration, back to back, no barrier inside, since the
round's other pairs run at the same time); the pairs of a round measure at once. A second
idle barrier, then every rank's per-iteration times go to every rank (allgather_obj: every
rank calls the same collectives, the same number of times, whatever its part in the round).
A pair's time per iteration is the slower of its two ends' (iteration i of one end is
iteration i of the other: a send/recv pairs them); its figures are p50s over the
iterations: lat_us at lat_nbytes, and bw_gbps = bw_nbytes / p50 at bw_nbytes, per direction
(each end sends and receives bw_nbytes in that time). The harness's own sampling loop is
not used: it takes the slowest rank of the whole communicator per iteration, which would
mix the pairs of a round.

Re-test: after every round of every repeat, rank 0 asks the analysis (judge: median and
MAD over the matrix) for suspect pairs and shares the list; each suspect pair is measured
again ALONE (every other rank waits at the barriers) `retests` times, which tells a bad link
from contention with the round's other pairs, and judge with the re-tests gives the
verdict. The schedule and the verdict are analyse/pairs.py's, a layer above this one: the
harness hands them over (harness.pairs).

Rows (rank 0): one per (pair, repeat) and one per re-test (`retest` true), with both ends'
names, ranks and hosts, `round`, `pairs_repeat`, lat_us, bw_gbps and the time_us_* of the
bandwidth size; the verdict, the matrix CSV and the lines said go to harness.keep.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

import numpy as np

from commbench.core.errors import UsageError
from commbench.core.stats import summarize_us

from .base import Benchmark, Param, Point, register

MODES = ("node", "rank", "rail")
# Untimed exchanges before each timed loop: the first ones pay connection set-up (TCP, shared
# memory segments), which is not the link.
WARMUP_ITERS = 2


# --- members and the checks on them (pure) ------------------------------------------------

def lanes_of(mode: str, nodes: list) -> list[list[int]]:
    """The ranks that measure, as lanes of equal length n: member i of every lane is node
    i's rank (node mode: its lowest; rail mode: its local index = the lane), or rank i (rank
    mode). A scheduled pair (i, j) runs on every lane at once. nodes: node of each rank."""
    if mode == "rank":
        return [list(range(len(nodes)))]
    order = list(dict.fromkeys(nodes))
    by_node = [[r for r, nd in enumerate(nodes) if nd == node] for node in order]
    if mode == "node":
        return [[ranks[0] for ranks in by_node]]
    depth = min(len(ranks) for ranks in by_node)  # a rail needs a rank on every node
    return [[ranks[i] for ranks in by_node] for i in range(depth)]


def member_names(mode: str, lanes: list[list[int]], hosts: list[str], nodes: list) -> list[list[str]]:
    """How rows and the verdict name each member: its host in node mode (node<k> where
    --ranks-per-node puts several nodes on one host), r<rank> in rank mode, <node>/<i> in
    rail mode."""
    order = list(dict.fromkeys(nodes))
    node_hosts = {node: {h for h, nd in zip(hosts, nodes) if nd == node} for node in order}
    unique = all(len(hs) == 1 for hs in node_hosts.values()) and \
        len({next(iter(hs)) for hs in node_hosts.values()}) == len(order)

    def node_name(rank):
        return hosts[rank] if unique else f"node{order.index(nodes[rank])}"
    if mode == "rank":
        return [[f"r{r}" for r in lane] for lane in lanes]
    if mode == "node":
        return [[node_name(r) for r in lane] for lane in lanes]
    return [[f"{node_name(r)}/{i}" for r in lane] for i, lane in enumerate(lanes)]


def _values(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def refusal_for(params: dict, world: int, node_count: int | None) -> str | None:
    """Why a pairs point cannot run on `world` ranks over `node_count` nodes (None: not
    known yet, asked again once hostnames group the ranks); None when it can."""
    mode, k = params.get("mode", "node"), int(params.get("partners", 0))
    if mode == "rank":
        n, unit = world, "ranks"
    elif node_count is None:
        return None
    else:
        n, unit = node_count, "nodes"
        if n < 2:
            return f"pairs mode={mode} needs at least 2 nodes (hosts, or --ranks-per-node)"
    if k > n - 1:
        return (f"pairs partners={k} is more than the {n - 1} other members of {n} {unit} (mode={mode}): "
                f"give 1 to {n - 1}, or 0 for every pair")
    return None


def schedule(analysis, n: int, params: dict) -> list[list[tuple[int, int]]]:
    """The rounds of disjoint member pairs: every pair (partners 0) or `partners` seeded
    partners per member."""
    k = int(params.get("partners", 0))
    return analysis.partner_rounds(n, k, int(params.get("seed", 0))) if k else analysis.round_robin(n)


def pair_figures(times_a, times_b, nbytes: int) -> tuple[np.ndarray, float]:
    """A pair's per-iteration seconds (the slower end's, iteration by iteration) and the
    p50 of them, in microseconds."""
    t = np.maximum(np.asarray(times_a, dtype=np.float64), np.asarray(times_b, dtype=np.float64))
    return t, float(np.median(t)) * 1e6


def judge_input(rows: list[dict]) -> tuple[list[dict], dict]:
    """judge()'s arguments from the rows: one entry per pair with its bw_gbps and lat_us
    per repeat, and the re-tests' bw_gbps per pair."""
    pairs, retests = {}, {}
    for r in rows:
        key = (r["pair_a"], r["pair_b"])
        if r.get("retest"):
            retests.setdefault(key, []).append(r["bw_gbps"])
        else:
            e = pairs.setdefault(key, {"a": key[0], "b": key[1], "bw_gbps": [], "lat_us": []})
            e["bw_gbps"].append(r["bw_gbps"])
            e["lat_us"].append(r["lat_us"])
    return list(pairs.values()), retests


def jsonable(x):
    """The verdict as JSON keeps it: tuples as lists, a pair as a dict key as "a-b"."""
    if isinstance(x, dict):
        return {("-".join(map(str, k)) if isinstance(k, tuple) else str(k)): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


# --- the benchmark -------------------------------------------------------------------------

@dataclass
class PairsBufs:
    send: object
    recv: object
    lat_count: int
    bw_count: int
    lanes: list
    names: list
    hosts: list
    rounds: list


@register
class Pairs(Benchmark):
    """Every pair of nodes, ranks or rails, bidirectional send/recv, round by round."""

    name = "pairs"
    sized = False
    min_world = 2
    whole_world_only = True
    view = "pairs"  # report/pairs_view.py: the verdict first, the pairs from the lowest, the matrix
    collective_rows = False  # rows of pairs, not of one collective over the world
    formula = "S per direction between the two ends of a pair; bw_gbps = S / p50 of the slower end"
    params = {
        "mode": Param("node", "node: one rank per node measures; rank: every rank; rail: local index i of every "
                      "node with local index i of the others (GPUs)", str, choices=MODES),
        "lat_nbytes": Param(8, "the latency size (bytes)", int, minimum=1),
        "bw_nbytes": Param(4 << 20, "the bandwidth size (bytes)", int, minimum=1),
        "repeats": Param(3, "times every round is run", int, minimum=1),
        "partners": Param(0, "seeded partners per member (0: every pair)", int, minimum=0),
        "seed": Param(0, "the seed of the partners", int, minimum=0),
        "retests": Param(3, "times each suspect pair is measured again alone", int, minimum=0),
        "iters": Param(20, "timed exchanges per pair and size", int, minimum=1),
    }

    def describe(self, params):
        return " ".join(f"{k}={params[k]}" for k in ("mode", "partners") if k in params)

    def refusal(self, backend, device, params):
        if "rail" in _values(params.get("mode", "node")) and device != "cuda":
            return (f"pairs mode=rail pairs GPU i of every node with GPU i of the others: it needs GPUs "
                    f"(--device cuda), got device {device}")
        return None

    def nodes_refusal(self, point: Point, node_count: int | None) -> str | None:
        return refusal_for(point.params, point.world, node_count)

    def validate(self, point):
        why = refusal_for(point.params, point.world, None)  # rank mode: the world is the member count
        if why:
            raise UsageError(why)

    def memory_nbytes(self, point):
        return 2 * max(point.params["lat_nbytes"], point.params["bw_nbytes"])

    def max_count(self, point):
        return max(point.params["lat_nbytes"], point.params["bw_nbytes"])

    def plan_nbytes(self, point):
        return point.params["bw_nbytes"]

    def busbw_factor(self, world):
        return 1.0

    def tier_nbytes(self, row, world, domains, inswitch):
        """A pair's bytes ride one link: scale-up when both ends share a domain."""
        n = float(row.get("nbytes") or 0)
        a, b = row.get("rank_a"), row.get("rank_b")
        if not isinstance(a, int) or not isinstance(b, int) or max(a, b) >= len(domains):
            return super().tier_nbytes(row, world, domains, inswitch)
        return (n, 0.0) if domains[a] == domains[b] else (0.0, n)

    def setup(self, comm, point):
        p = point.params
        hosts = comm.allgather_obj(socket.gethostname())
        nodes = list(getattr(comm, "node_of_rank", None) or [0] * comm.size)[:comm.size]
        why = refusal_for(p, comm.size, len(set(nodes)))
        if why:  # the run refused it at the start already; a plug-in caller may not have
            raise UsageError(why)
        lanes = lanes_of(p["mode"], nodes)
        nbytes = max(p["lat_nbytes"], p["bw_nbytes"])
        return PairsBufs(comm.alloc(nbytes, "uint8"), comm.alloc(nbytes, "uint8"), p["lat_nbytes"], p["bw_nbytes"],
                         lanes, member_names(p["mode"], lanes, hosts, nodes), hosts, [])

    def fill(self, comm, b):
        comm.fill(b.send, (np.arange(b.send.shape[0]) * 7 + comm.rank * 13) % 251)

    def _peer(self, comm, b, pairs, lanes=None) -> int | None:
        for li in lanes if lanes is not None else range(len(b.lanes)):
            lane = b.lanes[li]
            for i, j in pairs:
                if lane[i] == comm.rank:
                    return lane[j]
                if lane[j] == comm.rank:
                    return lane[i]
        return None

    def op(self, comm, b):
        """One exchange at bw_nbytes between members 0 and 1 of every lane (--check, before
        the schedule is made); the other ranks do nothing."""
        peer = self._peer(comm, b, [(0, 1)])
        if peer is None:
            return lambda: None
        return comm.send_recv(b.send[:b.bw_count], b.recv[:b.bw_count], peer)

    def check(self, comm, b):
        peer = self._peer(comm, b, [(0, 1)])
        if peer is None:
            return True
        want = (np.arange(b.bw_count) * 7 + peer * 13) % 251
        return bool(np.array_equal(comm.to_numpy(b.recv[:b.bw_count]), want))

    def _exchange(self, harness, comm, b, peer, count, iters):
        op = harness.pair_op(comm.send_recv(b.send[:count], b.recv[:count], peer), comm.rank, peer)
        comm.time_ops(op, WARMUP_ITERS)
        return comm.time_ops(op, iters)

    def _round(self, harness, comm, b, pairs, iters, lanes=None) -> list:
        """One round: every rank at both idle barriers and the gather, the members with a
        partner timing their exchanges in between. Every rank's (lat, bw) seconds, or None."""
        peer = self._peer(comm, b, pairs, lanes)
        comm.idle_barrier()
        mine = None
        if peer is not None:
            mine = (self._exchange(harness, comm, b, peer, b.lat_count, iters),
                    self._exchange(harness, comm, b, peer, b.bw_count, iters))
        comm.idle_barrier()
        return comm.allgather_obj(mine)

    def _rows(self, comm, b, pairs, got, lanes, extra: dict) -> list[dict]:
        rows = []
        for li in lanes:
            lane, names = b.lanes[li], b.names[li]
            for i, j in pairs:
                ra, rb = lane[i], lane[j]
                if got[ra] is None or got[rb] is None:
                    continue
                _, lat_us = pair_figures(got[ra][0], got[rb][0], b.lat_count)
                bw_t, bw_us = pair_figures(got[ra][1], got[rb][1], b.bw_count)
                bw = b.bw_count / (bw_us * 1e-6) / 1e9 if bw_us > 0 else 0.0
                # The stage names the row within its point (the key with point_key: compare
                # and the duplicate check read it), so two runs compare pair by pair.
                again = f"re-test {extra['pairs_repeat']}" if extra["retest"] else f"repeat {extra['pairs_repeat']}"
                rows.append({"stage": f"{names[i]}-{names[j]} {again}", "pair_a": names[i], "pair_b": names[j], "rank_a": ra, "rank_b": rb,
                             "host_a": b.hosts[ra], "host_b": b.hosts[rb], "lane": li, **extra,
                             "lat_us": lat_us, "bw_gbps": bw, "lat_nbytes": b.lat_count, "bw_nbytes": b.bw_count,
                             "nbytes": b.bw_count, "iters": len(bw_t), "warmup": WARMUP_ITERS,
                             "timing": "back_to_back", "clock": comm.timing_method, **summarize_us(bw_t),
                             "algbw_gbps": bw, "busbw_gbps": bw, "busbw_factor": 1.0})
        return rows

    def measure(self, harness, comm, point, b):
        p, analysis = point.params, harness.pairs
        tag = harness.pair_tags  # the test hook's delays (run/plant.py), said in every row of a planted run
        n = len(b.lanes[0])
        b.rounds = schedule(analysis, n, p)
        lanes = range(len(b.lanes))
        rows = []
        for rep in range(1, p["repeats"] + 1):
            for r, pairs in enumerate(b.rounds, 1):
                harness.arm(f"round {r} of {len(b.rounds)}, repeat {rep}")
                got = self._round(harness, comm, b, pairs, p["iters"])
                if comm.rank == 0:
                    rows += self._rows(comm, b, pairs, got, lanes,
                                       {"round": r, "pairs_repeat": rep, "retest": False, **tag})
        harness.arm("judging the matrix for suspects")
        # Rail mode pairs each rail's members among themselves: those are the pairs there are.
        possible = len(b.lanes) * n * (n - 1) // 2
        first = analysis.judge(judge_input(rows)[0], None, possible) if comm.rank == 0 else None
        suspects = comm.allgather_obj([tuple(s) for s in first["suspects"]] if first else None)[0]
        index = {name: (li, i) for li, names in enumerate(b.names) for i, name in enumerate(names)}
        for a, bb in suspects if p["retests"] else []:
            (li, i), (_, j) = index[a], index[bb]  # a pair is of one lane
            i, j = min(i, j), max(i, j)  # named in the rows' order, as in the rounds
            for t in range(1, p["retests"] + 1):
                harness.arm(f"re-test {t} of {a}-{bb}")
                got = self._round(harness, comm, b, [(i, j)], p["iters"], lanes=[li])
                if comm.rank == 0:
                    rows += self._rows(comm, b, [(i, j)], got, [li],
                                       {"round": 0, "pairs_repeat": t, "retest": True, **tag})
        if comm.rank == 0:
            self._conclude(harness, analysis, b, rows, first, possible, p)
        return rows

    def _conclude(self, harness, analysis, b, rows, first, possible, p) -> None:
        """The verdict (judge with the re-tests), the matrix and the lines rank 0 says."""
        pairs, retests = judge_input(rows)
        verdict = analysis.judge(pairs, retests, possible) if p["retests"] else first
        names = [name for lane in b.names for name in lane]
        lines = [f"pairs verdict: {verdict['line']}", *(f"  {x}" for x in verdict.get("lines") or [])]
        if p.get("partners"):
            lines.append(f"pairs coverage: {p['partners']} partners per member, {len(pairs)} of {possible} pairs "
                         f"({100 * len(pairs) / possible:.3g} %)")
        harness.keep(files={"pairs_matrix.csv": analysis.matrix_csv(pairs, names)},
                     meta={"pairs_verdict": jsonable(verdict)}, lines=lines)
