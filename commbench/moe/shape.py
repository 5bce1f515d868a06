"""The MoE layer shape commbench measures and models by default: DeepSeek-V3's, stated once
(docs/moe.md). The benchmark's parameter defaults, the what-if model's scenario,
`model`'s flags and the published-figures table's row defaults all read it from here."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    tokens: int  # tokens per rank in one dispatch
    hidden: int  # H: a token's hidden size
    experts: int  # E: routed experts
    topk: int  # K: experts each token is sent to
    max_groups: int  # M: node groups a token's experts may span (group-limited routing)
    dispatch_dtype: str = "fp8"  # FP8 dispatch rows: H + H/32 bytes (the scales)


# 4096 tokens per rank, H 7168, 256 routed experts, top-8, at most 4 nodes a token.
DEEPSEEK_V3 = MoeShape(tokens=4096, hidden=7168, experts=256, topk=8, max_groups=4)
