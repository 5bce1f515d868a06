"""Bytes a MoE dispatch/combine moves, and the copies-per-token formulas of
docs/ceilings.md#formulas (MoE dispatch bytes per rank on the scale-up link vs the NIC).

Every byte figure the MoE benchmark reports comes from here.
"""
from __future__ import annotations

import math

import numpy as np

# Elements sharing one fp32 scale in DeepSeek-V3's FP8 dispatch (1x128 blocks).
FP8_BLOCK_ELEMS = 128
_DTYPE_NBYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

CASES = ("flat", "hierarchical", "node_limited")


def token_bytes(hidden: int, dtype: str) -> int:
    """Bytes of one token row on the wire.

    fp8: hidden e4m3 bytes plus one fp32 scale per 128 elements = hidden + hidden/32
    (7392 for H = 7168); needs hidden % 128 == 0. bf16/fp16: 2 * hidden; fp32: 4 * hidden.
    """
    if hidden < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")
    if dtype == "fp8":
        if hidden % FP8_BLOCK_ELEMS:
            raise ValueError(
                f"fp8 tokens need hidden divisible by {FP8_BLOCK_ELEMS}, got {hidden}")
        return hidden + 4 * (hidden // FP8_BLOCK_ELEMS)
    if dtype not in _DTYPE_NBYTES:
        raise ValueError(f"unknown token dtype {dtype!r}; choose fp8, bf16, fp16 or fp32")
    return _DTYPE_NBYTES[dtype] * hidden


def dispatch_bytes(send_counts, recv_counts, rank: int, node_of_rank,
                   token_nbytes: int) -> dict[str, int]:
    """One rank's dispatch bytes, split the ways the reference tools count them.

    ``send_counts[d]``: rows this rank sends to rank d; ``recv_counts[s]``: rows it
    receives from rank s (both include the rank itself); ``node_of_rank``: int (world,).

    | key                    | rows counted                                            |
    |------------------------|---------------------------------------------------------|
    | recv_rows              | all received, including from itself                      |
    | sent_rows              | all sent, including to itself                            |
    | logical_nbytes         | received incl. itself: DeepEP's figure                  |
    | local_nbytes           | received from itself (a local copy, no link)            |
    | remote_nbytes          | received from other ranks                               |
    | scaleup_nbytes         | received from other ranks on this node (NVLink)         |
    | scaleout_nbytes        | received from ranks on other nodes (NIC)                |
    | sent_logical_nbytes    | sent incl. to itself                                     |
    | sent_remote_nbytes     | sent to other ranks                                     |
    | sent_scaleup_nbytes    | sent to other ranks on this node                        |
    | sent_scaleout_nbytes   | sent to ranks on other nodes                            |

    Every *_nbytes is rows * token_nbytes. remote = scaleup + scaleout, and
    logical = local + remote, on both sides.

    Combine moves the same rows backwards, and DeepEP counts it at the expert side
    too: its combine figure is this logical_nbytes (the rows the rank received in
    dispatch and now returns) with BF16 token bytes. So call this with the dispatch
    counts and token_bytes(H, "bf16"); then the recv fields are what the rank sends
    back and the sent_* fields are what it gets back.
    """
    send = np.asarray(send_counts, dtype=np.int64)
    recv = np.asarray(recv_counts, dtype=np.int64)
    node = np.asarray(node_of_rank, dtype=np.int64)
    world = node.shape[0]
    if send.shape != (world,) or recv.shape != (world,):
        raise ValueError(f"send_counts, recv_counts and node_of_rank must all be ({world},)")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside [0, {world})")
    other = np.arange(world) != rank
    same_node = node == node[rank]
    b = int(token_nbytes)

    def split(rows: np.ndarray) -> tuple[int, int, int, int]:
        return (int(rows.sum()) * b, int(rows[other].sum()) * b,
                int(rows[other & same_node].sum()) * b, int(rows[~same_node].sum()) * b)

    logical, remote, scaleup, scaleout = split(recv)
    s_logical, s_remote, s_scaleup, s_scaleout = split(send)
    return {
        "recv_rows": int(recv.sum()),
        "sent_rows": int(send.sum()),
        "logical_nbytes": logical,
        "local_nbytes": int(recv[rank]) * b,
        "remote_nbytes": remote,
        "scaleup_nbytes": scaleup,
        "scaleout_nbytes": scaleout,
        "sent_logical_nbytes": s_logical,
        "sent_remote_nbytes": s_remote,
        "sent_scaleup_nbytes": s_scaleup,
        "sent_scaleout_nbytes": s_scaleout,
    }


def _integral(v: float) -> bool:
    return float(v).is_integer()


def q_at_least_one(A: float, a: float, k: float) -> float:
    """Chance that a group holding ``a`` of ``A`` experts gets at least one of ``k``
    distinct uniform picks: 1 - C(A-a, k) / C(A, k).

    Exact (math.comb) when all three are integers. The node-limited case asks for
    k = K/M picks, which need not be an integer; then C(n, k) is read as
    Gamma(n+1) / (Gamma(k+1) Gamma(n-k+1)), evaluated with math.lgamma, which agrees
    with math.comb at integers. Where k > A - a the integer binomial C(A-a, k) is 0
    (a group that large cannot be missed) and the gamma form leaves the range where it
    means anything, so q = 1 there.
    """
    A, a, k = float(A), float(a), float(k)
    if not (A >= 0 and 0 <= a <= A and 0 <= k <= A):
        raise ValueError(
            f"q_at_least_one needs 0 <= a <= A and 0 <= k <= A, got A={A}, a={a}, k={k}")
    if k == 0 or a == 0:
        return 0.0
    if k > A - a:
        return 1.0
    if _integral(A) and _integral(a) and _integral(k):
        A_i, a_i, k_i = int(A), int(a), int(k)
        return 1.0 - math.comb(A_i - a_i, k_i) / math.comb(A_i, k_i)
    log_ratio = (math.lgamma(A - a + 1) + math.lgamma(A - k + 1)
                 - math.lgamma(A - a - k + 1) - math.lgamma(A + 1))
    return 1.0 - math.exp(log_ratio)


def expected_dest_ranks(num_experts: int, top_k: int, world: int) -> float:
    """Expected distinct destination ranks per token under uniform top-k:
    world * q(E, E/world, K); 5.29 for E=256, K=8, world=8."""
    if world < 1 or num_experts % world:
        raise ValueError(f"num_experts {num_experts} is not divisible by world {world}")
    return world * q_at_least_one(num_experts, num_experts // world, top_k)


def _check_shape(case, E, K, P, G, M) -> int:
    if case not in CASES:
        raise ValueError(f"unknown dispatch case {case!r}; choose one of {', '.join(CASES)}")
    if P < 1 or G < 1 or P % G:
        raise ValueError(f"ranks P={P} must be a multiple of ranks per node G={G}")
    if E % P:
        raise ValueError(f"experts E={E} is not divisible by ranks P={P}")
    if not 1 <= K <= E:
        raise ValueError(f"top-k K={K} must lie in [1, E={E}]")
    N = P // G
    if case == "node_limited":
        if M is None:
            raise ValueError("node_limited needs the node limit M")
        if not 1 <= M <= N:
            raise ValueError(f"node limit M={M} must lie in [1, nodes N={N}]")
        if K / M > E / N:
            raise ValueError(
                f"K/M={K / M:g} experts per node exceeds the E/N={E // N} a node holds")
    return N


def dispatch_copies_per_token(case: str, E: int, K: int, P: int, G: int,
                              M: int | None = None) -> tuple[float, float]:
    """Expected copies of one token a rank sends (NIC, NVLink), docs/ceilings.md#formulas:
    flat, hierarchical, node-limited.

    - "flat": one copy per (token, expert), plain all_to_all:
      (K (P-G)/P, K (G-1)/P).
    - "hierarchical": one copy per remote node over the NIC, forwarded inside it
      (DeepEP): ((N-1) q(E, E/N, K), (P-N) q(E, E/P, K)), N = P/G. Each of the P - N
      ranks that is not some node's landing rank (the sender included in its own
      node) gets an NVLink copy when it hosts one of the K experts.
    - "node_limited": M distinct nodes per token, about K/M experts in each:
      (M (N-1)/N, M (G-1) q(E/N, E/P, K/M)). The node set includes the own node with
      chance M/N, hence M (N-1)/N remote nodes; the K/M split is the approximation.

    DeepSeek-V3 (E=256, K=8, P=64, G=8, M=4) gives flat (7.0, 0.875), hierarchical
    (4.63, 6.72), node_limited (3.50, 6.66).
    """
    N = _check_shape(case, E, K, P, G, M)
    if case == "flat":
        return K * (P - G) / P, K * (G - 1) / P
    if case == "hierarchical":
        return ((N - 1) * q_at_least_one(E, E / N, K),
                (P - N) * q_at_least_one(E, E / P, K))
    return (M * (N - 1) / N,
            M * (G - 1) * q_at_least_one(E / N, E / P, K / M))


def dispatch_volume_nbytes(case: str, tokens: int, hidden: int, token_nbytes, E: int,
                           K: int, P: int, G: int, M: int | None = None) -> tuple[float, float]:
    """Expected bytes one rank sends per dispatch (V_nic, V_nvl): copies per token
    times ``tokens`` times token bytes. ``token_nbytes`` is bytes per token row, or a
    dtype name ("fp8", "bf16", ...) sized with ``hidden``; the combine moves the same
    volumes back with BF16 rows."""
    if isinstance(token_nbytes, str):
        token_nbytes = token_bytes(hidden, token_nbytes)
    nic, nvl = dispatch_copies_per_token(case, E, K, P, G, M)
    return nic * tokens * token_nbytes, nvl * tokens * token_nbytes


# --- measured routings: the two-tier (hierarchical) and low-latency dispatches ----------

def local_index(node_of_rank) -> np.ndarray:
    """Each rank's index among the ranks of its node, in rank order."""
    node = np.asarray(node_of_rank, dtype=np.int64)
    out = np.zeros(node.shape[0], dtype=np.int64)
    seen: dict[int, int] = {}
    for r, n in enumerate(node.tolist()):
        out[r] = seen.get(n, 0)
        seen[n] = out[r] + 1
    return out


def forwarder(src: int, node: int, node_of_rank) -> int:
    """The rank of `node` a token from `src` lands on in a hierarchical dispatch: the one with
    the sender's local index (DeepEP pairs the same GPU index across nodes, one NIC each),
    wrapping when that node has fewer ranks."""
    nodes = np.asarray(node_of_rank, dtype=np.int64)
    members = np.flatnonzero(nodes == node)
    return int(members[local_index(nodes)[src] % members.size])


def hierarchical_rows(topk_by_rank, num_experts: int, node_of_rank, copies: str) -> dict[str, np.ndarray]:
    """Rows each rank moves in a two-tier dispatch of the given routings (DeepEP's internode
    normal kernels): a token bound for another node crosses the scale-out tier once per
    (token, destination node), to that node's forwarder(src, node); the forwarder passes it
    on over the scale-up tier to each destination rank of its node (one row per rank with
    rank copies, one per expert with expert copies). Tokens bound for the sender's own node
    go over the scale-up tier directly. A row a rank hands itself crosses no link.

    topk_by_rank[s]: int (T, K) expert ids of rank s's tokens. Returns int64 (world,) arrays:
    scaleout_sent_rows / scaleout_recv_rows (first tier), scaleup_sent_rows /
    scaleup_recv_rows (second tier and direct, between different ranks), local_rows, and
    flat_scaleout_recv_rows / flat_scaleup_recv_rows: what a flat all_to_all of the same
    rows would receive on each tier, for comparison."""
    nodes = np.asarray(node_of_rank, dtype=np.int64)
    world = nodes.shape[0]
    if num_experts % world:
        raise ValueError(f"num_experts {num_experts} is not divisible by world {world}")
    per_rank = num_experts // world
    out = {k: np.zeros(world, dtype=np.int64) for k in (
        "scaleout_sent_rows", "scaleout_recv_rows", "scaleup_sent_rows", "scaleup_recv_rows", "local_rows",
        "flat_scaleout_recv_rows", "flat_scaleup_recv_rows")}
    fwd = {(s, n): forwarder(s, n, nodes) for s in range(world) for n in np.unique(nodes).tolist()}
    for s, topk in enumerate(topk_by_rank):
        dest = np.asarray(topk, dtype=np.int64) // per_rank             # (T, K) destination ranks
        if copies == "rank":  # one row per distinct (token, dest rank)
            t_idx, d = np.unique(np.stack([np.repeat(np.arange(dest.shape[0]), dest.shape[1]), dest.ravel()]),
                                 axis=1)
        else:                 # one row per (token, expert)
            t_idx, d = np.repeat(np.arange(dest.shape[0]), dest.shape[1]), dest.ravel()
        dn = nodes[d]
        # flat: each row straight from s to d
        remote = d != s
        np.add.at(out["flat_scaleout_recv_rows"], d[remote & (dn != nodes[s])], 1)
        np.add.at(out["flat_scaleup_recv_rows"], d[remote & (dn == nodes[s])], 1)
        # first tier: one row per (token, remote node), to that node's forwarder
        away = dn != nodes[s]
        pairs = np.unique(np.stack([t_idx[away], dn[away]]), axis=1) if away.any() else np.zeros((2, 0), np.int64)
        for n, cnt in zip(*np.unique(pairs[1], return_counts=True)):
            f = fwd[(s, int(n))]
            out["scaleout_sent_rows"][s] += cnt
            out["scaleout_recv_rows"][f] += cnt
        # second tier (and the own node's rows): from the forwarder (or s) to each destination
        via = np.array([fwd[(s, int(n))] if n != nodes[s] else s for n in dn.tolist()], dtype=np.int64)
        hop = via != d
        np.add.at(out["scaleup_sent_rows"], via[hop], 1)
        np.add.at(out["scaleup_recv_rows"], d[hop], 1)
        np.add.at(out["local_rows"], d[~hop], 1)
    return out


# What a low-latency exchange is made of (row fields `exchange`): routed rows with split
# sizes (what DeepEP's kernels put on the wire), or the whole slot table with equal splits
# (an exchange for a backend without split sizes: every slot sent, used or not).
EXCHANGE_SPLIT = "routed rows (all_to_all with split sizes)"
EXCHANGE_SLOT_TABLE = "emulates the slot table (equal splits: every slot sent, used or not)"
COUNT_NBYTES = 8  # one int64 row count per (source, expert) in a low-latency count header


def low_latency_rows(rows_per_rank_expert, capacity: int, row_nbytes: int, stage: str = "dispatch",
                     split_sizes: bool = True, count_nbytes: int = COUNT_NBYTES) -> dict[str, np.ndarray]:
    """Rows and bytes each rank puts into one stage of a low-latency exchange (DeepEP's
    decode kernels): every (source rank, expert) pair owns `capacity` slots on the
    receiver; a row beyond them overflows (dropped, never combined).

    rows_per_rank_expert: int (world, E), the (token, expert) rows rank r routes to expert
    e. With split sizes, as DeepEP's kernels send (csrc/kernels/internode_ll.cu, dispatch:
    one put per routed row into its slot, then one count per expert): dispatch carries
    each rank's routed rows and, per destination, a count header of
    ceil(local experts x count_nbytes / row_nbytes) rows; combine returns the rows each
    rank received, no header (their counts came with the dispatch). Without split sizes
    (the whole slot table, equal splits) every stage carries E x (capacity + 1) rows a
    rank: each region's slots and its header row, used or not.

    Returns int64 (world,) arrays: routed_rows (within capacity; what the routing needs
    carried), header_rows, sent_rows, overflow_rows (dispatch side), routed_nbytes,
    sent_nbytes. Every figure includes the rows a rank sends itself (the all_to_all's own
    chunk)."""
    c = np.asarray(rows_per_rank_expert, dtype=np.int64)
    cap = int(capacity)
    if cap < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if stage not in ("dispatch", "combine"):
        raise ValueError(f"stage must be dispatch or combine, got {stage!r}")
    if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] % c.shape[0]:
        raise ValueError(f"rows_per_rank_expert must be (world, E) with E divisible by world, got {c.shape}")
    world, experts = c.shape
    local = experts // world
    kept = np.minimum(c, cap)
    if stage == "dispatch":
        routed = kept.sum(axis=1)
        header = np.full(world, world * -(-local * int(count_nbytes) // int(row_nbytes)), dtype=np.int64)
    else:  # rank r returns what it received: every source's rows for r's local experts
        routed = kept.reshape(world, world, local).sum(axis=(0, 2))
        header = np.zeros(world, dtype=np.int64)
    if not split_sizes:
        header = np.full(world, experts, dtype=np.int64)
        sent = np.full(world, experts * (cap + 1), dtype=np.int64)
    else:
        sent = routed + header
    b = int(row_nbytes)
    return {"routed_rows": routed, "header_rows": header, "sent_rows": sent,
            "overflow_rows": np.maximum(c - cap, 0).sum(axis=1), "routed_nbytes": routed * b, "sent_nbytes": sent * b}


def padding_factor(sent_nbytes: float, routed_nbytes: float) -> float | None:
    """Bytes sent per routed byte (1 = nothing but the routed rows); None with nothing routed."""
    return float(sent_nbytes) / float(routed_nbytes) if routed_nbytes > 0 else None


def low_latency_fields(rows_per_rank_expert, capacity: int, row_nbytes: int, stage: str,
                       split_sizes: bool = True) -> dict:
    """A low-latency row's byte fields (docs/results.md): routed_nbytes, sent_nbytes and
    padding_factor of the rank that sends the most (the one the exchange waits for),
    count_nbytes (the count headers inside its sent_nbytes), overflow_rows (all ranks) and
    `exchange`, what the exchange is made of."""
    r = low_latency_rows(rows_per_rank_expert, capacity, row_nbytes, stage, split_sizes)
    i = int(np.argmax(r["sent_nbytes"]))
    routed, sent = int(r["routed_nbytes"][i]), int(r["sent_nbytes"][i])
    return {"routed_nbytes": routed, "sent_nbytes": sent, "padding_factor": padding_factor(sent, routed),
            "count_nbytes": int(r["header_rows"][i]) * int(row_nbytes), "overflow_rows": int(r["overflow_rows"].sum()),
            "exchange": EXCHANGE_SPLIT if split_sizes else EXCHANGE_SLOT_TABLE}
