"""Hostile use: signals that must stop a run of several launches (variants, repeats), a job
whose ranks never start, a launcher killed outright, and resuming what such runs leave. Each
test names the case it covers and fails where the case is not handled."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, needs_mpi, run_cli, run_meta, run_rows, tagged_pids

# Every test here starts processes (conftest: the multirank guard).
pytestmark = pytest.mark.multirank

PLUGINS = str(ROOT / "tests" / "plugins")
# Every point's setup takes this long (fault_plugin): a sweep of 4 points lasts long enough
# for a signal to land inside it, whatever the host's load.
SLOW = {"COMMBENCH_PLUGINS": "fault_plugin", "COMMBENCH_SLOW_SETUP_S": "1"}
TWO_VARIANTS = """benchmarks = ["all_reduce_fault"]
variants = ["default", "mine"]
[variant.mine]
description = "the library's choice again"
env = {NCCL_DEBUG = "WARN"}
"""


def _launch(args, env, tag: str):
    """The CLI in the background, its processes (and mpirun's, which inherit the
    environment) tagged so they can be found and reaped."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([PLUGINS, os.environ.get("PYTHONPATH", "")]),
             COMMBENCH_TEST_TAG=tag)
    e.update(env)
    e.pop("COMMBENCH_TTY", None)
    return subprocess.Popen([sys.executable, "-m", "commbench", *map(str, args)], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


_tagged = tagged_pids  # the name the tests here and beside them use


def _wait_for(cond, proc, what: str, limit_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the launcher ended before {what}: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def _rows(out: Path) -> list[dict]:
    try:
        return run_rows(out)
    except (OSError, ValueError):
        return []


def _statuses(meta) -> list[str]:
    """Every `status` meta.json holds (the run's, the variants')."""
    if isinstance(meta, dict):
        return [v for k, v in meta.items() if k == "status"] + [s for v in meta.values() for s in _statuses(v)]
    return [s for v in meta for s in _statuses(v)] if isinstance(meta, list) else []


@needs_mpi
def test_sigterm_to_a_launcher_of_two_variants_launches_no_further_variant(tmp_path, tag):
    """Case: SIGTERM to the launcher of a multi-variant run stopped the default variant's
    launch, then launched variant mine and measured it before exiting 143, status failed."""
    suite = tmp_path / "two.toml"
    suite.write_text(TWO_VARIANTS)
    out = tmp_path / "run"
    p = _launch(["run", suite, "--np", "2", "--sizes", "8:64", "--iters", "20", "--out", out], SLOW, tag)
    _wait_for(lambda: len(_rows(out)) >= 1, p, "the first row")
    p.send_signal(signal.SIGTERM)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 143, (p.returncode, err)
    assert "variant mine" not in stdout, stdout
    meta = run_meta(out)
    assert meta["status"] == "interrupted" and "SIGTERM" in meta["reason"], meta
    assert meta["variants"]["default"]["status"] == "interrupted", meta["variants"]
    assert meta["variants"]["mine"]["status"] == "interrupted", meta["variants"]
    assert "not run" in meta["variants"]["mine"]["reason"], meta["variants"]
    assert {r["variant"] for r in _rows(out)} == {"default"}


@needs_mpi
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_during_repeats_launches_no_further_repeat(tmp_path, tag, sig):
    """Case: SIGTERM or SIGHUP during repeat 2 of `--repeat 3`: repeat 3 started anyway, and
    the run could end `complete` with every row although the launcher exited 143 or 129."""
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "-b", "all_reduce_fault", "--sizes", "8:64", "--iters", "20",
                 "--repeat", "3", "--out", out], SLOW, tag)
    _wait_for(lambda: any(r.get("repeat") == 2 for r in _rows(out)), p, "a row of repeat 2")
    p.send_signal(sig)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert "repeat 3 of 3" not in stdout, stdout
    meta = run_meta(out)
    assert meta["status"] == "interrupted" and signal.Signals(sig).name in meta["reason"], meta
    assert meta["variants"]["default"]["status"] == "interrupted", meta["variants"]
    repeats = {r["repeat"] for r in _rows(out)}
    assert repeats == {1, 2}, repeats
    assert len([r for r in _rows(out) if r["repeat"] == 1]) == 4  # repeat 1 whole


@needs_mpi
def test_sigterm_leaves_no_state_running_in_a_one_variant_run(tmp_path, tag):
    """Case: SIGTERM left the variant `running` (or `failed`, the ranks' account of the
    SIGTERM passed on) in meta.json of a one-variant run whose status is `interrupted`."""
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "-b", "all_reduce_fault", "--sizes", "8:64", "--iters", "20",
                 "--out", out], SLOW, tag)
    _wait_for(lambda: len(_rows(out)) >= 1, p, "the first row")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    meta = run_meta(out)
    assert meta["status"] == "interrupted", meta
    assert meta["variants"]["default"]["status"] == "interrupted", meta["variants"]
    assert "running" not in _statuses(meta), meta


# A plug-in (loaded before the backend starts) that keeps rank 1 of a launch from starting.
STALL_PLUGIN = """import os, time
if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    time.sleep(3600)
"""


def _stalled(tmp_path) -> dict:
    """The environment of a launch whose rank 1 never starts: rank 0 waits for it in MPI_Init."""
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "stall_start.py").write_text(STALL_PLUGIN)
    return {"COMMBENCH_PLUGINS": "stall_start",
            "PYTHONPATH": os.pathsep.join([str(tmp_path / "plug"), os.environ.get("PYTHONPATH", "")])}


@needs_mpi
def test_a_launch_whose_ranks_never_start_is_stopped_at_the_start_up_bound(tmp_path, tag):
    """Case: a variant whose MPI cannot start (a mistyped OMPI_MCA_pml: MPI_Init aborts and
    prterun waits for ever) held the launcher without bound. Here rank 1 never starts (a
    plug-in that sleeps before the backend starts), so rank 0 waits in MPI_Init: the job is
    stopped at --timeout + the start-up floor, in one line, and the run is marked failed."""
    from commbench.run import launcher

    floor_s = getattr(launcher, "STARTUP_FLOOR_S", 30.0)  # what main held before the bound: none
    out = tmp_path / "run"
    t0 = time.monotonic()
    p = _launch(["run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", "8:64", "--timeout", "1",
                 "--out", out], _stalled(tmp_path), tag)
    try:
        _, err = p.communicate(timeout=1 + floor_s + launcher.GRACE_S + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the launcher still waits for ranks that never started")
    took = time.monotonic() - t0
    lines = [ln for ln in err.splitlines() if ln.startswith("commbench: error:")]
    assert p.returncode == 124 and len(lines) == 1, (p.returncode, err)
    assert f"did not start within {1 + floor_s:g} s" in lines[0], lines
    print(f"never-started job stopped {took:.0f} s after the launch")
    meta = run_meta(out)
    assert meta["status"] == "failed" and "did not start" in meta["reason"], meta
    assert meta["variants"]["default"]["status"] == "failed", meta
    t1 = time.monotonic()
    while _tagged(tag) and time.monotonic() - t1 < 10:
        time.sleep(0.1)
    assert not _tagged(tag), _tagged(tag)


@needs_mpi
def test_a_launcher_killed_outright_takes_mpirun_with_it(tmp_path, tag):
    """Case: SIGKILL of a launcher whose ranks had not started orphaned prterun, which then
    waited for ever. mpirun (prterun) must end with its launcher."""
    out = tmp_path / "run"
    p = _launch(["run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", "8:64", "--timeout", "1",
                 "--out", out], _stalled(tmp_path), tag)

    def mpirun():
        return [pid for pid, name in _tagged(tag).items() if name in ("prterun", "mpirun", "prte", "mpiexec")]
    _wait_for(lambda: mpirun() and len(_tagged(tag)) >= 4, p, "mpirun and its ranks")  # launcher, mpirun, 2 ranks
    time.sleep(1.0)
    p.kill()
    p.wait()
    t0 = time.monotonic()
    while mpirun() and time.monotonic() - t0 < 5:
        time.sleep(0.1)
    assert not mpirun(), f"mpirun outlived its launcher: {_tagged(tag)}"


def _saved_run(tmp_path, raw: dict, repeat: int, rows: list[dict], status: str = "interrupted") -> Path:
    """A run directory as a launcher of 2 ranks leaves it: meta.json with the config saved as
    the runner saves it, and rows.jsonl."""
    from dataclasses import asdict

    from commbench.run import suite

    cfg = suite.build_config(raw)
    out = tmp_path / "run"
    out.mkdir()
    variants = {n: {"status": "interrupted"} for n in cfg.variants}
    meta = {"schema": 3, "status": status, "suite": cfg.name, "backend": "mpi", "device": "cpu", "world": 2,
            "repeat": repeat, "config": json.loads(json.dumps(asdict(cfg), default=str)), "variants": variants}
    (out / "meta.json").write_text(json.dumps(meta))
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _row(nbytes: int, variant: str = "default", repeat: int = 1) -> dict:
    from conftest import make_row

    row = make_row("all_reduce", 2, nbytes, variant=variant, repeat=repeat)
    if repeat > 1:
        row["point_key"] += f"|repeat{repeat}"
    return row


def test_resume_dry_run_of_a_repeat_run_lists_the_missing_repeats(tmp_path):
    """Case: `run --resume DIR --dry-run` of a `--repeat 3` run with repeat 1 whole said
    "0 to run", while the real resume then ran repeats 2 and 3."""
    raw = {"name": "quick", "benchmarks": ["all_reduce"], "sizes": [8, 64], "dtypes": ["float32"]}
    out = _saved_run(tmp_path, raw, 3, [_row(8), _row(64), _row(8, repeat=2)])
    r = run_cli("run", "--resume", out, "--dry-run", "--np", "2", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "3 of 6 points already in" in r.stdout and "3 to run" in r.stdout, r.stdout
    assert "repeats 2, 3 of 3" in r.stdout, r.stdout


def test_a_run_with_a_custom_variant_resumes_with_its_own_saved_config(tmp_path):
    """Case: meta.json saves a suite's variant tables with a `name` key, and the resume check
    then refused the run's own config ("variant 'mine' has unknown key 'name'")."""
    raw = {"name": "two", "benchmarks": ["all_reduce"], "sizes": [8, 64], "dtypes": ["float32"],
           "variants": ["default", "mine"], "variant": {"mine": {"env": {"NCCL_DEBUG": "WARN"}}}}
    out = _saved_run(tmp_path, raw, 1, [_row(8), _row(64)])
    meta = run_meta(out)
    assert meta["config"]["variant_defs"]["mine"]["name"] == "mine"  # saved as the runner saves it
    r = run_cli("run", "--resume", out, "--dry-run", "--np", "2", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "2 of 4 points already in" in r.stdout and "(variants default, mine)" in r.stdout, r.stdout
    # A saved name that is not its table's is a hand edit: refused, not taken.
    meta["config"]["variant_defs"]["mine"]["name"] = "other"
    (out / "meta.json").write_text(json.dumps(meta))
    r = run_cli("run", "--resume", out, "--dry-run", "--np", "2", timeout=120)
    assert r.returncode == 2 and "unknown key 'name'" in r.stderr, r.stderr
