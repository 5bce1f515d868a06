"""Nothing is written outside a run or report directory: a link planted there (a temporary,
the lock, rows.jsonl, a report file, figures/) is replaced or refused, never written through;
a name from input never becomes a path out of the report, nor mathtext that stops a figure.
Each security case makes the file a link points to first and compares its bytes after."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import FIXTURES, needs_mpi, run_cli

OSU = FIXTURES / "osu_allreduce.txt"
SECRET = b"someone else's file\n"


def _target(tmp_path, name="outside") -> Path:
    """A file outside every run and report, with known bytes."""
    p = tmp_path / name
    p.write_bytes(SECRET)
    return p


def _one_line(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def _imported(tmp_path, name: str) -> Path:
    from commbench.store.importers import import_to_run

    d, _ = import_to_run([OSU], out=tmp_path / name, world=4)
    return d


def _edit_rows(run: Path, **fields) -> None:
    """Rewrite every row of run with fields (a hand-edited or old run's names)."""
    rows = [json.loads(x) for x in (run / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        r.update(fields)
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


# --- temporaries, rows and the lock ---------------------------------------------------

@pytest.mark.multirank
def test_import_never_writes_through_a_planted_temporary(tmp_path):
    """meta.json.tmp and results.csv.tmp as links to files outside: the import writes the
    run, and the files the links name keep their bytes."""
    run = tmp_path / "r"
    run.mkdir()
    meta_target, csv_target = _target(tmp_path, "meta_target"), _target(tmp_path, "csv_target")
    (run / "meta.json.tmp").symlink_to(meta_target)
    (run / "results.csv.tmp").symlink_to(csv_target)
    r = run_cli("import", OSU, "--world", "4", "--out", run, timeout=120)
    assert r.returncode == 0, r.stderr
    assert meta_target.read_bytes() == SECRET and csv_target.read_bytes() == SECRET
    assert json.loads((run / "meta.json").read_text())["status"] == "complete"
    assert not (run / "meta.json").is_symlink() and (run / "results.csv").is_file()


@pytest.mark.multirank
def test_a_dangling_rows_link_is_refused_and_nothing_is_created_where_it_points(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    nowhere = tmp_path / "elsewhere" / "rows"
    nowhere.parent.mkdir()
    (run / "rows.jsonl").symlink_to(nowhere)
    r = run_cli("import", OSU, "--world", "4", "--out", run, timeout=120)
    _one_line(r, "rows.jsonl", "symbolic link")
    assert not nowhere.exists() and list(nowhere.parent.iterdir()) == []


def test_a_rows_link_to_a_file_is_refused_before_its_tail_is_touched(tmp_path):
    """RunDir.open repairs a torn last line of rows.jsonl: through a link that would cut
    someone else's file."""
    from commbench.core.errors import UsageError
    from commbench.store.results import RunDir

    target = tmp_path / "outside"
    target.write_bytes(b"no newline at the end")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "rows.jsonl").symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link"):
        RunDir(tmp_path / "r").open({"status": "running"})
    assert target.read_bytes() == b"no newline at the end"


def test_the_run_lock_never_truncates_the_file_a_link_names(tmp_path):
    from commbench.core.errors import UsageError
    from commbench.store.lock import RunLock

    target = _target(tmp_path)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".lock").symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link"):
        RunLock(tmp_path / "r").acquire().release()
    assert target.read_bytes() == SECRET


@needs_mpi
@pytest.mark.multirank
def test_run_refuses_a_linked_rows_file_before_any_rank_starts(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    nowhere = tmp_path / "nowhere"
    (run / "rows.jsonl").symlink_to(nowhere)
    r = run_cli("run", "quick", "--np", "2", "--backend", "mpi", "-b", "all_reduce", "--sizes", "8:64",
                "--iters", "20", "--out", run, timeout=180)
    _one_line(r, "rows.jsonl", "symbolic link")
    assert not nowhere.exists() and not (run / "meta.json").exists()


def test_progress_and_failure_files_never_follow_links(tmp_path):
    """A rank's progress file, failure file and the space it sets aside for one are written
    through temporaries of fresh names: links named like the old fixed temporaries, or like
    the files themselves, are replaced, never written through."""
    from commbench.run.guard import Guard

    run = tmp_path / "r"
    prog = run / ".progress"
    prog.mkdir(parents=True)
    targets = {}
    for name in (".slot-0", ".rank-0.tmp", ".failed-0.tmp", "rank-0", "failed-L-rank-0"):
        targets[name] = _target(tmp_path, "t" + name)
        (prog / name).symlink_to(targets[name])
    g = Guard(0, 1, run, timeout_s=30, launch="L")
    g.start()
    try:
        g.arm("a phase")
        g.disarm()
        g._heartbeat()
        assert g._write_failure("boom")
    finally:
        g.stop()
    assert {n: t.read_bytes() for n, t in targets.items()} == {n: SECRET for n in targets}
    assert json.loads((prog / "rank-0").read_text())["where"] == "a phase"
    assert json.loads((prog / "failed-L-rank-0").read_text())["reason"] == "boom"


def test_a_linked_progress_folder_gets_nothing(tmp_path):
    from commbench.run.guard import Guard

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "r"
    run.mkdir()
    (run / ".progress").symlink_to(elsewhere, target_is_directory=True)
    g = Guard(0, 1, run, timeout_s=30, launch="L")
    g.start()
    try:
        g.arm("a phase")
        g._write_failure("boom")
    finally:
        g.stop()
    assert list(elsewhere.iterdir()) == []


# --- the report directory -------------------------------------------------------------

def test_report_replaces_links_in_its_out_dir_never_writes_through_them(tmp_path):
    from commbench.commands.report import write_report

    run = _imported(tmp_path, "r")
    rep = tmp_path / "rep"
    (rep / "figures").mkdir(parents=True)
    targets = {n: _target(tmp_path, "t_" + n.replace("/", "_"))
               for n in ("report.md", "report.html", "figures/busbw_all_reduce.png")}
    for n, t in targets.items():
        (rep / n).symlink_to(t)
    res = write_report([run], rep)
    assert {n: t.read_bytes() for n, t in targets.items()} == {n: SECRET for n in targets}
    assert res["markdown"].read_text().startswith("# ") and not res["markdown"].is_symlink()
    png = rep / "figures" / "busbw_all_reduce.png"
    assert not png.is_symlink() and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.multirank
def test_report_refuses_a_figures_link(tmp_path):
    run = _imported(tmp_path, "r")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "figures").symlink_to(elsewhere, target_is_directory=True)
    r = run_cli("report", run, "--out", rep, timeout=180)
    _one_line(r, "figures", "symbolic link")
    assert list(elsewhere.iterdir()) == []


# --- names that are paths ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["x/../../../../escaped", "x/y", "..", "$\\foo$"])
@pytest.mark.multirank
def test_import_refuses_a_benchmark_name_that_is_not_a_name(tmp_path, name):
    out = tmp_path / "r"
    r = run_cli("import", OSU, "--world", "4", "--benchmark", name, "--out", out, timeout=120)
    _one_line(r, "--benchmark", repr(name), "letters, digits")
    assert not out.exists()


@pytest.mark.multirank
def test_import_refuses_a_json_type_that_is_not_a_name(tmp_path):
    text = (FIXTURES / "nccl_reduce_scatter.json").read_text().replace('"type": "float"', '"type": "$\\\\foo$"')
    assert "$\\\\foo$" in text
    src = tmp_path / "rs.json"
    src.write_text(text)
    out = tmp_path / "r"
    r = run_cli("import", src, "--out", out, timeout=120)
    _one_line(r, "rs.json", "dtype", "letters, digits")
    assert not out.exists()


def test_a_hand_edited_benchmark_name_never_leaves_the_report_dir(tmp_path):
    """An old or hand-edited run whose rows name their benchmark "x/../../../escaped": the
    figures stay in rep/figures, even where the folders the name climbs through exist."""
    from commbench.commands.report import write_report

    run = _imported(tmp_path, "r")
    _edit_rows(run, benchmark="x/../../../escaped")
    rep = tmp_path / "rep"
    (rep / "figures" / "busbw_x").mkdir(parents=True)
    (rep / "figures" / "latency_x").mkdir(parents=True)
    res = write_report([run], rep)
    pngs = sorted(tmp_path.rglob("*.png"))
    assert pngs and all(p.parent == rep / "figures" for p in pngs), pngs
    assert len(res["figures"]) == 2 and all(p.parent == rep / "figures" for p in res["figures"].values())
    assert "figures/busbw_x_" in res["markdown"].read_text()


def test_figure_file_names_stay_in_their_folder_and_apart():
    from commbench.core.safe_write import file_name

    names = ["all_reduce", "x/../../y", "x_.._.._y", "..", ".hidden", "a b", "$\\foo$", "é", "", "n" * 300]
    got = [file_name(n) for n in names]
    assert got[0] == "all_reduce"
    assert len(set(got)) == len(got), got
    for g in got:
        assert g and "/" not in g and not g.startswith(".") and len(g) <= 120 and Path(g).name == g, g


# --- names that are mathtext ------------------------------------------------------------

@pytest.mark.parametrize("where", ["directory", "benchmark", "dtype"])
def test_mathtext_names_are_drawn_as_written(tmp_path, where):
    """A run directory, a benchmark or a dtype named "$\\foo$" (a hand-written rows.jsonl or
    an old run: import refuses such a name): the report draws every figure and shows the
    name as it is written."""
    from matplotlib.text import Text

    from commbench.commands.report import write_report

    name = "$\\foo$"
    a = _imported(tmp_path, f"a{name}" if where == "directory" else "a")
    b = _imported(tmp_path, "b")
    if where != "directory":
        _edit_rows(a, **{where: name})
        if where == "benchmark":
            _edit_rows(b, benchmark=name)
    res = write_report([a, b], tmp_path / "rep")
    assert res["figures"] and all(p.stat().st_size > 1000 for p in res["figures"].values())
    shown = [t.get_text() for f in res["drawn"].values() for t in f.figure.findobj(Text)]
    assert any(name in s for s in shown), shown


@pytest.mark.multirank
def test_a_mathtext_directory_name_reports_at_the_command_line(tmp_path):
    a = _imported(tmp_path, "a$\\foo$")
    b = _imported(tmp_path, "b")
    rep = tmp_path / "rep"
    r = run_cli("report", a, b, "--out", rep, timeout=180)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(os.listdir(rep / "figures")) >= 2


def test_a_write_that_fails_leaves_the_file_as_it_was_and_no_temporary(tmp_path):
    """The primitive itself: a link named like the file is replaced (its target kept); an
    error inside the block leaves the file and the folder as they were."""
    from commbench.core.safe_write import replacing, write_atomic

    target = _target(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").symlink_to(target)
    write_atomic(d / "f", "new")
    assert target.read_bytes() == SECRET and not (d / "f").is_symlink() and (d / "f").read_text() == "new"
    with pytest.raises(RuntimeError):
        with replacing(d / "f") as f:
            f.write("half")
            raise RuntimeError("cut")
    assert sorted(os.listdir(d)) == ["f"] and (d / "f").read_text() == "new"
