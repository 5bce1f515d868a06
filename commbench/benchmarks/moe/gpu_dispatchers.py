"""The dispatchers that run on torch engines of their own: `allgather` on gloo and nccl
(Megatron's all-gather token dispatcher, allgather_device.py; on mpi it keeps the host
path registered beside the others), and the GPU libraries' `deepep` (DeepEP normal),
`deepep-ll` (DeepEP low-latency) and `pplx` (pplx-kernels), skipped with the reason where
CUDA or the library is missing (backends/moe/gpu_lib.py).

The library paths time each library call as a stage, check what it returns against the
routing (the torch path's expectations), and put the library's own figures on the rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from commbench import moe as M
from commbench.backends.moe import deepep_adapter, pplx_adapter

from .allgather_device import gathered_tokens, make_allgather_path
from .dispatchers import DEVICE_BACKENDS, DISPATCHERS, FLAT, Dispatcher, register_dispatcher
from .host import EnginePath


@dataclass
class LibraryBufs:
    plan: object
    state: object
    path: object
    pack_method: str


class LibraryPath(EnginePath):
    """A GPU library's engine (deepep_adapter, pplx_adapter) stage by stage. Never held:
    the libraries' kernels wait on the other ranks' writes, and DeepEP's normal dispatch
    waits on the host for the received count."""

    hold = False
    host_waits: dict = {}
    exchange_laps = ("dispatch", "combine")  # the library's own calls: what outside_a2a_pct counts as the exchange

    def __init__(self, engine, name: str, dispatch_stages: tuple, combine_stages: tuple, weighted: bool):
        super().__init__(engine)
        self.name, self.dispatch_stages, self.combine_stages = name, dispatch_stages, combine_stages
        self.weighted = weighted

    def setup(self, comm, plan) -> LibraryBufs:
        p = plan.point.params
        st = self.engine.setup(plan.topk, plan.weights, p["experts"], p["hidden"], p["dispatch_dtype"],
                               gathered_tokens(plan), getattr(plan, "stride", 0))
        return LibraryBufs(plan, st, self, self.engine.method)

    def check(self, comm, b) -> bool:
        return self.engine.check(b.state, expectations(b.plan, comm.size, comm.rank, self.weighted))

    def row_info(self, b) -> dict:
        return {**self.engine.library_figures(b.state),
                "library_note": "unverified on a GPU here: the plumbing is tested against fakes of the library; "
                                "logical_gbps counts the rank's own tokens, as DeepEP's own figure does"}


def expectations(plan, world: int, me: int, weighted: bool) -> dict:
    """What this rank should get, from every rank's regenerated routing: the rows by
    source (rank copies: one per (token, this rank), in token order), the rows of each
    local expert by source (expert copies), the picks per local expert, and the factor
    combine(dispatch(x)) multiplies each token by (destination ranks, or the weight sum)."""
    num_experts = plan.point.params["experts"]
    local = num_experts // world
    mine = np.arange(me * local, (me + 1) * local)
    topks = [plan.topk if src == me else plan.routing_for(src).topk_idx for src in range(world)]
    sources = [(src, np.nonzero(np.isin(t, mine).any(axis=1))[0]) for src, t in enumerate(topks)]
    by_expert = [[(src, np.nonzero((t == e).any(axis=1))[0]) for src, t in enumerate(topks)] for e in mine]
    per_expert = [int(sum(int((t == e).sum()) for t in topks)) for e in mine]
    layout = M.dispatch_layout(plan.topk, num_experts, world, "expert" if weighted else "rank", weights=plan.weights)
    return {"sources": sources, "by_expert": by_expert, "per_local_expert": per_expert,
            "factor": M.combine_factor(layout, weighted)}


def _deepep(comm, params):
    return LibraryPath(deepep_adapter.DeepEPNormal(comm), "deep_ep", ("layout", "dispatch"), ("combine",), False)


def _deepep_ll(comm, params):
    return LibraryPath(deepep_adapter.DeepEPLowLatency(comm), "deep_ep", ("dispatch",), ("combine",), True)


def _pplx(comm, params):
    return LibraryPath(pplx_adapter.PplxAllToAll(comm), "pplx_kernels", ("dispatch",), ("combine",), True)


def _extend_allgather() -> None:
    """`allgather` runs the torch engine on gloo and nccl, and whatever was registered
    for the other backends (the host path on mpi) there."""
    before = DISPATCHERS.get("allgather")

    def make_path(comm, params):
        if comm.backend in DEVICE_BACKENDS or before is None:
            return make_allgather_path(comm, params)
        return before.make_path(comm, params)

    def why_not(backend, device, nodes, params):
        if backend in DEVICE_BACKENDS:
            return None
        return before.why_not(backend, device, nodes, params) if before else "runs on the device path (gloo, nccl)"

    if before is None:
        register_dispatcher(Dispatcher("allgather", "every rank gathers all tokens and routing, keeps its experts' "
                                       "rows; combine by reduce-scatter (Megatron MoEAllGatherTokenDispatcher)",
                                       ("prefill", "decode"), {"copies": "expert", **FLAT}, make_path, why_not))
    else:
        DISPATCHERS["allgather"] = replace(before, make_path=make_path, why_not=why_not)


_extend_allgather()

for _d in (
    Dispatcher("deepep", "DeepEP's Buffer, normal kernels (get_dispatch_layout, dispatch, combine); "
               "needs CUDA and deep_ep", ("prefill",), {"copies": "rank", **FLAT}, _deepep, deepep_adapter.why_not),
    Dispatcher("deepep-ll", "DeepEP's Buffer, low-latency kernels (low_latency_dispatch/combine); "
               "needs CUDA and deep_ep", ("decode",), {"copies": "expert", "mode": "low_latency", "path": "flat"},
               _deepep_ll, deepep_adapter.why_not),
    Dispatcher("pplx", "pplx-kernels' AllToAll over NVSHMEM (dispatch, combine); needs CUDA and pplx_kernels",
               ("prefill", "decode"), {"copies": "expert", **FLAT}, _pplx, pplx_adapter.why_not),
):
    register_dispatcher(_d)
