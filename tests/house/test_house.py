"""The shape of the package: no import cycles (lazy imports count), the registry full
after one import, every benchmark's busbw factor in one place."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multirank
def test_import_graph_has_no_cycle():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "import_cycles.py"), str(ROOT / "commbench")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 cycle(s)" in p.stdout


@pytest.mark.multirank
def test_cycle_finder_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def f():\n    from .a import x\n")
    (pkg / "a.py").write_text("from . import f\nx = 1\n")
    (pkg / "b.py").write_text("from .a import x\n")
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "import_cycles.py"), str(pkg)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "cycle: pkg <-> pkg.a" in p.stdout


@pytest.mark.multirank
def test_registry_is_full_after_one_import():
    code = ("from commbench.benchmarks.base import registry; import commbench.benchmarks; "
            "print(sorted(registry()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for name in ("all_reduce", "all_to_all", "barrier", "moe", "overlap"):
        assert name in out.stdout


def test_busbw_factors_come_from_the_benchmarks():
    from commbench.benchmarks import Point, registry

    reg = registry()
    assert reg["all_reduce"].busbw_factor(8) == 2 * 7 / 8
    for name in ("reduce_scatter", "all_gather", "all_to_all"):
        assert reg[name].busbw_factor(8) == 7 / 8
    assert reg["broadcast"].busbw_factor(8) == reg["send_recv"].busbw_factor(8) == 1.0
    # traffic() uses the same factor
    t = reg["all_gather"].traffic(Point("all_gather", 4, "float32", 1 << 20, {}))
    assert (t.nbytes, t.busbw_factor) == (1 << 20, 0.75)
