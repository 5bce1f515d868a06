"""The moe benchmark's all-gather dispatcher on the torch backends (gloo on CPU, nccl on
CUDA): the engine of backends/moe/torch_allgather.py (Megatron's all-gather token
dispatcher) driven stage by stage, its bytes as they move (every rank's tokens to every
rank, then fp32 partial sums back), and the same exact checks as the all-to-all path: with
expert copies the local experts' rows are ordered (expert, source, token), the all-to-all
path's arrival order regrouped by expert; with rank copies (source, token), its arrival
order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .device import DevicePath


@dataclass
class AllGatherBufs:
    plan: object
    state: object
    path: object
    pack_method: str


def gathered_tokens(plan) -> int:
    """T_max: the largest token count of any rank (all_gather moves equal blocks)."""
    if getattr(plan, "tokens", None) is not None:
        return int(np.max(plan.tokens))
    return max(int(plan.routing_for(s).topk_idx.shape[0]) if s != plan.rank else int(plan.topk.shape[0])
               for s in range(plan.matrix.shape[0]))


class AllGatherPath(DevicePath):
    """DevicePath's checks over the all-gather engine's stages: expert copies (Megatron's
    choice: one row per (token, local expert), weighted combine) or rank copies (one row
    per token with a local expert, unweighted combine)."""

    name = "torch"
    dispatch_stages = ("gather", "select")
    combine_stages = ("reduce", "reduce_scatter")
    exchange_laps = ("gather", "reduce_scatter")  # what outside_a2a_pct counts as the exchange
    # Held on a device: only select reads the device on the host (the per-expert counts).
    hold = True
    host_waits = {"dispatch": ("select",)}

    def __init__(self, engine):
        super().__init__(engine)
        self._stages_accounted = 0

    def setup(self, comm, plan) -> AllGatherBufs:
        p = plan.point.params
        st = self.engine.setup(plan.topk, plan.weights, p["experts"], p["copies"], p["hidden"], p["dispatch_dtype"],
                               gathered_tokens(plan), plan.n_recv, getattr(plan, "stride", 0))
        return AllGatherBufs(plan, st, self, self.engine.method)

    def accounting(self, plan, rank, node_of_rank, row_nbytes) -> dict:
        """Algorithmic logical_nbytes (the routed rows, as the all-to-all paths count them);
        physical remote/scaleup/scaleout_nbytes: what left the rank, as the host path
        (allgather.py) counts it: T_max rows plus 8 bytes of routing per top-k slot to
        every other rank in dispatch, T_max fp32 partial sums (4H bytes) in combine.
        measure() asks for dispatch, then combine, once each on a path made for the
        point's step: the call's order says which (their row sizes may be equal)."""
        stage = ("dispatch", "combine")[min(self._stages_accounted, 1)]
        self._stages_accounted += 1
        p = plan.point.params
        t_max = gathered_tokens(plan)
        per = t_max * (plan.rb_d + 8 * p["topk"]) if stage == "dispatch" else t_max * 4 * p["hidden"]
        acc = super().accounting(plan, rank, node_of_rank, row_nbytes)
        node = np.asarray(node_of_rank)
        other = np.arange(node.shape[0]) != rank
        same = node == node[rank]
        acc.update(remote_nbytes=int(other.sum()) * per, scaleup_nbytes=int((other & same).sum()) * per,
                   scaleout_nbytes=int((~same).sum()) * per, sent_logical_nbytes=int(other.sum()) * per)
        return acc

    def row_info(self, b) -> dict:
        from commbench.backends.moe.torch_allgather import EXCHANGE

        return {"cpu_threads": b.state.cpu_threads, "exchange": EXCHANGE, "padded_tokens": b.state.t_max,
                "combine_carried_as": "float32",
                "bytes_note": "logical_nbytes: algorithmic (the routed rows this rank's experts take, as the "
                              "all-to-all dispatchers count them); remote/scaleup/scaleout_nbytes: physical, what "
                              "left the rank (its tokens padded to the largest rank's count plus 8 bytes of routing "
                              "per top-k slot to every other rank; combine: fp32 partial sums of those tokens)"}


def make_allgather_path(comm, params: dict) -> AllGatherPath:
    """The all-gather path on a torch comm (gloo, nccl); torch is imported here, when asked."""
    from commbench.backends.moe.torch_allgather import AllGatherMoE

    from .engines import engine

    return AllGatherPath(AllGatherMoE(engine(comm)))
