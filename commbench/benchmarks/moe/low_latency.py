"""The moe benchmark's low-latency mode (mode=low_latency, DeepEP's decode kernels): the
device engine of backends/moe/torch_low_latency.py driven stage by stage, its byte
accounting (padded bytes beside useful ones) and its checks against the host's regenerated routing."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M

from .host import EnginePath


@dataclass
class LowLatencyBufs:
    plan: object
    state: object
    path: object
    pack_method: str


class LowLatencyPath(EnginePath):
    name = "torch"
    dispatch_stages = ("layout", "pack", "a2a")
    combine_stages = ("pack", "a2a", "reduce")
    # No step reads the device on the host: on a GPU each is timed behind a stream hold.
    hold = True


    def setup(self, comm, plan) -> LowLatencyBufs:
        p = plan.point.params
        st = self.engine.setup(plan.topk, plan.weights, p["experts"], p["hidden"], p["dispatch_dtype"], p["capacity"])
        return LowLatencyBufs(plan, st, self, self.engine.method)






    def _per_source_expert(self, plan) -> np.ndarray:
        """(world, local) rows each source routes to each of this rank's experts."""
        world, me = plan.matrix.shape[0], plan.rank
        local = plan.point.params["experts"] // world
        return np.array([plan.source_layout(s).tokens_per_expert[me * local:(me + 1) * local] for s in range(world)],
                        dtype=np.int64)

    def stage_info(self, acc: dict, stage: str) -> dict:
        return dict(self._info)

    def accounting(self, plan, rank, node_of_rank, row_nbytes) -> dict:
        """Per tier, the useful rows (the flat all_to_all's); the padded figures, what this
        emulation's one all_to_all really carries, go beside them (stage_info)."""
        acc = super().accounting(plan, rank, node_of_rank, row_nbytes)
        cap = plan.point.params["capacity"] or plan.point.params["tokens"]
        rows = M.low_latency_rows(plan.layout.tokens_per_expert, self._per_source_expert(plan), cap)
        world = plan.matrix.shape[0]
        # Each region also carries one header row (its count).
        header = plan.point.params["experts"]
        self._info = {"capacity": cap, "overflow_rows": rows["overflow_rows"],
                      "padded_sent_nbytes": (rows["padded_sent_rows"] + header) * row_nbytes,
                      "padded_recv_nbytes": (rows["padded_recv_rows"] + header) * row_nbytes,
                      "useful_sent_nbytes": rows["useful_sent_rows"] * row_nbytes,
                      "useful_recv_nbytes": rows["useful_recv_rows"] * row_nbytes,
                      "padded_over_useful": ((rows["padded_recv_rows"] + header) / rows["useful_recv_rows"]
                                             if rows["useful_recv_rows"] else float("inf")),
                      "padding_note": f"every (source, expert) region holds {cap} slots and a header row, "
                                      f"{world} sources x {header // world} local experts"}
        return acc

    def row_info(self, b) -> dict:
        return {"cpu_threads": b.state.cpu_threads, "mode_note": "no count exchange, no host sync"}

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
