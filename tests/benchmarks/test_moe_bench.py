"""The MoE dispatch/combine benchmark: pure parts, real ranks, and bad parameters."""

import numpy as np
import pytest

import commbench.moe as M
from commbench.benchmarks.moe import MoE
from commbench.benchmarks.moe.host import _bf16, _from_bf16, reduce_bf16_rows, regroup_perm, send_order, token_value
from commbench.store.load import load
from conftest import needs_mpi, needs_torch, run_cli, run_meta

SMALL = ["--param", "moe.tokens=64", "--param", "moe.hidden=256", "--param", "moe.experts=16",
         "--param", "moe.topk=4", "--param", "moe.max_groups=2"]
ROUTINGS = "uniform,balanced,zipf,hot_rank,group_limited"


def test_regroup_perm_orders_by_expert_then_source():
    counts = np.array([[2, 1], [0, 3]])  # [src, local expert]
    # received: s0e0 s0e0 s0e1 | s1e1 s1e1 s1e1 -> e0: s0 s0 ; e1: s0 s1 s1 s1
    assert regroup_perm(counts).tolist() == [0, 1, 2, 3, 4, 5]
    counts = np.array([[1, 1], [1, 1]])
    assert regroup_perm(counts).tolist() == [0, 2, 1, 3]


@pytest.mark.parametrize("copies", ["rank", "expert"])
def test_reduce_bf16_rows_matches_reference(copies):
    r = M.make_routing("uniform", num_tokens=200, num_experts=32, top_k=4, rank=0, world=4, seed=3)
    lay = send_order(M.dispatch_layout(r.topk_idx, 32, 4, copies, weights=r.weights))
    rows = np.random.default_rng(0).integers(-8, 8, size=(lay.num_rows, 16)).astype(np.float32)
    weighted = copies == "expert"
    got = reduce_bf16_rows(_bf16(rows), lay, 200, weighted, block_tokens=7)
    assert np.allclose(got, M.combine_reduce(rows, lay, 200, weighted), rtol=1e-6)


def test_token_values_are_exact_in_bf16():
    v = token_value(np.arange(64)[:, None], np.arange(500)[None, :]).ravel()
    assert np.array_equal(_from_bf16(_bf16(v)), v)


def test_skew_axes_do_not_duplicate_points():
    b = MoE()
    p = {k: v.default for k, v in b.params.items()}
    assert b.canonical_params({**p, "routing": "uniform", "alpha": 1.5}) == {**p, "routing": "uniform"}
    assert b.canonical_params({**p, "routing": "zipf", "alpha": 1.5})["alpha"] == 1.5


def _run(tmp_path, backend, np_, extra):
    out = tmp_path / f"{backend}{np_}"
    p = run_cli("run", "-b", "moe", "--backend", backend, "--np", np_, "--check", "--iters", 3, "--warmup", 1,
                "--out", out, *SMALL, *extra)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, load(out)


def _assert_rows(df, routings, np_):
    assert (df["check"] == "ok").all(), df[["world", "params", "stage", "check"]]
    assert set(df["stage"]) == {"dispatch", "combine"}
    got = {(p["routing"], p["copies"]) for p in df["params"]}
    assert got == {(r, c) for r in routings for c in ("rank", "expert")}
    for col in ("logical_nbytes", "remote_nbytes", "scaleup_nbytes", "scaleout_nbytes", "logical_gbps",
                "load_max_over_mean", "hottest_rank", "stage_us_a2a", "outside_a2a_pct"):
        assert col in df.columns, col
    assert (df["logical_nbytes"] >= df["remote_nbytes"]).all()
    assert (df["remote_nbytes"] == df["scaleup_nbytes"] + df["scaleout_nbytes"]).all()
    assert (df["load_max_over_mean"] >= 1.0).all()
    d = df[df["stage"] == "dispatch"]
    assert (d["dtype"] == "fp8").all() and (df[df["stage"] == "combine"]["dtype"] == "bf16").all()


@needs_mpi
@pytest.mark.multirank
def test_mpi_every_routing_both_copies(tmp_path):
    out, df = _run(tmp_path, "mpi", 4, ["--param", f"moe.routing={ROUTINGS}", "--param", "moe.copies=rank,expert"])
    _assert_rows(df, ROUTINGS.split(","), 4)
    assert set(df["world"]) == {2, 4}
    assert set(df["engine"]) == {"host"} and df["pack_method"].str.startswith("MPI_Alltoallw").all()


@needs_mpi
@pytest.mark.multirank
def test_bytes_and_bandwidth_match_the_layout(tmp_path):
    """logical bytes = the most loaded rank's received rows x token bytes; GB/s = bytes / p50."""
    out, df = _run(tmp_path, "mpi", 4, [])
    for _, r in df.iterrows():
        p, w = r["params"], int(r["world"])
        make = MoE().routing_for(p, w)
        recv_rows = M.global_layout(make, p["experts"], w, p["copies"]).sum(axis=0)
        tb = M.token_bytes(p["hidden"], "fp8" if r["stage"] == "dispatch" else "bf16")
        assert r["logical_nbytes"] == recv_rows.max() * tb
        assert r["logical_gbps"] == pytest.approx(r["logical_nbytes"] / (r["time_us_p50"] * 1e-6) / 1e9)
        assert r["load_max_over_mean"] == pytest.approx(recv_rows.max() / recv_rows.mean())


@needs_torch
@pytest.mark.multirank
def test_gloo_every_routing_both_copies(tmp_path):
    out, df = _run(tmp_path, "gloo", 2, ["--param", f"moe.routing={ROUTINGS}", "--param", "moe.copies=rank,expert"])
    _assert_rows(df, ROUTINGS.split(","), 2)
    assert set(df["engine"]) == {"torch"}  # gloo runs the device path, on CPU tensors


@needs_mpi
@pytest.mark.multirank
def test_two_tiers_on_one_host(tmp_path):
    out, df = _run(tmp_path, "mpi", 4, ["--worlds", "4", "--ranks-per-node", "2"])
    assert (df["scaleout_nbytes"] > 0).all() and (df["scaleup_nbytes"] > 0).all()
    assert run_meta(out)["nodes"] == [0, 0, 1, 1]


@needs_mpi
@pytest.mark.parametrize("bench", ["moe_drop_row", "moe_misroute"])
@pytest.mark.multirank
def test_check_catches_dropped_and_misrouted_rows(tmp_path, bench):
    """The host path (mpi); tests/backends/test_moe_torch.py has the torch path's."""
    out = tmp_path / "bad"
    p = run_cli("run", "-b", bench, "--backend", "mpi", "--np", 2, "--check", "--iters", 2, "--out", out,
                *[a.replace("moe.", f"{bench}.") for a in SMALL], env={"COMMBENCH_PLUGINS": "moe_drop_plugin"})
    assert p.returncode != 0 and "failed the data check" in p.stderr
    assert set(load(out)["check"]) == {"fail"}


@pytest.mark.parametrize("params,msg", [
    (["moe.experts=6"], "not divisible by world"),
    (["moe.topk=20"], "exceeds num_experts"),
    (["moe.routing=group_limited", "moe.max_groups=8"], "exceeds groups"),
    (["moe.routing=zipf", "moe.alpha=-0.5"], "must be >= 0.0"),
    (["moe.routing=hot_rank", "moe.ratio=0.5"], "must be >= 1.0"),
    (["moe.copies=both"], "not one of"),
    (["moe.hidden=100"], "hidden divisible by 128"),
])
@pytest.mark.multirank
def test_bad_moe_params_exit_2_before_launch(tmp_path, params, msg):
    args = ["run", "-b", "moe", "--np", 4, "--param", "moe.tokens=64", "--param", "moe.experts=16",
            "--param", "moe.topk=4", "--param", "moe.hidden=256"]
    for p in params:
        args += ["--param", p]
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "results").exists()


@needs_mpi
@pytest.mark.multirank
def test_a_moe_runs_stages_are_not_taken_for_duplicates_but_a_doubled_row_is(tmp_path):
    """A MoE point is measured once and kept as one row per stage (dispatch, combine), under
    one point_key: report, compare and load say nothing about duplicates for a real run, and
    still say it for a row that really is there twice."""
    import shutil

    out = tmp_path / "moe"
    p = run_cli("run", "moe", "--backend", "mpi", "--np", 2, "--iters", 3, "--warmup", 1, "--out", out, *SMALL)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "more than once" not in p.stderr
    said = []
    df = load(out, warn=said.append)
    assert set(df["stage"]) == {"dispatch", "combine"} and df["point_key"].duplicated().any()
    assert said == []
    r = run_cli("report", out)
    assert r.returncode == 0 and "more than once" not in r.stderr, r.stderr
    again = tmp_path / "moe2"
    shutil.copytree(out, again)
    r = run_cli("compare", out, again, "--all")
    assert r.returncode == 0 and "more than once" not in r.stdout + r.stderr, r.stdout + r.stderr

    lines = (again / "rows.jsonl").read_text().splitlines()
    (again / "rows.jsonl").write_text("\n".join(lines + lines[1:2]) + "\n")  # one combine row twice
    said = []
    load(again, warn=said.append)
    assert len(said) == 1 and "1 point(s) appear more than once" in said[0], said
    r = run_cli("report", again)
    assert "1 point(s) appear more than once" in r.stderr, r.stderr
    r = run_cli("compare", out, again)
    assert r.returncode == 2 and "more than once" in r.stderr, r.stderr
