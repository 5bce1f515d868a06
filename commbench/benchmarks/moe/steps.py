"""A point's routing steps (param `steps`): a time-varying workload is measured as a
training run sees it, one routing per step, iteration i of a timed stage running step
i mod steps. Each step has its own plan and buffers, made at setup, so a timed
iteration only switches which step's state it runs on.

Also what every row says about the routing it measured (routing_fields), and the
ragged case: a rank's tokens are its Routing's num_tokens, which may differ by rank and
step (source_ragged, burst, traces).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M

from .host import send_order

# Routings whose tokens per rank differ between ranks (the jax engine's global arrays
# need one shape on every rank: refused there). burst changes every rank's count together,
# each step its own arrays: it runs.
RAGGED_ROUTINGS = ("source_ragged",)


@dataclass
class MoEPlan:
    """What both paths share, worked out on the host at setup: this rank's routing and
    layout (in send order), the rows every rank sends every other (each rank's routing
    regenerated locally), and the row sizes."""

    point: object
    routing_for: object
    rank: int
    topk: np.ndarray
    weights: np.ndarray
    layout: M.Layout          # this rank's, in send order
    matrix: np.ndarray        # rows sent [src, dst]
    local: int                # counts exchanged per destination (local experts, or 1)
    rb_d: int                 # dispatch bytes a row
    rb_c: int                 # combine bytes a row
    tokens: np.ndarray | None = None  # (world,) tokens each rank holds at this step
    max_tokens: int = 0       # the most tokens any rank holds at any step: token ids' stride

    @property
    def n_recv(self) -> int:
        return int(self.matrix[:, self.rank].sum())

    @property
    def num_tokens(self) -> int:
        """This rank's tokens at this step (its routing's rows: ranks may differ)."""
        return int(self.topk.shape[0])

    def tokens_of(self, src: int) -> int:
        return int(self.tokens[src]) if self.tokens is not None else self.num_tokens

    @property
    def stride(self) -> int:
        """Token ids run src * stride + token: every rank agrees on it, whatever its count."""
        return self.max_tokens or self.num_tokens

    def source_layout(self, src: int) -> M.Layout:
        """Rank src's layout in send order, from its regenerated routing."""
        if src == self.rank:
            return self.layout
        p, world = self.point.params, self.matrix.shape[0]
        r = self.routing_for(src)
        return send_order(M.dispatch_layout(r.topk_idx, p["experts"], world, p["copies"], weights=r.weights))


@dataclass
class StepBufs:
    """The buffers of every step of a point (each a path's own, with .plan and .path) and
    the step the next iteration runs. Reads of any other attribute go to the current
    step's buffers (b.path, b.plan, b.state), so code written for one step still reads."""

    steps: list
    routing: dict             # the row fields that say which routing was measured
    cur: int = 0

    @property
    def now(self):
        return self.steps[self.cur]

    def advance(self) -> None:
        self.cur = (self.cur + 1) % len(self.steps)

    def goto(self, i: int) -> None:
        """Iteration i runs step i mod steps."""
        self.cur = i % len(self.steps)

    def __getattr__(self, name):
        if name in ("steps", "routing", "cur"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.steps[self.cur], name)


def current(b):
    """The buffers one step's operations work on: the current step's of a StepBufs."""
    return b.now if isinstance(b, StepBufs) else b


@dataclass
class StepRouting:
    """One step as this rank sees it after regenerating every rank's routing once."""

    own: M.Routing            # this rank's routing
    matrix: np.ndarray        # rows sent [src, dst]
    tokens: np.ndarray        # (world,) tokens each rank holds
    stats: dict               # routing_stats of every rank's routing


def survey(make, steps: int, experts: int, world: int, copies: str, rank: int) -> list[StepRouting]:
    """Every step's routing of every rank, generated once each (seeded per (rank, step),
    so every rank works out the same): the rows matrix, tokens per rank, load figures."""
    out = []
    for step in range(steps):
        m = np.zeros((world, world), dtype=np.int64)
        topks, own = [], None
        for src in range(world):
            r = make(src, step=step)
            m[src] = M.dispatch_layout(r, experts, world, copies).send_counts
            topks.append(r.topk_idx)
            own = r if src == rank else own
        out.append(StepRouting(own, m, np.array([t.shape[0] for t in topks], np.int64),
                               M.routing_stats(topks, experts, world)))
    return out


def routing_fields(per_step: list[dict]) -> dict:
    """The row's routing fields over the steps: the largest max/mean of any step (the step
    the exchange waits longest in), the mean local share, tokens per rank over ranks and
    steps; `steps` where there are several."""
    f = {"rank_load_max_over_mean": float(max(s["rank_load_max_over_mean"] for s in per_step)),
         "expert_load_max_over_mean": float(max(s["expert_load_max_over_mean"] for s in per_step)),
         "local_pick_share": float(np.mean([s["local_pick_share"] for s in per_step])),
         "tokens_min": int(min(s["tokens_min"] for s in per_step)),
         "tokens_max": int(max(s["tokens_max"] for s in per_step))}
    if len(per_step) > 1:
        f["steps"] = len(per_step)
    return f


def mean_over_steps(figures: list[dict]) -> dict:
    """Per-step row figures as one: numbers averaged over the steps, anything else as
    step 0 has it; one step's as they are."""
    if len(figures) == 1:
        return figures[0]
    out = dict(figures[0])
    for k, v in out.items():
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            out[k] = float(np.mean([f[k] for f in figures]))
    return out


def load_fields(matrices: list) -> dict:
    """Rows received per rank (the exchange's load): the step with the largest max/mean
    names the hottest rank; rows max over steps, mean over steps."""
    loads = [np.asarray(m).sum(axis=0) for m in matrices]
    imbs = [M.load_imbalance(load) for load in loads]
    worst = int(np.argmax([i for i, _ in imbs]))
    return {"load_max_over_mean": imbs[worst][0], "hottest_rank": imbs[worst][1],
            "recv_rows_max": int(max(int(load.max()) for load in loads)),
            "recv_rows_mean": float(np.mean([load.mean() for load in loads]))}
