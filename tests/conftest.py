"""Shared helpers: run the real CLI in a subprocess, as a user would."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, timeout=300, env=None, cwd=None):
    e = dict(os.environ)
    e.pop("COMMBENCH_TTY", None)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "plugins"), e.get("PYTHONPATH", "")])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=cwd or ROOT)


needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
