"""One presentation route: every benchmark's rows reach the terminal, report.md/report.html
and the figures through the view it names (Benchmark.view), registered with
commbench.report.views.register_view by the built-ins and plug-ins alike; the Benchmark
contract documented whole in docs/plugins.md; `commbench report` reading each run's rows
and meta.json once."""
from __future__ import annotations

import builtins
import io
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from commbench import cli
from commbench.benchmarks import base, registry
from commbench.benchmarks.base import Benchmark
from commbench.benchmarks.collectives import AllReduce
from commbench.core.errors import UsageError
from commbench.report import views
from commbench.report.tables import table
from commbench.report.terminal import print_tables
from commbench.store.results import RunDir, Status
from conftest import make_row

ROOT = Path(__file__).resolve().parents[2]


class _Probe(AllReduce):
    name = "probe_view_bench"
    view = "probe_view"
    collective_rows = False


@pytest.fixture
def probe(monkeypatch):
    """A benchmark naming its own view, and that view registered: the registries restored after."""
    monkeypatch.setattr(views, "_VIEWS", dict(views._VIEWS))
    monkeypatch.setitem(base._REGISTRY, _Probe.name, _Probe())
    calls = []

    def probe_tables(b, rows, plain):
        calls.append((b.name, len(rows)))
        t = table("probe: its own table", "drawn by the probe view", plain)
        t.add_column("world")
        for r in rows:
            t.add_row(f"probe-world-{r['world']}")
        return [t]

    views.register_view("probe_view", tables=probe_tables)
    return calls


def test_a_registered_view_gets_its_tables_in_report(probe):
    rows = [make_row(_Probe.name, w, 4096, 10.0 + w) for w in (2, 4)] + \
        [make_row("all_reduce", 2, n, 5.0) for n in (1024, 4096)]
    console = Console(file=io.StringIO(), width=200)
    print_tables(rows, console)
    out = console.file.getvalue()
    assert probe == [(_Probe.name, 2)]
    assert "probe: its own table" in out and "probe-world-2" in out and "probe-world-4" in out
    assert f"{_Probe.name}  [" not in out  # its view replaced the generic table
    assert "all_reduce  [mpi/cpu]" in out  # the others keep the collective view


def test_built_ins_go_through_the_same_registry():
    known = views.registered()
    assert {"collective", "moe", "overlap"} <= set(known)
    for name, b in registry().items():
        assert views.view_of(b) is known[b.view], name
    assert registry()["moe"].view == "moe" and registry()["overlap"].view == "overlap"
    assert registry()["all_reduce"].view == "collective" and Benchmark().view == "collective"
    # One route: the benchmark carries no presentation hooks of its own.
    for hook in ("tables", "figures", "report_sections"):
        assert not hasattr(Benchmark, hook), hook


def test_no_benchmark_class_is_tested_in_report():
    pattern = re.compile(r"isinstance\([^,]+,\s*\(?\s*(MoE|Overlap|AllReduce|Benchmark|[A-Z]\w*Bench\w*)\b")
    for path in sorted((ROOT / "commbench" / "report").glob("*.py")):
        assert not pattern.search(path.read_text()), path.name


def test_a_view_nobody_registered_or_registered_twice_is_refused(monkeypatch):
    monkeypatch.setattr(views, "_VIEWS", dict(views._VIEWS))

    class Lost(Benchmark):
        name = "lost"
        view = "nowhere"

    with pytest.raises(UsageError, match="view 'nowhere', which no module registered"):
        views.tables(Lost(), [], True)
    with pytest.raises(ValueError, match="registered twice"):
        views.register_view("moe")


def _documented_members() -> set[str]:
    text = (ROOT / "docs" / "plugins.md").read_text()
    part = text.split("## The `Benchmark` contract, whole", 1)[1].split("\n## ", 1)[0]
    cells = [ln.split("|")[1].strip() for ln in part.splitlines() if ln.startswith("| `")]
    return {re.match(r"`(\w+)", c).group(1) for c in cells}


def test_the_benchmark_contract_is_documented_whole():
    members = {n for n in dir(Benchmark) if not n.startswith("_")}
    documented = _documented_members()
    assert documented == members, (f"in the class, not in docs/plugins.md: {sorted(members - documented)}; "
                                   f"in docs/plugins.md, not in the class: {sorted(documented - members)}")


def _run(path: Path, variant_rows: bool) -> Path:
    d = RunDir(path).open({"schema": 3, "status": "running", "suite": "quick", "backend": "mpi", "device": "cpu",
                           "world": 2, "hosts": ["h", "h"], "nodes": [0, 0],
                           "variants": {"default": {"status": "complete"}, "other": {"status": "complete"},
                                        "gone": {"status": "skipped", "reason": "not here"}}})
    for variant in (("default", "other") if variant_rows else ("default",)):
        for n in (1024, 65536, 1 << 20):
            d.append(make_row("all_reduce", 2, n, 5.0 + n / 1e4, variant=variant))
    d.finish(Status.COMPLETE)
    return path


def test_report_reads_each_runs_rows_and_meta_once(tmp_path, monkeypatch, capsys):
    runs = [_run(tmp_path / "a", True), _run(tmp_path / "b", False)]
    opened: list[str] = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

    def note(file, reading: bool) -> None:
        name = os.path.basename(os.fspath(file)) if isinstance(file, (str, bytes, os.PathLike)) else ""
        if reading and name in ("rows.jsonl", "meta.json"):
            opened.append(os.path.join(os.path.basename(os.path.dirname(os.fspath(file))), name))

    def counted_open(file, mode="r", *a, **k):
        note(file, not any(c in mode for c in "wax+"))
        return real_open(file, mode, *a, **k)

    def counted_io_open(file, mode="r", *a, **k):
        note(file, not any(c in mode for c in "wax+"))
        return real_io_open(file, mode, *a, **k)

    def counted_os_open(file, flags, *a, **k):
        note(file, not flags & (os.O_WRONLY | os.O_RDWR))
        return real_os_open(file, flags, *a, **k)

    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(io, "open", counted_io_open)
    monkeypatch.setattr(os, "open", counted_os_open)
    status = cli.main(["report", *map(str, runs), "--profile", "h100-hgx", "--out", str(tmp_path / "rep")])
    monkeypatch.undo()
    out = capsys.readouterr().out
    assert status == 0, out
    assert "report:" in out and "variant gone: skipped" in out  # the terminal and the files both
    assert sorted(opened) == ["a/meta.json", "a/rows.jsonl", "b/meta.json", "b/rows.jsonl"], opened
