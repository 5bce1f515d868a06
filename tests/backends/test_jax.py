"""The jax backend on the loopback, real ranks, checks on: every collective at 2 ranks, a
4-rank launch with its 2-rank sub-world, faults inside compiled programs caught, the MoE
engine (through an emulated ragged_all_to_all where XLA has none), and the refusal where
ragged_all_to_all does not run. Skipped only when jax is not installed."""
import importlib.util
import pickle

import numpy as np
import pytest

from commbench.store.load import load
from conftest import ROOT, run_cli, run_meta

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                reason="jax is not installed (pip install 'commbench[jax]'; make test installs it)")

STANDARD = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv", "barrier"]
JAX_OPS = {"all_reduce": "psum", "reduce_scatter": "psum_scatter", "all_gather": "all_gather",
           "all_to_all": "all_to_all", "broadcast": "psum_masked", "send_recv": "ppermute", "barrier": "psum"}
FAST = ["--check", "--iters", 3, "--warmup", 1]
# Both copy modes on the good engine; the lost row on expert copies (regrouped by expert).
MOE_SHAPE = ["--param", "tokens=64", "--param", "hidden=256", "--param", "experts=8", "--param", "topk=2",
             "--param", "moe_jax_emulated.copies=rank,expert", "--param", "moe_jax_emulated_drop_row.copies=expert"]


def _fail_text(p) -> str:
    return p.stdout[-3000:] + p.stderr[-3000:]


@pytest.mark.multirank
def test_listed_without_importing_jax():
    p = run_cli("list")
    assert p.returncode == 0
    line = next(ln for ln in p.stdout.splitlines() if ln.strip().startswith("jax "))
    assert " yes " in line and "bfloat16" in line
    import subprocess
    import sys

    code = "import sys, commbench.cli as c; c.cmd_list(); print('jax' in sys.modules)"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert probe.stdout.strip().endswith("False")


@pytest.mark.multirank
def test_every_collective_two_ranks(tmp_path):
    out = tmp_path / "run"
    p = run_cli("run", "quick", "-b", ",".join(STANDARD), "--backend", "jax", "--np", 2, "--sizes", "4K",
                "--dtypes", "float32,bfloat16", *FAST, "--out", out)
    assert p.returncode == 0, _fail_text(p)
    df = load(out)
    assert set(df["benchmark"]) == set(STANDARD)
    bad = df[(df["check"] != "ok") & (df["benchmark"] != "barrier")]
    assert bad.empty, bad[["benchmark", "nbytes", "dtype", "check"]]
    assert (df["clock"] == "jax_compiled_loop").all()
    # Compile time is reported per point and is not in the samples.
    assert (df["compile_ms"] > 0).all() and (df["ops_per_sample"] >= 1).all()
    assert (df["time_us_p50"] > 0).all() and (df["time_us_min"] <= df["time_us_p50"]).all()
    for bench, op in JAX_OPS.items():
        assert set(df[df["benchmark"] == bench]["jax_op"]) == {op}
    ar = df[df["benchmark"] == "all_reduce"]
    assert set(ar["placement"]) == {"out-of-place"}
    meta = run_meta(out)
    assert meta["status"] == "complete" and meta["versions"]["jax"] and meta["versions"]["jax_collectives"] == "gloo"
    assert meta["ceilings"]["probe"]["latency_us"] > 0  # the loopback probe's pair exchange ran on jax


@pytest.mark.multirank
def test_four_ranks_with_sub_world_and_barrier_timing(tmp_path):
    """World 4 and the mesh over its first 2 devices (ranks 2 and 3 wait outside it);
    --timing barrier: one operation per program call, a barrier between."""
    out = tmp_path / "run"
    p = run_cli("run", "quick", "-b", "all_reduce,send_recv", "--backend", "jax", "--np", 4,
                "--sizes", "256", "--dtypes", "int32,float16", "--timing", "barrier", *FAST, "--out", out)
    assert p.returncode == 0, _fail_text(p)
    df = load(out)
    assert set(df["world"]) == {2, 4}
    assert (df["check"] == "ok").all(), df[["benchmark", "world", "dtype", "check"]]
    assert (df["ops_per_sample"] == 1).all() and (df["timing"] == "barrier").all()


@pytest.mark.multirank
def test_faults_inside_programs_are_caught_and_moe_runs(tmp_path):
    """One launch: a dropped and a corrupted element inside the compiled programs, one
    corrupted after the operation on the host, and the MoE engine with and without a lost
    row. The good points pass, every faulty one fails, and the run exits 1."""
    out = tmp_path / "run"
    benches = ["all_gather_jax_drop", "all_reduce_jax_corrupt", "all_reduce_corrupt", "moe_jax_emulated",
               "moe_jax_emulated_drop_row"]
    p = run_cli("run", "quick", "-b", ",".join(benches), "--backend", "jax", "--np", 2, "--sizes", "64",
                *FAST, *MOE_SHAPE, "--out", out,
                env={"COMMBENCH_PLUGINS": "corrupt_plugin,jax_ragged_plugin,jax_fault_plugin"})
    assert p.returncode == 1, _fail_text(p)
    assert "failed the data check" in p.stderr
    df = load(out)
    checks = df.groupby("benchmark")["check"].agg(set).to_dict()
    assert checks == {"all_gather_jax_drop": {"fail"}, "all_reduce_jax_corrupt": {"fail"},
                      "all_reduce_corrupt": {"fail"}, "moe_jax_emulated": {"ok"},
                      "moe_jax_emulated_drop_row": {"fail"}}
    moe = df[df["benchmark"] == "moe_jax_emulated"]
    assert set(moe["stage"]) == {"dispatch", "combine"} and set(moe["engine"]) == {"jax"}
    assert set(moe["exchange"]) == {"emulated_ragged_all_to_all"} and (moe["compile_ms"] > 0).all()
    assert (moe["stage_us_a2a"] > 0).all()
    assert set(moe["params"].map(lambda q: q["copies"])) == {"rank", "expert"}


@pytest.mark.multirank
def test_moe_refused_in_one_line_where_ragged_all_to_all_does_not_run(tmp_path):
    from commbench.backends.jax_probe import ragged_all_to_all_support

    why = ragged_all_to_all_support("cpu")  # the environment now carries the verdict to the CLI
    if why is None:
        pytest.skip("this JAX runs ragged_all_to_all on CPU: moe runs there (not refused)")
    p = run_cli("run", "moe", "--np", 2, "--backend", "jax", "--out", tmp_path / "run")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error: moe on jax moves rows with "
                                                   "jax.lax.ragged_all_to_all"), p.stderr
    assert not (tmp_path / "run").exists()
    p = run_cli("run", "moe-decode", "--np", 2, "--backend", "jax")
    assert p.returncode == 2 and "mode=low_latency" in p.stderr and len(p.stderr.strip().splitlines()) == 1


HLO_CHECK = r"""
import re, numpy as np, jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 2)
from types import SimpleNamespace
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from commbench.backends.jax_dist import AXIS, JaxComm
mesh = Mesh(np.array(jax.devices()), (AXIS,))
comm = SimpleNamespace(jax=jax, ranks=(0, 1), rank=0, size=2, mesh=lambda r: mesh, _barrier=None)
a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
ops = {"all_reduce": JaxComm.all_reduce(comm, a, b), "reduce_scatter": JaxComm.reduce_scatter(comm, a, b[:2]),
       "all_gather": JaxComm.all_gather(comm, a[:2], b), "all_to_all": JaxComm.all_to_all(comm, a, b),
       "broadcast": JaxComm.broadcast(comm, b, 0), "send_recv": JaxComm.send_recv(comm, a, b, 1),
       "barrier": JaxComm.barrier_op(comm)}
for name, op in ops.items():
    op.compile(jax.device_put(np.zeros(2 * op.src.shape[0], op.src.dtype), NamedSharding(mesh, P(AXIS))))
    comps = re.split(r"\n(?=\S)", op.compiled.as_text())
    found = [c.split()[0] for c in comps for line in c.splitlines()
             if re.search(r"= .*? (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(", line)]
    entry = next(c for c in comps if c.startswith("ENTRY"))
    print(name, len(found), "ENTRY" in found, bool(re.search(r" copy\(%param", entry)))
"""


@pytest.mark.multirank
def test_each_program_holds_one_collective_inside_its_loop():
    """XLA must not hoist the collective out of the timed loop, nor keep the one that only
    types the loop's carry: one collective per program, outside the entry computation; and
    the donated input is not copied into the loop."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", HLO_CHECK], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines()}
    assert got == {name: ["1", "False", "False"] for name in JAX_OPS}, got


def test_expert_answer_is_the_host_paths_token_value():
    from commbench.benchmarks.moe.host import token_value
    from commbench.benchmarks.moe.jax_path import answer

    src, tok = np.meshgrid(np.arange(9), np.arange(300), indexing="ij")
    assert np.array_equal(answer(src, tok).astype(np.float32), token_value(src, tok))


class _FakeStore:
    """The coordination service's key-value calls, in one process."""

    def __init__(self):
        self.kv, self.deleted = {}, []

    def key_value_set_bytes(self, key, value):
        assert key not in self.kv
        self.kv[key] = value

    def blocking_key_value_get_bytes(self, key, timeout_ms):
        return self.kv[key]

    def key_value_delete(self, key):
        self.deleted.append(key)
        del self.kv[key]


def test_key_value_gathers_name_each_call_and_free_the_one_before():
    from commbench.backends.jax_dist import KeyValueGroups

    store = _FakeStore()
    ranks = (0, 1)
    a, b = KeyValueGroups(store, "c1", 0), KeyValueGroups(store, "c1", 1)
    for step in range(3):
        # b writes first, as a faster rank would; each then reads both keys of the call.
        store.kv[b._key(ranks, step, 1)] = pickle.dumps(("b", step))
        b._seq[ranks] = step + 1
        assert a.allgather(("a", step), ranks) == [("a", step), ("b", step)]
    assert store.deleted == [a._key(ranks, 0, 0), a._key(ranks, 1, 0)]
    # Another set of ranks counts its own calls.
    assert b.allgather(7, (1,)) == [7] and b._key((1,), 0, 1) in store.kv
