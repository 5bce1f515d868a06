"""The house's shape, as rules a change cannot break unseen: layers as folders that import
only downwards (tools/layers.py), in-package imports at the top of a module, no module
over 500 lines, the top of the package only its entry points, one place that builds a
suite's config, every module the tools name importable; a rank that never imports the
launcher, a harness that never imports report/, and a run's status written only by the
record (store/record.py)."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "commbench"
MAX_LINES = 500


def _layers(pkg: Path, *extra: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "layers.py"), str(pkg), *map(str, extra)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.multirank
def test_no_layer_imports_one_above_it_and_imports_wait_only_beside_heavy_libraries():
    p = _layers(PKG, *sorted((ROOT / "tools").glob("*.py")))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 climbing import(s); 0 in-package import(s) inside functions" in p.stdout, p.stdout
    assert "0 rank/launcher or harness/report import(s); 0 status write(s) outside the record" in p.stdout, p.stdout


def _planted(tmp_path, module: str, late_import: str) -> subprocess.CompletedProcess:
    """tools/layers.py over a copy of the package with `late_import` added inside a
    function of `module` (a path under the package)."""
    pkg = tmp_path / "commbench"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    f = pkg / module
    f.write_text(f.read_text() + f"\n\ndef _late():\n    {late_import}\n    return None\n")
    return _layers(pkg)


@pytest.mark.multirank
def test_a_planted_climbing_import_is_found(tmp_path):
    p = _planted(tmp_path, "core/units.py", "from commbench.run import launch  # climbs")
    assert p.returncode == 1, p.stdout
    assert re.search(r"climb: .*core/units\.py:\d+: commbench\.core\.units \(core\) imports commbench\.run\.launch "
                     r"\(run\)", p.stdout), p.stdout


@pytest.mark.multirank
def test_a_planted_lazy_in_package_import_is_counted(tmp_path):
    p = _planted(tmp_path, "run/plan.py", "from commbench.core.units import fmt_size")
    assert "lazy: " in p.stdout and "commbench.run.plan imports commbench.core.units.fmt_size" in p.stdout


@pytest.mark.multirank
def test_a_planted_launcher_import_in_a_rank_module_is_found(tmp_path):
    """A rank imports the contract (run/contract.py), never the launcher, not even through
    a module the rank imports."""
    p = _planted(tmp_path, "run/guard.py", "from commbench.run import launcher")
    assert p.returncode == 1, p.stdout
    assert ("rule: rank module commbench.run.guard imports launcher module commbench.run.launcher: "
            "commbench.run.guard -> commbench.run.launcher") in p.stdout, p.stdout


@pytest.mark.multirank
def test_a_launcher_import_reached_through_another_module_is_found(tmp_path):
    p = _planted(tmp_path, "run/plan.py", "from commbench.run.launcher_variants import mpi_flavor")
    assert p.returncode == 1, p.stdout
    assert re.search(r"rule: rank module commbench\.run\.rank_run imports launcher module "
                     r"commbench\.run\.launcher_variants: commbench\.run\.rank_run -> .*commbench\.run\.plan -> "
                     r"commbench\.run\.launcher_variants", p.stdout), p.stdout


@pytest.mark.multirank
def test_a_planted_report_import_in_the_harness_is_found(tmp_path):
    p = _planted(tmp_path, "run/point_harness.py", "from commbench.report.progress import Progress")
    assert p.returncode == 1, p.stdout
    assert ("rule: harness module commbench.run.point_harness imports commbench.report.progress: "
            "commbench.run.point_harness -> commbench.report.progress") in p.stdout, p.stdout


@pytest.mark.multirank
def test_a_rule_naming_a_module_that_is_gone_says_so(tmp_path):
    pkg = tmp_path / "commbench"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "run" / "guard.py").unlink()
    p = _layers(pkg)
    assert p.returncode == 1 and "rule: commbench.run.guard is named in tools/layers.py but is no module" in p.stdout


@pytest.mark.parametrize("write", ['meta = {}; meta["status"] = "running"',
                                   'meta = {}; meta.setdefault("variants", {})["default"]["status"] = "failed"',
                                   'meta = {}; meta.update(status="complete", reason=None)',
                                   'meta = {"status": "running"}',
                                   'meta = {}; meta.setdefault("status", "running")',
                                   'meta = dict(status="interrupted")'])
@pytest.mark.multirank
def test_a_planted_status_write_outside_the_record_is_found(tmp_path, write):
    p = _planted(tmp_path, "run/plan.py", write)
    assert p.returncode == 1, p.stdout
    assert re.search(r"status: .*run/plan\.py:\d+: commbench\.run\.plan writes ", p.stdout), p.stdout


@pytest.mark.multirank
def test_reading_a_status_is_no_write(tmp_path):
    p = _planted(tmp_path, "run/plan.py", 'meta = {}; ok = meta.get("status") == "complete" or meta["status"]')
    assert not re.search(r"status: .*run/plan\.py", p.stdout), p.stdout


def test_the_top_of_the_package_holds_only_its_entry_points():
    assert sorted(p.name for p in PKG.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py"]


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_a_suite_config_is_built_in_one_place():
    sites = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "SuiteConfig":
                sites.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert sites == ["commbench/run/suite.py:" + sites[0].rsplit(":", 1)[1]] and len(sites) == 1, sites


@pytest.mark.multirank
def test_every_module_the_tools_name_imports():
    names = set()
    for p in (ROOT / "tools").glob("*.py"):
        names |= set(re.findall(r"\b(commbench(?:\.[a-z_]+)+)", p.read_text()))
    modules = sorted(n for n in names
                     if (PKG.parent / Path(*n.split("."))).with_suffix(".py").exists()
                     or (PKG.parent / Path(*n.split(".")) / "__init__.py").exists())
    assert modules, "the tools name no module of the package"
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')"
    p = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
