"""The moe dispatchers: the registry and its names, the params a dispatcher fixes on the
point, where each cannot run (skipped, recorded, reported), the host dispatchers
mpi-alltoallv and allgather against the exact check (in-process over a threaded world, and
once through a real mpi launch), and a dispatcher a user registers from a module."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from commbench.backends.base import Comm, RowsExchange
from commbench.benchmarks.base import Point
from commbench.benchmarks.moe import MoE
from commbench.benchmarks.moe import dispatchers as D
from commbench.benchmarks.moe.allgather import AllGatherHostPath
from commbench.benchmarks.moe.alltoallv import AlltoallvPath
from commbench.benchmarks.moe.host import HEADER, HostPath
from commbench.store.record import RunRecord
from conftest import ROOT, needs_mpi, run_cli, run_meta, run_rows

BUILTIN = ("deepep-normal", "alltoall", "allgather", "hierarchical", "low-latency", "mpi-alltoallw", "mpi-alltoallv")
TINY = ["--param", "moe.tokens=16", "--param", "moe.hidden=256", "--param", "moe.experts=8", "--param", "moe.topk=2"]


def _defaults(**kw) -> dict:
    return {**{k: v.default for k, v in MoE.params.items()}, **kw}


# --- the registry ---------------------------------------------------------------------

def test_the_built_in_dispatchers_are_registered_with_what_they_fix():
    assert set(BUILTIN) <= set(D.DISPATCHERS)
    for name in BUILTIN:
        d = D.DISPATCHERS[name]
        assert d.name == name and d.description and "\n" not in d.description
        assert set(d.serves) <= {"prefill", "decode"} and d.serves
        assert set(d.fixed) <= set(MoE.params), d.fixed
    assert D.DISPATCHERS["alltoall"].fixed["copies"] == "expert"
    assert D.DISPATCHERS["deepep-normal"].fixed["copies"] == "rank"
    assert D.DISPATCHERS["low-latency"].fixed["mode"] == "low_latency"
    assert D.DISPATCHERS["low-latency"].serves == ("decode",)
    assert D.DISPATCHERS["hierarchical"].fixed["path"] == "hierarchical"


def test_register_refuses_a_second_name_and_a_bad_one():
    d = D.DISPATCHERS["alltoall"]
    with pytest.raises(ValueError, match="registered twice"):
        D.register_dispatcher(d)
    with pytest.raises(ValueError, match="serves"):
        D.register_dispatcher(replace(d, name="test-bad-serves", serves=("training",)))
    assert "test-bad-serves" not in D.DISPATCHERS


def test_a_named_dispatcher_sets_its_params_on_the_point():
    b = MoE()
    p = _defaults(copies="rank")
    assert b.canonical_params({**p, "dispatcher": "alltoall"})["copies"] == "expert"
    ll = b.canonical_params({**p, "dispatcher": "low-latency", "capacity": 7})
    assert (ll["copies"], ll["mode"], ll["path"], ll["capacity"]) == ("expert", "low_latency", "flat", 7)
    assert b.canonical_params({**p, "dispatcher": "hierarchical"})["path"] == "hierarchical"
    # The host dispatchers leave copies to the point: both run.
    assert b.canonical_params({**p, "dispatcher": "mpi-alltoallv", "copies": "expert"})["copies"] == "expert"
    assert b.canonical_params(p) == b.canonical_params({**p})  # "" keeps today's choice


def test_an_unknown_dispatcher_is_refused_in_one_line_naming_the_known():
    why = MoE().refusal("mpi", "cpu", {"dispatcher": ["alltoall", "deepep-nomral"]})
    assert why.startswith("moe: unknown dispatcher 'deepep-nomral' (known: deepep-normal, alltoall")
    assert MoE().refusal("mpi", "cpu", {"dispatcher": ["alltoall", "low-latency"]}) is None


class _Where(Comm):
    def __init__(self, backend, device="cpu", nodes=(0, 0)):
        super().__init__(0, len(nodes))
        self.backend, self.device, self.node_of_rank = backend, device, list(nodes)


@pytest.mark.parametrize("name, backend, nodes, why", [
    ("hierarchical", "gloo", (0, 0), "needs ranks on at least 2 nodes"),
    ("hierarchical", "gloo", (0, 1), None),
    ("hierarchical", "mpi", (0, 1), "runs on the device path (gloo, nccl)"),
    ("low-latency", "mpi", (0, 0), "runs on the device path (gloo, nccl)"),
    ("low-latency", "nccl", (0, 0), None),
    ("mpi-alltoallv", "gloo", (0, 0), "runs on mpi"),
    ("mpi-alltoallw", "mpi", (0, 0), None),
    ("allgather", "mpi", (0, 0), None),
    ("alltoall", "jax", (0, 0), None),
])
def test_skip_reasons_follow_backend_and_nodes(name, backend, nodes, why):
    point = Point("moe", len(nodes), "float32", 0, MoE().canonical_params(_defaults(dispatcher=name)))
    got = MoE().skip_reason(_Where(backend, nodes=nodes), point)
    assert (got is None) if why is None else (why in got), got
    assert MoE().skip_reason(_Where(backend, nodes=nodes), Point("moe", 2, "float32", 0, _defaults())) is None


# --- the host dispatchers in one process: a world of threads ------------------------------

class _World:
    def __init__(self, n):
        self.n, self.slots, self.bar = n, [None] * n, threading.Barrier(n, timeout=60)

    def swap(self, rank, obj) -> list:
        self.slots[rank] = obj
        self.bar.wait()
        got = list(self.slots)
        self.bar.wait()
        return got


class _ThreadComm(Comm):
    """What the host paths ask of an mpi comm, between threads: numpy buffers and the
    collectives they call."""

    backend, device = "mpi", "cpu"

    def __init__(self, world, rank):
        super().__init__(rank, world.n)
        self.w, self.node_of_rank, self.packed = world, [0] * world.n, []

    def alloc(self, count, dtype):
        return np.zeros(count, dtype)

    def host_view(self, buf):
        return buf

    def barrier_op(self):
        return lambda: self.w.swap(self.rank, None)

    def max_over_ranks(self, values):
        return np.max(self.w.swap(self.rank, np.array(values, dtype=np.float64)), axis=0)

    def allgather_obj(self, obj):
        return self.w.swap(self.rank, obj)

    def all_gather(self, send, recv):
        def op():
            recv[:] = np.concatenate(self.w.swap(self.rank, send.copy()))
        return op

    def reduce_scatter(self, send, recv):
        def op():
            total = np.sum(self.w.swap(self.rank, send.copy()), axis=0)
            recv[:] = total[self.rank * recv.size:(self.rank + 1) * recv.size]
        return op

    def all_to_all(self, send, recv, send_counts=None, recv_counts=None):
        def op():
            n = self.size
            sc = np.full(n, send.size // n) if send_counts is None else np.asarray(send_counts)
            got = self.w.swap(self.rank, (send.copy(), sc))
            parts = [s[int(c[:self.rank].sum()):int(c[:self.rank + 1].sum())] for s, c in got]
            recv[:sum(p.size for p in parts)] = np.concatenate(parts)
        return op

    def rows_all_to_all(self, *args, packed=False):
        self.packed.append(packed)
        return RowsExchange(self, *args)


def _round_trip(world, params, corrupt=None):
    """Every rank: setup, fill, dispatch + experts + combine, check; (ok per rank, comms, bufs)."""
    w = _World(world)
    comms = [_ThreadComm(w, r) for r in range(world)]
    point = Point("moe", world, "float32", 0, MoE().canonical_params(_defaults(**params)))
    MoE().validate(point)
    out, bufs, errors = [None] * world, [None] * world, []

    def rank(r):
        try:
            b = MoE().setup(comms[r], point)
            MoE().fill(comms[r], b)
            MoE().op(comms[r], b)()
            if corrupt:
                corrupt(r, b)
            bufs[r], out[r] = b, MoE().check(comms[r], b)
        except BaseException as e:  # noqa: BLE001 (reported below, with the rank)
            errors.append((r, e))
            w.bar.abort()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out, comms, bufs


SHAPE = {"tokens": 24, "hidden": 256, "experts": 8, "topk": 3}


@pytest.mark.parametrize("copies", ["rank", "expert"])
@pytest.mark.parametrize("routing", ["uniform", "hot_rank"])
def test_mpi_alltoallv_passes_the_exact_check_and_packs(copies, routing):
    ok, comms, bufs = _round_trip(4, {**SHAPE, "routing": routing, "copies": copies, "dispatcher": "mpi-alltoallv"})
    assert ok == [True] * 4
    assert all(c.packed and all(c.packed) for c in comms)  # every row exchange asked packed
    assert isinstance(D.path_for(comms[0], {"dispatcher": "mpi-alltoallv"}), AlltoallvPath)
    assert type(D.path_for(comms[0], {"dispatcher": "mpi-alltoallw"})) is HostPath


@pytest.mark.parametrize("copies", ["rank", "expert"])
@pytest.mark.parametrize("routing", ["uniform", "hot_rank"])
def test_allgather_passes_the_exact_check(copies, routing):
    ok, comms, bufs = _round_trip(4, {**SHAPE, "routing": routing, "copies": copies, "dispatcher": "allgather"})
    assert ok == [True] * 4
    b = getattr(bufs[0], "steps", [bufs[0]])[0]
    assert isinstance(b.path, AllGatherHostPath) and b.path.dispatch_stages == ("gather", "select")
    # The rows this rank's experts took: as many as the all-to-all paths deliver it.
    assert b.expert_in.shape[0] == b.plan.n_recv


def test_allgather_check_catches_a_wrong_row_and_a_lost_partial():
    def torn_row(r, b):
        if r == 1:
            getattr(b, "steps", [b])[0].expert_in[0, HEADER] ^= 1

    def lost_sum(r, b):
        if r == 2:
            getattr(b, "steps", [b])[0].out[3] = 0

    assert _round_trip(4, {**SHAPE, "copies": "expert", "dispatcher": "allgather"}, torn_row)[0] == \
        [True, False, True, True]
    assert _round_trip(4, {**SHAPE, "copies": "rank", "dispatcher": "allgather"}, lost_sum)[0] == \
        [True, True, False, True]


def test_allgather_counts_algorithmic_and_physical_bytes():
    _, comms, bufs = _round_trip(4, {**SHAPE, "copies": "expert", "dispatcher": "allgather"})
    b = getattr(bufs[0], "steps", [bufs[0]])[0]
    plan, path = b.plan, b.path  # measure asks dispatch's bytes, then combine's
    nodes = np.array([0, 0, 1, 1])
    d = path.accounting(plan, 0, nodes, plan.rb_d)
    c = path.accounting(plan, 0, nodes, plan.rb_c)
    assert d["logical_nbytes"] == plan.n_recv * plan.rb_d  # the routed rows, as the all-to-all counts them
    assert d["remote_nbytes"] == 3 * 24 * (plan.rb_d + 24) == d["sent_logical_nbytes"]
    assert (d["scaleup_nbytes"], d["scaleout_nbytes"]) == (24 * (plan.rb_d + 24), 2 * 24 * (plan.rb_d + 24))
    assert c["remote_nbytes"] == 3 * 24 * 256 * 4 and c["logical_nbytes"] == plan.n_recv * plan.rb_c


# --- skipped points: recorded once, done for a resume ----------------------------------

def test_a_skipped_point_is_recorded_once_and_counts_done(tmp_path):
    rec = RunRecord(tmp_path)
    rec.open_new(["commbench", "run"], suite="moe")
    for _ in range(2):
        rec.point_skipped("default|moe|2|k", "moe", {"dispatcher": "low-latency"}, "runs on the device path")
    meta = RunRecord(tmp_path).read()
    assert meta["skipped_points"] == [{"point_key": "default|moe|2|k", "benchmark": "moe",
                                       "params": {"dispatcher": "low-latency"}, "reason": "runs on the device path"}]
    assert RunRecord(tmp_path).skipped_keys() == set() and rec.skipped_keys() == {"default|moe|2|k"}


# --- through the CLI ------------------------------------------------------------------------

def _doc_plugin(tmp_path) -> dict:
    """docs/plugins.md's dispatcher example as a module, and the environment that loads it."""
    part = (ROOT / "docs" / "plugins.md").read_text().split("## A dispatcher of your own", 1)[1]
    (tmp_path / "my_dispatchers.py").write_text(part.split("```python\n", 1)[1].split("```", 1)[0])
    return {"PYTHONPATH": str(tmp_path), "COMMBENCH_PLUGINS": "my_dispatchers"}


@needs_mpi
@pytest.mark.multirank
def test_host_dispatchers_a_skipped_one_and_a_plug_in_in_one_mpi_run(tmp_path):
    env, out = _doc_plugin(tmp_path), tmp_path / "run"
    r = run_cli("run", "moe", "--backend", "mpi", "--np", 2, *TINY, "--param",
                "moe.dispatcher=mpi-alltoallw,mpi-alltoallv,allgather,low-latency,synced-alltoallw",
                "--check", "--iters", 3, "--warmup", 1, "--out", out, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    skipped = [ln for ln in r.stdout.splitlines() if ln.startswith("skipped:")]
    assert len(skipped) == 1 and "dispatcher=low-latency" in skipped[0] and "world 2" in skipped[0], skipped
    assert skipped[0].endswith(": runs on the device path (gloo, nccl)")
    rows = run_rows(out)
    ran = {(x["params"]["dispatcher"], x["params"]["copies"], x["stage"]) for x in rows}
    assert ran == {(d, c, s) for d in ("mpi-alltoallw", "mpi-alltoallv", "allgather", "synced-alltoallw")
                   for c in ("rank", "expert") for s in ("dispatch", "combine")}
    assert all(x["check"] == "ok" for x in rows)
    by = {(x["params"]["dispatcher"], x["stage"]): x for x in rows if x["params"]["copies"] == "expert"}
    assert "stage_us_gather" in by["allgather", "dispatch"] and "stage_us_reduce_scatter" in by["allgather", "combine"]
    assert "MPI_Alltoallv" in by["mpi-alltoallv", "dispatch"]["pack_method"]
    assert "stage_us_barrier" in by["synced-alltoallw", "dispatch"]
    meta = run_meta(out)
    assert [(s["params"]["dispatcher"], s["reason"]) for s in meta["skipped_points"]] == \
        [("low-latency", "runs on the device path (gloo, nccl)")]
    rep = run_cli("report", out, env=env)
    assert rep.returncode == 0 and \
        "skipped: moe dispatcher=low-latency (1 point): runs on the device path (gloo, nccl)" in rep.stdout
    listed = run_cli("list", env=env).stdout
    assert "synced-alltoallw" in listed and "[prefill]" in listed and "allgather" in listed


@pytest.mark.multirank
def test_an_unknown_dispatcher_ends_in_one_line_before_any_rank(tmp_path):
    r = run_cli("run", "moe", "--np", 2, *TINY, "--param", "moe.dispatcher=alltoall,deepep-nomral", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "unknown dispatcher 'deepep-nomral' (known: deepep-normal, alltoall" in r.stderr
    assert not (tmp_path / "results").exists()


@needs_mpi
@pytest.mark.multirank
def test_a_resume_counts_a_skipped_point_done_and_does_not_ask_again(tmp_path):
    import json

    out = tmp_path / "run"
    args = ("--backend", "mpi", "--np", 2, *TINY, "--param", "moe.copies=rank", "--iters", 2, "--warmup", 0)
    r = run_cli("run", "moe", *args, "--param", "moe.dispatcher=mpi-alltoallw,low-latency", "--out", out)
    assert r.returncode == 0 and r.stdout.count("skipped:") == 1, r.stdout[-2000:] + r.stderr[-2000:]
    # As if the launch had died before its measured point was written.
    (out / "rows.jsonl").write_text("")
    meta = run_meta(out)
    meta["status"] = "failed"
    meta["variants"]["default"]["status"] = "failed"
    (out / "meta.json").write_text(json.dumps(meta))
    r = run_cli("run", "--resume", out, "--np", 2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resume: 1 of 2 points already" in r.stdout and "skipped:" not in r.stdout, r.stdout
    assert len(run_meta(out)["skipped_points"]) == 1
    assert {x["params"]["dispatcher"] for x in run_rows(out)} == {"mpi-alltoallw"}
