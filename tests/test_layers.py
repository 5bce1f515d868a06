"""The house's shape, as rules a change cannot break unseen: layers as folders that import
only downwards (tools/layers.py), in-package imports at the top of a module, no module
over 500 lines, the top of the package only its entry points, one place that builds a
suite's config, and every module the tools name importable."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "commbench"
MAX_LINES = 500


def _layers(pkg: Path, *extra: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "layers.py"), str(pkg), *map(str, extra)],
                          capture_output=True, text=True, timeout=120)


def test_no_layer_imports_one_above_it_and_imports_wait_only_beside_heavy_libraries():
    p = _layers(PKG, *sorted((ROOT / "tools").glob("*.py")))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 climbing import(s); 0 in-package import(s) inside functions" in p.stdout, p.stdout


def _planted(tmp_path, module: str, late_import: str) -> subprocess.CompletedProcess:
    """tools/layers.py over a copy of the package with `late_import` added inside a
    function of `module` (a path under the package)."""
    pkg = tmp_path / "commbench"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    f = pkg / module
    f.write_text(f.read_text() + f"\n\ndef _late():\n    {late_import}\n    return None\n")
    return _layers(pkg)


def test_a_planted_climbing_import_is_found(tmp_path):
    p = _planted(tmp_path, "core/units.py", "from commbench.run import launch  # climbs")
    assert p.returncode == 1, p.stdout
    assert re.search(r"climb: .*core/units\.py:\d+: commbench\.core\.units \(core\) imports commbench\.run\.launch "
                     r"\(run\)", p.stdout), p.stdout


def test_a_planted_lazy_in_package_import_is_counted(tmp_path):
    p = _planted(tmp_path, "run/plan.py", "from commbench.core.units import fmt_size")
    assert "lazy: " in p.stdout and "commbench.run.plan imports commbench.core.units.fmt_size" in p.stdout


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
