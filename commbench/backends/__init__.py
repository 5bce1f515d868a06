"""Backends: the names users know (mpi, gloo, nccl) behind one small interface.

Nothing heavy is imported here: `commbench list` answers whether each backend works
without importing torch or mpi4py.
"""
from __future__ import annotations

import importlib
import importlib.util

from commbench.backends.gpus import visible_gpus
from commbench.core.errors import UsageError

# name -> (module, class, device)
BACKENDS = {
    "mpi": ("commbench.backends.mpi", "MpiBackend"),
    "gloo": ("commbench.backends.torch_backend", "TorchBackend"),
    "nccl": ("commbench.backends.torch_backend", "TorchBackend"),
    "jax": ("commbench.backends.jax_dist", "JaxBackend"),
}
# dtypes each backend carries (MPI has no bfloat16 datatype).
BACKEND_DTYPES = {
    "mpi": ("float32", "float16", "int32"),
    "gloo": ("float32", "bfloat16", "float16", "int32"),
    "nccl": ("float32", "bfloat16", "float16", "int32"),
    "jax": ("float32", "bfloat16", "float16", "int32"),
}


def gpu_visible() -> bool:
    """A CUDA GPU is present, judged without importing torch or cupy."""

    return visible_gpus() > 0


# What a pip user installs for a backend (the extras of pyproject.toml).
INSTALL_HINT = ("pip install 'commbench[torch]' for gloo and nccl, or 'commbench[mpi]' with a system MPI "
                "('commbench[mpi,mpi-wheel]' without one) for mpi, or 'commbench[jax]' for jax")


def availability(name: str) -> tuple[bool, str]:
    """(works here, why not)."""
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return False, ("mpi4py is not installed (pip install 'commbench[mpi]' with a system MPI, or "
                           "'commbench[mpi,mpi-wheel]')")
        return True, "mpi4py"
    if name == "jax":
        # Found, not imported: importing jax takes seconds, and a rank must not start JAX
        # before jax.distributed.initialize.
        if importlib.util.find_spec("jax") is None or importlib.util.find_spec("jaxlib") is None:
            return False, "jax is not installed (pip install 'commbench[jax]')"
        return True, "jax.lax collectives in shard_map (gloo on CPU; NCCL with JAX's CUDA plugin)"
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed (pip install 'commbench[torch]')"
    if name == "nccl" and not gpu_visible():
        return False, "no CUDA GPU visible"
    return True, "torch.distributed"


def default_backend() -> str | None:
    """nccl with a visible GPU, else mpi, else gloo: the first that works here; None when
    none does (the caller says what to install)."""
    order = ("nccl", "mpi", "gloo") if gpu_visible() else ("mpi", "gloo")
    return next((name for name in order if availability(name)[0]), None)


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
