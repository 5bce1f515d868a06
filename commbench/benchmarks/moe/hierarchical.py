"""The moe benchmark's hierarchical path (path=hierarchical): DeepEP's internode normal
dispatch, two tiers. A token bound for another node crosses the scale-out tier once per
(token, destination node), to the rank of that node with the sender's local index, which
forwards it over the scale-up tier to the destination ranks of its node; combine reverses
it, the forwarder summing its node's partial rows before one row goes back. The data path
is backends/moe/torch_hierarchical.py, reached through the engine (no torch here).

Bytes per tier are commbench.moe.accounting.hierarchical_rows' rows times the row bytes;
rows carry the flat path's scale-out and scale-up bytes for the same routing beside them
(flat_scaleout_nbytes, flat_scaleup_nbytes; the most loaded rank's, as the measured keys).
First-tier dispatch rows also carry the token's expert ids (and weights, expert copies):
scaleout_meta_nbytes, kept out of scaleout_nbytes so it compares with flat row for row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M
from commbench.moe.accounting import forwarder, hierarchical_rows

from .host import EnginePath, regroup_perm


def node_indices(comm) -> np.ndarray:
    """Node of each rank as 0, 1, ... (comm.node_of_rank: the runner's hostname grouping or
    --ranks-per-node); every rank on one node when the communicator has none."""
    nodes = getattr(comm, "node_of_rank", None)
    if nodes is None:
        return np.zeros(comm.size, np.int64)
    return np.unique(np.asarray(nodes, dtype=np.int64)[:comm.size], return_inverse=True)[1].astype(np.int64)


def first_tier_from(topk: np.ndarray, experts: int, nodes: np.ndarray, src: int, me: int) -> int:
    """(token, node) rows source `src` sends rank `me` on the scale-out tier."""
    if nodes[src] == nodes[me] or forwarder(src, int(nodes[me]), nodes) != me:
        return 0
    dest_node = nodes[np.asarray(topk, dtype=np.int64) // (experts // nodes.shape[0])]
    return int((dest_node == nodes[me]).any(axis=1).sum())


@dataclass
class HierBufs:
    plan: object
    state: object
    path: object
    pack_method: str
    nodes: np.ndarray


class HierarchicalPath(EnginePath):
    """The torch engine's two-tier exchange driven stage by stage; checks as DevicePath's
    (the rows each rank ends up with are the flat path's, in the flat path's order), plus
    the first-tier counts."""

    name = "torch"
    dispatch_stages = ("layout", "counts", "sync", "a2a_out", "forward", "a2a_in", "unpack")
    combine_stages = ("pack", "a2a_in", "forward", "a2a_out", "reduce")
    # Held on a device: sync and forward read split sizes on the host (.tolist()).
    hold = True
    host_waits = {"dispatch": ("sync", "forward")}

    def __init__(self, engine):
        super().__init__(engine)
        self._rows: dict = {}

    def tier_rows(self, plan, nodes) -> dict:
        """hierarchical_rows of every rank's regenerated routing (once per node map)."""
        key = tuple(np.asarray(nodes).tolist())
        if key not in self._rows:
            p, world = plan.point.params, plan.matrix.shape[0]
            topk = [plan.topk if s == plan.rank else plan.routing_for(s).topk_idx for s in range(world)]
            self._rows[key] = hierarchical_rows(topk, p["experts"], nodes, p["copies"])
        return self._rows[key]

    def setup(self, comm, plan) -> HierBufs:
        p, me = plan.point.params, comm.rank
        nodes = node_indices(comm)
        r = self.tier_rows(plan, nodes)
        sizes = {"n_send1": int(r["scaleout_sent_rows"][me]), "n_recv1": int(r["scaleout_recv_rows"][me]),
                 "n_send2": int(r["scaleup_sent_rows"][me] + r["local_rows"][me]),
                 "n_recv": int(r["scaleup_recv_rows"][me] + r["local_rows"][me])}
        assert sizes["n_recv"] == plan.n_recv, "the two tiers deliver the flat path's rows"
        fwd = np.array([forwarder(me, n, nodes) for n in range(int(nodes.max()) + 1)], np.int64)
        st = self.engine.setup(plan.topk, plan.weights, p["experts"], p["copies"], p["hidden"], p["dispatch_dtype"],
                               nodes, fwd, sizes, plan.stride)
        return HierBufs(plan, st, self, self.engine.method, nodes)






    # --- bytes per tier -----------------------------------------------------------
    def accounting(self, plan, rank: int, node_of_rank, row_nbytes: int) -> dict:
        """This rank's bytes per tier (dispatch_bytes' keys): scale-out = first-tier rows it
        receives, scale-up = second-tier rows from other ranks, logical = every row it ends
        up with (its own included). The flat figures are the most loaded rank's already."""
        nodes = np.unique(np.asarray(node_of_rank, dtype=np.int64), return_inverse=True)[1]
        r, b = self.tier_rows(plan, nodes), int(row_nbytes)
        up, out, loc = (int(r[k][rank]) for k in ("scaleup_recv_rows", "scaleout_recv_rows", "local_rows"))
        sent = int(r["scaleout_sent_rows"][rank] + r["scaleup_sent_rows"][rank] + r["local_rows"][rank])
        meta = 4 * plan.topk.shape[1] * (2 if plan.point.params["copies"] == "expert" else 1)
        return {"logical_nbytes": (up + loc) * b, "local_nbytes": loc * b, "remote_nbytes": (up + out) * b,
                "scaleup_nbytes": up * b, "scaleout_nbytes": out * b, "sent_logical_nbytes": sent * b,
                "flat_scaleout_nbytes": int(r["flat_scaleout_recv_rows"].max()) * b,
                "flat_scaleup_nbytes": int(r["flat_scaleup_recv_rows"].max()) * b,
                "scaleout_meta_nbytes": int(r["scaleout_recv_rows"].max()) * meta}

    def stage_info(self, acc: dict, stage: str) -> dict:
        info = {k: acc[k] for k in ("flat_scaleout_nbytes", "flat_scaleup_nbytes")}
        info["scaleout_meta_nbytes"] = acc["scaleout_meta_nbytes"] if stage == "dispatch" else 0
        return info

    def row_info(self, b: HierBufs) -> dict:
        return {"cpu_threads": b.state.cpu_threads}

    # --- checks ---------------------------------------------------------------------
    def check(self, comm, b: HierBufs) -> bool:
        """DevicePath's checks (counts per source and local expert, every row in the flat
        path's place, combine(dispatch(x)) through identity experts), and the first-tier
        counts: each source's (token, node) rows for this rank as its forwarder."""
        plan, eng = b.plan, self.engine
        p = plan.point.params
        world, me, local = comm.size, comm.rank, plan.local
        expert = p["copies"] == "expert"
        counts, sources, first = [], [], []
        for src in range(world):
            lay = plan.source_layout(src)
            off = lay.send_offsets
            sources.append((src, lay.send_token_idx[off[me]:off[me + 1]]))
            counts.append(lay.tokens_per_expert[me * local:(me + 1) * local] if expert else lay.send_counts[me:me + 1])
            topk = plan.topk if src == me else plan.routing_for(src).topk_idx
            first.append(first_tier_from(topk, p["experts"], b.nodes, src, me))
        counts = np.array(counts, dtype=np.int64).reshape(world, local)
        return (eng.check_counts(b.state, np.array(first, np.int64), counts)
                and eng.check_rows(b.state, sources, regroup_perm(counts) if expert else None)
                and eng.check_combine(b.state, M.combine_factor(plan.layout, expert), expert))
