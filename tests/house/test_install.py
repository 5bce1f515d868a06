"""A normal install: the wheel, installed into a fresh virtual environment, runs the quick
suite from a directory outside the checkout, with the suites it ships."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, needs_torch, run_meta, run_rows, starts_processes

# Every test here starts processes (conftest: the multirank guard).
pytestmark = pytest.mark.multirank


def _run(cmd, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COMMBENCH_SUITES", "COMMBENCH_TTY")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
@starts_processes
def installed(tmp_path_factory):
    """(python, bin dir) of a fresh venv holding the commbench wheel and nothing of the checkout."""
    tmp = tmp_path_factory.mktemp("install")
    # Build from a copy of what the wheel is made of, so the checkout gets no build output.
    src = tmp / "src"
    shutil.copytree(ROOT / "commbench", src / "commbench", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    wheels = tmp / "wheels"
    p = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation",
              "-w", wheels, src], cwd=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    wheel = next(wheels.glob("commbench-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {"commbench/suites/quick.toml", "commbench/suites/inswitch.toml"} <= names

    venv = tmp / "venv"
    p = _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    py = venv / "bin" / "python"
    # pip drives the fresh interpreter (--python), so the console script points at it. This
    # comes before the dependencies are made visible: pip must not see (and replace) the
    # checkout's own editable install.
    p = _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel], cwd=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    # The dependencies (numpy, pandas, rich, torch) come from this interpreter's environment,
    # as a plain path: its editable commbench is a finder that only a site directory's own
    # .pth files start, so it stays out.
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip())
    (site / "commbench-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, venv / "bin"


@needs_torch
def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    py, _ = installed
    p = _run([py, "-c", "import commbench.run.suite as s; print(s.__file__); print(s.PACKAGE_SUITES)"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    mod, suites = p.stdout.split()
    venv = py.parent.parent
    assert Path(mod).is_relative_to(venv) and Path(suites).is_relative_to(venv), p.stdout
    assert not Path(mod).is_relative_to(ROOT)


@needs_torch
def test_list_from_another_directory_shows_the_shipped_suites(installed, tmp_path):
    _, bin_ = installed
    p = _run([bin_ / "commbench", "list"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    suites = p.stdout.split("suites:")[1].split()
    assert {"quick", "collectives", "inswitch", "moe"} <= set(suites)
    default = [ln for ln in p.stdout.splitlines() if "(default)" in ln]
    assert len(default) == 1 and " yes " in default[0], p.stdout


@needs_torch
def test_quick_runs_from_another_directory(installed, tmp_path):
    py, _ = installed
    p = _run([py, "-m", "commbench", "run", "quick", "--np", "2", "--sizes", "8:64", "--iters", "3", "--warmup", "1",
              "--backend", "gloo"], cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    runs = list((tmp_path / "results").glob("*-quick"))
    assert len(runs) == 1 and (runs[0] / "rows.jsonl").is_file(), p.stdout[-2000:]
    meta = run_meta(runs[0])
    assert meta["suite"] == "quick" and meta["status"] == "complete"
    assert {r["benchmark"] for r in run_rows(runs[0])} >= {
        "all_reduce", "all_to_all", "barrier"}
