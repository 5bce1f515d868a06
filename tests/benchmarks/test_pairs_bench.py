"""The pairs benchmark: members per mode, the refusals (at the launcher and on the ranks),
the planted-pair hook, --dry-run's schedule, and short launches: rank mode on 4 and 3 local
ranks (the full matrix, every pair once per repeat, the CSV, the verdict) and a planted slow
pair that --fail-on-outlier names."""
from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import Counter, deque
from types import SimpleNamespace

import numpy as np
import pytest

from commbench import cli
from commbench.analyse import pairs as pairs_analysis
from commbench.benchmarks import get
from commbench.benchmarks.base import Point
from commbench.benchmarks.pairs import (
    jsonable,
    judge_input,
    lanes_of,
    member_names,
    pair_figures,
    refusal_for,
)
from commbench.core.errors import UsageError
from commbench.run import pairs_plan, plant
from commbench.run import plan as plan_mod
from commbench.run import spec as spec_mod
from commbench.run import suite as suite_mod
from conftest import needs_mpi, run_cli

SMALL = ["--param", "pairs.bw_nbytes=65536", "--param", "pairs.iters=5", "--param", "pairs.repeats=2",
         "--param", "pairs.retests=1"]


def _params(**kw):
    return {**{k: p.default for k, p in get("pairs").params.items()}, **kw}


# --- members -------------------------------------------------------------------------------

def test_lanes_per_mode():
    nodes = [0, 0, 1, 1, 2, 2]
    assert lanes_of("rank", nodes) == [[0, 1, 2, 3, 4, 5]]
    assert lanes_of("node", nodes) == [[0, 2, 4]]  # the lowest rank of each node; the others wait
    assert lanes_of("rail", nodes) == [[0, 2, 4], [1, 3, 5]]  # local index i with local index i
    assert lanes_of("rail", [0, 0, 1]) == [[0, 2]]  # a rail needs a rank on every node


def test_member_names_by_host_or_grouping():
    lanes = lanes_of("node", [0, 1])
    assert member_names("node", lanes, ["h1", "h2"], [0, 1]) == [["h1", "h2"]]
    # --ranks-per-node puts two nodes on one host: named by their index, not twice "vm"
    assert member_names("node", lanes_of("node", [0, 0, 1, 1]), ["vm"] * 4, [0, 0, 1, 1]) == [["node0", "node1"]]
    assert member_names("rank", [[0, 1, 2]], ["vm"] * 3, [0, 0, 0]) == [["r0", "r1", "r2"]]
    assert member_names("rail", lanes_of("rail", [0, 0, 1, 1]), ["a", "a", "b", "b"],
                        [0, 0, 1, 1]) == [["a/0", "b/0"], ["a/1", "b/1"]]


# --- refusals ------------------------------------------------------------------------------

def test_refusal_for_nodes_and_partners():
    assert refusal_for(_params(mode="node"), 4, 1) == \
        "pairs mode=node needs at least 2 nodes (hosts, or --ranks-per-node)"
    assert refusal_for(_params(mode="node"), 4, None) is None  # not known until hostnames group the ranks
    assert refusal_for(_params(mode="node"), 4, 2) is None
    assert "partners=4 is more than the 3 other members of 4 ranks" in refusal_for(_params(mode="rank", partners=4), 4, 1)
    assert refusal_for(_params(mode="rank", partners=3), 4, 1) is None
    assert "partners=2 is more than the 1 other members of 2 nodes" in refusal_for(_params(partners=2), 4, 2)


def test_rail_refused_without_gpus():
    bench = get("pairs")
    assert "needs GPUs (--device cuda)" in bench.refusal("mpi", "cpu", {"mode": "rail"})
    assert "needs GPUs" in bench.refusal("gloo", "cpu", {"mode": ["node", "rail"]})  # a sweep that holds it
    assert bench.refusal("nccl", "cuda", {"mode": "rail"}) is None
    assert bench.refusal("mpi", "cpu", {"mode": "rank"}) is None


def test_launch_nodes_and_check_nodes():
    assert spec_mod.launch_nodes(4, 4, None) == 1  # --np alone: every rank on this host
    assert spec_mod.launch_nodes(5, 5, 2) == 3
    assert spec_mod.launch_nodes(None, 8, None) is None  # mpirun/srun: the hostnames tell
    p = Point("pairs", 4, "float32", 0, _params())
    with pytest.raises(UsageError, match="needs at least 2 nodes"):
        spec_mod.check_nodes([p], 1)
    with pytest.raises(UsageError, match="needs at least 2 nodes"):
        spec_mod.check_nodes([p], [0, 0, 0, 0])  # on the ranks: the node of each rank
    spec_mod.check_nodes([p], [0, 0, 1, 1])
    spec_mod.check_nodes([p], None)


def test_sweep_measures_the_whole_launch_only():
    cfg = spec_mod.checked_config({"benchmarks": ["pairs"]}, {}, ["pairs.mode=rank"])
    points, _ = suite_mod.expand(cfg, 8, ("float32",))
    assert [p.world for p in points] == [8]  # not 2 and 4 too: a part of the matrix is not the matrix


@pytest.mark.parametrize("argv, says", [
    (["--np", "4"], "pairs mode=node needs at least 2 nodes (hosts, or --ranks-per-node)"),
    (["--np", "4", "--pairs-mode", "rank", "--partners", "4"], "partners=4 is more than the 3 other members"),
    (["--np", "4", "--ranks-per-node", "2", "--param", "pairs.partners=2"], "partners=2 is more than the 1"),
    (["--np", "2", "--param", "pairs.mode=rail"], "pairs mode=rail pairs GPU i of every node"),
    (["--np", "2", "-b", "all_reduce", "--partners", "1"], "--partners and --pairs-mode set the pairs benchmark's"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, argv, says):
    out = tmp_path / "run"
    bench = [] if "-b" in argv else ["-b", "pairs"]
    rc = cli.main(["run", *bench, "--backend", "mpi", "--out", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("commbench: error: ") and says in err[0], err
    assert not out.exists()


def test_dry_run_prints_rounds_pairs_and_time(tmp_path, capsys):
    rc = cli.main(["run", "pairs", "--backend", "mpi", "--np", "4", "--pairs-mode", "rank", "--dry-run",
                   "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "run").exists()
    assert "4 ranks, 3 rounds, 6 pairs (every pair), 3 repeats" in out
    assert "  round 1: r0-r3 r1-r2" in out and "  round 3: r0-r1 r2-r3" in out
    assert "expected: about" in out


def test_dry_run_of_a_large_schedule_shows_a_few_and_counts(capsys):
    p = Point("pairs", 1024, "float32", 0, _params())
    lines = pairs_plan.dry_run_lines([p], 1024)
    assert "1024 nodes, 1023 rounds, 523776 pairs (every pair)" in lines[0]
    assert sum(x.startswith("  round ") for x in lines) == pairs_plan.SHOWN_ROUNDS
    assert lines[1].endswith(f"and {512 - pairs_plan.SHOWN_PAIRS} more")
    assert any("and 1019 more rounds" in x for x in lines)
    k = pairs_plan.dry_run_lines([Point("pairs", 1024, "float32", 0, _params(partners=4))], 1024)
    assert "4 partners per member" in k[0] and "coverage 0.391 %" in k[0]


def test_plan_time_of_a_pairs_point_is_its_schedules():
    p = Point("pairs", 4, "float32", 0, _params(mode="rank"))
    rows = pairs_plan.with_pairs_times([{"point": p, "est_s": 0.0}], None)
    want = pairs_plan.expected_s(p, pairs_analysis.round_robin(4))
    assert want > 0 and rows[0]["est_s"] == pytest.approx(want + plan_mod.PLAN_SETUP_S)
    node = Point("pairs", 4, "float32", 0, _params())
    assert pairs_plan.with_pairs_times([{"point": node, "est_s": 1.5}], None)[0]["est_s"] == 1.5  # nodes unknown


# --- the pure parts of measure --------------------------------------------------------------

def test_pair_time_is_the_slower_end_per_iteration():
    t, p50_us = pair_figures([1e-6, 5e-6, 2e-6], [3e-6, 1e-6, 2e-6], 8)
    assert list(t) == [3e-6, 5e-6, 2e-6] and p50_us == pytest.approx(3.0)


def test_judge_input_and_the_verdict_as_json():
    rows = [{"pair_a": "r0", "pair_b": "r1", "bw_gbps": 1.0, "lat_us": 2.0, "retest": False},
            {"pair_a": "r0", "pair_b": "r1", "bw_gbps": 3.0, "lat_us": 4.0, "retest": False},
            {"pair_a": "r0", "pair_b": "r1", "bw_gbps": 5.0, "lat_us": 1.0, "retest": True}]
    pairs, retests = judge_input(rows)
    assert pairs == [{"a": "r0", "b": "r1", "bw_gbps": [1.0, 3.0], "lat_us": [2.0, 4.0]}]
    assert retests == {("r0", "r1"): [5.0]}
    assert json.loads(json.dumps(jsonable({"slow_links": [("a", "b")], "x": {("a", "b"): 1}}))) == \
        {"slow_links": [["a", "b"]], "x": {"a-b": 1}}


def test_planted_pair_hook(monkeypatch):
    for name in (plant.PAIR_ENV, plant.PAIR_DELAY_ENV, plant.PAIRS_BASE_ENV):
        monkeypatch.delenv(name, raising=False)
    assert plant.pair_setting() is None and plant.pair_tags() == {}
    op = lambda: None  # noqa: E731
    assert plant.pair_op(op, 0, 1) is op  # unset: nothing wrapped
    for bad in ("1", "1-1", "a-b", "1-2-3"):
        with pytest.raises(UsageError, match=plant.PAIR_ENV):
            plant.pair_setting({plant.PAIR_ENV: bad})
    with pytest.raises(UsageError, match=plant.PAIR_DELAY_ENV):
        plant.pair_setting({plant.PAIR_ENV: "0-1", plant.PAIR_DELAY_ENV: "-5"})
    with pytest.raises(UsageError, match=plant.PAIRS_BASE_ENV):
        plant.setting({plant.PAIRS_BASE_ENV: "nan"})  # refused with the point hook, before any rank starts
    monkeypatch.setenv(plant.PAIR_ENV, "2-0")
    monkeypatch.setenv(plant.PAIR_DELAY_ENV, "50")
    assert plant.pair_op(op, 0, 1) is op and plant.pair_op(op, 1, 2) is op
    assert plant.pair_op(op, 0, 2) is not op and plant.pair_op(op, 2, 0) is not op
    assert plant.pair_tags() == {"planted_pair": "0-2"}
    monkeypatch.setenv(plant.PAIRS_BASE_ENV, "20")
    assert plant.pair_op(op, 0, 1) is not op  # the base slows every pair
    assert plant.pair_tags() == {"planted_pair": "0-2", "planted_base_us": 20.0}


def test_fail_on_outlier_reads_the_verdicts(tmp_path, capsys):
    (tmp_path / "meta.json").write_text(json.dumps({"pairs_verdicts": [
        {"line": "no outlier: ...", "slow_nodes": [], "slow_links": [], "outlier": False},
        {"line": "link h2-h6: 0.31x the median", "slow_nodes": [], "slow_links": [["h2", "h6"]], "outlier": True}]}))
    assert pairs_plan.fail_on_outlier(0, tmp_path) == 1
    assert "--fail-on-outlier: link h2-h6" in capsys.readouterr().err
    assert pairs_plan.fail_on_outlier(2, tmp_path) == 2  # a failed run keeps its own status
    (tmp_path / "meta.json").write_text(json.dumps({"pairs_verdicts": [{"line": "no outlier", "outlier": False}]}))
    assert pairs_plan.fail_on_outlier(0, tmp_path) == 0


# --- launches ---------------------------------------------------------------------------------

def _rows(out):
    return [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]


def _check_schedule(rows, n, repeats):
    """Every pair of n members in exactly one round of each repeat, rounds of disjoint pairs,
    a pair in the same round each repeat."""
    first = [r for r in rows if not r["retest"]]
    per = Counter((r["pair_a"], r["pair_b"], r["pairs_repeat"]) for r in first)
    assert len({(a, b) for a, b, _ in per}) == n * (n - 1) // 2
    assert set(per.values()) == {1} and len(per) == repeats * n * (n - 1) // 2
    for rep in range(1, repeats + 1):
        for rnd in {r["round"] for r in first}:
            ends = [x for r in first if r["pairs_repeat"] == rep and r["round"] == rnd for x in (r["rank_a"], r["rank_b"])]
            assert len(ends) == len(set(ends))  # disjoint
    rounds = {}
    for r in first:
        rounds.setdefault((r["pair_a"], r["pair_b"]), set()).add(r["round"])
    assert all(len(v) == 1 for v in rounds.values())


@needs_mpi
@pytest.mark.multirank
def test_rank_mode_on_4_ranks_gives_the_full_matrix(tmp_path):
    out = tmp_path / "run"
    p = run_cli("run", "pairs", "--backend", "mpi", "--np", "4", "--param", "pairs.mode=rank", *SMALL,
                "--out", out, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = _rows(out)
    _check_schedule(rows, 4, 2)
    assert {r["round"] for r in rows if not r["retest"]} == {1, 2, 3}
    r = rows[0]
    assert r["benchmark"] == "pairs" and r["host_a"] and r["host_b"] and r["lat_us"] > 0 and r["bw_gbps"] > 0
    assert r["time_us_p50"] == pytest.approx(65536 / (r["bw_gbps"] * 1e9) * 1e6)
    assert {x["check"] for x in rows} == {"ok"}  # the suite checks one exchange's data first
    assert len({x["stage"] for x in rows}) == len(rows)  # (point_key, stage) names each row: compare reads it
    csv_lines = (out / "pairs_matrix.csv").read_text().splitlines()
    assert csv_lines[0] == "node,r0,r1,r2,r3" and len(csv_lines) == 5
    assert all(len(x.split(",")) == 5 for x in csv_lines)
    verdict = json.loads((out / "meta.json").read_text())["pairs_verdict"]
    assert f"pairs verdict: {verdict['line']}" in p.stdout


@pytest.mark.slow  # a launch whose plumbing the in-process tests cover: make test-slow
@needs_mpi
@pytest.mark.multirank
def test_odd_members_take_a_bye(tmp_path):
    out = tmp_path / "run"
    p = run_cli("run", "-b", "pairs", "--backend", "mpi", "--np", "3", "--pairs-mode", "rank", *SMALL,
                "--param", "pairs.retests=0", "--out", out, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = _rows(out)
    _check_schedule(rows, 3, 2)
    assert {r["round"] for r in rows} == {1, 2, 3}  # 3 rounds of one pair: one member idle each round
    assert "pairs verdict: " in p.stdout


@needs_mpi
@pytest.mark.multirank
def test_fail_on_outlier_names_a_planted_slow_pair(tmp_path):
    out = tmp_path / "run"
    # Every exchange sleeps 2 ms first (a base rate, as a shaped link between namespace hosts
    # sets one), ranks 0 and 1 8 ms more: the sleeping ranks leave the 2 cores to the others,
    # so the healthy pairs agree within about 1 % whatever else the host runs. Without the
    # base, 4 ranks polling on 2 cores made healthy pairs differ up to 2x, and that spread
    # (the MAD) hid the planted pair in 1 run of 8 to 3 of 10.
    env = {plant.PAIRS_BASE_ENV: "2000", plant.PAIR_ENV: "0-1", plant.PAIR_DELAY_ENV: "8000"}
    steady = [*SMALL, "--param", "pairs.iters=10", "--param", "pairs.repeats=3", "--param", "pairs.retests=2"]
    p = run_cli("run", "-b", "pairs", "--backend", "mpi", "--np", "4", "--pairs-mode", "rank", *steady,
                "--fail-on-outlier", "--out", out, env=env, timeout=240)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    said = [x for x in p.stderr.splitlines() if "--fail-on-outlier" in x]
    assert said and "r0-r1" in said[0], p.stderr[-2000:]
    verdict = json.loads((out / "meta.json").read_text())["pairs_verdict"]
    assert verdict["outlier"] and verdict["slow_nodes"] == []
    assert all(r.get("planted_pair") == "0-1" and r.get("planted_base_us") == 2000 for r in _rows(out))
    # the suspect was measured again alone
    assert any(r["retest"] and {r["rank_a"], r["rank_b"]} == {0, 1} for r in _rows(out))


@needs_mpi
@pytest.mark.multirank
def test_one_node_under_mpirun_refused_by_rank_0_before_measuring(tmp_path):
    from commbench.run.launcher import local_mpi_env, mpirun_command

    out = tmp_path / "run"
    cmd = mpirun_command(2, ["run", "-b", "pairs", "--backend", "mpi", "--out", str(out)])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=local_mpi_env(dict(os.environ)))
    assert p.returncode != 0
    said = [x for x in p.stderr.splitlines() if x.startswith("commbench: error:")]
    assert said == ["commbench: error: pairs mode=node needs at least 2 nodes (hosts, or --ranks-per-node)"]
    assert not (out / "rows.jsonl").exists() and not (out / "meta.json").exists()


# --- measure() on ranks as threads ------------------------------------------------------------
# A fake world whose ranks are threads: send/recv through queues, barriers and allgather
# through one threading.Barrier (a rank that calls a collective the others do not hangs it
# until the barrier's timeout fails the test), time_ops giving each pair a known time.

class _World:
    def __init__(self, nodes, slow=frozenset(), slow_s=1e-3):
        self.n, self.nodes, self.slow, self.slow_s = len(nodes), nodes, slow, slow_s
        self.bar = threading.Barrier(self.n, timeout=20)
        self.slots = [None] * self.n
        self.box, self.cv = {}, threading.Condition()
        self.calls = [[] for _ in nodes]
        self.peers = [set() for _ in nodes]


class _Comm:
    backend, device, timing_method = "fake", "cpu", "host_clock"

    def __init__(self, world, rank):
        self.w, self.rank, self.size, self.node_of_rank = world, rank, world.n, list(world.nodes)

    def alloc(self, count, dtype):
        return np.zeros(count, np.uint8)

    def fill(self, buf, values):
        buf[...] = values

    def to_numpy(self, buf):
        return np.array(buf, dtype=np.float64)

    def idle_barrier(self):
        self.w.calls[self.rank].append("barrier")
        self.w.bar.wait()

    def allgather_obj(self, obj):
        self.w.calls[self.rank].append("allgather")
        self.w.slots[self.rank] = obj
        self.w.bar.wait()
        out = list(self.w.slots)
        self.w.bar.wait()
        return out

    def send_recv(self, send, recv, peer):
        w, me = self.w, self.rank

        def op():
            with w.cv:
                w.box.setdefault((me, peer), deque()).append(np.array(send))
                w.cv.notify_all()
                assert w.cv.wait_for(lambda: w.box.get((peer, me)), timeout=20)
                recv[...] = w.box[(peer, me)].popleft()
        op.peer = peer
        return op

    def time_ops(self, op, iters, barrier_each=False):
        self.w.peers[self.rank].add(op.peer)
        for _ in range(iters):
            op()
        slow = frozenset((self.rank, op.peer)) == self.w.slow
        return np.full(iters, self.w.slow_s if slow else 1e-5)


def _measure(nodes, mode, slow=frozenset(), **kw):
    world = _World(nodes, slow)
    bench, kept = get("pairs"), {}
    point = Point("pairs", len(nodes), "float32", 0, _params(mode=mode, bw_nbytes=64, iters=3, repeats=2, **kw))
    harness = SimpleNamespace(pairs=pairs_analysis, pair_tags={}, pair_op=lambda op, rank, peer: op,
                              arm=lambda *a, **k: None, keep=lambda **k: kept.update(k))
    rows, errors = {}, []

    def rank_main(r):
        try:
            comm = _Comm(world, r)
            b = bench.setup(comm, point)
            bench.fill(comm, b)
            bench.op(comm, b)()
            assert bench.check(comm, b)
            rows[r] = bench.measure(harness, comm, point, b)
        except BaseException as e:  # noqa: BLE001 (said by the test)
            errors.append(e)
            world.bar.abort()
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(c == world.calls[0] for c in world.calls)  # every rank: the same collectives, as often
    return rows[0], kept, world


def test_node_mode_measures_one_rank_a_node_the_others_wait():
    rows, kept, world = _measure([0, 0, 1, 1, 2, 2, 3, 3], "node")
    _check_schedule(rows, 4, 2)
    assert {r["pair_a"] for r in rows} | {r["pair_b"] for r in rows} == {"node0", "node1", "node2", "node3"}
    assert {x for r in rows for x in (r["rank_a"], r["rank_b"])} == {0, 2, 4, 6}
    assert not any(world.peers[r] for r in (1, 3, 5, 7))  # the node's other ranks never exchanged
    assert kept["meta"]["pairs_verdict"]["line"].startswith("no outlier")
    assert kept["files"]["pairs_matrix.csv"].splitlines()[0] == "node,node0,node1,node2,node3"


def test_rail_mode_runs_every_rail_in_the_same_rounds():
    rows, _, world = _measure([0, 0, 1, 1, 2, 2], "rail")
    assert len(rows) == 2 * 2 * 3  # 2 rails x 2 repeats x 3 pairs
    assert {(r["pair_a"], r["pair_b"]) for r in rows if r["lane"] == 1} == \
        {("node0/1", "node1/1"), ("node0/1", "node2/1"), ("node1/1", "node2/1")}
    assert all(world.peers[r] <= {1, 3, 5} for r in (1, 3, 5))  # local index 1 meets local index 1 only
    by_round = {(r["pair_a"].split("/")[0], r["pair_b"].split("/")[0]): set() for r in rows}
    for r in rows:
        by_round[(r["pair_a"].split("/")[0], r["pair_b"].split("/")[0])].add(r["round"])
    assert all(len(v) == 1 for v in by_round.values())  # both rails of a node pair in one round


def test_a_slow_pair_is_retested_alone_and_named():
    rows, kept, _ = _measure(list(range(5)), "rank", slow=frozenset((1, 3)), retests=2)
    again = [r for r in rows if r["retest"]]
    assert [(r["pair_a"], r["pair_b"]) for r in again] == [("r1", "r3")] * 2
    verdict = kept["meta"]["pairs_verdict"]
    assert verdict["slow_links"] == [["r1", "r3"]] and verdict["slow_nodes"] == []
    assert any(x.startswith("pairs verdict: link r1-r3") for x in kept["lines"])
    slow = [r for r in rows if {r["rank_a"], r["rank_b"]} == {1, 3}]
    assert all(r["bw_gbps"] == pytest.approx(64 / 1e-3 / 1e9) for r in slow)  # bw_nbytes / the slower end's p50


def test_partners_cover_a_part_and_say_so():
    rows, kept, _ = _measure(list(range(6)), "rank", partners=2)
    measured = {(r["pair_a"], r["pair_b"]) for r in rows if not r["retest"]}
    assert len(measured) < 15
    assert any(x.startswith("pairs coverage: 2 partners per member") for x in kept["lines"])
