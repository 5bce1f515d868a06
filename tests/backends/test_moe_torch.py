"""The moe benchmark's torch path (backends/moe/torch_normal.py): its pure pieces against the host
path's numpy reference, a whole exchange of several ranks simulated in one process, the
engine at world 1 in-process, and gloo ranks through the CLI, faults included."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import commbench.moe as M
from commbench.backends.moe import torch_normal as tm
from commbench.benchmarks.moe.host import regroup_perm, send_order
from commbench.store.load import load
from conftest import run_cli

SMALL = ["--param", "moe.tokens=128", "--param", "moe.hidden=256", "--param", "moe.experts=16",
         "--param", "moe.topk=4"]


def host_layout(routing, experts, world, copies):
    return send_order(M.dispatch_layout(routing.topk_idx, experts, world, copies, weights=routing.weights))


def route(name="uniform", rank=0, world=4, tokens=333, experts=32, topk=4, **own):
    return M.make_routing(name, num_tokens=tokens, num_experts=experts, top_k=topk, rank=rank, world=world, seed=5,
                          **own)


# --- the token data: exact through fp8 ---------------------------------------------------

@pytest.mark.parametrize("hidden", [128, 512, 7168])
def test_fp8_round_trip_is_exact_with_power_of_two_scales(hidden):
    tokens = 64 if hidden == 7168 else 300
    for src in range(3):
        idx = torch.arange(tokens)
        x = tm.token_activations(src, idx, tokens, hidden)
        rows = tm.token_rows(src, idx, tokens, hidden, "fp8")
        assert rows.shape == (tokens, M.token_bytes(hidden, "fp8")) and rows.dtype == torch.uint8
        back = torch.empty(tokens, hidden, dtype=torch.bfloat16)
        tm.decode_rows(rows, hidden, "fp8", back)
        assert torch.equal(back.view(torch.int16), x.view(torch.int16))  # bit for bit
        # Each scale is amax / 448 exactly, and a power of two (no mantissa bits).
        scale = rows[:, hidden:].contiguous().view(torch.float32)
        amax = x.float().view(tokens, -1, 128).abs().amax(dim=2)
        assert torch.equal(scale, amax / 448.0)
        assert ((scale.view(torch.int32) & 0x7FFFFF) == 0).all()
        # The payload holds the integers x / scale, each a float8_e4m3fn value.
        q = rows[:, :hidden].contiguous().view(torch.float8_e4m3fn).float().view(tokens, -1, 128)
        assert torch.equal(q, x.float().view(tokens, -1, 128) / scale.unsqueeze(2))
        assert q.abs().max() == 448.0 and (q == q.round()).all()


def test_bf16_rows_are_the_activations_and_every_row_differs():
    tokens, hidden = 500, 256
    seen = set()
    for src in range(4):
        idx = torch.arange(tokens)
        x = tm.token_activations(src, idx, tokens, hidden)
        rows = tm.token_rows(src, idx, tokens, hidden, "bf16")
        assert torch.equal(rows.view(torch.bfloat16), x)
        for dtype in ("bf16", "fp8"):
            seen |= {(dtype, bytes(r)) for r in tm.token_rows(src, idx, tokens, hidden, dtype).numpy()}
    assert len(seen) == 2 * 4 * tokens  # a swapped or misplaced row always shows


def test_pow2_is_exact():
    e = torch.arange(-126, 128)
    assert torch.equal(tm.pow2(e).double(), torch.pow(2.0, e.double()))


# --- layout, regroup, reduce against the host path's numpy -------------------------------

@pytest.mark.parametrize("copies", ["rank", "expert"])
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("name,own", [("uniform", {}), ("zipf", {"alpha": 1.5}), ("hot_rank", {"ratio": 8.0}),
                                      ("group_limited", {"max_groups": 1})])
def test_device_layout_matches_host_layout(copies, world, name, own):
    r = route(name, rank=world - 1, world=world, **own)
    want = host_layout(r, 32, world, copies)
    got = tm.device_layout(torch.from_numpy(r.topk_idx), torch.from_numpy(r.weights), 32, world, copies)
    n = want.num_rows
    assert got.send_counts.tolist() == want.send_counts.tolist()
    assert torch.equal(got.send_token_idx[:n], torch.from_numpy(want.send_token_idx))
    if copies == "expert":
        assert torch.equal(got.send_weight, torch.from_numpy(want.send_weight))
        assert got.counts.tolist() == want.tokens_per_expert.tolist()
    else:
        assert got.send_weight is None and got.counts.tolist() == want.send_counts.tolist()


def test_count_is_bincount():
    idx = torch.tensor([3, 0, 3, 5, 3])
    assert tm.count(idx, 7).tolist() == np.bincount(idx.numpy(), minlength=7).tolist()


def test_regroup_index_matches_host_regroup():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (2, 2), (3, 5), (4, 8)]:
        for _ in range(10):
            m = rng.integers(0, 4, size=shape)
            got = tm.regroup_index(torch.from_numpy(m), int(m.sum()))
            assert got.tolist() == regroup_perm(m).tolist()


@pytest.mark.parametrize("copies", ["rank", "expert"])
def test_reduce_rows_matches_host_reduce(copies):
    r = route(tokens=200, world=4)
    lay = host_layout(r, 32, 4, copies)
    vals = np.random.default_rng(1).integers(-8, 8, size=(lay.num_rows, 16)).astype(np.float32)
    weighted = copies == "expert"
    out = torch.empty(200, 16)
    tm.reduce_rows(out, torch.from_numpy(vals).to(torch.bfloat16), torch.from_numpy(lay.send_token_idx),
                   torch.from_numpy(lay.send_weight) if weighted else None, torch.empty(7, 16))  # 7-row chunks
    want = M.combine_reduce(vals, lay, 200, weighted)
    assert np.allclose(out.numpy(), want, rtol=1e-6) if weighted else np.array_equal(out.numpy(), want)


# --- a whole exchange of several ranks in one process --------------------------------------

@pytest.mark.parametrize("copies", ["rank", "expert"])
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_simulated_ranks_round_trip(copies, dtype):
    """The engine's pure pieces in the order the engine runs them, the all-to-alls done by
    slicing: each rank's arrivals are its slices of every sender's packed rows."""
    world, tokens, hidden, experts = 3, 96, 256, 12
    local = experts // world if copies == "expert" else 1
    rt = [route("zipf", rank=s, world=world, tokens=tokens, experts=experts, alpha=1.2) for s in range(world)]
    lays = [tm.device_layout(torch.from_numpy(r.topk_idx), torch.from_numpy(r.weights), experts, world, copies)
            for r in rt]
    sent = []
    for s, lay in enumerate(lays):  # pack
        x = tm.token_rows(s, torch.arange(tokens), tokens, hidden, dtype)
        n = int(lay.send_counts.sum())
        sent.append(torch.index_select(x, 0, lay.send_token_idx[:n]).split(lay.send_counts.tolist()))
    counts = [torch.stack([lays[s].counts.view(world, local)[d] for s in range(world)]) for d in range(world)]
    outs = {}
    for d in range(world):  # arrive, unpack, identity experts, combine pack
        arrived = torch.cat([sent[s][d] for s in range(world)])
        n = arrived.shape[0]
        perm = tm.regroup_index(counts[d], n) if copies == "expert" else torch.arange(n)
        assert perm.tolist() == (regroup_perm(counts[d].numpy()).tolist() if copies == "expert" else list(range(n)))
        y = torch.empty(n, hidden, dtype=torch.bfloat16)
        tm.decode_rows(arrived[perm], hidden, dtype, y)
        back = torch.empty_like(y).index_copy_(0, perm, y)
        outs[d] = back.split([int(c) for c in counts[d].sum(dim=1)])
    for s, lay in enumerate(lays):  # combine: each sender's rows come back in its send order
        n = int(lay.send_counts.sum())
        rows = torch.cat([outs[d][s] for d in range(world)])
        out = torch.empty(tokens, hidden)
        w = lay.send_weight[:n] if lay.send_weight is not None else None
        tm.reduce_rows(out, rows, lay.send_token_idx[:n], w, torch.empty(10, hidden))
        host = host_layout(rt[s], experts, world, copies)
        x = tm.token_activations(s, torch.arange(tokens), tokens, hidden).double()
        expect = (x * torch.from_numpy(M.combine_factor(host, copies == "expert")).unsqueeze(1)).float()
        assert torch.allclose(out, expect, rtol=1e-5, atol=0) if w is not None else torch.equal(out, expect)


# --- the engine itself, at world 1, in this process ----------------------------------------



@pytest.mark.parametrize("copies", ["rank", "expert"])
def test_benchmark_runs_the_engine_at_world_1(gloo_world1, copies):
    from commbench.benchmarks.base import Point
    from commbench.benchmarks.moe import MoE

    comm = gloo_world1
    bench = MoE()
    params = {k: v.default for k, v in bench.params.items()}
    params.update(tokens=200, hidden=256, experts=8, topk=4, copies=copies)
    b = bench.setup(comm, Point("moe", 1, "", 0, params))
    assert b.path.name == "torch" and b.state.cpu_threads >= 1
    bench.fill(comm, b)
    seen = []
    bench.op(comm, b)()
    assert bench.check(comm, b)
    bench.dispatch(comm, b, lambda: seen.append("d"))
    bench.combine(comm, b, lambda: seen.append("c"))
    assert seen == ["d"] * 6 + ["c"] * 3
    assert b.state.send_split == [b.plan.layout.num_rows] and b.state.recv_split == [b.plan.n_recv]
    b.state.received[3] = b.state.received[4]  # one row lost under a copy of another
    assert not bench.check(comm, b)
    b.path.release(comm, b)


def test_the_benchmark_picks_one_engine_per_comm_and_kind_the_comm_knows_no_moe():
    from commbench.backends.base import Comm
    from commbench.backends.moe.torch_hierarchical import HierMoE
    from commbench.backends.moe.torch_low_latency import LowLatencyMoE
    from commbench.benchmarks.moe import MoE
    from commbench.benchmarks.moe.device import DevicePath
    from commbench.benchmarks.moe.engines import engine
    from commbench.benchmarks.moe.hierarchical import HierarchicalPath
    from commbench.benchmarks.moe.host import HostPath
    from commbench.benchmarks.moe.low_latency import LowLatencyPath

    # The backend interface speaks of collectives only.
    assert not [name for name in dir(Comm) if "moe" in name.lower()]
    host = Comm(0, 1)
    host.backend = "mpi"
    assert engine(host) is None and isinstance(MoE.path(host, {"mode": "normal", "path": "flat"}), HostPath)

    class TorchLike(Comm):  # what the torch engines read of a TorchComm
        backend, tdev = "gloo", torch.device("cpu")
    a, b = TorchLike(0, 1), TorchLike(0, 1)
    normal = engine(a)
    assert isinstance(normal, tm.TorchMoE) and engine(a) is normal and engine(a, "normal") is normal
    assert engine(b) is not normal  # one engine per comm
    ll, hier = engine(a, "low_latency"), engine(a, "hierarchical")
    assert isinstance(ll, LowLatencyMoE) and isinstance(hier, HierMoE)
    assert ll.engine is normal and hier.engine is normal  # built on the comm's normal engine
    assert engine(a, "low_latency") is ll and engine(a, "hierarchical") is hier
    chosen = {kind: MoE.path(a, {"mode": mode, "path": path})
              for kind, mode, path in (("normal", "normal", "flat"), ("low_latency", "low_latency", "flat"),
                                       ("hierarchical", "normal", "hierarchical"))}
    assert isinstance(chosen["normal"], DevicePath) and chosen["normal"].engine is normal
    assert isinstance(chosen["low_latency"], LowLatencyPath) and chosen["low_latency"].engine is ll
    assert isinstance(chosen["hierarchical"], HierarchicalPath) and chosen["hierarchical"].engine is hier
    with pytest.raises(ValueError, match="unknown moe engine kind"):
        engine(a, "mesh")


def test_moe_is_refused_only_where_it_cannot_run():
    from commbench.core.errors import UsageError
    from commbench.run import spec, suite

    cfg = suite.build_config(suite.read_suite("moe"))
    spec.check_backend(cfg, "nccl", "cuda")  # the device path
    spec.check_backend(cfg, "gloo", "cpu")
    with pytest.raises(UsageError, match="packs rows on the host on mpi"):
        spec.check_backend(cfg, "mpi", "cuda")


# --- gloo ranks through the CLI ----------------------------------------------------------

@pytest.mark.multirank
def test_gloo_torch_path_every_copy_and_dtype_at_2_and_4_ranks(tmp_path):
    out = tmp_path / "g"
    p = run_cli("run", "-b", "moe", "--backend", "gloo", "--np", 4, "--check", "--iters", 3, "--warmup", 1,
                "--out", out, *SMALL, "--param", "moe.copies=rank,expert", "--param", "moe.dispatch_dtype=fp8,bf16",
                "--param", "moe.routing=uniform,zipf", "--param", "moe.alpha=1.5")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = load(out)
    assert (df["check"] == "ok").all(), df[["world", "params", "stage", "check"]]
    assert set(df["world"]) == {2, 4} and len(df) == 2 * 2 * 2 * 2 * 2
    assert set(df["engine"]) == {"torch"} and set(df["payload_carried_as"]) == {"uint8"}
    assert df["pack_method"].str.contains("all_to_all_single").all()
    d = df[df["stage"] == "dispatch"]
    for s in ("layout", "counts", "sync", "pack", "a2a", "unpack"):
        assert (d[f"stage_us_{s}"] >= 0).all()
    assert set(d["dtype"]) == {"fp8", "bf16"}
    # Bytes from the host-side accounting: rows x token bytes of the dtype that ran.
    for _, r in d.iterrows():
        prm, w = r["params"], int(r["world"])
        from commbench.benchmarks.moe import MoE

        recv = M.global_layout(MoE().routing_for(prm, w), prm["experts"], w, prm["copies"]).sum(axis=0)
        assert r["logical_nbytes"] == recv.max() * M.token_bytes(prm["hidden"], prm["dispatch_dtype"])


@pytest.mark.parametrize("bench", ["moe_torch_drop_row", "moe_torch_misroute"])
@pytest.mark.multirank
def test_check_catches_dropped_and_misrouted_rows_on_the_torch_path(tmp_path, bench):
    out = tmp_path / "bad"
    p = run_cli("run", "-b", bench, "--backend", "gloo", "--np", 2, "--check", "--iters", 2, "--out", out,
                *[a.replace("moe.", f"{bench}.") for a in SMALL], "--param", f"{bench}.copies=rank,expert",
                env={"COMMBENCH_PLUGINS": "moe_drop_plugin"})
    assert p.returncode == 1 and "failed the data check" in p.stderr, p.stderr[-3000:]
    df = load(out)
    assert set(df["check"]) == {"fail"} and set(df["engine"]) == {"torch"} and len(df) == 4
