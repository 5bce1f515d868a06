"""Algorithm variants: validation, availability, the speedup/crossover maths, and real
Open MPI variants on the loopback, each launched separately into one run."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

import commbench
from commbench.analyse.speedups import crossover_nbytes, pick_baseline, wire_gbps
from commbench.core.errors import UsageError
from commbench.run import launcher
from commbench.run.variants import (
    BUILTIN,
    nccl_algorithms,
    ompi_selected_component,
    parse_suite_variants,
    requested_ompi_component,
    resolve,
    unavailable,
)
from commbench.store.record import overall_status
from conftest import ROOT, needs_mpi, run_cli, run_meta, run_rows


def test_resolve_refuses_unknown_empty_and_duplicate():
    assert [v.name for v in resolve(["default", "ompi-ring"])] == ["default", "ompi-ring"]
    for names, words in ((["nope"], "unknown variant 'nope'"), ([""], "empty name"),
                         (["ompi-ring", "ompi-ring"], "named twice")):
        with pytest.raises(UsageError, match=words):
            resolve(names)


def test_suite_variant_tables_are_checked():
    v = parse_suite_variants({"mine": {"env": {"OMPI_A": 1}, "backend": "mpi", "inswitch": True}}, "s")["mine"]
    assert v.env == {"OMPI_A": "1"} and v.backend == "mpi" and v.inswitch
    for table, words in (({"x": {"envv": {}}}, "unknown key 'envv'"), ({"x": {"backend": "carrier"}}, "unknown backend"),
                         ({"": {}}, "empty name"), ({"x": {"requires": ["warp-drive"]}}, "requires"),
                         ({"x": {"env": ["A=1"]}}, "'env'")):
        with pytest.raises(UsageError, match=words):
            parse_suite_variants(table, "s")


def test_what_cannot_run_here_says_why():
    assert "needs CUDA" in unavailable(BUILTIN["nccl-ring"], "nccl", "cpu")
    assert "backend nccl" in unavailable(BUILTIN["nccl-nvls"], "mpi", "cpu")
    assert "NVLink SHARP" in unavailable(BUILTIN["nccl-nvls"], "nccl", "cuda")
    assert unavailable(BUILTIN["nccl-nvls"], "nccl", "cuda", caps={"nvls": True}) is None
    assert unavailable(BUILTIN["symm-mem"], "nccl", "cuda", caps={"symm_mem": "no multicast"}) == "no multicast"
    assert "MPICH" in unavailable(BUILTIN["mpich-ring"], "mpi", "cpu", "Open MPI")
    assert unavailable(BUILTIN["ompi-ring"], "mpi", "cpu", "Open MPI") is None
    assert unavailable(BUILTIN["default"], "gloo", "cpu") is None


def test_speedup_crossover_and_wire_maths():
    # speedups by size: loses small, wins from 1M up (a dip at 4K does not count)
    assert crossover_nbytes([8, 4096, 65536, 1 << 20, 1 << 24], [0.5, 1.2, 0.9, 1.1, 1.6]) == 1 << 20
    assert crossover_nbytes([8, 64], [0.9, 0.8]) is None
    assert crossover_nbytes([8, 64], [1.1, 1.2]) == 8
    assert wire_gbps(100.0, 8, True, 175.0) == pytest.approx(112.5)  # algbw * 9/8
    assert wire_gbps(100.0, 8, False, 175.0) == 175.0
    assert pick_baseline(["default", "nccl-nvls", "nccl-ring"]) == "nccl-ring"
    assert pick_baseline(["default", "x"]) == "default"
    with pytest.raises(UsageError):
        pick_baseline(["default"], "ompi-ring")
    assert overall_status({"a": {"status": "complete"}, "b": {"status": "skipped"}}) == "complete"
    assert overall_status({"a": {"status": "complete"}, "b": {"status": "check_failed"}}) == "check_failed"


def test_what_the_library_says():
    log = "\n".join([
        "[vm:1] coll:base:comm_select: new communicator: MPI_COMM_WORLD (cid 0)",
        "[vm:1] coll:base:comm_select: selecting basic, priority 10, Enabled",
        "[vm:1] coll:base:comm_select: selecting han, priority 35, Disabled",
        "[vm:1] coll:base:comm_select: selecting tuned, priority 30, Enabled",
        "[vm:1] coll:base:comm_select: new communicator: MPI_COMM_SELF (cid 1)",
        "[vm:1] coll:base:comm_select: selecting self, priority 75, Enabled"])
    assert ompi_selected_component(log) == "tuned"
    assert requested_ompi_component(BUILTIN["ompi-ring"].env) == "tuned"
    assert nccl_algorithms("host:1:2 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo 4 proto 2 time 15.1\n"
                           "x NCCL INFO Broadcast: opCount 0 Algo Ring") == {"NVLS", "Ring"}


SUITE = """benchmarks = ["all_reduce", "all_gather"]
sizes = ["8", "64K"]
worlds = [2]
check = true
min_time_ms = 5
variants = ["default", "ompi-ring", "ompi-recursive-doubling", "nccl-nvls", "han-ring"]
baseline = "ompi-ring"
[variant.han-ring]
description = "asks coll/han for its allreduce algorithm, which disqualifies itself on one node"
backend = "mpi"
env = { OMPI_MCA_coll_han_use_allreduce_algorithm = "1" }
"""


@needs_mpi
@pytest.mark.multirank
def test_variants_launch_separately_into_one_run(tmp_path):
    (tmp_path / "v.toml").write_text(SUITE)
    out = tmp_path / "run"
    r = run_cli("run", tmp_path / "v.toml", "--np", "2", "--out", out, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # one launch per runnable variant, each announced; the GPU one skipped with its reason
    for name in ("default", "ompi-ring", "ompi-recursive-doubling", "han-ring"):
        assert f"variant {name}: " in r.stdout
    assert "variant nccl-nvls: skipped: a variant for backend nccl" in r.stdout
    df = commbench.load(out)
    assert set(df["variant"]) == {"default", "ompi-ring", "ompi-recursive-doubling", "han-ring"}
    assert (df["check"] == "ok").all()
    ring = df[df["variant"] == "ompi-ring"].iloc[0]
    assert ring["variant_env"]["OMPI_MCA_coll_tuned_allreduce_algorithm"] == "4"
    meta = run_meta(out)
    assert meta["status"] == "complete"
    vs = meta["variants"]
    assert vs["nccl-nvls"]["status"] == "skipped" and "nccl" in vs["nccl-nvls"]["reason"]
    assert vs["ompi-ring"]["library"] == {"asked": "coll/tuned", "used": "coll/tuned", "scope": "MPI_COMM_WORLD",
                                          "mismatch": False}
    # han disqualifies itself on one node: the variant did not get what it asked for, and says so
    assert vs["han-ring"]["library"]["mismatch"] is True
    assert "asked for coll/han but the library used coll/tuned" in r.stdout
    # side-by-side report with speedups and crossover, from the run and from disk
    # One run each: no speedup or slowdown is claimed, and the line says what would judge it.
    assert "variants side by side (baseline ompi-ring)" in r.stdout
    assert re.search(r"vs ompi-ring: cannot judge: one run each \(--repeat 3 to judge\)", r.stdout), r.stdout[-3000:]
    assert "clearly" not in r.stdout
    rep = run_cli("report", out)
    assert rep.returncode == 0 and "variants side by side" in rep.stdout and "nccl-nvls: skipped" in rep.stdout


@needs_mpi
@pytest.mark.multirank
def test_external_launcher_runs_one_variant_per_launch(tmp_path):
    out = tmp_path / "run"
    base = ["run", "quick", "-b", "all_reduce", "--sizes", "64K", "--worlds", "2", "--out", str(out)]
    for v in ("ompi-ring", "default"):
        cmd = launcher.mpirun_command(2, base + ["--variant", v])
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
    df = commbench.load(out)
    assert sorted(df["variant"]) == ["default", "ompi-ring"]
    # the same variant again would overwrite: refused
    p = subprocess.run(launcher.mpirun_command(2, base + ["--variant", "default"]), cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "already holds a run" in p.stderr
    # several variants under a launcher (without --np, no launcher, `run` starts the ranks itself): one per launch
    r = run_cli("run", "inswitch", env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert r.returncode == 2 and "--variant NAME" in r.stderr


@pytest.mark.multirank
def test_list_variants_prints_the_suite_names():
    r = run_cli("run", "inswitch", "--list-variants")
    assert r.returncode == 0 and r.stdout.split() == ["default", "nccl-ring", "nccl-tree", "nccl-nvls", "nccl-nvlstree",
                                                      "nccl-collnet", "symm-mem", "ompi-ring",
                                                      "ompi-recursive-doubling", "ompi-rabenseifner"]


@needs_mpi
@pytest.mark.multirank
def test_resume_reruns_only_the_unfinished_variant(tmp_path):
    suite = tmp_path / "v.toml"
    suite.write_text('benchmarks = ["all_reduce"]\nsizes = ["8", "64K"]\nworlds = [2]\ncheck = true\n'
                     'min_time_ms = 5\nvariants = ["default", "ompi-ring"]\n')
    out = tmp_path / "run"
    assert run_cli("run", suite, "--np", "2", "--out", out).returncode == 0
    # Make it look as if the ompi-ring launch died after its first point.
    rows = run_rows(out)
    keep = [r for r in rows if r["variant"] == "default"] + [r for r in rows if r["variant"] == "ompi-ring"][:1]
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep))
    meta = run_meta(out)
    meta["status"] = "failed"
    meta["variants"]["ompi-ring"]["status"] = "failed"
    (out / "meta.json").write_text(json.dumps(meta))
    r = run_cli("run", "--resume", out, "--np", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resume: 1 of 2 points already" in r.stdout
    df = commbench.load(out)
    assert sorted(df["variant"]) == ["default", "default", "ompi-ring", "ompi-ring"]
    ring = df[df["variant"] == "ompi-ring"]
    assert ring["variant_env"].iloc[-1]["OMPI_MCA_coll_tuned_allreduce_algorithm"] == "4"
    meta = run_meta(out)
    assert meta["status"] == "complete" and meta["variants"]["ompi-ring"]["status"] == "complete"


@needs_mpi
@pytest.mark.multirank
def test_a_later_variant_runs_longer_than_the_drain_bound_to_its_end(tmp_path):
    """Each variant is its own launch into one run directory: the `complete` the first one
    wrote is not the second launch's, which must run its whole sweep (longer than the
    launcher's drain bound, max(GRACE_S, --timeout)) and not be stopped as already marked."""
    from commbench.run.launcher import GRACE_S

    suite = tmp_path / "v.toml"
    suite.write_text('benchmarks = ["all_reduce_fault"]\nsizes = ["8", "1K", "4K", "16K", "64K"]\nworlds = [2]\n'
                     'iters = 2\nwarmup = 1\ntimeout_s = 8\nvariants = ["default", "ompi-ring"]\n')
    slow_s = 2.5  # per point: 5 points a variant take 12.5 s, past the drain bound
    assert 5 * slow_s > max(GRACE_S, 8)
    out = tmp_path / "run"
    r = run_cli("run", suite, "--np", "2", "--out", out, timeout=300,
                env={"COMMBENCH_PLUGINS": "fault_plugin", "COMMBENCH_SLOW_SETUP_S": str(slow_s)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "after the run was marked" not in r.stderr
    df = commbench.load(out)
    assert sorted(df.groupby("variant").size().items()) == [("default", 5), ("ompi-ring", 5)]
    meta = run_meta(out)
    assert meta["status"] == "complete" and "teardown" not in meta


@needs_mpi
@pytest.mark.multirank
def test_variants_with_repeats_alternate_repeat_by_repeat_and_a_lost_launch_resumes(tmp_path):
    """`--repeat 2` over two variants: four launches, A1 B1 A2 B2 (rows in that order), each
    launch with the repeats up to its own; after the first round of launches the variants are
    unfinished (a launcher lost there leaves a run that --resume completes)."""
    suite = tmp_path / "v.toml"
    suite.write_text('benchmarks = ["all_reduce"]\nsizes = ["8", "64K"]\nworlds = [2]\ncheck = true\n'
                     'min_time_ms = 5\nvariants = ["default", "ompi-ring"]\n')
    out = tmp_path / "run"
    r = run_cli("run", suite, "--np", "2", "--repeat", "2", "--out", out, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.findall(r"variant (\S+) \(repeat (\d) of 2\)", r.stdout) == [
        ("default", "1"), ("ompi-ring", "1"), ("default", "2"), ("ompi-ring", "2")]
    rows = run_rows(out)
    assert [(x["variant"], x["repeat"]) for x in rows] == [
        ("default", 1), ("default", 1), ("ompi-ring", 1), ("ompi-ring", 1),
        ("default", 2), ("default", 2), ("ompi-ring", 2), ("ompi-ring", 2)]
    meta = run_meta(out)
    assert meta["status"] == "complete" and meta["repeat"] == 2
    assert {v["status"] for v in meta["variants"].values()} == {"complete"}

    # The launcher lost after the first round: every variant has repeat 1 only.
    (out / "rows.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows if x["repeat"] == 1))
    for v in meta["variants"].values():
        v["status"] = "interrupted"
    meta["status"] = "interrupted"
    (out / "meta.json").write_text(json.dumps(meta))
    r = run_cli("run", "--resume", out, "--np", "2", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = run_rows(out)
    assert sorted((x["variant"], x["repeat"], x["nbytes"]) for x in rows) == sorted(
        (v, k, n) for v in ("default", "ompi-ring") for k in (1, 2) for n in (8, 65536))
    assert run_meta(out)["status"] == "complete"
