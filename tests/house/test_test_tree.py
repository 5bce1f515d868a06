"""The test tree's own rules: a test that starts Python or a launcher without the multirank
marker fails before the process starts; fixtures are found in one folder; a run is read
through RunDir, every line a row."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import FIXTURES, _program_started, fixture_path, make_row, run_dir, run_meta, run_rows


def test_starting_python_without_the_marker_fails_the_test_before_it_starts():
    with pytest.raises(pytest.fail.Exception, match="without @pytest.mark.multirank"):
        subprocess.run([sys.executable, "-c", "open('/nonexistent/started', 'w')"], timeout=60)


@pytest.mark.parametrize("argv", [["mpirun", "-np", "2", "x"], "sh -c 'python -m commbench run quick'",
                                  ["ip", "netns", "exec", "h1", "env", "A=1", sys.executable, "-m", "commbench"],
                                  ["/venv/bin/commbench", "list"], ["torchrun", "--nproc-per-node", "2"]])
def test_a_launcher_or_python_anywhere_in_the_command_counts(argv):
    assert _program_started(argv)


@pytest.mark.parametrize("argv", [["git", "rev-parse", "HEAD"], ["make", "-n", "quick"], ["mount", "-o", "ro"]])
def test_tools_that_return_at_once_need_no_marker(argv):
    assert _program_started(argv) is None


@pytest.mark.multirank
def test_a_marked_test_starts_what_it_likes():
    assert subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout == "7\n"


def test_fixtures_live_in_one_folder():
    assert fixture_path("real-outputs/SOURCES.tsv").parent.parent == FIXTURES
    with pytest.raises(FileNotFoundError, match="no fixture"):
        fixture_path("no-such-file.txt")


def test_a_run_is_read_through_rundir_and_a_torn_line_is_not_a_row(tmp_path):
    rd = run_dir(tmp_path / "r").open({"status": "running"})
    rd.append(make_row())
    rd.close_rows()
    assert run_meta(tmp_path / "r")["status"] == "running" and len(run_rows(tmp_path / "r")) == 1
    with open(rd.rows_path, "a") as f:
        f.write('{"benchm')
    with pytest.raises(AssertionError, match="not rows"):
        run_rows(tmp_path / "r")
