"""The moe benchmark's routing steps and ragged tokens per source rank (benchmarks/moe/steps.py):
iteration i of a timed stage runs step i mod steps, combine reads a dispatch of its own step,
every step is checked; rank 0 holding twice rank 1's tokens passes the exact checks on every
path (tests/plugins/moe_steps_plugin.py); rows say what routing they measured."""
import numpy as np
import pytest

import commbench.moe as M
from commbench.benchmarks.moe import MoE
from commbench.benchmarks.moe.steps import StepBufs, current, load_fields, mean_over_steps, routing_fields
from commbench.store.load import load
from conftest import needs_mpi, needs_torch, run_cli

SHAPE = {"tokens": 16, "hidden": 256, "experts": 8, "topk": 2, "seed": 0}
SMALL = [a for k, v in SHAPE.items() if k != "seed" for a in ("--param", f"{k}={v}")] + ["--iters", 3, "--warmup", 1]
PLUGIN = {"COMMBENCH_PLUGINS": "moe_steps_plugin"}
def ragged_routing(p: dict, world: int, rank: int, step: int) -> M.Routing:
    """tests/plugins/moe_steps_plugin.py's routing, regenerated here: rank 0 holds twice the
    tokens, uniform picks seeded per (rank, step)."""
    return M.make_routing("uniform", num_tokens=p["tokens"] * (2 if rank == 0 else 1), num_experts=p["experts"],
                          top_k=p["topk"], rank=rank, world=world, seed=p["seed"], step=step)


ROUTING_KEYS = {"rank_load_max_over_mean", "expert_load_max_over_mean", "local_pick_share", "tokens_min",
                "tokens_max"}


def test_routing_fields_take_the_worst_step_the_mean_share_and_the_token_range():
    a = {"rank_load_max_over_mean": 1.5, "expert_load_max_over_mean": 2.0, "local_pick_share": 0.2,
         "tokens_min": 8, "tokens_max": 16}
    b = {"rank_load_max_over_mean": 1.1, "expert_load_max_over_mean": 3.0, "local_pick_share": 0.4,
         "tokens_min": 4, "tokens_max": 12}
    assert routing_fields([a]) == a  # one step: no `steps` field
    assert routing_fields([a, b]) == {"rank_load_max_over_mean": 1.5, "expert_load_max_over_mean": 3.0,
                                      "local_pick_share": pytest.approx(0.3), "tokens_min": 4, "tokens_max": 16,
                                      "steps": 2}
    one = {"sent_nbytes": 10, "exchange": "x", "capacity": 4}
    assert mean_over_steps([one]) is one
    assert mean_over_steps([one, {"sent_nbytes": 20, "exchange": "y", "capacity": 4}]) == \
        {"sent_nbytes": 15.0, "exchange": "x", "capacity": 4.0}
    m1, m2 = np.array([[1, 3], [2, 2]]), np.array([[4, 0], [4, 0]])  # loads [3, 5] and [8, 0]
    assert load_fields([m1]) == {"load_max_over_mean": 1.25, "hottest_rank": 1, "recv_rows_max": 5,
                                 "recv_rows_mean": 4.0}
    assert load_fields([m1, m2]) == {"load_max_over_mean": 2.0, "hottest_rank": 0, "recv_rows_max": 8,
                                     "recv_rows_mean": 4.0}


def test_jax_refuses_ragged_routings_in_one_line():
    why = MoE().refusal("jax", "cpu", {"routing": ["uniform", "source_ragged"]})
    assert why and "routing=source_ragged" in why and "\n" not in why


# --- the timed loops' cycle, in this process at world 1 -------------------------------------

@pytest.fixture
def gloo_world1():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from commbench.backends.torch_dist import TorchComm

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield TorchComm(None, 0, 1, "gloo", "cpu"), torch
    finally:
        dist.destroy_process_group()


class Recorded(MoE):
    """The plugin's routing (changes with every step); records the step each operation ran on."""

    def __init__(self):
        self.seen = []

    def routing_for(self, p, world):
        return lambda rank, step=0: ragged_routing(p, world, rank, step)

    def _step(self, b):
        return b.plan.routing_for.keywords["step"]

    def dispatch(self, comm, b, *lap):
        self.seen.append(("d", self._step(current(b))))
        super().dispatch(comm, b, *lap)

    def combine(self, comm, b, *lap):
        s = current(b)
        # The rows the experts answered are this step's: as many as this step routed here.
        assert s.state.n_recv == s.plan.n_recv
        self.seen.append(("c", self._step(s)))
        super().combine(comm, b, *lap)


class CycleHarness:
    """Runs each stage's warm-up (2 iterations) and timed loop (7), calling restart before
    each loop and after_each after each iteration, as the harness does."""

    def time_steps(self, comm, point, step, traffic, stage="", laps=(), hold=False, host_waits=(), after_each=None,
                   restart=None):
        for n in (2, 7):
            if restart is not None:
                restart()
            for i in range(n):
                step(lambda: None)
                if after_each is not None:
                    after_each(i)
        return {"time_us_p50": 1.0, "stage_us_a2a": 0.5}, None


def test_iterations_cycle_the_steps_and_combine_reads_its_own_step(gloo_world1):
    from commbench.benchmarks.base import Point

    comm, _ = gloo_world1
    bench = Recorded()
    params = {k: v.default for k, v in bench.params.items()}
    params.update(SHAPE, steps=3, copies="expert")
    b = bench.setup(comm, Point("moe", 1, "", 0, params))
    assert isinstance(b, StepBufs) and len(b.steps) == 3
    # Each step its own routing and buffers: the plugin's routing differs by step.
    assert not np.array_equal(b.steps[0].plan.topk, b.steps[1].plan.topk)
    bench.fill(comm, b)
    bench.op(comm, b)()
    assert bench.check(comm, b)
    assert bench.seen == [("d", 0), ("c", 0), ("d", 1), ("c", 1), ("d", 2), ("c", 2)]
    bench.seen.clear()
    rows = bench.measure(CycleHarness(), comm, Point("moe", 1, "", 0, params), b)
    d_loop = [s for k, s in bench.seen if k == "d"]
    c_loop = [s for k, s in bench.seen if k == "c"]
    # Warm-up and timed loop each from step 0 (iteration i runs step i mod 3); then one
    # untimed dispatch per step before the combine loops, which cycle the same way.
    assert d_loop == [0, 1] + [0, 1, 2, 0, 1, 2, 0] + [0, 1, 2]
    assert c_loop == [0, 1] + [0, 1, 2, 0, 1, 2, 0]
    assert rows[0]["steps"] == 3 and rows[0]["tokens_min"] == rows[0]["tokens_max"] == 32  # world 1: rank 0
    # A step whose dispatch state is broken fails the check, whichever step it is.
    b.steps[2].state.received[0] = b.steps[2].state.received[1]
    assert not bench.check(comm, b)


# --- launches ----------------------------------------------------------------------------------

def _expected(p: dict, world: int, stage: str) -> dict:
    """The row's routing fields and bytes, from the plugin's routing regenerated here."""
    steps = p["steps"]
    per_step, most = [], []
    tb = M.token_bytes(p["hidden"], p["dispatch_dtype"] if stage == "dispatch" else "bf16")
    for s in range(steps):
        topk = [ragged_routing(p, world, r, s).topk_idx for r in range(world)]
        per_rank = p["experts"] // world
        picks = np.bincount(np.concatenate([t.ravel() for t in topk]) // per_rank, minlength=world)
        experts = np.bincount(np.concatenate([t.ravel() for t in topk]), minlength=p["experts"])
        local = sum(int((t // per_rank == r).sum()) for r, t in enumerate(topk)) / sum(t.size for t in topk)
        per_step.append((picks.max() / picks.mean(), experts.max() / experts.mean(), local,
                         [t.shape[0] for t in topk]))
        recv = M.global_layout(lambda r, s=s: ragged_routing(p, world, r, s), p["experts"], world,
                               p["copies"]).sum(axis=0)
        most.append(recv.max() * tb)
    want = {"rank_load_max_over_mean": max(x[0] for x in per_step),
            "expert_load_max_over_mean": max(x[1] for x in per_step),
            "local_pick_share": float(np.mean([x[2] for x in per_step])),
            "tokens_min": min(min(x[3]) for x in per_step), "tokens_max": max(max(x[3]) for x in per_step),
            "logical_nbytes": int(np.mean(most))}
    return want


@needs_mpi
@pytest.mark.multirank
def test_mpi_steps_and_ragged_tokens_pass_the_check_and_rows_say_the_routing(tmp_path):
    out = tmp_path / "mpi"
    p = run_cli("run", "quick", "-b", "moe_ragged_steps", "--backend", "mpi", "--np", 2, "--check", *SMALL,
                "--param", "moe_ragged_steps.steps=1,3", "--param", "moe_ragged_steps.copies=rank,expert",
                "--out", out, env=PLUGIN)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = load(out)
    assert len(df) == 2 * 2 * 2 and (df["check"] == "ok").all(), df[["params", "stage", "check"]]
    assert set(df["engine"]) == {"host"}
    for _, r in df.iterrows():
        want = _expected(r["params"], 2, r["stage"])
        assert want["tokens_min"] == 16 and want["tokens_max"] == 32  # rank 0 holds twice rank 1's tokens
        for k, v in want.items():
            assert r[k] == pytest.approx(v), (k, r["params"], r["stage"])
    one = df[df["params"].map(lambda q: q["steps"] == 1)].dropna(axis=1, how="all")
    three = df[df["params"].map(lambda q: q["steps"] == 3)].dropna(axis=1, how="all")
    assert "steps" not in one.columns and (three["steps"] == 3).all()
    assert set(three.columns) - set(one.columns) == {"steps"}
    assert ROUTING_KEYS <= set(one.columns)
    assert (three["bandwidth_note"].str.endswith("mean over the routing steps")).all()


@needs_torch
@pytest.mark.multirank
def test_gloo_every_path_takes_ragged_tokens_over_steps(tmp_path):
    """Normal mode (both copies, flat and two tiers: two 'nodes' of one rank) and low-latency
    mode; rank 0 holds 32 tokens, rank 1 16, and the routing changes with each of 3 steps."""
    out = tmp_path / "gloo"
    p = run_cli("run", "quick", "-b", "moe_ragged_steps,moe_ragged_steps_ll", "--backend", "gloo", "--np", 2,
                "--ranks-per-node", 1, "--check", *SMALL, "--param", "steps=3",
                "--param", "moe_ragged_steps.copies=rank,expert", "--param", "moe_ragged_steps.path=flat,hierarchical",
                "--out", out, env=PLUGIN)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = load(out)
    assert len(df) == 2 * (4 + 1) and (df["check"] == "ok").all(), df[["benchmark", "params", "stage", "check"]]
    assert set(df["engine"]) == {"torch"} and (df["steps"] == 3).all()
    assert (df["tokens_min"] == 16).all() and (df["tokens_max"] == 32).all()
    ll = df[df["benchmark"] == "moe_ragged_steps_ll"]
    assert (ll["capacity"] == 32).all() and (ll["overflow_rows"] == 0).all()  # the most tokens of any rank
    flat = df[(df["benchmark"] == "moe_ragged_steps") & df["params"].map(lambda q: q["path"] == "flat")]
    for _, r in flat.iterrows():
        assert r["logical_nbytes"] == _expected(r["params"], 2, r["stage"])["logical_nbytes"]
