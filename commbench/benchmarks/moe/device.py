"""The moe benchmark's torch path in normal mode: the engine of backends/moe/torch_normal.py
(gloo on CPU tensors, nccl on CUDA tensors) driven stage by stage, and checked against the
host's regenerated layouts."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M

from .host import EnginePath, regroup_perm


@dataclass
class DeviceBufs:
    plan: object              # the benchmark's MoEPlan: routing, the host layout, row sizes
    state: object             # the engine's MoEState: device buffers and the last plan
    path: object
    pack_method: str


class DevicePath(EnginePath):
    """The torch engine driven stage by stage; its checks get their expectations from the
    host's regenerated layouts, an implementation independent of the device layout they
    check."""

    name = "torch"
    dispatch_stages = ("layout", "counts", "sync", "pack", "a2a", "unpack")
    combine_stages = ("pack", "a2a", "reduce")
    # Held on a device: only the sync stage reads the device on the host (.tolist()).
    hold = True
    host_waits = {"dispatch": ("sync",)}

    def setup(self, comm, plan) -> DeviceBufs:
        p = plan.point.params
        st = self.engine.setup(plan.topk, plan.weights, p["experts"], p["copies"], p["hidden"], p["dispatch_dtype"],
                               plan.layout.num_rows, plan.n_recv, plan.stride)
        return DeviceBufs(plan, st, self, self.engine.method)

    def row_info(self, b: DeviceBufs) -> dict:
        return {"cpu_threads": b.state.cpu_threads}

    def check(self, comm, b: DeviceBufs) -> bool:
        """The host path's checks: the exchanged counts (per expert, for expert copies),
        every received row in place (grouped by source, each source's rows in its send
        order; regrouped by expert for expert copies), and combine(dispatch(x)) through
        identity experts = x times the copies (rank, exact) or the weight sum (expert)."""
        plan, eng = b.plan, self.engine
        world, me, local = comm.size, comm.rank, plan.local
        expert = plan.point.params["copies"] == "expert"
        counts, sources = [], []
        for src in range(world):
            lay = plan.source_layout(src)
            off = lay.send_offsets
            sources.append((src, lay.send_token_idx[off[me]:off[me + 1]]))
            counts.append(lay.tokens_per_expert[me * local:(me + 1) * local] if expert else lay.send_counts[me:me + 1])
        counts = np.array(counts, dtype=np.int64).reshape(world, local)
        return (eng.check_counts(b.state, counts)
                and eng.check_rows(b.state, sources, regroup_perm(counts) if expert else None)
                and eng.check_combine(b.state, M.combine_factor(plan.layout, expert), expert))
