import os
from pathlib import Path

import pytest

from commbench.core.errors import UsageError
from commbench.run.suite import build_config, expand, list_suites, read_suite, resolve_worlds

F32 = ("float32", "float16", "int32")


def cfg(**kw):
    return build_config({"name": "t", "benchmarks": ["all_reduce"], **kw})


def test_every_shipped_suite_validates():
    assert {"quick", "collectives"} <= set(list_suites())
    for name in list_suites():
        points, _ = expand(build_config(read_suite(name)), 8, ("float32", "bfloat16", "float16", "int32"))
        assert points


def test_quick_suite_shape():
    c = build_config(read_suite("quick"))
    pts, _ = expand(c, 4, F32)
    assert {p.world for p in pts} == {2, 4}
    assert max(p.nbytes for p in pts) == 4 << 20 and min(p.nbytes for p in pts if p.nbytes) == 8
    assert {p.benchmark for p in pts} == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                          "broadcast", "send_recv", "barrier"}


def test_default_worlds_are_powers_of_two_plus_launch():
    assert resolve_worlds(cfg(), 8) == [2, 4, 8]
    assert resolve_worlds(cfg(), 6) == [2, 4, 6]
    assert resolve_worlds(cfg(max_world=4), 8) == [2, 4]
    with pytest.raises(UsageError, match="only 4 rank"):
        resolve_worlds(cfg(worlds=[8]), 4)


def test_cli_overrides_win():
    c = build_config({"name": "t", "benchmarks": ["all_reduce"], "iters": 5}, {"iters": 9, "benchmarks": ["barrier"]})
    assert c.iters == 9 and c.benchmarks == ("barrier",)


def test_rounding_and_rejection():
    c = cfg(benchmarks=["all_to_all"], sizes={"min": "24", "max": "24"})
    pts, notes = expand(c, 4, F32)  # 24 B over 4 ranks x 4 B: rounded to 16
    assert [p.nbytes for p in pts if p.world == 4] == [16]
    assert any("rounded down" in n for n in notes)
    with pytest.raises(UsageError, match="rejected"):
        expand(cfg(benchmarks=["all_to_all"], sizes=["24"]), 4, F32)
    pts, notes = expand(cfg(benchmarks=["all_to_all"], sizes=["8", "64"]), 4, F32)
    assert any("skipped" in n for n in notes)


@pytest.mark.parametrize("raw,msg", [
    ({"benchmarks": "all_reduce", "bogus": 1}, "unknown key 'bogus'"),
    ({"benchmarks": []}, "no benchmarks"),
    ({"benchmarks": ["all_reduce"], "sizes": []}, "empty list"),
    ({"benchmarks": ["all_reduce"], "sizes": {"min": "8"}}, "needs min and max"),
    ({"benchmarks": ["all_reduce"], "sizes": 8}, "must be a"),
    ({"benchmarks": ["all_reduce"], "dtypes": ["float8"]}, "unknown dtype"),
    ({"benchmarks": ["all_reduce"], "worlds": [0]}, "positive integers"),
    ({"benchmarks": ["all_reduce"], "iters": "many"}, "must be an integer"),
    ({"benchmarks": ["all_reduce"], "check": "yes"}, "true or false"),
    ({"benchmarks": ["all_reduce"], "min_time_ms": -1}, "positive"),
    ({"benchmarks": ["all_reduce"], "min_iters": 10, "max_iters": 5}, "min_iters"),
    ({"benchmarks": ["all_reduce"], "params": 3}, "table of tables"),
])
def test_bad_suites(raw, msg):
    with pytest.raises(UsageError, match=msg):
        build_config({"name": "t", **raw})


@pytest.mark.parametrize("kw,msg", [
    ({"benchmarks": ["nope"]}, "unknown benchmark"),
    ({"sizes": {"min": "4M", "max": "8"}}, "inverted"),
    ({"sizes": ["0"]}, "positive"),
    ({"dtypes": ["bfloat16"]}, "not supported"),
    ({"params": {"barrier": {"x": 1}}}, "does not run|unknown param"),
    ({"benchmarks": ["send_recv"], "worlds": [3]}, "even world"),
])
def test_impossible_sweeps(kw, msg):
    with pytest.raises(UsageError, match=msg):
        expand(cfg(**kw), 4, F32)


def test_keys_come_from_the_config_fields():
    from dataclasses import fields

    from commbench.run.suite import SuiteConfig, suite_keys

    keys = suite_keys()
    assert "variant" in keys and "variant_defs" not in keys and "name" not in keys
    assert all(keys.values()), "every key has its help"
    assert set(keys) == {f.metadata.get("key") or f.name for f in fields(SuiteConfig) if f.name != "name"}
    # the documentation names every one of them (the table of suite keys is in
    # docs/collectives.md; a key that belongs to one job may be described on its page)
    root = Path(__file__).resolve().parents[2]
    table = "".join(p.read_text() for p in sorted((root / "docs").glob("*.md")))
    missing = [k for k in keys if f"`{k}`" not in table and f"`[{k}.NAME]`" not in table and f"`[{k}.BENCH]`" not in table]
    assert not missing, missing


def test_defaults_and_types_are_the_fields():
    c = cfg()
    assert (c.iters, c.warmup, c.min_time_ms, c.timing, c.variants, c.dtypes) == (0, 5, 50.0, "back_to_back",
                                                                                 ("default",), ("float32",))
    c = cfg(benchmarks="barrier", dtypes="int32", worlds=4, variants="default", timeout_s=2, min_time_ms=7)
    assert (c.benchmarks, c.dtypes, c.worlds, c.variants) == (("barrier",), ("int32",), (4,), ("default",))
    assert isinstance(c.timeout_s, float) and isinstance(c.min_time_ms, float)


@pytest.mark.parametrize("raw,msg", [
    ({"timing": "sideways"}, "suite key 'timing' must be one of back_to_back, barrier"),
    ({"backend": "pigeon"}, "suite key 'backend' must be one of mpi, gloo, nccl"),
    ({"iters": True}, "'iters' must be an integer"),
    ({"iters": -1}, "'iters' must be >= 0"),
    ({"timeout_s": "soon"}, "'timeout_s' must be a number of seconds"),
    ({"cuda_graph": 1}, "'cuda_graph' must be true or false"),
    ({"profile": 3}, "'profile' must be a profile name or path"),
    ({"benchmarks": [1]}, "'benchmarks' must be a list of names"),
    ({"variants": []}, "'variants' must be a non-empty list of names"),
    ({"params": {"moe": 3}}, "table of tables"),
    ({"baseline": "ompi-ring"}, "baseline variant 'ompi-ring' is not among the variants run"),
    ({"baseline": {"pigeon": "default"}}, "'baseline' must be a variant name or a table"),
    ({"variants": ["default", "nccl-ring"], "baseline": {"nccl": "ompi-ring"}}, "'ompi-ring' is not among"),
])
def test_bad_keys_say_which_and_why(raw, msg):
    with pytest.raises(UsageError, match=msg):
        build_config({"name": "t", "benchmarks": ["all_reduce"], **raw})


def test_cli_params_merge_into_the_suite_ones():
    c = build_config({"name": "t", "benchmarks": ["moe"], "params": {"moe": {"tokens": 8, "topk": 2}}},
                     {"params": {"moe": {"tokens": 16}}})
    assert c.params == {"moe": {"tokens": 16, "topk": 2}}


# --- variant planning: pure, so the GPU cases need no GPU -------------------------------

def test_inswitch_baseline_is_the_ring_of_the_backend_that_runs():
    from commbench.run.variants import plan

    inswitch = build_config(read_suite("inswitch"))
    on_nccl = plan(inswitch, "nccl", "cuda", caps={"nvls": True, "collnet": True, "symm_mem": True})
    assert on_nccl.baseline == "nccl-ring" and not on_nccl.note
    assert [v.name for v in on_nccl.runnable] == ["default", "nccl-ring", "nccl-tree", "nccl-nvls", "nccl-nvlstree",
                                                  "nccl-collnet", "symm-mem"]
    assert set(on_nccl.skipped) == {"ompi-ring", "ompi-recursive-doubling", "ompi-rabenseifner"}
    assert plan(inswitch, "nccl", "cuda").baseline == "nccl-ring"  # NVLS etc. skipped without the capability
    on_mpi = plan(inswitch, "mpi", "cpu", mpi_flavor="Open MPI")
    assert on_mpi.baseline == "ompi-ring" and [v.name for v in on_mpi.runnable] == [
        "default", "ompi-ring", "ompi-recursive-doubling", "ompi-rabenseifner"]
    assert plan(inswitch, "gloo", "cpu").baseline == "default"


def test_a_baseline_that_cannot_run_here_gives_way_and_says_so():
    from commbench.run.variants import plan

    c = cfg(variants=["default", "nccl-ring", "ompi-ring"], baseline="ompi-ring")
    p = plan(c, "nccl", "cuda")
    assert p.baseline == "nccl-ring" and "baseline ompi-ring cannot run here" in p.note
    assert plan(c, "mpi", "cpu", mpi_flavor="Open MPI").baseline == "ompi-ring"


def test_one_requested_variant_may_be_a_builtin_the_suite_does_not_list():
    from commbench.run.variants import plan

    p = plan(cfg(), "mpi", "cpu", requested="ompi-linear", mpi_flavor="Open MPI")
    assert p.names == ["ompi-linear"] and not p.skipped
    assert "needs CUDA" in plan(cfg(), "nccl", "cpu", requested="nccl-ring").skipped["nccl-ring"]
    with pytest.raises(UsageError, match="unknown variant 'warp-drive'"):
        plan(cfg(), "mpi", "cpu", requested="warp-drive")
    own = build_config({"name": "t", "benchmarks": ["all_reduce"], "variants": ["mine"],
                        "variant": {"mine": {"backend": "mpi", "env": {"OMPI_A": "1"}}}})
    assert plan(own, "mpi", "cpu").runnable[0].env == {"OMPI_A": "1"}
    assert "backend mpi" in plan(own, "gloo", "cpu").skipped["mine"]


# --- where suites are found -------------------------------------------------------------

def test_suites_ship_in_the_package_and_user_ones_come_first(tmp_path, monkeypatch):
    from commbench.run import suite

    assert (suite.PACKAGE_SUITES / "quick.toml").is_file() and suite.PACKAGE_SUITES.parent.name == "commbench"
    monkeypatch.chdir(tmp_path)
    assert suite.find_suite("quick") == suite.PACKAGE_SUITES / "quick.toml"
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "quick.toml").write_text('benchmarks = ["barrier"]\n')
    (tmp_path / "suites" / "mine.toml").write_text('benchmarks = ["barrier"]\n')
    assert build_config(read_suite("quick")).benchmarks == ("barrier",)  # ./suites wins over the package
    assert {"mine", "quick", "collectives"} <= set(list_suites())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.toml").write_text('benchmarks = ["broadcast"]\n')
    single = tmp_path / "solo.toml"
    single.write_text('benchmarks = ["send_recv"]\n')
    monkeypatch.setenv(suite.SUITES_ENV, f"{elsewhere}{os.pathsep}{single}")
    assert build_config(read_suite("mine")).benchmarks == ("broadcast",)
    assert build_config(read_suite("solo")).benchmarks == ("send_recv",)
    assert build_config(read_suite(str(single))).benchmarks == ("send_recv",)


def test_default_backend_is_never_one_that_does_not_work(monkeypatch):
    from commbench import backends

    works = {"mpi": False, "gloo": True, "nccl": False}
    monkeypatch.setattr(backends, "availability", lambda n: (works[n], ""))
    monkeypatch.setattr(backends, "gpu_visible", lambda: False)
    assert backends.default_backend() == "gloo"
    works["gloo"] = False
    assert backends.default_backend() is None
    works.update(mpi=True, nccl=True)
    assert backends.default_backend() == "mpi"
    monkeypatch.setattr(backends, "gpu_visible", lambda: True)
    assert backends.default_backend() == "nccl"


def test_a_benchmark_named_twice_runs_once():
    from commbench.run import suite

    cfg = suite.build_config(suite.read_suite("quick"), {"benchmarks": ["all_reduce", "all_gather", "all_reduce"]})
    assert cfg.benchmarks == ("all_reduce", "all_gather")
