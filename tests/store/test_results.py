"""The run model: one row schema, one point key, migrations on read, RunDir's writes."""
from __future__ import annotations

import json

import pytest

from commbench.core.errors import UsageError
from commbench.core.schema import ROW_FIELDS, SCHEMA_VERSION, normalize_row, params_dict, point_key
from commbench.store.load import load
from commbench.store.record import RunRecord, Status, overall_status
from commbench.store.results import RunDir, read_rows


def test_point_key_is_stable_and_orders_params():
    a = point_key("moe", 4, 0, "float32", {"tokens": 8, "copies": "rank"}, "default")
    b = point_key("moe", 4, 0, "float32", {"copies": "rank", "tokens": 8})
    assert a == b == 'default|moe|4|0|float32|{"copies": "rank", "tokens": 8}'


def test_params_always_a_dict():
    assert params_dict('{"a": 1}') == {"a": 1}
    assert params_dict(None) == {} and params_dict("") == {} and params_dict(float("nan")) == {}
    with pytest.raises(UsageError):
        params_dict("[1, 2]")


def test_schema_1_row_migrates():
    old = {"schema": 1, "benchmark": "all_reduce", "world": 2, "nbytes": 8, "dtype": "float32",
           "timing": "host_clock", "params": "{}"}
    row = normalize_row(dict(old))
    assert row["schema"] == SCHEMA_VERSION
    assert (row["clock"], row["timing"]) == ("host_clock", "back_to_back")
    assert row["params"] == {} and row["variant"] == "default"
    assert row["placement"] == "out-of-place"
    assert row["point_key"] == point_key("all_reduce", 2, 8, "float32", {}, "default", "out-of-place")


@pytest.mark.parametrize("row,placement,variant", [
    ({"backend": "gloo", "benchmark": "all_reduce"}, "in-place", "default"),   # torch reduced in place
    ({"backend": "nccl", "benchmark": "all_reduce"}, "in-place", "default"),
    ({"backend": "mpi", "benchmark": "all_reduce"}, "out-of-place", "default"),
    ({"backend": "mpi", "benchmark": "broadcast"}, "in-place", "default"),
    ({"backend": "mpi", "benchmark": "moe"}, None, "default"),
    # an imported nccl-tests in-place half was variant "in-place"
    ({"backend": "nccl", "benchmark": "all_gather", "source": "nccl-tests", "variant": "in-place"}, "in-place",
     "default"),
    ({"backend": "nccl", "benchmark": "all_reduce", "source": "nccl-tests"}, "out-of-place", "default"),
])
def test_schema_2_rows_get_their_placement(row, placement, variant):
    old = {"schema": 2, "world": 2, "nbytes": 8, "dtype": "float32", "params": {}, "point_key": "old", **row}
    new = normalize_row(old)
    assert (new["placement"], new["variant"], new["schema"]) == (placement, variant, SCHEMA_VERSION)
    assert new["point_key"] == point_key(row["benchmark"], 2, 8, "float32", {}, variant, placement)


def test_read_rows_drops_torn_and_non_row_lines(tmp_path):
    p = tmp_path / "rows.jsonl"
    good = {"schema": 2, "benchmark": "b", "world": 1, "nbytes": 0, "dtype": "float32", "params": {"k": 1},
            "time_us_p50": 1.0}
    p.write_text(json.dumps(good) + "\n[1, 2]\n" + '{"schema": 2, "bench')
    rows = read_rows(p)
    assert len(rows) == 1 and rows[0]["params"] == {"k": 1}


def test_rundir_writes_and_settles(tmp_path):
    rd = RunDir(tmp_path / "run").open({"status": "running"})
    rd.record.variant_running("default")
    rd.append({"schema": 2, "benchmark": "b", "world": 1, "nbytes": 8, "dtype": "float32", "params": {},
               "time_us_p50": 1.0})
    rd.finish(Status.COMPLETE)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["status"] == "complete" and "finished" in meta
    assert (tmp_path / "run" / "results.csv").read_text().splitlines()[0].split(",")[:len(ROW_FIELDS)] == list(
        ROW_FIELDS)
    df = load(tmp_path / "run")
    assert df["params"].iloc[0] == {} and df["run"].iloc[0] == "run"
    # The launcher's last word changes nothing on a finished run ...
    RunRecord(tmp_path / "run").settle_launch([], 1, interrupted=False)
    assert RunDir(tmp_path / "run").read_meta()["status"] == "complete"
    # ... and marks one its ranks left running.
    rd2 = RunDir(tmp_path / "run2").open({"status": "running"})
    RunRecord(tmp_path / "run2").settle_launch([], 3, interrupted=False)
    m = rd2.read_meta()
    assert m["status"] == "failed" and "status 3" in m["reason"]
    RunRecord(tmp_path / "run2").settle_launch([], 130, interrupted=True)
    assert rd2.read_meta()["status"] == "interrupted"


def test_overall_status_is_the_worst_variant():
    assert overall_status({"a": {"status": "complete"}, "b": {"status": "skipped"}}) == Status.COMPLETE
    assert overall_status({"a": {"status": "complete"}, "b": {"status": "check_failed"}}) == "check_failed"
    assert overall_status({"a": {"status": "interrupted"}, "b": {"status": "failed"}}) == Status.FAILED
    assert Status.COMPLETE.finished and not Status.FAILED.finished


def test_the_launcher_settles_only_what_its_own_launch_left(tmp_path):
    """Ctrl-C to a resume before its rank 0 reopened the run: the run's status is still the
    earlier launch's `failed`, with that launch's reason, and stays so."""
    rd = RunDir(tmp_path / "run").open({"status": "failed", "reason": "rank 1 lost", "launch": "1-1"})
    rd.finish(Status.FAILED, "rank 1 lost")
    RunRecord(tmp_path / "run").settle_launch([], 130, interrupted=True, ours=False)
    m = RunDir(tmp_path / "run").read_meta()
    assert (m["status"], m["reason"]) == ("failed", "rank 1 lost")
    RunRecord(tmp_path / "run").settle_launch([], 130, interrupted=True, ours=True)
    assert RunDir(tmp_path / "run").read_meta()["status"] == "interrupted"
