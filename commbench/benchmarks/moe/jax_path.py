"""The moe benchmark's jax path: the jax engine (backends/moe/jax_normal.py) moves the
rows with jax.lax.ragged_all_to_all; the routing, layouts, byte accounting and checks are the
ones every path shares. Rows are the host path's (host.make_x: a header naming source
rank and token, then bytes that depend on both), and the identity experts answer each row
with its token's value in bf16, so the checks are the host path's: the exchanged counts,
every received row in order, and combine(dispatch(x)) = x times the copies (rank copies,
exact) or the weight sum (expert copies, rtol 1e-5).

Where the installed JAX cannot run ragged_all_to_all on the device at hand (XLA:CPU has no
ragged-all-to-all), the point is refused before any rank starts, in one line.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench import moe as M
from commbench.backends import availability
from commbench.backends.jax_probe import ragged_all_to_all_support
from commbench.core.errors import UsageError

from .host import EnginePath, make_x, regroup_perm, token_value


def answer(src, token):
    """host.token_value in operations jax.numpy and numpy share (the experts compute
    it on the device from each row's header)."""
    return 1 + (src * 31 + token) % 61


def refusal(device: str, odd: list[str]) -> str | None:
    """Why moe cannot run on jax here, or None."""
    if odd:
        return (f"moe {', '.join(odd)} runs on the device path of gloo and nccl; jax has the flat exchange "
                f"in the normal mode")

    if not availability("jax")[0]:  # the run is refused for that, with the install hint
        return None
    why = ragged_all_to_all_support(device)
    if why:
        return f"moe on jax moves rows with jax.lax.ragged_all_to_all, which does not run here: {why}"
    return None


@dataclass
class JaxBufs:
    plan: object              # moe.MoEPlan
    state: object             # the engine's JaxMoEState: compiled stages and their arrays
    path: object
    pack_method: str


class JaxPath(EnginePath):
    """The engine driven stage by stage (EnginePath), checked here on the host against the
    regenerated layouts of every rank."""

    name = "jax"
    dispatch_stages = ("layout", "counts", "pack", "a2a", "unpack")
    combine_stages = ("pack", "a2a", "reduce")

    def setup(self, comm, plan) -> JaxBufs:
        p = plan.point.params
        if plan.tokens is not None and len(set(plan.tokens.tolist())) > 1:  # refusal() names the routings
            raise UsageError(f"moe on jax: ranks hold different token counts ({plan.tokens.tolist()}); the jax "
                             f"engine's arrays have one shape on every rank: run it on mpi, gloo or nccl")
        x = make_x(plan.rank, plan.num_tokens, plan.rb_d)
        st = self.engine.setup(plan.topk, plan.weights, x, p["experts"], p["copies"], p["hidden"],
                               plan.layout.num_rows, plan.n_recv, answer)
        return JaxBufs(plan, st, self, self.engine.method)

    def row_info(self, b: JaxBufs) -> dict:
        return {"compile_ms": b.state.compile_ms, "exchange": self.engine.exchange}

    def check(self, comm, b: JaxBufs) -> bool:
        plan, eng, st = b.plan, self.engine, b.state
        p, world, me, local = plan.point.params, comm.size, comm.rank, plan.local
        expert = p["copies"] == "expert"
        counts, want = [], []
        for src in range(world):
            lay = plan.source_layout(src)
            off = lay.send_offsets
            want.append(make_x(src, plan.tokens_of(src), plan.rb_d)[lay.send_token_idx[off[me]:off[me + 1]]])
            counts.append(lay.tokens_per_expert[me * local:(me + 1) * local] if expert else lay.send_counts[me:me + 1])
        counts = np.array(counts, dtype=np.int64).reshape(world, local)
        if not np.array_equal(eng.counts_received(st), counts):
            return False
        want = np.concatenate(want)
        if expert:  # the experts hold their rows grouped by local expert
            want = want[regroup_perm(counts)]
        got = eng.received(st)
        if got.shape != want.shape or not np.array_equal(got, want):
            return False
        x = token_value(me, np.arange(plan.num_tokens))
        expect = (x * M.combine_factor(plan.layout, expert)).astype(np.float32)[:, None]
        out = eng.combined(st)
        if out.shape != (plan.num_tokens, p["hidden"]):
            return False
        if expert:
            return bool(np.allclose(out, expect, rtol=1e-5, atol=0))
        return bool(np.array_equal(out, np.broadcast_to(expect, out.shape)))
