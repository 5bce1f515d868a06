"""The moe benchmark's dispatchers: the names users know for one dispatch/combine
implementation, each a small plug-in over the same routing, tokens and exact check.

A dispatcher fixes the params that make it what it is (copies, mode, path: set on the
point, so rows say what ran), builds the path that moves the rows (an ExchangePath,
host.py), and says why it cannot run on a backend, device or node count (the point is
then skipped with that reason, not refused: a sweep over every dispatcher runs what it
can here). `--param moe.dispatcher=` (the default) keeps the choice made from copies,
mode and path.

Out-of-tree dispatchers register like benchmarks: a module named in COMMBENCH_PLUGINS
calls register_dispatcher (docs/plugins.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .allgather import AllGatherHostPath
from .alltoallv import AlltoallvPath
from .device import DevicePath
from .engines import engine, has_engine
from .hierarchical import HierarchicalPath
from .host import HostPath
from .jax_path import JaxPath
from .low_latency import LowLatencyPath

DEVICE_BACKENDS = ("gloo", "nccl")  # the torch engines (engines.py)


@dataclass(frozen=True)
class Dispatcher:
    name: str              # the name users know: "deepep-normal", "alltoall", "allgather", ...
    description: str       # one line, shown by `commbench list`
    serves: tuple          # ("prefill",), ("decode",) or both
    fixed: dict = field(default_factory=dict)   # params it sets on the point
    make_path: Callable = None   # (comm, params) -> an ExchangePath (host.py)
    why_not: Callable = None     # (backend, device, nodes, params) -> why it cannot run here, or None


DISPATCHERS: dict[str, Dispatcher] = {}


def register_dispatcher(d: Dispatcher) -> Dispatcher:
    """Add a dispatcher; a name registered twice is refused (as benchmarks are)."""
    if not d.name or not isinstance(d.name, str):
        raise ValueError("a dispatcher needs a name")
    if d.name in DISPATCHERS:
        raise ValueError(f"dispatcher {d.name!r} registered twice")
    if not callable(d.make_path) or not callable(d.why_not):
        raise ValueError(f"dispatcher {d.name!r} needs make_path and why_not")
    bad = set(d.serves) - {"prefill", "decode"}
    if bad or not d.serves:
        raise ValueError(f"dispatcher {d.name!r}: serves is 'prefill' and/or 'decode', not {sorted(bad)}")
    DISPATCHERS[d.name] = d
    return d


def default_path(comm, params: dict):
    """The path the params choose (no dispatcher named): the jax engine on jax; the device
    path of the backend's engine (gloo, nccl) in the mode and path asked; else the host
    path (mpi: refused for anything but flat normal, MoE.refusal)."""
    if comm.backend == "jax":  # stages of its own, no host sync (jax_path.py); flat normal only
        return JaxPath(engine(comm))
    if not has_engine(comm):
        return HostPath()
    if params["mode"] == "low_latency":
        return LowLatencyPath(engine(comm, "low_latency"))
    if params["path"] == "hierarchical":
        return HierarchicalPath(engine(comm, "hierarchical"))
    return DevicePath(engine(comm))


def path_for(comm, params: dict):
    """The path of the point's dispatcher, or the default choice."""
    name = params.get("dispatcher", "")
    return DISPATCHERS[name].make_path(comm, params) if name else default_path(comm, params)


def with_fixed(params: dict) -> dict:
    """The params with the named dispatcher's fixed ones set (rows then say what ran)."""
    d = DISPATCHERS.get(params.get("dispatcher", ""))
    return {**params, **d.fixed} if d else params


def node_count(comm) -> int:
    """Distinct nodes among the comm's ranks (one where the comm knows none)."""
    nodes = getattr(comm, "node_of_rank", None)
    return len(set(list(nodes)[:comm.size])) if nodes is not None else 1


def skip_reason(comm, params: dict) -> str | None:
    """Why the point's dispatcher cannot run on this comm (backend, device, nodes), or None.
    Every rank gets the same answer: it depends on the comm's shared facts only."""
    d = DISPATCHERS.get(params.get("dispatcher", ""))
    return d.why_not(comm.backend, getattr(comm, "device", "cpu"), node_count(comm), params) if d else None


def unknown(names) -> str | None:
    """One line naming the known dispatchers, for a name (or one of a sweep's list) nobody
    registered; None when all are known."""
    for name in names if isinstance(names, list) else [names]:
        if name and (not isinstance(name, str) or name not in DISPATCHERS):
            return f"moe: unknown dispatcher {name!r} (known: {', '.join(DISPATCHERS)})"
    return None


# --- why_not rules the built-ins share ---------------------------------------------------

def anywhere(backend, device, nodes, params):
    return None


def on_device_path(backend, device, nodes, params):
    if backend not in DEVICE_BACKENDS:
        return "runs on the device path (gloo, nccl)"
    return None


def on_mpi(backend, device, nodes, params):
    if backend != "mpi":
        return "runs on mpi (host buffers)"
    if device != "cpu":
        return "runs on host buffers (device cpu)"
    return None


def on_two_nodes(backend, device, nodes, params):
    return on_device_path(backend, device, nodes, params) or (
        "needs ranks on at least 2 nodes (two namespace hosts, or --ranks-per-node)" if nodes < 2 else None)


FLAT = {"mode": "normal", "path": "flat"}

for _d in (
    Dispatcher("deepep-normal", "one row per (token, destination rank), counts exchanged first "
               "(DeepEP normal kernels)",
               ("prefill",), {"copies": "rank", **FLAT}, default_path, anywhere),
    Dispatcher("alltoall", "one row per (token, expert), permuted by local expert (Megatron "
               "MoEAlltoAllTokenDispatcher)", ("prefill",), {"copies": "expert", **FLAT}, default_path, anywhere),
    Dispatcher("hierarchical", "across nodes once per (token, node), then inside the node "
               "(DeepEP internode); needs 2 nodes", ("prefill",),
               {"copies": "rank", "mode": "normal", "path": "hierarchical"}, default_path, on_two_nodes),
    Dispatcher("low-latency", "fixed slots per (source, expert), no count exchange, no host sync "
               "(DeepEP low-latency kernels)", ("decode",),
               {"copies": "expert", "mode": "low_latency", "path": "flat"}, default_path, on_device_path),
    Dispatcher("mpi-alltoallw", "rows straight from the token buffer by one MPI_Alltoallw of "
               "derived datatypes (the host path)", ("prefill", "decode"), dict(FLAT),
               lambda comm, params: HostPath(), on_mpi),
    Dispatcher("mpi-alltoallv", "rows packed by numpy into one contiguous buffer, one plain "
               "MPI_Alltoallv of bytes, unpacked", ("prefill", "decode"), dict(FLAT),
               lambda comm, params: AlltoallvPath(), on_mpi),
    # On mpi the host path below (gpu_dispatchers.py adds the torch engine's on gloo, nccl).
    Dispatcher("allgather", "all ranks gather every token and its routing, each keeps its experts' "
               "rows; combine by reduce-scatter (Megatron all-gather dispatcher)", ("prefill", "decode"),
               dict(FLAT), lambda comm, params: AllGatherHostPath(), on_mpi),
):
    register_dispatcher(_d)
# gpu_dispatchers.py adds allgather's torch engine (gloo, nccl), deepep, deepep-ll and pplx;
# the moe package imports it after this module (imported from here, the two would cycle).
