"""Imports and reports under hostile input: long lines that a backtracking pattern would read
for hours, -J JSON of the wrong types, a log whose rows NCCL's log cut apart, runs that share
a directory name, and a reader that leaves a long table early."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, fixture_path, make_row, run_cli

FIX = FIXTURES
REAL = fixture_path("real-outputs")
MB2 = 2 << 20
# A pattern that backtracks over a line takes hours on these 2 MB lines; reading them in
# time proportional to their length takes seconds. The bound only catches the hang.
HANG_S = 240


def _first(lines, start: str) -> int:
    return next(i for i, line in enumerate(lines) if line.strip().startswith(start))


def _import(src, out, *args):
    r = run_cli("import", src, "--out", out, *args, timeout=HANG_S)
    assert r.returncode == 0, r.stderr[-500:]
    return r


# ---------------------------------------------------------------------------------------
# long lines: every import reads in time proportional to the input

@pytest.mark.multirank
def test_long_lines_in_an_nccl_tests_log_import_in_linear_time(tmp_path):
    lines = (FIX / "nccl_all_reduce_8gpu.txt").read_text().splitlines()
    rank0 = _first(lines, "#  Rank  0")
    lines[rank0] = lines[rank0].replace("NVIDIA H100", "NVIDIA" + " " * MB2 + "H100")
    row = _first(lines, "8 ")
    lines[row + 1:row + 1] = [
        "<script>" + "A" * MB2,  # no space: an unanchored host-name pattern retried from every letter
        "node" + "-" * MB2 + ":1",
        "ztan-mig-235z:6899:6899 [0] NCCL INFO " + "x" * MB2,
    ]
    # Lines before the table are read by the format detector too (an OSU title?).
    lines.insert(0, "# OSU MPI A" + " " * MB2 + "B")
    p = tmp_path / "all_reduce_long.txt"
    p.write_text("\n".join(lines) + "\n")
    r = _import(p, tmp_path / "run")
    assert "imported 18 rows" in r.stdout
    assert f"line {row + 3}: not understood" in r.stdout and "'<script>AAAA" in r.stdout
    assert max(map(len, r.stdout.splitlines())) < 1000  # the long lines are quoted short


@pytest.mark.multirank
def test_long_lines_in_an_osu_log_import_in_linear_time(tmp_path):
    lines = (FIX / "osu_allreduce.txt").read_text().splitlines()
    lines[0] = "# OSU MPI Allreduce" + " " * MB2 + "Latency Test v5.3"
    lines[3:3] = [
        "# OSU MPI A" + " " * MB2 + "B",
        "# OSU " + "A_" * (MB2 // 2),
        "# Send Buffer on " + "A" * MB2,
        "<script>" + "A" * MB2,
    ]
    p = tmp_path / "osu_long.txt"
    p.write_text("\n".join(lines) + "\n")
    r = _import(p, tmp_path / "run", "--world", "4")
    assert "imported 19 rows (all_reduce" in r.stdout
    assert max(map(len, r.stdout.splitlines())) < 1000


@pytest.mark.multirank
def test_long_nccl_tests_json_reads_in_linear_time(tmp_path):
    """A -J file of a million results, the last one bad, and a 2 MB string: the refusal names
    the last result's line (found by counting lines once, not from the top for each)."""
    doc = json.loads((FIX / "nccl_reduce_scatter.json").read_text())
    doc["start_time"] = "A" * MB2
    head = json.dumps({k: v for k, v in doc.items() if k != "results"})[:-1]
    n = 1_000_000
    p = tmp_path / "rs_long.json"
    with open(p, "w") as f:
        f.write(head + ', "results": [\n' + '{"size": 0},\n' * n + '{"size": "big"}\n]}\n')
    r = run_cli("import", p, "--out", tmp_path / "run", timeout=HANG_S)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"commbench: error: {p}:{n + 2}: results[{n}]: size 'big' is not a number"]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------
# -J JSON of the wrong types: one line naming the field, exit 2, no run directory

def _json_doc():
    return json.loads((FIX / "nccl_reduce_scatter.json").read_text())


def _set(path, value):
    def change(doc):
        *keys, last = path
        d = doc
        for k in keys:
            d = d[k]
        d[last] = value
        return doc
    return change


WRONG_TYPES = [
    (_set(["devices", 1, "rank"], "zero"), "devices[1].rank 'zero' is not a rank number (a whole number >= 0)"),
    (_set(["devices", 0, "rank"], None), "devices[0].rank None is not a rank number (a whole number >= 0)"),
    (_set(["devices"], 5), "devices: 5 is not a list (an object per rank)"),
    (_set(["devices", 2], 7), "devices[2] 7 is not an object (one per rank)"),
    (_set(["out_of_bounds"], 5), "out_of_bounds: 5 is not an object (with a count)"),
    (_set(["average_bus_bandwidth"], [1]), "average_bus_bandwidth: [1] is not an object (with a bandwidth)"),
    (_set(["config"], 3), "config: 3 is not an object (the run's settings)"),
    (_set(["env"], 5), "env: 5 is not a list of NAME=VALUE strings"),
    (_set(["args"], {"a": 1}), "args: {'a': 1} is not a list (the command line)"),
    (_set(["config", "iterations"], "lots"), "config.iterations 'lots' is not a count (a whole number >= 0)"),
    (_set(["results", 1, "actual_iterations"], "lots"),
     "results[1]: actual_iterations 'lots' is not a count (a whole number >= 0)"),
    (_set(["results", 2, "out_of_place_per_iter", "times_us"], ["x"]),
     "results[2]: out_of_place_per_iter.times_us[0] 'x' is not a number (microseconds)"),
    (_set(["results", 1, "redop"], 5), "results[1]: redop 5 is not a reduction's name (sum, prod, ...) or null"),
    (_set(["results", 1, "size"], float("inf")), "results[1]: size inf is not a number"),
    (_set(["results", 1, "size"], 1.5), "results[1]: size 1.5 is not a whole number of bytes"),
]


@pytest.mark.parametrize("change, words", WRONG_TYPES, ids=[w.split(" ")[0] + str(i) for i, (_, w) in
                                                             enumerate(WRONG_TYPES)])
def test_json_of_the_wrong_types_is_refused_in_one_line(tmp_path, change, words):
    from commbench.core.errors import UsageError
    from commbench.store.importers import import_to_run

    doc = change(_json_doc())
    p = tmp_path / "rs.json"
    p.write_text(json.dumps(doc, indent=1).replace("Infinity", "1e999"))
    with pytest.raises(UsageError) as e:
        import_to_run(p, out=tmp_path / "run")
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{p}:") and line.endswith(words), line
    assert not (tmp_path / "run").exists()


@pytest.mark.multirank
def test_json_nested_too_deep_is_refused_and_leaves_no_run(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    for name, text in (("deep.json", '{"nccl_version": 22803, "results": ' + deep + "}"), ("deep_list.json", deep)):
        p = tmp_path / name
        p.write_text(text)
        r = run_cli("import", p, "--world", "2", "--out", tmp_path / "run")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-800:]
        assert r.stderr.startswith(f"commbench: error: {p}:1:") and "Traceback" not in r.stderr
        assert "nested too deep" in r.stderr or "not nccl-tests -J output" in r.stderr
        assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------
# rows that NCCL's log cut apart

def _split_log(tail_comes: bool = True) -> tuple[list[str], int]:
    """The real 16-rank log with its rank lines and one size line cut by NCCL INFO lines of
    several ranks: the row's head ends its line, its tail stands on a line of its own."""
    lines = (REAL / "a3mega_nccl_allreduce_16r.txt").read_text().splitlines()
    info = [f"ztan-mig-235z:{6899 + r}:{7012 + r} [{r}] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7" for r in range(3)]
    rank3 = _first(lines, "#  Rank  3")
    lines[rank3:rank3 + 1] = [lines[rank3][:40], info[0], lines[rank3][40:]]
    at = _first(lines, "1048576 ")
    toks = lines[at].split()
    head, tail = "   ".join(toks[:8]), "   ".join(toks[8:])
    lines[at:at + 1] = [head, info[1], info[2]] + ([tail] if tail_comes else [])
    return lines, at


@pytest.mark.multirank
def test_a_row_cut_by_nccl_log_lines_is_read_with_its_rest(tmp_path):
    lines, at = _split_log()
    p = tmp_path / "allreduce_split.log"
    p.write_text("\n".join(lines) + "\n")
    r = _import(p, tmp_path / "run", "--benchmark", "all_reduce", "--world", "16")
    assert "imported 62 rows (all_reduce, world 16)" in r.stdout
    assert f"note: line {at + 1}: a size line cut in two by an NCCL log line, read with its rest on line {at + 4}" \
        in r.stdout


@pytest.mark.multirank
def test_a_row_part_beside_nccl_log_lines_is_said_and_the_rest_imports(tmp_path):
    lines, at = _split_log(tail_comes=False)
    p = tmp_path / "allreduce_part.log"
    p.write_text("\n".join(lines) + "\n")
    r = _import(p, tmp_path / "run", "--benchmark", "all_reduce", "--world", "16")
    assert "imported 60 rows (all_reduce, world 16)" in r.stdout
    assert f"note: line {at + 1}: part of a size line (8 of 13 fields) beside NCCL log lines, skipped" in r.stdout


# ---------------------------------------------------------------------------------------
# runs that share a directory name

def test_run_names_tell_runs_of_one_name_apart():
    from commbench.store.load import run_names

    assert run_names(["/r/x1/quick", "/r/y1/quick", "/r/z/other"]) == ["x1/quick", "y1/quick", "other"]
    assert run_names(["/r/a/x/quick", "/r/b/x/quick", "/r/c/quick"]) == ["a/x/quick", "b/x/quick", "c/quick"]
    assert run_names(["/quick", "/a/quick"]) == ["quick", "a/quick"]
    assert run_names(["/r/quick"]) == ["quick"]
    assert run_names(["/r/x/quick", "/r/x/quick", "/r/y/quick"]) == ["x/quick", "x/quick", "y/quick"]


def _write_run(d: Path, p50s: dict, world: int = 2) -> Path:
    from commbench.store.results import RunDir, Status

    run = RunDir(d).open({"schema": 3, "status": "running", "suite": "quick", "world": world})
    for nbytes, p50 in p50s.items():
        run.append(make_row(nbytes=nbytes, p50=p50, world=world), flush=False)
    run.finish(Status.COMPLETE)
    return d


@pytest.mark.multirank
def test_two_runs_of_one_name_stay_two_in_tables_reports_and_load(tmp_path):
    from commbench.store.load import load

    x = _write_run(tmp_path / "x1" / "quick", {1024: 11.0, 4096: 12.0})
    y = _write_run(tmp_path / "y1" / "quick", {1024: 21.0, 4096: 22.0})
    df = load([x, y])
    assert sorted(set(df["run"])) == ["x1/quick", "y1/quick"]
    assert not df.duplicated(["run", "point_key"]).any()
    r = run_cli("report", "x1/quick", "y1/quick", "--out", "rep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in r.stdout.splitlines()]
    assert sorted((t[0], t[3]) for t in cells if t[0] in ("x1/quick", "y1/quick")) == [
        ("x1/quick", "11.00"), ("x1/quick", "12.00"), ("y1/quick", "21.00"), ("y1/quick", "22.00")], r.stdout
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "<summary>x1/quick</summary>" in html and "<summary>y1/quick</summary>" in html
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "### x1/quick" in md and "### y1/quick" in md


# ---------------------------------------------------------------------------------------
# a reader that leaves early

@pytest.mark.multirank
def test_report_of_a_long_table_into_a_pipe_closed_early(tmp_path):
    """`commbench report BIGRUN | head -2`: a table longer than rich lays out is written by
    commbench itself; the reader leaving is no error."""
    run = _write_run(tmp_path / "big", {8 * k: 1.0 + k for k in range(1, 6001)})
    p = subprocess.Popen([sys.executable, "-m", "commbench", "report", str(run)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = [p.stdout.readline() for _ in range(2)]
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=HANG_S) == 0, err
    assert all(head) and err == ""
