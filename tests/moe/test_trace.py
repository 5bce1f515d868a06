"""Captured routing traces: reading every format, refusing every bad file in one line (pure,
`commbench routing`, `commbench run`), the load a trace puts on the ranks, the benchmark's
`trace` param, and a replay through a real launch."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from commbench import moe as M
from commbench.core.errors import UsageError
from commbench.moe import trace as T
from tests.conftest import needs_mpi, run_cli, run_rows

E, K = 8, 2


def _uniform(steps=2, tokens=32, experts=E, k=K, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
                     for _ in range(steps)]).astype(np.int64)


def _hot(steps=1, tokens=32, world=2, hot=1, experts=E, k=K):
    """Every token picks K experts of rank `hot` at `world`."""
    per = experts // world
    ids = hot * per + np.arange(k) % per
    return np.broadcast_to(ids, (steps, tokens, k)).copy()


# --- good traces, every format --------------------------------------------------------------

def _write_all_formats(tmp_path, topk, weights, num_experts, ep_size):
    np.save(tmp_path / "t.npy", topk)
    np.savez(tmp_path / "t.npz", topk_idx=topk, weights=weights, num_experts=num_experts, ep_size=ep_size)
    with open(tmp_path / "t.jsonl", "w") as f:
        f.write(json.dumps({"num_experts": num_experts, "ep_size": ep_size}) + "\n")
        for s in range(topk.shape[0]):
            for t in range(topk.shape[1]):
                f.write(json.dumps({"step": s, "experts": topk[s, t].tolist(),
                                    "weights": weights[s, t].tolist()}) + "\n")
    with open(tmp_path / "t.csv", "w") as f:
        f.write(f"# num_experts={num_experts} ep_size={ep_size}\nstep,experts,weights\n")
        for s in range(topk.shape[0]):
            for t in range(topk.shape[1]):
                f.write(f"{s},{' '.join(map(str, topk[s, t]))},{' '.join(map(repr, weights[s, t].tolist()))}\n")


def test_every_format_reads_the_same_trace(tmp_path):
    topk = _uniform(steps=3, tokens=8, experts=16)
    w = np.random.default_rng(1).random(topk.shape).astype(np.float32) + 0.1
    _write_all_formats(tmp_path, topk, w, 32, 4)
    for ext in ("npz", "jsonl", "csv"):
        tr = T.load_trace(tmp_path / f"t.{ext}")
        assert (tr.steps, tr.tokens, tr.top_k, tr.num_experts, tr.recorded_world) == (3, 8, 2, 32, 4), ext
        assert np.array_equal(tr.topk, topk) and np.array_equal(tr.weights, w), ext
    npy = T.load_trace(tmp_path / "t.npy")  # no header: E is the largest id + 1, no weights, no EP size
    assert npy.num_experts == int(topk.max()) + 1 and npy.weights is None and npy.recorded_world is None
    assert np.allclose(npy.routing(0, 2).weights, 1 / K)
    one = tmp_path / "one.npy"
    np.save(one, topk[0])  # [tokens, topk]: one step
    assert T.load_trace(one).topk.shape == (1, 8, 2)


def test_routing_splits_each_step_in_order_and_refuses_an_uneven_world(tmp_path):
    topk = _uniform(steps=2, tokens=12)
    np.save(tmp_path / "t.npy", topk)
    tr = T.load_trace(tmp_path / "t.npy")
    assert np.array_equal(tr.routing(1, 3, step=1).topk_idx, topk[1, 4:8])
    assert np.array_equal(tr.routing(2, 3, step=2).topk_idx, topk[0, 8:12])  # step mod steps
    with pytest.raises(ValueError, match="12 tokens a step do not split over 5 ranks"):
        tr.routing(0, 5)


def test_one_hot_rank_trace_loads_that_rank_world_times_the_mean_and_uniform_about_once(tmp_path):
    for world in (2, 4):
        np.save(tmp_path / "hot.npy", _hot(world=world, hot=world - 1))
        tr = T.load_trace(tmp_path / "hot.npy")
        loads = tr.rank_loads(world)
        assert loads.shape == (1, world)
        assert loads[0].max() / loads[0].mean() == pytest.approx(world)
        assert int(np.argmax(loads[0])) == world - 1
        assert T.trace_stats(tr, world)["all"]["local_pick_share"] == pytest.approx(1 / world)
    np.save(tmp_path / "u.npy", _uniform(steps=2, tokens=4096, experts=16))
    u = T.trace_stats(T.load_trace(tmp_path / "u.npy"), 4)["all"]
    assert 1.0 <= u["rank_load_max_over_mean"] < 1.05
    assert u["local_pick_share"] == pytest.approx(0.25, abs=0.02)


def test_generated_routing_saved_and_replayed_is_the_same_routing(tmp_path):
    world, steps = 2, 2
    step_kw = (lambda s: {"step": s}) if "step" in M.routing.COMMON_KEYS else (lambda s: {"seed": 7 + s})
    gen = [[M.make_routing("uniform", num_tokens=16, num_experts=E, top_k=K, rank=r, world=world,
                           **{"seed": 7, **step_kw(s)}) for r in range(world)] for s in range(steps)]
    tr = T.load_trace(T.save_trace(tmp_path / "gen.npz", gen, E))
    assert (tr.steps, tr.tokens, tr.num_experts, tr.recorded_world) == (steps, 32, E, world)
    for s in range(steps):
        for r in range(world):
            got = tr.routing(r, world, s)
            assert np.array_equal(got.topk_idx, gen[s][r].topk_idx)
            assert np.array_equal(got.weights, gen[s][r].weights)


def test_reshard_note_names_both_ep_sizes(tmp_path):
    np.savez(tmp_path / "t.npz", topk_idx=_uniform(tokens=16), ep_size=8)
    tr = T.load_trace(tmp_path / "t.npz")
    assert tr.reshard_note(8) is None
    assert tr.reshard_note(2) == ("recorded at EP 8, replayed at EP 2: experts re-sharded over 2 ranks (E/2 each), "
                                  "tokens split in order")


def test_a_trace_is_read_once_per_process_until_it_changes(tmp_path, monkeypatch):
    p = tmp_path / "t.npy"
    np.save(p, _uniform())
    reads = []
    real = T.load_trace
    monkeypatch.setattr(T, "load_trace", lambda *a, **k: reads.append(a) or real(*a, **k))
    first = T.cached_trace(p)
    assert T.cached_trace(str(p)) is first and len(reads) == 1
    np.save(p, _uniform(seed=5, tokens=16))
    os.utime(p, ns=(1, 1))  # a changed file: another size and mtime
    assert T.cached_trace(p).tokens == 16 and len(reads) == 2


# --- bad traces --------------------------------------------------------------------------------

def _jsonl(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _bad(tmp_path, case):
    """Write the bad trace `case`; return its path."""
    good = _uniform(tokens=4)
    if case == "negative id":
        p = tmp_path / "neg.npy"
        np.save(p, np.where(good == good[0, 0, 0], -1, good))
    elif case == "out of range":
        p = tmp_path / "range.npz"
        np.savez(p, topk_idx=good, num_experts=4)
    elif case == "duplicate":
        p = tmp_path / "dup.npy"
        g = good.copy()
        g[1, 2] = [3, 3]
        np.save(p, g)
    elif case == "ragged":
        p = tmp_path / "ragged.jsonl"
        _jsonl(p, [{"experts": [1, 2]}, {"experts": [1, 2, 3]}])
    elif case in ("nan", "inf", "negative weight"):
        p = tmp_path / f"{case.replace(' ', '_')}.npz"
        w = np.ones(good.shape, np.float32)
        w[0, 1, 0] = {"nan": np.nan, "inf": np.inf, "negative weight": -0.5}[case]
        np.savez(p, topk_idx=good, weights=w)
    elif case == "float ids":
        p = tmp_path / "float.npy"
        np.save(p, good.astype(np.float32))
    elif case == "object array":
        p = tmp_path / "obj.npy"
        np.save(p, np.array([[1, 2], [3, None]], dtype=object), allow_pickle=True)
    elif case == "empty array":
        p = tmp_path / "empty.npy"
        np.save(p, np.zeros((0, 2), np.int64))
    elif case == "empty file":
        p = tmp_path / "zero.npz"
        p.write_bytes(b"")
    elif case in ("truncated npy", "truncated npz"):
        ext = case.split()[1]
        p = tmp_path / f"cut.{ext}"
        (np.save if ext == "npy" else lambda f, a: np.savez(f, topk_idx=a))(p, _uniform(tokens=512))
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif case == "over the limit":
        p = tmp_path / "big.npy"
        with open(p, "wb") as f:  # sparse: 2 GiB of nothing, never to be read
            f.truncate(2 << 30)
    elif case == "unknown extension":
        p = tmp_path / "t.txt"
        p.write_text("1 2\n")
    elif case == "step token counts":
        p = tmp_path / "steps.jsonl"
        _jsonl(p, [{"step": 0, "experts": [1, 2]}, {"step": 0, "experts": [2, 3]}, {"step": 1, "experts": [1, 2]}])
    elif case == "bad json":
        p = tmp_path / "bad.jsonl"
        p.write_text('{"experts": [1, 2]}\n{"experts": [1,\n')
    elif case == "bad csv id":
        p = tmp_path / "bad.csv"
        p.write_text("step,experts\n0,1 2\n0,1 x\n")
    elif case == "fifo":
        p = tmp_path / "pipe.npy"
        os.mkfifo(p)
    elif case == "directory":
        p = tmp_path / "dir.npz"
        p.mkdir()
    elif case == "wrong shape":
        p = tmp_path / "flat.npy"
        np.save(p, np.arange(8))
    else:
        raise AssertionError(case)
    return p


BAD = {"negative id": "negative expert id -1", "out of range": "out of range for num_experts 4",
       "duplicate": "picks expert 3 twice", "ragged": "ragged top-k", "nan": "NaN or infinity",
       "inf": "NaN or infinity", "negative weight": "negative weight", "float ids": "must be integers",
       "object array": "unreadable", "empty array": "empty trace", "empty file": "empty file",
       "truncated npy": "unreadable", "truncated npz": "truncated or corrupt",
       "over the limit": "over the 1073741824-byte limit", "unknown extension": "unknown extension '.txt'",
       "step token counts": "different token counts", "bad json": "not JSON", "bad csv id": "'x' is not an integer",
       "wrong shape": "shaped [steps, tokens, topk]", "fifo": "is a FIFO", "directory": "is a directory"}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_trace_is_one_line_naming_the_problem(tmp_path, case):
    p = _bad(tmp_path, case)
    with pytest.raises(ValueError) as e:
        T.load_trace(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"trace {p}") and BAD[case] in msg, msg


# Through the CLI the refusal is one path whatever the case (load_trace raises, the command
# prints one line): a few cases of different families in the test run, every case under
# `make test-slow` (each case is a fresh interpreter: about 1.3 s apiece on 2 cores).
CLI_CASES = ("out of range", "nan", "truncated npy", "over the limit")


def _cli_cases(every: bool) -> list[str]:
    picked = [c for c in sorted(BAD) if every or c in CLI_CASES]
    assert every or len(picked) == len(CLI_CASES), "CLI_CASES names keys of BAD"
    return picked


@pytest.mark.multirank
@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_commbench_routing_refuses_every_bad_trace_in_one_line(tmp_path, every):
    for case in _cli_cases(every):
        p = _bad(tmp_path, case)
        r = run_cli("routing", p)
        assert r.returncode == 2 and r.stdout == "", (case, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("commbench: error: trace ") \
            and BAD[case] in r.stderr, (case, r.stderr)


@pytest.mark.multirank
@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_run_refuses_every_bad_trace_and_conflict_before_any_rank_starts(tmp_path, every):
    tiny = ["--param", "moe.hidden=256", "--iters", "3"]
    np.save(tmp_path / "good.npy", _uniform(tokens=16))  # E = 8 (largest id + 1), K = 2, 16 tokens a step
    np.save(tmp_path / "odd.npy", _uniform(tokens=15))
    cases = [([f"moe.trace={_bad(tmp_path, c)}"], BAD[c]) for c in _cli_cases(every)]
    cases += [(["moe.trace=" + str(tmp_path / "good.npy"), "moe.experts=16"], "experts=16 conflicts with trace"),
              (["moe.trace=" + str(tmp_path / "good.npy"), "moe.experts=256"], "experts=256 conflicts with trace"),
              (["moe.trace=" + str(tmp_path / "good.npy"), "moe.topk=4"], "topk=4 conflicts with trace"),
              (["moe.trace=" + str(tmp_path / "good.npy"), "moe.routing=zipf"], "routing=zipf conflicts with trace"),
              (["moe.trace=" + str(tmp_path / "good.npy"), "moe.tokens=5"], "tokens=5 conflicts with trace"),
              (["moe.trace=" + str(tmp_path / "odd.npy")], "15 tokens a step do not split over 2 ranks")]
    for i, (params, want) in enumerate(cases):
        out = tmp_path / f"out{i}"
        r = run_cli("run", "-b", "moe", "--backend", "mpi", "--np", "2", "--out", out,
                    *[w for kv in params for w in ("--param", kv)], *tiny)
        assert r.returncode == 2, (params, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("commbench: error: ") and want in r.stderr, \
            (params, r.stderr)
        assert not out.exists(), f"{params}: something was written to --out"


# --- the benchmark param, without a launch -----------------------------------------------------

def _points(params, world=2):
    from commbench.run import suite as S

    cfg = S.build_config({"benchmarks": ["moe"], "worlds": [world]}, None, params)
    return S.expand(cfg, world, ("float32", "bfloat16"))[0]


def test_the_trace_sets_experts_topk_steps_and_tokens_per_rank(tmp_path):
    np.savez(tmp_path / "t.npz", topk_idx=_uniform(steps=3, tokens=24, experts=12), num_experts=12)
    for world, per_rank in ((2, 12), (4, 6)):
        (pt,) = _points([f"moe.trace={tmp_path / 't.npz'}", "moe.hidden=256"], world)
        p = pt.params
        assert (p["routing"], p["experts"], p["topk"], p["tokens"]) == ("trace", 12, K, per_rank)
        assert p.get("steps", 3) == 3
    with pytest.raises(UsageError, match="tokens=7 conflicts with trace t.npz, which implies tokens=12"):
        _points([f"moe.trace={tmp_path / 't.npz'}", "moe.tokens=7"], 2)


def test_routing_for_reads_the_trace_and_rows_name_it(tmp_path):
    from commbench.benchmarks.moe import MoE

    topk = _uniform(steps=2, tokens=16)
    np.savez(tmp_path / "t.npz", topk_idx=topk, ep_size=4)
    (pt,) = _points([f"moe.trace={tmp_path / 't.npz'}"], 2)
    make = MoE().routing_for(pt.params, 2)
    assert np.array_equal(make(1, step=1).topk_idx, topk[1, 8:])
    from commbench.benchmarks.moe import replay

    info = replay.row_info(pt.params, 2)
    assert info["trace"] == T.load_trace(tmp_path / "t.npz").label and info["trace"].startswith("t.npz@")
    assert info["trace_note"].startswith("recorded at EP 4, replayed at EP 2")


# --- through the command line --------------------------------------------------------------------

@pytest.mark.multirank
def test_commbench_routing_prints_the_hot_ranks_load(tmp_path):
    np.savez(tmp_path / "hot.npz", topk_idx=_hot(steps=2, world=4, hot=2), num_experts=E, ep_size=4)
    r = run_cli("routing", tmp_path / "hot.npz", "--per-step")
    assert r.returncode == 0, r.stderr
    assert "2 step(s), 32 tokens a step, E=8 K=2" in r.stdout and "recorded EP size: EP 4" in r.stdout
    assert "all      rank load max/mean 4.000 (hottest rank 2)" in r.stdout
    assert r.stdout.count("rank load max/mean 4.000") == 3  # all, step 0, step 1
    r = run_cli("routing", tmp_path / "hot.npz", "--world", "2")
    assert "rank load max/mean 2.000 (hottest rank 1)" in r.stdout and "recorded at EP 4, replayed at EP 2" in r.stdout
    r = run_cli("routing", tmp_path / "hot.npz", "--world", "3")
    assert r.returncode == 2 and "do not split over 3 ranks" in r.stderr


@needs_mpi
@pytest.mark.multirank
def test_a_replayed_hot_rank_trace_runs_checked_and_rows_show_the_load(tmp_path):
    np.savez(tmp_path / "hot.npz", topk_idx=_hot(steps=2, tokens=32, world=2, hot=1), num_experts=E, ep_size=4)
    out = tmp_path / "run"
    r = run_cli("run", "-b", "moe", "--backend", "mpi", "--np", "2", "--out", out, "--check", "--iters", "3",
                "--param", f"moe.trace={tmp_path / 'hot.npz'}", "--param", "moe.hidden=256", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = run_rows(out)
    assert rows and all(x["check"] == "ok" for x in rows)
    label = T.load_trace(tmp_path / "hot.npz").label
    for x in rows:
        assert x["load_max_over_mean"] == pytest.approx(2.0) and x["hottest_rank"] == 1
        assert x["trace"] == label and x["trace_note"].startswith("recorded at EP 4, replayed at EP 2")
        assert (x["params"]["routing"], x["params"]["tokens"], x["params"]["experts"]) == ("trace", 16, E)
    copy = x["params"]["trace"]  # the run's own copy, named by the trace's sha256
    assert copy.startswith(str(out.resolve() / "traces")) and os.path.isfile(copy)
    assert T.load_trace(copy).label == label
