"""The moe benchmark's hierarchical path (benchmarks/moe/hierarchical.py, backends/moe/torch_hierarchical.py):
gloo ranks through the CLI as two 'nodes' of two ranks on this host, checks on, and the
bytes per tier against commbench.moe.accounting.hierarchical_rows recomputed here from the
seeded routing."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import commbench.moe as M
from commbench.backends.moe.torch_hierarchical import block_index
from commbench.benchmarks.moe.host import regroup_perm
from commbench.moe.accounting import hierarchical_rows
from commbench.store.load import load
from conftest import run_cli

TOKENS, HIDDEN, EXPERTS, TOPK = 64, 256, 8, 2
NODES = [0, 0, 1, 1]  # --ranks-per-node 2 at 4 ranks


def test_block_index_is_regroup_for_one_forwarder():
    rng = np.random.default_rng(0)
    for world, local in [(2, 3), (4, 2)]:
        m = rng.integers(0, 4, size=(world, local))
        blocks = torch.arange(world * local).view(1, world, local)
        got = block_index(torch.from_numpy(m).reshape(-1), blocks.permute(2, 1, 0).reshape(-1), int(m.sum()))
        assert got.tolist() == regroup_perm(m).tolist()


def test_block_index_orders_blocks_by_source_across_forwarders():
    # Two forwarders; forwarder 0 carries sources 0 and 2, forwarder 1 source 1.
    lens = torch.tensor([2, 0, 1,   0, 3, 0])  # (forwarder, source)
    order = torch.arange(6).view(2, 3).t().reshape(-1)
    assert block_index(lens, order, 6).tolist() == [0, 1, 3, 4, 5, 2]


def expected_rows(prm: dict) -> dict:
    """hierarchical_rows of every rank's seeded routing, as the run regenerates it."""
    own = {"groups": prm["groups"] or 4, "max_groups": prm["max_groups"]} if prm["routing"] == "group_limited" else {}
    topk = [M.make_routing(prm["routing"], num_tokens=prm["tokens"], num_experts=prm["experts"], top_k=prm["topk"],
                           rank=r, world=4, seed=prm["seed"], **own).topk_idx for r in range(4)]
    return hierarchical_rows(topk, prm["experts"], NODES, prm["copies"])


@pytest.mark.multirank
def test_hierarchical_on_gloo_two_nodes_of_two_ranks(tmp_path):
    out = tmp_path / "h"
    p = run_cli("run", "-b", "moe", "--backend", "gloo", "--np", 4, "--ranks-per-node", 2, "--check",
                "--iters", 2, "--warmup", 1, "--out", out, "--param", f"moe.tokens={TOKENS}",
                "--param", f"moe.hidden={HIDDEN}", "--param", f"moe.experts={EXPERTS}", "--param", f"moe.topk={TOPK}",
                "--param", "moe.path=flat,hierarchical", "--param", "moe.copies=rank,expert",
                "--param", "moe.routing=uniform,group_limited", "--param", "moe.max_groups=1",
                "--param", "moe.groups=2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = load(out)
    assert (df["check"] == "ok").all(), df[["world", "params", "stage", "check"]]
    assert set(df["engine"]) == {"torch"} and len(df) == 2 * 2 * 2 * 2 * 2
    hier = df[df["params"].map(lambda q: q["path"] == "hierarchical")]
    flat = df[df["params"].map(lambda q: q["path"] == "flat")]
    d = hier[hier["stage"] == "dispatch"]
    for s in ("layout", "counts", "sync", "a2a_out", "forward", "a2a_in", "unpack"):
        assert (d[f"stage_us_{s}"] >= 0).all()
    # One node at world 2: nothing crosses the scale-out tier.
    assert (hier[hier["world"] == 2]["scaleout_nbytes"] == 0).all()
    seen = set()
    for _, r in hier[hier["world"] == 4].iterrows():
        prm = r["params"]
        rows = expected_rows(prm)
        rb = M.token_bytes(HIDDEN, prm["dispatch_dtype"] if r["stage"] == "dispatch" else "bf16")
        assert r["scaleout_nbytes"] == rows["scaleout_recv_rows"].max() * rb
        assert r["scaleup_nbytes"] == rows["scaleup_recv_rows"].max() * rb
        assert r["flat_scaleout_nbytes"] == rows["flat_scaleout_recv_rows"].max() * rb
        # The flat figure beside it is what the flat path's own row reports.
        twin = flat[(flat["world"] == 4) & (flat["stage"] == r["stage"])
                    & flat["params"].map(lambda q, prm=prm: {**q, "path": "hierarchical"} == prm)]
        assert len(twin) == 1 and twin.iloc[0]["scaleout_nbytes"] == r["flat_scaleout_nbytes"]
        assert r["scaleout_nbytes"] <= r["flat_scaleout_nbytes"]
        if prm["routing"] == "group_limited":  # a token's experts all on one node: one NIC row
            assert r["scaleout_nbytes"] < r["flat_scaleout_nbytes"]
        meta = 4 * TOPK * (2 if prm["copies"] == "expert" else 1)
        want_meta = rows["scaleout_recv_rows"].max() * meta if r["stage"] == "dispatch" else 0
        assert r["scaleout_meta_nbytes"] == want_meta
        seen.add((prm["copies"], prm["routing"], r["stage"]))
    assert len(seen) == 8


@pytest.mark.multirank
def test_check_catches_a_row_lost_on_the_first_tier(tmp_path):
    out = tmp_path / "bad"
    bench = "moe_hier_drop_forwarded"
    p = run_cli("run", "-b", bench, "--backend", "gloo", "--np", 4, "--ranks-per-node", 2, "--check",
                "--iters", 2, "--out", out, "--param", f"{bench}.tokens={TOKENS}", "--param", f"{bench}.hidden={HIDDEN}",
                "--param", f"{bench}.experts={EXPERTS}", "--param", f"{bench}.topk={TOPK}",
                "--param", f"{bench}.path=hierarchical", "--param", f"{bench}.copies=rank,expert",
                env={"COMMBENCH_PLUGINS": "moe_hier_fault_plugin"})
    assert p.returncode == 1 and "failed the data check" in p.stderr, p.stderr[-3000:]
    df = load(out)
    assert set(df[df["world"] == 4]["check"]) == {"fail"} and set(df[df["world"] == 2]["check"]) == {"ok"}
