"""Run directories that were torn, doubled or are not runs at all: resume repairs, readers
warn, compare and report refuse in one line."""
from __future__ import annotations

import json

import pytest

from commbench.store.load import load
from commbench.store.results import RunDir, Status, read_rows_checked
from conftest import make_row, run_cli


def _row(nbytes, p50=1.0, key=None):
    r = make_row("all_reduce", 2, nbytes, p50, algbw_gbps=0.0, busbw_gbps=0.0, busbw_factor=1.0)
    return {**r, "point_key": key} if key else r


def test_resume_after_a_torn_line_starts_a_fresh_line(tmp_path):
    rd = RunDir(tmp_path / "r").open({"status": "running"})
    rd.append(_row(8))
    rd.finish(Status.FAILED)
    with open(tmp_path / "r" / "rows.jsonl", "a") as f:
        f.write('{"schema": 3, "benchm')  # killed mid-write
    rd = RunDir(tmp_path / "r").open()
    rd.append(_row(16))
    rd.finish(Status.COMPLETE)
    rows, bad = read_rows_checked(tmp_path / "r" / "rows.jsonl")
    assert [r["nbytes"] for r in rows] == [8, 16] and bad == []


def test_lines_that_are_not_rows_are_skipped_and_said(tmp_path):
    rd = RunDir(tmp_path / "r").open({"status": "running"})
    rd.append(_row(8))
    rd.finish(Status.COMPLETE)
    with open(tmp_path / "r" / "rows.jsonl", "ab") as f:
        f.write(b'[1, 2, 3]\n42\n{"point_key": 5}\n\xff\xfe binary\n')
    said = []
    df = load(tmp_path / "r", warn=said.append)
    assert len(df) == 1 and len(said) == 1 and "4 line(s) are not rows" in said[0]


@pytest.mark.multirank
def test_duplicate_points_are_said_and_compare_refuses_to_guess(tmp_path):
    rd = RunDir(tmp_path / "twice").open({"status": "running"})
    rd.append(_row(8, 1.0))
    rd.append(_row(8, 2.0))  # a second writer
    rd.finish(Status.COMPLETE)
    said = []
    load(tmp_path / "twice", warn=said.append)
    assert said and "1 point(s) appear more than once" in said[0]
    rd = RunDir(tmp_path / "once").open({"status": "running"})
    rd.append(_row(8, 1.0))
    rd.finish(Status.COMPLETE)
    r = run_cli("compare", tmp_path / "once", tmp_path / "twice")
    assert r.returncode == 2 and "more than once" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.multirank
def test_compare_against_a_text_file_and_report_under_a_file_are_one_line(tmp_path):
    rd = RunDir(tmp_path / "r").open({"status": "running"})
    rd.append(_row(8))
    rd.finish(Status.COMPLETE)
    (tmp_path / "notes.txt").write_text("just some notes\nnot a run\n")
    r = run_cli("compare", tmp_path / "r", tmp_path / "notes.txt")
    assert r.returncode == 2 and "not a commbench row" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "file").write_text("x")
    r = run_cli("report", tmp_path / "r", "--out", tmp_path / "file" / "rep")
    assert r.returncode == 2 and "report --out" in r.stderr and "Traceback" not in r.stderr
    assert json.loads((tmp_path / "r" / "meta.json").read_text())["status"] == "complete"
