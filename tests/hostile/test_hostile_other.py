"""Hostile use, the cases that belong to no other family: each test names the case it
covers and fails where the case is not handled."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, kill_pids, needs_mpi, run_cli, run_meta, run_rows  # noqa: F401


@needs_mpi
@pytest.mark.multirank
def test_signalled_launchers_and_shared_refusals_leave_nothing_in_tmp(tmp_path):
    """Case: launchers signalled left /tmp/commbench-{marked,opened}-* files behind, and every
    refusal the ranks of a launch share left a /tmp/commbench-said-* one. A private TMPDIR
    (short: Open MPI keeps its sockets there) holds what this test's processes write."""
    import shutil
    import signal
    import tempfile
    import time
    import uuid

    from test_hostile_signals import _tagged

    from commbench.run.launcher import mpirun_command

    tmp = Path(tempfile.mkdtemp(prefix="cb-", dir="/tmp"))
    tag = uuid.uuid4().hex
    env = dict(os.environ, TMPDIR=str(tmp), COMMBENCH_TEST_TAG=tag,
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "plugins"), os.environ.get("PYTHONPATH", "")]))
    env.pop("COMMBENCH_TTY", None)
    try:
        # A refusal every rank reaches (mpirun started by hand, as a user would).
        p = subprocess.run(mpirun_command(2, ["run", "quick", "-b", "no_such_bench", "--out", str(tmp_path / "r0")]),
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and "unknown benchmark" in p.stderr, p.stderr
        # A launch stopped by SIGTERM, then killed before it was done (a scheduler's stop
        # whose grace ran out): its rank 0 marks the run after the launcher is gone.
        out = tmp_path / "r1"
        p = subprocess.Popen([sys.executable, "-m", "commbench", "run", "quick", "--np", "2", "-b", "all_reduce_fault",
                              "--sizes", "8:64", "--iters", "20", "--out", str(out)], cwd=ROOT,
                             env=dict(env, COMMBENCH_PLUGINS="fault_plugin", COMMBENCH_SLOW_SETUP_S="1"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not ((out / "rows.jsonl").is_file() and (out / "rows.jsonl").read_text().strip()):
            assert p.poll() is None and time.monotonic() - t0 < 120, "the run never wrote a row"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        p.kill()
        p.wait()
        t0 = time.monotonic()
        while _tagged(tag) and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert not _tagged(tag), _tagged(tag)
        assert run_meta(out)["status"] != "running"
        left = sorted(f.name for f in tmp.iterdir() if f.name.startswith("commbench-"))
        assert not left, left
    finally:
        kill_pids(_tagged(tag))
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.multirank
def test_compare_of_two_timing_methods_cannot_judge_and_does_not_fail_the_gate(tmp_path):
    """Case: `compare --fail-on-regression` of a back_to_back run against a `--timing barrier`
    run failed the gate ("6 slower, +5..+132 %") without a word that the two measured
    differently. Such points are "cannot judge (timing back_to_back vs barrier)", said in the
    header: the gate is inconclusive (exit 3), not failed."""
    import pandas as pd

    from commbench.store.results import RunDir, Status
    from conftest import make_row

    def run(name, timing, scale):
        w = RunDir(tmp_path / name).open({"schema": 3, "status": "running"})
        for i, s in enumerate(8 << k for k in range(6)):
            w.append(make_row("all_reduce", 2, s, (1.0 + s / 3000) * scale * (1 + 0.2 * i), spread_pct=1.0,
                              iters=2000, timing=timing))
        w.finish(Status.COMPLETE)
        return str(tmp_path / name)

    a, b = run("a", "back_to_back", 1.0), run("b", "barrier", 2.0)
    csv = tmp_path / "c.csv"
    p = run_cli("compare", a, b, "--fail-on-regression", "--all", "--csv", csv)
    assert p.returncode == 3, (p.stdout, p.stderr)
    head = p.stdout.splitlines()[0]
    assert "0 slower" in head and "6 cannot judge (timing back_to_back vs barrier)" in head, p.stdout
    got = pd.read_csv(csv)
    assert set(got["verdict"]) == {"cannot judge"} and set(got["caveat"]) == {"timing back_to_back vs barrier"}
    # The same methods on both sides are judged as before: three times as slow is slower (one
    # run a side: beyond the 2x one run each can show).
    p = run_cli("compare", a, run("c", "back_to_back", 3.0), "--fail-on-regression")
    assert p.returncode == 1 and "6 slower" in p.stdout, p.stdout


def test_report_md_escapes_html_and_markdown_from_names_and_imported_headers(tmp_path, monkeypatch):
    """Case: report.md passed raw HTML from names and imported headers (report.html escapes
    it): a run directory named `<img src=x onerror=alert(1)>`, a host, a note or a command
    from a file went into report.md as HTML a Markdown viewer runs, and a `|` split a table
    row."""
    import re

    from commbench.commands.report import write_report
    from commbench.report import plots
    from commbench.store.results import RunDir, Status
    from conftest import make_row

    monkeypatch.setattr(plots, "have_matplotlib", lambda: False)  # the tables are the case, not figures
    evil = "<img src=x onerror=alert(1)>"
    runs = [tmp_path / evil, tmp_path / "a|b"]  # two runs: the tables get a run column
    for run in runs:
        w = RunDir(run).open({"schema": 3, "status": "running", "suite": "<b>s|uite</b>",
                              "hosts": ["<script>h</script>"],
                              "command": ["commbench", "run", "[x](javascript:alert(1))"],
                              "import_notes": ["header said <iframe src=//e>"]})
        for s in (8, 64, 512):
            w.append(make_row("all_reduce", 2, s, 1.0 + s / 1000, spread_pct=1.0, iters=200))
        w.finish(Status.COMPLETE)
    md = write_report(runs, tmp_path / "rep")["markdown"].read_text()
    for raw in ("<img", "<b>", "<script", "<iframe", "[x](javascript"):
        assert raw not in md, raw
    assert "&lt;img src=x onerror=alert(1)&gt;" in md and "&lt;script&gt;h&lt;/script&gt;" in md
    # A `|` from data stays in its cell: every row of a table has as many columns as its header.
    for block in md.split("\n\n"):
        rows = [ln for ln in block.splitlines() if ln.startswith("| ")]
        if rows:
            cols = {len(re.split(r"(?<!\\)\|", ln)) for ln in rows}
            assert len(cols) == 1, rows
    assert "| a\\|b |" in md and "s\\|uite" in md


def _bounded_cli(*args, cwd=None, timeout=60):
    """run_cli with the address space capped at 2 GiB and a hang guard: a command that reads
    without bound fails here (MemoryError, or the timeout) instead of taking the host's memory."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "plugins"),
                                                      os.environ.get("PYTHONPATH", "")]))
    env.pop("COMMBENCH_TTY", None)
    try:
        return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd or ROOT, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        pytest.fail(f"commbench {' '.join(map(str, args))} still running after {timeout} s")


def _one_line_refusal(p, *words):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("commbench: error: "), \
        (p.returncode, p.stderr[-1500:])
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.multirank
def test_files_a_command_reads_are_regular_files_within_a_cap(tmp_path):
    """Case: `commbench model --against /dev/zero` read without bound (2.5 GB RSS in 3 s). Every
    file a command reads by a name the user gives (--against, a suite file, a profile, a file to
    import) is a regular file within a stated cap: a device, a FIFO, a directory or a file past
    the cap is refused in one line, exit 2."""
    fifo = tmp_path / "f.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(5 << 20)  # past the 4 MiB a suite, profile or table may hold
    folder = tmp_path / "d.toml"
    folder.mkdir()
    for target, kind in (("/dev/zero", "is a device"), (fifo, "is a FIFO"), (folder, "is a directory"),
                         (big, "5 MiB, more than the 4 MiB")):
        _one_line_refusal(_bounded_cli("model", "--against", target), f"--against {target}: {kind}")
    _one_line_refusal(_bounded_cli("run", big, "--dry-run"), f"suite {big}: 5 MiB, more than the 4 MiB")
    _one_line_refusal(_bounded_cli("run", folder, "--dry-run"), f"suite {folder}: is a directory")
    _one_line_refusal(_bounded_cli("run", fifo, "--dry-run"), f"suite {fifo}: is a FIFO")
    _one_line_refusal(_bounded_cli("ceilings", "--profile", big), f"profile file {big}: 5 MiB")
    _one_line_refusal(_bounded_cli("ceilings", "--profile", fifo), f"profile file {fifo}: is a FIFO")
    _one_line_refusal(_bounded_cli("import", fifo, "--world", "2", "--out", tmp_path / "imp"), "is a FIFO")
    _one_line_refusal(_bounded_cli("import", "/dev/zero", "--world", "2", "--out", tmp_path / "imp"), "is a device")
    assert not (tmp_path / "imp").exists()


@pytest.mark.multirank
def test_model_against_a_figure_at_world_1_or_with_nothing_held_out(tmp_path):
    """Case: `commbench model --against FILE` with a figure at world 1 ended in a
    ZeroDivisionError traceback; with every row `fit` it said "held-out within 1.5x: 0 of 0
    ... the model agrees with every held-out figure" and exited 0."""
    row = """[[figure]]
id = "x"
group = "all_reduce-intra"
use = "{use}"
source = "s"
hardware = "h"
profile = "h100-hgx"
kind = "all_reduce"
algorithm = "nccl-default"
world = {world}
nbytes = 1048576
measure = "busbw_GBps"
published = 75
"""
    one = tmp_path / "one.toml"
    one.write_text(row.format(use="held-out", world=1))
    _one_line_refusal(run_cli("model", "--against", one), "figure 1 (x): world must be at least 2, got 1")
    fit = tmp_path / "fit.toml"
    fit.write_text(row.format(use="fit", world=4))
    p = run_cli("model", "--against", fit)
    assert p.returncode == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert "agrees" not in p.stdout and "0 of 0" not in p.stdout, p.stdout
    assert "verdict: nothing to judge: no figure is held out" in p.stdout, p.stdout
    held = tmp_path / "held.toml"
    held.write_text(row.format(use="held-out", world=4))
    p = run_cli("model", "--against", held)
    assert p.returncode == 0 and "verdict: the model agrees with the held-out figures" in p.stdout, p.stdout


@pytest.mark.multirank
def test_ab_gate_refuses_an_infinite_slowdown_and_an_out_that_is_a_file(tmp_path):
    """Case: `tools/ab_gate.py --pct inf` was accepted and spun both cores; `--out` naming an
    existing file ended in a FileExistsError traceback. One line, exit 2, each."""
    gate = [sys.executable, str(ROOT / "tools" / "ab_gate.py")]
    target = tmp_path / "file"
    target.write_bytes(b"keep me\n")
    # The planted point lies outside the sweep: where --pct is not refused first, the gate
    # stops at that instead of starting runs that spin (the refusal must come before any run).
    nothing = ["--sizes", "8", "--dtypes", "float32", "--planted", "all_reduce:float16:8", "--out", str(tmp_path / "g")]
    for args, words in ((["--pct", "inf", *nothing], "--pct must be a number above 0"),
                        (["--pct", "nan", *nothing], "--pct must be a number above 0"),
                        (["--pct", "1e9", *nothing], "at most 1000"),
                        (["--rounds", "1", "--out", str(target)], f"--out {target}: exists and is not a directory")):
        try:
            p = subprocess.run(gate + args, cwd=ROOT, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ab_gate {args} still running after 60 s")
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and words in lines[0], (args, p.returncode, p.stderr[-1500:])
    assert target.read_bytes() == b"keep me\n" and not (tmp_path / "g").exists()


@pytest.mark.multirank
def test_ranks_per_node_beyond_the_world_is_refused(tmp_path):
    """Case: `--ranks-per-node 3` with `--np 2` was accepted without a word (every rank on one
    node: the grouping asked for cannot be). Refused in one line, exit 2, before anything runs."""
    out = tmp_path / "r"
    p = run_cli("run", "quick", "--np", "2", "--ranks-per-node", "3", "-b", "all_reduce", "--sizes", "8:64",
                "--iters", "20", "--dry-run", "--out", out)
    _one_line_refusal(p, "--ranks-per-node 3 is more than the 2 rank(s) of this launch")
    assert not out.exists()
    p = run_cli("run", "quick", "--np", "4", "--ranks-per-node", "3", "-b", "all_reduce", "--sizes", "8:64",
                "--dry-run")
    assert p.returncode == 0, p.stderr  # a last node with fewer ranks is modelled, as on real hosts


@needs_mpi
@pytest.mark.multirank
def test_a_folder_named_like_a_suite_never_shadows_it(tmp_path):
    """Case: in an empty folder `commbench run quick --np 2 ... --out quick` made quick/ (its
    lock) first, then each rank took the suite `quick` for that folder ("suite file quick not
    found", an Open MPI banner, quick/.lock left behind); any folder named like a suite hid it
    (`mkdir quick; commbench run quick --dry-run`). A directory is never a suite file, and the
    ranks read the suite file their launcher resolved."""
    p = run_cli("run", "quick", "--np", "2", "-b", "all_reduce", "--sizes", "8:64", "--iters", "20",
                "--out", "quick", cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    meta = run_meta(tmp_path / "quick")
    assert meta["status"] == "complete" and meta["suite"] == "quick"
    assert len(run_rows(tmp_path / "quick")) == 4
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "collectives").mkdir()
    p = run_cli("run", "collectives", "--dry-run", "-b", "all_reduce", "--sizes", "8", cwd=tmp_path / "other")
    assert p.returncode == 0 and "suite collectives:" in p.stdout, (p.stdout, p.stderr)
