"""The moe benchmark's low-latency mode (mode=low_latency, DeepEP's decode kernels): the
device engine of backends/moe/torch_low_latency.py driven stage by stage, its bytes as sent
(routed bytes, sent bytes and their ratio, moe/accounting.py) and its checks against the
host's regenerated routing."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M
from commbench.moe.accounting import low_latency_fields

from .host import EnginePath


@dataclass
class LowLatencyBufs:
    plan: object
    state: object
    path: object
    pack_method: str


class LowLatencyPath(EnginePath):
    name = "torch"
    dispatch_stages = ("layout", "pack", "a2a", "unpack")
    combine_stages = ("pack", "a2a", "reduce")
    # No step reads the device on the host: on a GPU each is timed behind a stream hold.
    hold = True

    def setup(self, comm, plan) -> LowLatencyBufs:
        p = plan.point.params
        st = self.engine.setup(plan.topk, plan.weights, p["experts"], p["hidden"], p["dispatch_dtype"],
                               self.capacity(plan), self._per_source_expert(plan), plan.stride)
        return LowLatencyBufs(plan, st, self, self.engine.method)

    @staticmethod
    def capacity(plan) -> int:
        """Slots per (source, expert), the same on every rank: the param, or the most tokens
        any rank holds at any step (a token reaches an expert once: that never overflows)."""
        return int(plan.point.params["capacity"] or plan.max_tokens or plan.num_tokens)

    def _per_source_expert(self, plan) -> np.ndarray:
        """(world, local) rows each source routes to each of this rank's experts."""
        world, me = plan.matrix.shape[0], plan.rank
        local = plan.point.params["experts"] // world
        return np.array([plan.source_layout(s).tokens_per_expert[me * local:(me + 1) * local] for s in range(world)],
                        dtype=np.int64)

    def accounting(self, plan, rank, node_of_rank, row_nbytes) -> dict:
        """Per tier, the routed rows (the flat all_to_all's); what the exchange sends, from
        every rank's regenerated routing, goes beside them (stage_info)."""
        world = plan.matrix.shape[0]
        self._rows = (np.array([plan.source_layout(s).tokens_per_expert for s in range(world)], dtype=np.int64),
                      self.capacity(plan), row_nbytes)
        return super().accounting(plan, rank, node_of_rank, row_nbytes)

    def stage_info(self, acc: dict, stage: str) -> dict:
        counts, cap, rb = self._rows
        return {"capacity": cap, **low_latency_fields(counts, cap, rb, stage, self.engine.split_sizes)}

    def row_info(self, b) -> dict:
        return {"cpu_threads": b.state.cpu_threads,
                "mode_note": "no count exchange before the rows, no host sync: split sizes from the point's routing, "
                             "known at setup (an all_to_all needs them up front, DeepEP's one-sided puts do not)"}

    def check(self, comm, b) -> bool:
        """Counts in every region's header, the right rows in the first slots of each
        region (each source's tokens for that expert in token order), and combine(dispatch(x))
        through identity experts = x times the token's weight sum."""
        plan, eng = b.plan, self.engine
        world, me = comm.size, comm.rank
        local = plan.point.params["experts"] // world
        expected = []
        for src in range(world):
            lay = plan.source_layout(src)  # in send order: by expert, tokens in order
            off = np.concatenate(([0], np.cumsum(lay.tokens_per_expert)))
            expected.append([lay.send_token_idx[off[e]:off[e + 1]] for e in range(me * local, (me + 1) * local)])
        return (eng.check_counts(b.state, self._per_source_expert(plan))
                and eng.check_rows(b.state, expected)
                and eng.check_combine(b.state, M.combine_factor(plan.layout, True)))
