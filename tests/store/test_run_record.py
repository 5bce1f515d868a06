"""The run's record (store/record.py): its transitions alone (no ranks), and every way a real
run ends (finish, a failed check, a lost rank, SIGTERM, SIGINT, --timeout, a stop between two
repeats and between two variants), each leaving the run's, the variants' and the repeats'
state final: no `running` anywhere in meta.json. Its writes never go through a link."""
from __future__ import annotations

import json
import secrets
import signal
import subprocess

import pytest
from test_hostile_signals import SLOW, TWO_VARIANTS, _launch, _rows, _statuses, _wait_for

from commbench.core.safe_write import LinkRefused
from commbench.store.lock import RunLock
from commbench.store.record import RunRecord, Status
from commbench.store.results import RunDir
from conftest import needs_mpi

# --- the transitions, without ranks ----------------------------------------------------------


def _opened(tmp_path, variant="default", **fields) -> RunRecord:
    rec = RunRecord(tmp_path / "run")
    rec.open_new(["run", "quick"], suite="quick", repeat=1, **fields)
    rec.open_launch("1-1", variant, env={}, inswitch=None, description="d")
    return rec


def test_a_launch_opened_then_done_ends_complete(tmp_path):
    rec = _opened(tmp_path)
    assert rec.status == "running" and rec.variant_status("default") == "running"
    assert rec.meta["launch"] == "1-1" and rec.meta["suite"] == "quick" and "versions" in rec.meta
    rec.repeat_done("default", 1, 1)
    rec.end(reason=None)
    m = RunRecord(tmp_path / "run").read()
    assert (m["status"], m["variants"]["default"]["status"]) == ("complete", "complete") and "finished" in m


def test_a_failed_check_ends_variant_and_run_check_failed(tmp_path):
    rec = _opened(tmp_path)
    rec.repeat_done("default", 1, 2, check_failed=True)  # a failed check ends the variant at once
    rec.end(reason="1 point(s) failed the data check")
    m = RunRecord(tmp_path / "run").read()
    assert (m["status"], m["variants"]["default"]["status"]) == ("check_failed", "check_failed")


def test_a_repeat_before_the_last_leaves_the_variant_unfinished_and_the_next_reopens_it(tmp_path):
    rec = _opened(tmp_path)
    rec.repeat_done("default", 1, 2)
    rec.end()
    m = RunRecord(tmp_path / "run").read()
    assert m["status"] == "interrupted" and m["variants"]["default"]["status"] == "interrupted"
    assert m["variants"]["default"]["reason"].startswith("repeat 1 of 2 done")
    again = RunRecord(tmp_path / "run")
    again.read()
    assert again.is_open_run()
    again.reopen(["run"], resume=False)
    again.open_launch("1-2", "default")
    assert again.variant_status("default") == "running" and "reason" not in again.meta["variants"]["default"]
    again.repeat_done("default", 2, 2)
    again.end()
    assert RunRecord(tmp_path / "run").read()["status"] == "complete"


@pytest.mark.parametrize("status", [Status.FAILED, Status.INTERRUPTED])
def test_an_end_with_a_final_status_leaves_no_variant_running(tmp_path, status):
    rec = _opened(tmp_path)
    rec.end(status, f"rank 0: {status}")
    m = RunRecord(tmp_path / "run").read()
    assert m["status"] == status.value and m["variants"]["default"]["status"] == status.value
    assert "running" not in _statuses(m)


def test_the_launcher_stopped_marks_what_is_unfinished_and_keeps_what_is_done(tmp_path):
    rec = _opened(tmp_path)
    rec.variant_done("default")
    rec.variant_skipped("nvls", "no NVLink switch")
    rec.launcher_stopped(["default", "mine"], signal.SIGTERM)
    rec.write()
    m = RunRecord(tmp_path / "run").read()
    assert m["status"] == "interrupted" and "SIGTERM" in m["reason"]
    v = m["variants"]
    assert (v["default"]["status"], v["nvls"]["status"], v["mine"]["status"]) == ("complete", "skipped", "interrupted")
    assert v["mine"]["reason"].startswith("not run: SIGTERM")


def test_the_launcher_settles_a_launch_whose_rank_0_died(tmp_path):
    rec = _opened(tmp_path)
    rec.write()  # rank 0 opened the run, then was killed
    RunRecord(tmp_path / "run").settle_launch([], 137, interrupted=False, ours=True, variant="default")
    m = RunRecord(tmp_path / "run").read()
    assert m["status"] == "failed" and "status 137" in m["reason"] and m["variants"]["default"]["status"] == "failed"


def test_the_launcher_keeps_a_failure_another_launch_wrote(tmp_path):
    rec = _opened(tmp_path)
    rec.end(Status.FAILED, "rank 1 lost")
    RunRecord(tmp_path / "run").settle_launch([], 143, interrupted=True, why="SIGTERM to the launcher stopped the job",
                                              ours=False, variant="default")
    m = RunRecord(tmp_path / "run").read()
    assert (m["status"], m["reason"], m["variants"]["default"]["status"]) == ("failed", "rank 1 lost", "failed")
    RunRecord(tmp_path / "run").settle_launch([], 143, interrupted=True, why="SIGTERM to the launcher stopped the job",
                                              ours=True, variant="default")
    m = RunRecord(tmp_path / "run").read()
    assert m["status"] == "interrupted" and m["variants"]["default"]["status"] == "interrupted"
    assert m["reason"].startswith("SIGTERM to the launcher")


def test_a_job_that_never_started_gets_a_failed_record(tmp_path):
    RunRecord(tmp_path / "run").write_spec({"suite": "quick"})
    RunRecord(tmp_path / "run").settle_launch(["run", "quick"], 124, interrupted=False, why="did not start",
                                              variant="default")
    m = RunRecord(tmp_path / "run").read()
    assert (m["status"], m["reason"], m["variants"]["default"]["status"]) == ("failed", "did not start", "failed")
    assert m["spec"] == {"suite": "quick"} and m["command"] == ["commbench", "run", "quick"]


def test_the_spec_is_kept_when_rank_0_opens_the_run(tmp_path):
    assert RunRecord.read_spec(tmp_path / "none") is None
    RunRecord(tmp_path / "run").write_spec({"sizes": [8, 16]})
    rec = RunRecord(tmp_path / "run")
    rec.read()
    assert not rec.is_open_run()  # a spec alone is not a run: rank 0 opens a new one
    rec.open_new(["run"], suite="quick")
    rec.open_launch("1-1", "default")
    rec.end(Status.COMPLETE)
    assert RunRecord.read_spec(tmp_path / "run") == {"sizes": [8, 16]}
    assert RunRecord(tmp_path / "run").read()["status"] == "complete"


def test_notes_after_the_end_keep_the_status(tmp_path):
    rec = _opened(tmp_path, host_state={"cores": {}})
    rec.add_control({"when": "start", "unix_s": 1.0, "cpu_loop_us": 2.0})
    rec.note_host_over_run("default", {"load": 1}, 2)
    rec.repeat_done("default", 1, 1)
    rec.end()
    RunRecord(tmp_path / "run").note_teardown("ranks hung")
    RunRecord(tmp_path / "run").note_ab({"side": "A"})
    m = RunRecord(tmp_path / "run").read()
    assert m["status"] == "complete" and m["teardown"].endswith("ranks hung") and m["ab"] == {"side": "A"}
    assert m["host_state"]["disturbed_points"] == 2 and len(m["controls"]) == 1


# --- the record's writes never follow a link -------------------------------------------------

SECRET = b"someone else's file\n"


def test_the_record_never_writes_through_a_link_at_its_temporary_or_its_name(tmp_path, monkeypatch):
    """meta.json is written to a temporary of a fresh name created exclusively, without
    following links (core/safe_write), then renamed: a link planted at the temporary's
    name is left as it is, and so is the file it names; a link named meta.json is replaced,
    not written through."""
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "target"
    target.write_bytes(SECRET)
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: next(names))
    (run / ".meta.json.planted.tmp").symlink_to(target)
    (run / "meta.json").symlink_to(target)
    rec = _opened(tmp_path)
    rec.end(Status.COMPLETE)
    assert target.read_bytes() == SECRET
    assert (run / ".meta.json.planted.tmp").is_symlink() and not (run / "meta.json").is_symlink()
    assert json.loads((run / "meta.json").read_text())["status"] == "complete"
    assert not (run / ".meta.json.fresh.tmp").exists()


def test_the_lock_and_the_rows_never_follow_a_link(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "target"
    target.write_bytes(SECRET)
    (run / ".lock").symlink_to(target)
    with pytest.raises(LinkRefused):
        RunLock(run).acquire()
    (run / "rows.jsonl").symlink_to(target)
    with pytest.raises(LinkRefused):
        RunDir(run).open({"suite": "quick"})
    assert target.read_bytes() == SECRET and not (run / "meta.json").exists()


# --- every way a real run ends ---------------------------------------------------------------

TINY = ["--np", "2", "--sizes", "8:64", "--iters", "20"]
FAULT = {"COMMBENCH_PLUGINS": "fault_plugin"}


def _meta_now(out) -> dict:
    try:
        return json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def _first_row(out):
    return lambda: len(_rows(out)) >= 1


def _repeat_1_done(out):
    return lambda: (_meta_now(out).get("variants") or {}).get("default", {}).get("reason", "").startswith("repeat 1 of 2")


def _default_done(out):
    return lambda: (_meta_now(out).get("variants") or {}).get("default", {}).get("status") == "complete"


# name: (arguments after `run`, environment, (signal, when) or None, exit status, run, variants)
ENDS = {
    "finish": (["quick", "-b", "all_reduce", *TINY], {}, None, 0, "complete", {"default": "complete"}),
    "check_failure": (["quick", "-b", "all_reduce_corrupt", "--check", *TINY], {"COMMBENCH_PLUGINS": "corrupt_plugin"},
                      None, 1, "check_failed", {"default": "check_failed"}),
    "rank_death": (["quick", "-b", "all_reduce_fault", "--timeout", "5", "--no-check", *TINY],
                   {**FAULT, "COMMBENCH_FAULT": "kill:1:64"}, None, "nonzero", "failed", {"default": "failed"}),
    "timeout": (["quick", "-b", "all_reduce_fault", "--timeout", "3", "--no-check", *TINY],
                {**FAULT, "COMMBENCH_FAULT": "hang_op:1:64"}, None, "nonzero", "failed", {"default": "failed"}),
    # The case as it was measured: the run `interrupted`, its variant left `running`.
    "sigterm": (["quick", "--np", "2", "--sizes", "8:4M", "--iters", "1000"], {}, (signal.SIGTERM, _first_row),
                143, "interrupted", {"default": "interrupted"}),
    "sigint": (["quick", "-b", "all_reduce_fault", *TINY], SLOW, (signal.SIGINT, _first_row), 130, "interrupted",
               {"default": "interrupted"}),
    "between_repeats": (["quick", "-b", "all_reduce_fault", "--repeat", "2", *TINY], SLOW,
                        (signal.SIGTERM, _repeat_1_done), 143, "interrupted", {"default": "interrupted"}),
    "between_variants": (["{suite}", *TINY], SLOW, (signal.SIGTERM, _default_done), 143, "interrupted",
                         {"default": "complete", "mine": "interrupted"}),
}


@needs_mpi
@pytest.mark.multirank
@pytest.mark.parametrize("end", list(ENDS))
def test_every_end_leaves_the_run_and_its_variants_and_repeats_final(tmp_path, tag, end):
    args, env, stop, code, run_status, variants = ENDS[end]
    suite = tmp_path / "two.toml"
    suite.write_text(TWO_VARIANTS)
    out = tmp_path / "run"
    p = _launch(["run", *[str(suite) if a == "{suite}" else a for a in args], "--out", out], env, tag)
    if stop is not None:
        sig, when = stop
        _wait_for(when(out), p, f"the moment to send {sig.name}")
        p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"{end}: the launcher did not end")
    assert p.returncode != 0 if code == "nonzero" else p.returncode == code, (p.returncode, err)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["status"] == run_status, meta
    assert {n: v["status"] for n, v in meta["variants"].items()} == variants, meta["variants"]
    assert "running" not in _statuses(meta), meta
    if end in ("timeout",):
        assert "timeout" in meta["reason"], meta["reason"]
    if end == "between_repeats":  # repeat 1 whole, and the run knows it was asked for 2
        assert meta["repeat"] == 2 and len([r for r in _rows(out) if r.get("repeat") == 1]) == 4
