"""The allgather dispatcher's torch engine (backends/moe/torch_allgather.py, Megatron's
all-gather token dispatcher): in this process at world 1 through the benchmark, its checks
failing on a corrupted exchange, and gloo ranks through the CLI."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from commbench.store.load import load
from conftest import run_cli

SMALL = ["--param", "moe.tokens=16", "--param", "moe.hidden=256", "--param", "moe.experts=8", "--param", "moe.topk=2"]




def _setup(comm, **over):
    from commbench.benchmarks.base import Point
    from commbench.benchmarks.moe import MoE

    bench = MoE()
    params = {k: v.default for k, v in bench.params.items()}
    params.update(tokens=40, hidden=256, experts=8, topk=4, dispatcher="allgather", **over)
    b = bench.setup(comm, Point("moe", 1, "", 0, params))
    return bench, b, b.steps[0]


@pytest.mark.parametrize("copies,dtype", [("expert", "fp8"), ("rank", "bf16")])
def test_allgather_engine_runs_and_checks_at_world_1(gloo_world1, copies, dtype):
    from commbench.benchmarks.moe.allgather_device import AllGatherPath

    comm = gloo_world1
    bench, b, s = _setup(comm, copies=copies, dispatch_dtype=dtype)
    assert isinstance(s.path, AllGatherPath)
    assert s.path.dispatch_stages == ("gather", "select") and s.path.combine_stages == ("reduce", "reduce_scatter")
    bench.fill(comm, b)
    seen = []
    bench.dispatch(comm, b, lambda: seen.append("d"))
    bench.experts(comm, b)
    bench.combine(comm, b, lambda: seen.append("c"))
    assert seen == ["d", "d", "c", "c"]
    assert bench.check(comm, b)
    st = s.state
    # Every token is gathered; the selected rows are the routed ones (one per pick for
    # expert copies, one per token for rank copies at world 1).
    assert st.g_x.shape[0] == 40 and st.expert_in.shape[0] == (40 * 4 if copies == "expert" else 40)
    assert sum(st.tokens_per_expert) == 40 * 4
    s.path.release(comm, s)


@pytest.mark.parametrize("fault", ["row", "weight", "count"])
def test_allgather_checks_fail_on_a_corrupted_exchange(gloo_world1, fault):
    comm = gloo_world1
    bench, b, s = _setup(comm, copies="expert")
    bench.fill(comm, b)
    bench.op(comm, b)()
    assert bench.check(comm, b)
    st = s.state
    if fault == "row":
        st.expert_in[3] = st.expert_in[4]  # a row lost under a copy of another
    elif fault == "weight":
        st.out_full[5, 7] += 1.0  # a combined sum off
    else:
        st.counts_recv[0] += 1
    assert not bench.check(comm, b)
    s.path.release(comm, s)


def test_allgather_engine_pads_to_the_largest_rank_and_marks_padding_nobodys():
    from commbench.backends.moe.torch_allgather import AllGatherMoE
    from commbench.backends.moe.torch_normal import TorchMoE

    class Comm1:  # world 1: all_gather and reduce_scatter are copies
        size, rank, backend, tdev = 1, 0, "gloo", torch.device("cpu")

        def all_gather(self, send, recv):
            return lambda: recv.copy_(send)

        def reduce_scatter(self, send, recv):
            return lambda: recv.copy_(send)

    eng = AllGatherMoE(TorchMoE(Comm1()))
    topk = np.array([[0, 1], [2, 3], [1, 3]], dtype=np.int64)
    weights = np.full((3, 2), 0.5, dtype=np.float32)
    st = eng.setup(topk, weights, 4, "expert", 128, "bf16", t_max=5, n_recv=6)
    assert st.ids_send.dtype == torch.int32 and st.ids_send[3:].eq(-1).all() and st.w_send[3:].eq(0).all()
    eng.fill(st)
    eng.dispatch(st, lambda: None)
    # (local expert, source, token) order: expert 0 <- token 0, 1 <- 0, 2, 2 <- 1, 3 <- 1, 2
    assert st.sel_token.tolist() == [0, 0, 2, 1, 1, 2] and st.tokens_per_expert == [1, 2, 1, 2]
    eng.experts(st)
    eng.combine(st, lambda: None)
    assert st.out.shape == (3, 128) and eng.check_combine(st, np.ones(3), True)
    with pytest.raises(RuntimeError, match="more than the 2 gathered"):
        eng.setup(topk, weights, 4, "expert", 128, "bf16", t_max=2, n_recv=6)
    eng.release(st)


@pytest.mark.multirank
def test_gloo_allgather_dispatcher_passes_the_exact_check_with_physical_bytes(tmp_path):
    out = tmp_path / "ag"
    p = run_cli("run", "-b", "moe", "--backend", "gloo", "--np", 2, "--check", "--iters", 2, "--warmup", 1,
                "--out", out, *SMALL, "--param", "moe.dispatcher=allgather", "--param", "moe.copies=rank,expert",
                "--param", "moe.routing=uniform,source_ragged")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = load(out)
    assert len(df) == 2 * 2 * 2 and (df["check"] == "ok").all(), df[["params", "stage", "check"]]
    assert set(df["engine"]) == {"torch"} and df["exchange"].str.contains("reduce_scatter").all()
    d = df[df["stage"] == "dispatch"]
    assert (d["stage_us_gather"] >= 0).all() and (d["stage_us_select"] >= 0).all()
    c = df[df["stage"] == "combine"]
    assert (c["stage_us_reduce_scatter"] >= 0).all()
    # Physical bytes: the padded tokens (row + 8 bytes of routing per pick) to the other
    # rank in dispatch, their fp32 sums in combine; whatever the routing.
    for _, r in df.iterrows():
        t_max, rb = int(r["padded_tokens"]), 256 + 4 * 2  # fp8 rows: H + H/32 bytes
        want = t_max * (rb + 8 * 2) if r["stage"] == "dispatch" else t_max * 4 * 256
        assert r["remote_nbytes"] == want
