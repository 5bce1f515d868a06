"""The moe benchmark on a routing that changes with every step and gives rank 0 twice the
tokens of every other rank (uniform picks, seeded per (rank, step)): moe_ragged_steps in
normal mode, moe_ragged_steps_ll in low-latency mode (expert copies)."""
from commbench import moe as M
from commbench.benchmarks.base import Param, register
from commbench.benchmarks.moe import MoE


def ragged_routing(p: dict, world: int, rank: int, step: int) -> M.Routing:
    return M.make_routing("uniform", num_tokens=p["tokens"] * (2 if rank == 0 else 1), num_experts=p["experts"],
                          top_k=p["topk"], rank=rank, world=world, seed=p["seed"], step=step)


@register
class MoERaggedSteps(MoE):
    name = "moe_ragged_steps"

    def routing_for(self, p, world):
        return lambda rank, step=0: ragged_routing(p, world, rank, step)

    def max_tokens(self, p, world):
        return 2 * p["tokens"]


@register
class MoERaggedStepsLowLatency(MoERaggedSteps):
    name = "moe_ragged_steps_ll"
    params = {**MoE.params, "mode": Param("low_latency", "low_latency", str, choices=("normal", "low_latency")),
              "copies": Param("expert", "expert", str, choices=("rank", "expert"))}
