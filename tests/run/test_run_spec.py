"""The run's spec (run/spec.py): built once from the command line or from a saved run, the
same either way; a bad field refused in one line; ranks that disagree refused; the sweep
expanded once a process; a launcher's ranks read its spec; a resume continues it."""
import json
import os

import pytest

from commbench.cli import build_parser, profile_overrides
from commbench.commands import run
from commbench.core.errors import UsageError
from commbench.run import rank_run, resume, suite
from commbench.run import spec as spec_mod
from commbench.store.record import RunRecord

LAUNCH_VARS = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_NTASKS",
               "SLURM_PROCID", "WORLD_SIZE", "RANK", "LOCAL_RANK", "COMMBENCH_LAUNCHER_PID", "COMMBENCH_LAUNCH_ID",
               "COMMBENCH_RUN_LOCK", "COMMBENCH_REPEAT_UPTO")


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch):
    """Not inside a launch, whatever the shell running the tests has set; what the code
    under test sets in the environment (a launcher's lock) is undone after."""
    for k in LAUNCH_VARS:
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)


def _args(*words):
    argv = ["run", *map(str, words)]
    args = build_parser().parse_args(argv)
    return args, argv


def _spec(*words):
    args, argv = _args(*words)
    return run.from_command_line(args, argv, profile_overrides(args))


def _count_expand(monkeypatch) -> list:
    calls = []
    real = suite.expand

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)
    monkeypatch.setattr(suite, "expand", counted)
    return calls


QUICK = ("quick", "-b", "all_reduce,moe", "--sizes", "8:1K:4", "--backend", "gloo", "--np", "2",
         "--param", "tokens=64,128", "--profile", "loopback", "--scaleup-GBps", "12")


def test_the_spec_from_the_command_line_and_from_the_saved_run_are_one(tmp_path):
    out = tmp_path / "r"
    spec = _spec(*QUICK, "--out", out)
    assert spec.config.sizes.nbytes == (8, 32, 128, 512) and spec.config.sizes.from_range  # parsed: bytes
    assert spec.config.params == {"moe": {"tokens": [64, 128]}}  # --param given to the benchmark that has it
    assert spec.world == 2 and spec.np == 2 and spec.backend == "gloo" and spec.out == str(out)
    assert spec.profile is not None and spec.profile.scaleup_line_gbps == 12.0  # loaded, overridden
    RunRecord(out).write_spec(spec.to_dict())
    assert json.loads(json.dumps(spec.to_dict())) == spec.to_dict()  # plain JSON values
    assert spec_mod.from_saved(out) == spec
    assert spec_mod.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("field,value,said", [
    ("world", 0, "world must be an integer >= 1"),
    ("backend", "carrier-pigeon", "backend must be one of"),
    ("colour", "blue", "unknown field 'colour'"),
    ("config", {"name": "quick", "benchmarks": ["all_reduce"], "sizes": {"nbytes": [8, -1], "from_range": False}},
     "positive sizes in bytes"),
    ("profile", {"name": "loopback", "scaleup_line_gbps": "fast"}, "profile field scaleup_line_gbps"),
    ("profile", {"name": "loopback", "warp_factor": 9}, "unknown profile field 'warp_factor'"),
    ("version", 99, "version 99"),
])
def test_a_bad_field_is_refused_in_one_line(tmp_path, field, value, said):
    d = _spec(*QUICK, "--out", tmp_path / "r").to_dict()
    d[field] = value
    with pytest.raises(UsageError) as e:
        spec_mod.from_dict(d)
    assert said in str(e.value) and "\n" not in str(e.value)
    del d[field]
    if field != "colour":
        with pytest.raises(UsageError, match=f"no field '{field}'|version None"):
            spec_mod.from_dict(d)


def test_ranks_that_disagree_are_refused_naming_the_field(tmp_path):
    rank0 = _spec(*QUICK, "--out", tmp_path / "a").to_dict()
    same = _spec(*QUICK, "--out", tmp_path / "b").to_dict()  # each rank names its own directory
    spec_mod.refuse_disagreement(rank0, same, 1)
    other = _spec(*[w if w != "8:1K:4" else "8:1K:2" for w in QUICK], "--out", tmp_path / "a").to_dict()
    with pytest.raises(UsageError) as e:
        spec_mod.refuse_disagreement(rank0, other, 3)
    assert str(e.value).startswith("the ranks of this launch were given different runs: rank 3 differs from rank 0 "
                                   "in config.sizes: ")
    slow = dict(rank0, repeat=2)
    assert spec_mod.disagreement(rank0, slow) == "repeat: rank 0 has 1, this rank 2"


def test_the_launcher_expands_the_sweep_once_and_its_ranks_read_its_spec(tmp_path, monkeypatch):
    out = tmp_path / "r"
    calls = _count_expand(monkeypatch)
    args, argv = _args(*QUICK, "--out", out, "--dry-run")
    assert run.run_command(args, argv, profile_overrides(args)) == 0
    assert len(calls) == 1 and not out.exists()  # a dry run: the sweep once, nothing written

    # The launcher: the sweep once, the spec in meta.json once, then the ranks.
    calls.clear()
    started = []
    monkeypatch.setattr(run.launcher, "spawn_local", lambda np_, backend, child, **kw: started.append(child) or 0)
    args, argv = _args(*QUICK, "--out", out)
    assert run.run_command(args, argv, profile_overrides(args)) == 0
    assert len(calls) == 1 and len(started) == 1
    launcher_spec = spec_mod.from_saved(out)
    assert launcher_spec == run.from_command_line(args, argv, profile_overrides(args))

    # A rank it started: the spec read, not built; the sweep once.
    calls.clear()
    monkeypatch.setenv("COMMBENCH_LAUNCHER_PID", str(os.getppid()))  # an ancestor, as its launcher is
    monkeypatch.setattr(run, "from_command_line", lambda *a: pytest.fail("a launcher's rank built its spec"))
    got = {}
    monkeypatch.setattr(rank_run, "run", lambda spec, points, notes, argv, **kw: got.update(spec=spec, kw=kw) or 0)
    args, argv = _args(*started[0][1:])
    assert run.run_command(args, argv, profile_overrides(args)) == 0
    assert len(calls) == 1
    assert got["spec"] == launcher_spec and got["kw"]["variant"] == "default"


def test_a_saved_run_resumes_from_its_spec(tmp_path, monkeypatch):
    out = tmp_path / "r"
    spec = _spec("quick", "-b", "all_reduce", "--sizes", "64,8", "--backend", "gloo", "--np", "1", "--out", out,
                 "--repeat", "2")
    out.mkdir()
    (out / "rows.jsonl").write_text("")
    # What the rest of meta.json says of the config is not read back: the spec is the run's.
    (out / "meta.json").write_text(json.dumps({"status": "interrupted", "suite": "quick", "backend": "gloo",
                                               "world": 1, "config": {"name": "quick", "benchmarks": ["barrier"]},
                                               "spec": spec.to_dict(), "variants": {}}))
    calls = _count_expand(monkeypatch)
    got = {}
    monkeypatch.setattr(resume.rank_run, "run", lambda s, points, notes, argv, **kw: got.update(
        spec=s, points=points, kw=kw) or 0)
    args, argv = _args("--resume", out, "--timeout", "30")
    assert run.run_command(args, argv, profile_overrides(args)) == 0
    assert got["spec"].config.timeout_s == 30.0  # the one setting a resume may change
    from dataclasses import replace
    assert replace(got["spec"].config, timeout_s=spec.config.timeout_s) == spec.config
    assert got["spec"].repeat == 2 and got["kw"] == {"variant": "default", "resume": True}
    assert sorted(p.nbytes for p in got["points"]) == [8, 64] and len(calls) == 1
