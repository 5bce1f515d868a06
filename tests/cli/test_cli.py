"""End to end through the CLI, and bad input."""
import time

import pytest

import commbench
from commbench.core.schema import SCHEMA_VERSION
from conftest import ROOT, needs_mpi, run_cli, run_meta

# Every test here starts processes (conftest: the multirank guard).
pytestmark = pytest.mark.multirank


@needs_mpi
def test_quick_then_report_then_load(tmp_path):
    out = tmp_path / "quick"
    # The quick suite itself, with a shorter calibration target so the test stays fast.
    p = run_cli("run", "quick", "--np", 2, "--min-time-ms", 2, "--out", out)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "all_reduce" in p.stdout and "busbw (GB/s)" in p.stdout
    for f in ("meta.json", "rows.jsonl", "results.csv"):
        assert (out / f).is_file()
    rep = run_cli("report", out)
    assert rep.returncode == 0 and "all_to_all" in rep.stdout and "p99 (us)" in rep.stdout
    df = commbench.load(out)
    assert len(df) == sum(1 for _ in open(out / "rows.jsonl"))
    assert set(df["check"]) <= {"ok", "skipped"}
    both = commbench.load([out, out])
    assert len(both) == 2 * len(df)
    meta = run_meta(out)
    assert meta["suite"] == "quick" and meta["schema"] == SCHEMA_VERSION and "commbench" in meta["versions"]


def test_list_is_fast_and_imports_no_torch():
    t0 = time.perf_counter()
    p = run_cli("list")
    elapsed = time.perf_counter() - t0
    assert p.returncode == 0 and "all_reduce" in p.stdout and "gloo" in p.stdout and "quick" in p.stdout
    probe = run_cli_py("import sys, commbench.cli as c; c.cmd_list(); print('torch' in sys.modules, 'mpi4py' in sys.modules)")
    assert probe.strip().endswith("False False")
    assert elapsed < 30  # sanity only; the start-up time is measured by `make bench-startup`


def run_cli_py(code):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout


BAD = [
    (["run", "nosuch"], "unknown suite"),
    (["run", "quick", "--backend", "foo"], "invalid choice: 'foo'"),
    (["run", "quick", "--timing", "sideways"], "invalid choice: 'sideways'"),
    (["run", "quick", "-b", "nope"], "unknown benchmark"),
    (["run", "quick", "--dtypes", "float8"], "unknown dtype"),
    (["run", "quick", "--sizes", "0"], "must be positive"),
    (["run", "quick", "-b", "all_to_all", "--sizes", "20", "--np", "2"], "cannot be split evenly"),
    (["run", "quick", "--np", "2", "--worlds", "4"], "only 2 rank"),
    (["run", "quick", "--np", "2", "--dtypes", "bfloat16", "--backend", "mpi"], "not supported"),
    (["run", "quick", "--iters", "x"], "invalid int"),
    (["run", "quick", "--param", "nokey"], "KEY=VALUE"),
    (["run", "--np", "2"], "run needs a suite"),
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize("args,msg", BAD)
def test_bad_input_one_line_exit_2_no_dir(tmp_path, args, msg):
    p = run_cli(*args, cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("text,msg", [
    ('benchmarks = "x\n', "malformed TOML"),
    ('benchmarks = ["all_reduce"]\ncolor = 1\n', "unknown key 'color'"),
    ('benchmarks = ["all_reduce"]\nsizes = {min = "8"}\n', "needs min and max"),
    ('benchmarks = ["all_reduce"]\nsizes = {min = "4M", max = "8"}\n', "inverted"),
])
def test_bad_suite_files(tmp_path, text, msg):
    f = tmp_path / "s.toml"
    f.write_text(text)
    p = run_cli("run", f, "--np", 2, cwd=tmp_path)
    assert p.returncode == 2 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "results").exists()
