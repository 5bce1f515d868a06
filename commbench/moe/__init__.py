"""Mixture-of-experts expert-parallel dispatch/combine: routing generators, dispatch
layouts and byte accounting in plain numpy, shared by the benchmark and its checks."""
from .accounting import (
    dispatch_bytes,
    dispatch_copies_per_token,
    dispatch_volume_nbytes,
    expected_dest_ranks,
    forwarder,
    hierarchical_rows,
    local_index,
    low_latency_rows,
    q_at_least_one,
    token_bytes,
)
from .layout import (
    Layout,
    combine_expected,
    combine_factor,
    combine_reduce,
    dispatch_layout,
    global_layout,
    load_imbalance,
    recv_counts_from_all,
)
from .routing import (
    COMMON_KEYS,
    ROUTING_HELP,
    ROUTING_PARAMS,
    ROUTINGS,
    Routing,
    RoutingHooks,
    expected_load_imbalance,
    expected_rank_load_share,
    expert_probabilities,
    make_routing,
    register_routing,
    validate_routing_params,
)
from .workloads import (
    max_tokens_per_rank,
    parse_tokens_by_rank,
    routing_stats,
    tokens_per_rank,
)

__all__ = [
    "ROUTINGS", "Routing", "make_routing", "validate_routing_params",
    "COMMON_KEYS", "ROUTING_HELP", "ROUTING_PARAMS", "RoutingHooks", "register_routing",
    "tokens_per_rank", "max_tokens_per_rank", "routing_stats", "parse_tokens_by_rank",
    "expert_probabilities", "expected_rank_load_share", "expected_load_imbalance",
    "Layout", "dispatch_layout", "recv_counts_from_all", "global_layout",
    "combine_factor", "combine_expected", "combine_reduce", "load_imbalance",
    "token_bytes", "dispatch_bytes", "q_at_least_one", "expected_dest_ranks",
    "dispatch_copies_per_token", "dispatch_volume_nbytes",
    "hierarchical_rows", "low_latency_rows", "forwarder", "local_index",
]
