"""Which MoE engine runs on a communicator: the benchmark's choice, not the comm's.

A comm offers collectives; the engines (backends/moe/) move routed rows with them on the
comm's own tensors. The choice is keyed by the comm's backend name: torch comms (gloo,
nccl) take the torch engines, a jax comm the jax one, and any other (mpi) none, so the
benchmark packs rows on the host (host.py). An engine is made once per comm and kind and
kept while the comm lives, as the points of a run share it (the jax one keeps the exchange
a plug-in put in; the torch low-latency and two-tier ones wrap the normal one).
"""
from __future__ import annotations

import weakref

from commbench.backends.moe.jax_normal import JaxMoE
from commbench.core.errors import UsageError

KINDS = ("normal", "low_latency", "hierarchical")


def _torch(comm, kind: str):
    # The torch engines import torch: here, when a torch comm asks, not when moe is imported.
    if kind == "normal":
        from commbench.backends.moe.torch_normal import TorchMoE

        return TorchMoE(comm)
    normal = engine(comm, "normal")  # the low-latency and two-tier engines build on it
    if kind == "low_latency":
        from commbench.backends.moe.torch_low_latency import LowLatencyMoE

        return LowLatencyMoE(normal)
    from commbench.backends.moe.torch_hierarchical import HierMoE

    return HierMoE(normal)


def _jax(comm, kind: str):
    if kind != "normal":  # moe's refusal says so before any rank starts
        raise UsageError(f"backend jax: moe {kind} is not implemented (mode=normal, path=flat only)")
    return JaxMoE(comm)


# backend name -> the maker of its engines; a backend not named here runs the host path.
ENGINES = {"gloo": _torch, "nccl": _torch, "jax": _jax}

# comm -> {kind: engine}; weak, so an engine goes with its comm.
_MADE = weakref.WeakKeyDictionary()


def has_engine(comm) -> bool:
    """Does the comm's backend have a device engine (else: the host path)?"""
    return comm.backend in ENGINES


def engine(comm, kind: str = "normal"):
    """The comm's engine of this kind (normal, low_latency, hierarchical), made on first
    use and the same one after; None where the backend has none (the host path)."""
    if kind not in KINDS:
        raise ValueError(f"unknown moe engine kind {kind!r} (known: {', '.join(KINDS)})")
    make = ENGINES.get(comm.backend)
    if make is None:
        return None
    made = _MADE.setdefault(comm, {})
    if kind not in made:
        made[kind] = make(comm, kind)
    return made[kind]
