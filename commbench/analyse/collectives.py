"""Collectives of the what-if model: all_reduce as NCCL runs it (Ring, Tree, NVLS / NVLSTree,
and the MPI-style algorithms), all_gather, reduce_scatter and all_to_all, inside a scale-up
domain and across domains (docs/model.md).

A fabric built from a GPU profile (Terms.gpu_arch set) runs NCCL: every NCCL algorithm's
latency and protocols come from NCCL's tuner (latency.py), the bandwidth from the profile's
measured rates. A fabric without it (loopback, fabric_from_rates) is plain alpha-beta: each
step costs its tier's alpha."""
from __future__ import annotations

from commbench.analyse import latency as L
from commbench.analyse.fabric import Fabric, Tier, _check_p, _domain, _flat_tier, _lg, _scaleout, _xfer_us
from commbench.core.errors import UsageError

ALL_REDUCE_ALGOS = ("ring", "tree", "recursive_doubling", "rabenseifner", "inswitch", "hierarchical")
# NCCL's names for the algorithms it runs; the others are MPI-style and NCCL never picks them.
NCCL_NAMES = {"ring": "Ring", "tree": "Tree"}
TREE_BW_FACTOR = L.TREE_ALL_REDUCE  # tuning.cc:331: a tree all_reduce reaches 0.92 of the link
NCCL_CANDIDATES = ("ring", "tree", "inswitch")


def tree_net_bytes_factor(N: int) -> float:
    """Bytes a domain's NICs carry per direction in NCCL's double binary tree, over S: each
    domain is interior in at most one of the two trees (each carrying S/2) and a leaf in the
    other; reduce goes up while broadcast comes down the same links in the other direction.
    Two domains: each is the root of one tree with one child and a leaf in the other, S in all;
    three: a root with two children (S) and a leaf (S/2); four and more: an interior node with
    a parent and two children (3S/2) and a leaf (S/2), 2S."""
    return 1.0 if N <= 2 else 1.5 if N == 3 else 2.0


def nvlstree_net_bytes_factor(N: int) -> float:
    """NVLSTree's network bytes per direction over S, a domain's NICs together: its inter-node
    tree runs at twice bwInter on two nodes, once above (tuning.cc:320)."""
    return 1.0 if N <= 2 else 2.0


def _bound(lat: float, nvl: float, nic: float) -> str:
    """Which term decides a time: the largest of latency, NVLink and NIC bandwidth."""
    return max((lat, "latency-bound"), (nvl, "NVLink-bound"), (nic, "NIC-bound"))[1]


def _net_gbps(G: int, fabric: Fabric, what: str) -> float:
    """R_net: what one domain moves to the others, rails x NIC (NCCL runs one ring or tree
    per NIC, rail-optimised; docs/model.md): min(G, rails) NICs of B_nic each."""
    nic = _scaleout(fabric, what)
    rails = fabric.terms.rails or G
    return min(G, rails) * nic.bandwidth_gbps


def nvls_usable(p: int, fabric: Fabric) -> str | None:
    """None when NCCL would run NVLS (NVLSTree above a domain) at world p, else why not."""
    if fabric.terms.inswitch_algbw_gbps is None:
        return "no in-switch rate in the profile (no NVLink SHARP)"
    if min(p, _domain(p, fabric)) <= 4:
        return "NVLS gains nothing on 4 GPUs a domain or fewer (NVIDIA/nccl#1455)"
    return None


def _detail(lat, nvl, nic, red, name, proto) -> dict:
    return {"time_us": lat + max(nvl, nic) + red, "latency_us": lat, "nvl_us": nvl, "nic_us": nic,
            "bound": _bound(lat, nvl, nic), "nccl": name, "proto": proto}


def _fastest(options: list[dict]) -> dict:
    return min(options, key=lambda d: d["time_us"])


def net_ramp_us(nic_nbytes: float, nics: int, rate_gbps: float, fabric: Fabric) -> float:
    """The network's bandwidth ramp (a profile's model.net_ramp_MiB_per_gpu): of the bytes the
    domain's `nics` NICs send, the first ramp x nics move at half the rate, so min(bytes, ramp x
    nics) / rate on top of bytes / rate (0 where the profile has no ramp)."""
    R = fabric.terms.net_ramp_nbytes_per_gpu * nics
    return min(nic_nbytes, R) / (rate_gbps * 1e3) if R > 0 else 0.0


def _net_lat(fabric: Fabric) -> tuple:
    """The fabric's network latency and its Simple extra (None: the same again, NCCL's rule)."""
    return fabric.terms.net_latency_us, fabric.terms.net_simple_latency_us


def _fixed(N: int, fabric: Fabric) -> float:
    """What a NCCL Ring or Tree collective (or all_to_all) across domains pays once beyond
    NCCL's step latencies (the profile's net_fixed_us); 0 inside one domain."""
    return fabric.terms.net_fixed_us if N > 1 else 0.0


def _nics(G: int, fabric: Fabric) -> int:
    return min(G, fabric.terms.rails or G)


def nccl_channels_across(fabric: Fabric) -> int | None:
    """The channels NCCL's graph search gives a full domain across nodes, where the model knows
    them (Terms.nic_channels; latency.nccl_net_channels), else None."""
    if not fabric.terms.nic_channels or fabric.scaleout is None or fabric.domain_gpus is None:
        return None
    return L.nccl_net_channels(_nics(fabric.domain_gpus, fabric), fabric.scaleout.bandwidth_gbps,
                               fabric.terms.gpu_arch)


def _plateau(S: float, p: int, G: int, N: int, fabric: Fabric) -> bool:
    """NCCL's ring plateau: Ring Simple all_reduce across nodes pays 1.4x its latency once each
    channel carries 64 bytes a rank (tuning.cc:647-650), where the channels are known."""
    if N <= 1 or not fabric.terms.nic_channels:
        return False
    ch = L.nccl_net_channels(_nics(G, fabric), _scaleout(fabric, "ring").bandwidth_gbps, fabric.terms.gpu_arch)
    return S / (ch * p) >= 64


def _channel_cap(algo: str, proto, G: int, N: int, fabric: Fabric) -> float | None:
    """NCCL's tuner ceiling on a Ring LL128 or Tree rate across domains (bus bandwidth, GB/s):
    its per-channel maxima times the channels its graph search gives one NIC a GPU
    (latency.per_channel_cap_gbps, nccl_net_channels); None inside a domain, for other
    algorithms and protocols, or where the fabric's channels are not NCCL's one a NIC."""
    if N <= 1 or proto is None or not fabric.terms.nic_channels:
        return None
    ch = L.nccl_net_channels(_nics(G, fabric), _scaleout(fabric, algo).bandwidth_gbps, fabric.terms.gpu_arch)
    return L.per_channel_cap_gbps(algo, proto, N, fabric.terms.gpu_arch, ch)


def _protocols(algo: str, fabric: Fabric, proto: str | None, N: int = 1) -> tuple[str, ...]:
    """The protocols to cost: NCCL's for a NCCL fabric (or the one asked for), none otherwise;
    across domains only those the fabric's network runs (Terms.net_protocols)."""
    if fabric.terms.gpu_arch is None:
        return (None,)
    allowed = L.protocols_for(algo)
    if N > 1 and fabric.terms.net_protocols is not None:
        allowed = tuple(x for x in allowed if x in fabric.terms.net_protocols)
    if proto is None:
        return allowed
    if proto not in allowed:
        raise UsageError(f"NCCL runs {algo} with {', '.join(allowed)} only here, not {proto}")
    return (proto,)


def _rate(algo: str, proto, rate_gbps: float, N: int, fabric: Fabric) -> float:
    return rate_gbps if proto is None else L.protocol_rate_gbps(algo, proto, rate_gbps, N, fabric.terms.gpu_arch)


def _ring(coll: str, p: int, S: float, fabric: Fabric, proto) -> dict:
    """Ring all_reduce (coll "all_reduce": 2(p-1) steps, 2(p-1)/p S) or all_gather /
    reduce_scatter (p-1 steps, (p-1)/p S); across domains at min(B_up, R_net), rail-parallel."""
    G = _domain(p, fabric)
    N = p // G
    up = fabric.scaleup
    R = up.bandwidth_gbps if N == 1 else min(up.bandwidth_gbps, _net_gbps(G, fabric, f"ring {coll}"))
    steps = 2 if coll == "all_reduce" else 1
    frac = steps * (p - 1) / p
    out = []
    for pr in _protocols("ring", fabric, proto, N):
        rate = _rate("ring", pr, R, N, fabric)
        cap = _channel_cap("ring", pr, G, N, fabric)  # tuning.cc:328-329 (LL128 only)
        rate = rate if cap is None else min(rate, cap)
        bw = frac * S / (rate * 1e3) + (net_ramp_us(frac * S, _nics(G, fabric), rate, fabric) if N > 1 else 0.0)
        if pr is None:
            lat = steps * (p - N) * up.alpha_us + (steps * (N - 1) * fabric.scaleout.alpha_us if N > 1 else 0.0)
        else:
            lat = L.nccl_latency_us("ring", pr, coll, p, G, N, *_net_lat(fabric))
            if coll == "all_reduce" and pr == "Simple" and _plateau(S, p, G, N, fabric):
                lat *= L.RING_PLATEAU  # tuning.cc:647-650
            lat += _fixed(N, fabric)
        nvl, nic = (bw, 0.0) if R == up.bandwidth_gbps else (0.0, bw)
        out.append(_detail(lat, nvl, nic, 0.0, "Ring", pr))
    return _fastest(out)


def _tree(p: int, S: float, fabric: Fabric, proto) -> dict:
    """NCCL's Tree all_reduce: a chain in each domain (2S each way on NVLink), a double binary
    tree across (tree_net_bytes_factor(N) S on a domain's NICs), pipelined: the slower counts;
    both at 0.92 of the rate (tuning.cc:331)."""
    G = _domain(p, fabric)
    N = p // G
    up = fabric.scaleup
    out = []
    for pr in _protocols("tree", fabric, proto, N):
        # NCCL's mid-size share of the tree's rate (tuning.cc:640-642); 1 off NCCL
        c = 1.0 if pr is None else L.tree_correction("tree", pr, S, fabric.terms.gpu_arch, fabric.terms.host_cpu)
        nvl = 2 * S / (_rate("tree", pr, TREE_BW_FACTOR * up.bandwidth_gbps, N, fabric) * c * 1e3)
        nic = 0.0
        if N > 1:
            R_net = _net_gbps(G, fabric, "tree all_reduce")
            rate = _rate("tree", pr, TREE_BW_FACTOR * R_net, N, fabric) * c
            k = tree_net_bytes_factor(N)
            nic = k * S / (rate * 1e3) + net_ramp_us(k * S, _nics(G, fabric), rate, fabric)
            cap = _channel_cap("tree", pr, G, N, fabric)
            if cap is not None:  # NCCL's tree moves S at half its bus rate (tuning.cc:331-335, :380)
                nic = max(nic, 2 * S / (cap * c * 1e3))
        if pr is None:
            lat = 2 * (G - 1) * up.alpha_us + (2 * _lg(N) * fabric.scaleout.alpha_us if N > 1 else 0.0)
        else:
            lat = L.nccl_latency_us("tree", pr, "all_reduce", p, G, N, *_net_lat(fabric)) + _fixed(N, fabric)
        out.append(_detail(lat, nvl, nic, 0.0, "Tree", pr))
    return _fastest(out)


def nvls_ramp_us(S: float, G: int, fabric: Fabric) -> float:
    """NVLS's bandwidth ramp, apart from its latency: the first R = ramp x G bytes move at half
    the in-switch rate A (the switch needs R in flight to reach A), so min(S, R)/A on top of
    S/A: 0 at S = 0, R/A from S = R on (the extra time the 72-GPU rack shows at 512 MiB)."""
    A = fabric.terms.inswitch_algbw_gbps
    return min(S, fabric.terms.inswitch_ramp_nbytes_per_gpu * G) / (A * 1e3)


def _nvls(p: int, S: float, fabric: Fabric, proto) -> dict:
    """NVLS in a domain, NVLSTree across: the in-switch time S/A plus the ramp; NVLSTree's
    network at nvlstree_net_bytes_factor(N) S / R_net, the phases pipelined."""
    G = _domain(p, fabric)
    N = p // G
    up = fabric.scaleup
    pr = _protocols("nvls", fabric, proto, N)[0]
    # NVLSTree's mid-size share on Blackwell x86 hosts (tuning.cc:643-646); 1 for NVLS and off NCCL
    c = 1.0 if pr is None or N == 1 else L.tree_correction("nvls_tree", pr, S, fabric.terms.gpu_arch,
                                                             fabric.terms.host_cpu)
    A = Tier("inswitch", up.alpha_us, fabric.terms.inswitch_algbw_gbps * c)
    nvl = _xfer_us(S, A) + nvls_ramp_us(S, G, fabric) / c
    nic = 0.0
    if N > 1:
        out = _scaleout(fabric, "NVLSTree all_reduce")
        k, R_net = nvlstree_net_bytes_factor(N), _net_gbps(G, fabric, "NVLSTree") * c
        nic = k * S / (R_net * 1e3) + net_ramp_us(k * S, _nics(G, fabric), R_net, fabric)
    name = "NVLS" if N == 1 else "NVLSTree"
    if pr is None:
        lat = up.alpha_us if N == 1 else 2 * up.alpha_us + 2 * _lg(N) * out.alpha_us
    else:
        # no net_fixed_us: it is fitted on Tree (8 B); no fit source times NVLSTree at small sizes, and
        # NCCL's own NVLSTree latency (25 us over NVLink + 2 log2 N x 20.9) already sits above the one
        # published small NVLSTree figure (docs/model.md#latency-and-protocols)
        lat = L.nccl_latency_us("nvls" if N == 1 else "nvls_tree", pr, "all_reduce", p, G, N, *_net_lat(fabric))
    return _detail(lat, nvl, nic, 0.0, name, pr)


def all_reduce_detail(algo: str, p: int, nbytes: float, fabric: Fabric, proto: str | None = None) -> dict:
    """One all_reduce of S = nbytes over p ranks, modelled the way NCCL runs it (docs/model.md).

    G ranks per domain, N = p/G domains, B_up the scale-up rate (ring busbw), R_net =
    min(G, rails) x B_nic what one domain sends to the others. Bandwidth terms:

    - ring: 2(p-1)/p S / R, R = B_up in a domain, else min(B_up, R_net) (rail-parallel rings);
    - tree (NCCL Tree): max(2S / (0.92 B_up), k(N) S / (0.92 R_net)), k = 1, 1.5, 2 at 2, 3, 4+
      domains (tree_net_bytes_factor);
    - inswitch: NVLS in a domain, S/A + min(S, ramp G)/A (A the in-switch S/t); above a domain
      NVLSTree, max(that, k S / R_net), k = 1 on two domains, 2 above (tuning.cc:320); at <= 4
      GPUs a domain NVLS runs as the ring (tree across domains). A profile without an
      in-switch rate gets a generic switch at the link rate: a + S(p+1)/(p B);
    - hierarchical: reduce-scatter in the domain, all_reduce of S/G across, all_gather,
      pipelined: 2(G-1) a_up + 2(N-1) a_nic + max(2(G-1)/G S/B_up, 2(N-1)/N S/R_net);
    - recursive_doubling, rabenseifner: flat, at the slowest link (docs/ceilings.md#formulas).

    Latency: on a NCCL fabric (a GPU profile) NCCL's tuner's for Ring, Tree and NVLS(Tree), each
    at the fastest protocol (or `proto`: LL, LL128, Simple), the protocol's share of the rate
    (latency.py); otherwise, and for the MPI-style ones, alpha per step.

    Returns time_us, latency_us, nvl_us, nic_us, bound (latency-, NVLink- or NIC-bound),
    nccl (NCCL's name for it, None for the MPI-style ones), proto (None off NCCL).
    """
    p = _check_p(p)
    if algo not in ALL_REDUCE_ALGOS:
        raise UsageError(f"unknown all_reduce algorithm {algo!r}; choose one of {', '.join(ALL_REDUCE_ALGOS)}")
    S, g = float(nbytes), fabric.gamma_us_per_byte
    if p == 1:
        return _detail(0.0, 0.0, 0.0, 0.0, NCCL_NAMES.get(algo), None)
    G = _domain(p, fabric)
    N = p // G
    up = fabric.scaleup
    red = (p - 1) / p * S * g  # reduction cost, 0 unless gamma is set
    if algo == "inswitch" and nvls_usable(p, fabric) is not None:
        if fabric.terms.inswitch_algbw_gbps is not None:  # <= 4 GPUs: no gain over those
            d = _ring("all_reduce", p, S, fabric, proto) if N == 1 else _tree(p, S, fabric, proto)
            return {**d, "time_us": d["time_us"] + red, "nccl": "NVLS" if N == 1 else "NVLSTree"}
        tier = _flat_tier(p, fabric, "inswitch all_reduce")
        bw = (p + 1) / p * _xfer_us(S, tier)
        nvl, nic = (bw, 0.0) if tier is up else (0.0, bw)
        return _detail(tier.alpha_us, nvl, nic, red, None, None)
    if algo == "inswitch":
        d = _nvls(p, S, fabric, proto)
    elif algo == "ring":
        d = _ring("all_reduce", p, S, fabric, proto)
    elif algo == "tree":
        d = _tree(p, S, fabric, proto)
    elif algo == "hierarchical":
        lat = 2 * (G - 1) * up.alpha_us
        nvl = 2 * (G - 1) / G * _xfer_us(S, up)
        nic = 0.0
        if N > 1:
            lat += 2 * (N - 1) * _scaleout(fabric, "hierarchical all_reduce").alpha_us
            nic = 2 * (N - 1) / N * S / (_net_gbps(G, fabric, "hierarchical all_reduce") * 1e3)
        d = _detail(lat, nvl, nic, 0.0, None, None)
    else:
        tier = _flat_tier(p, fabric, f"{algo} all_reduce")
        a, lg = tier.alpha_us, _lg(p)
        if algo == "recursive_doubling":
            lat, bw, red = lg * a, lg * _xfer_us(S, tier), lg * S * g
        else:  # rabenseifner
            lat, bw = 2 * lg * a, 2 * (p - 1) / p * _xfer_us(S, tier)
        nvl, nic = (bw, 0.0) if tier is up else (0.0, bw)
        d = _detail(lat, nvl, nic, 0.0, None, None)
    return {**d, "time_us": d["time_us"] + red}


def all_reduce_time_us(algo: str, p: int, nbytes: float, fabric: Fabric) -> float:
    """Time of one all_reduce of nbytes over p ranks (all_reduce_detail's time_us)."""
    return all_reduce_detail(algo, p, nbytes, fabric)["time_us"]


def nccl_label(d: dict) -> str:
    """NCCL's algorithm with the protocol it runs at: 'Tree LL', 'NVLS Simple', 'Ring'."""
    return f"{d['nccl']} {d['proto']}" if d.get("proto") else str(d["nccl"])


def nccl_pick(p: int, nbytes: float, fabric: Fabric) -> dict:
    """The algorithm NCCL would run: of Ring, Tree and NVLS / NVLSTree (where the profile has
    NVLink SHARP and a domain holds more than 4 GPUs), each at its fastest protocol, the
    fastest by this model, as NCCL's tuner picks the fastest by its own (src/graph/tuning.cc).
    Returns algo, nccl, proto, time_us, bound and why (one line: what decided it and what was
    left out)."""
    options = [a for a in NCCL_CANDIDATES if a != "inswitch" or nvls_usable(p, fabric) is None]
    got = {a: all_reduce_detail(a, p, nbytes, fabric) for a in options}
    best = min(options, key=lambda a: got[a]["time_us"])
    d = got[best]
    others = ", ".join(f"{nccl_label(got[a])} {got[a]['time_us']:.4g} us" for a in options if a != best)
    why = f"{nccl_label(d)} fastest by this model ({d['bound']}); " + (f"then {others}" if others else "no other")
    if "inswitch" not in options:
        why += f"; NVLS not offered: {nvls_usable(p, fabric)}"
    return {"algo": best, **d, "why": why}


def all_gather_detail(p: int, nbytes: float, fabric: Fabric, proto: str | None = None) -> dict:
    """Ring all_gather, S = the whole output: (p-1)/p S at B_up in a domain, at min(B_up,
    R_net) across domains (rail-parallel rings, as all_reduce); latency NCCL's (p-1 steps, N-1
    of them across) at the fastest protocol, or (p-N) a_up + (N-1) a_nic off NCCL."""
    p = _check_p(p)
    if p == 1:
        return _detail(0.0, 0.0, 0.0, 0.0, "Ring", None)
    return _ring("all_gather", p, float(nbytes), fabric, proto)


def all_gather_time_us(p: int, nbytes: float, fabric: Fabric) -> float:
    return all_gather_detail(p, nbytes, fabric)["time_us"]


def reduce_scatter_detail(p: int, nbytes: float, fabric: Fabric, proto: str | None = None) -> dict:
    """Ring reduce_scatter, S = the whole input: all_gather's time + (p-1)/p S gamma."""
    p = _check_p(p)
    if p == 1:
        return _detail(0.0, 0.0, 0.0, 0.0, "Ring", None)
    S = float(nbytes)
    d = _ring("reduce_scatter", p, S, fabric, proto)
    return {**d, "time_us": d["time_us"] + (p - 1) / p * S * fabric.gamma_us_per_byte}


def reduce_scatter_time_us(p: int, nbytes: float, fabric: Fabric) -> float:
    return reduce_scatter_detail(p, nbytes, fabric)["time_us"]


def all_to_all_detail(p: int, nbytes: float, fabric: Fabric) -> dict:
    """Pairwise all_to_all, S = bytes a rank sends in total.

    Bandwidth: inside one domain (p <= G) S/B_nvl (S includes the rank's own chunk, so this is
    the same B a fit of t = (p-1) a + S/B measures); above it the p-G peers in other domains
    take (p-G)/p S over the rank's own NIC and the G-1 in its domain (G-1)/p S over scale-up,
    both at once: max((p-G)/p S/B_nic, (G-1)/p S/B_nvl).

    Latency: on a NCCL fabric the sends to every peer are posted at once (one group of p-1
    send/recv pairs), so the per-peer latencies overlap: one Simple step of each tier used
    (NCCL's base + NVLink latency, + one network step across domains). Off NCCL (MPI-style
    pairwise exchange, one peer after another): (p-1) a_nvl in a domain, (p-G) a_nic +
    (G-1) a_nvl above.
    """
    p = _check_p(p)
    if p == 1:
        return _detail(0.0, 0.0, 0.0, 0.0, "pairwise", None)
    S, G = float(nbytes), _domain(p, fabric)
    up = fabric.scaleup
    nccl = fabric.terms.gpu_arch is not None
    if p <= G:
        lat = (L.BASE_LAT_US["ring"][2] + L.HW_LAT_NVLINK_US["ring"][2]) if nccl else (p - 1) * up.alpha_us
        return _detail(lat, _xfer_us(S, up), 0.0, 0.0, "pairwise", "Simple" if nccl else None)
    nic = _scaleout(fabric, "all_to_all")
    if nccl:
        lat = (L.BASE_LAT_US["ring"][2] + L.HW_LAT_NVLINK_US["ring"][2]
               + L.inter_latency_us("ring", "Simple", fabric.terms.net_latency_us, G,
                                    fabric.terms.net_simple_latency_us)
               + fabric.terms.net_fixed_us)
    else:
        lat = (p - G) * nic.alpha_us + (G - 1) * up.alpha_us
    remote = (p - G) / p * S
    return _detail(lat, _xfer_us((G - 1) / p * S, up),
                   _xfer_us(remote, nic) + net_ramp_us(remote, 1, nic.bandwidth_gbps, fabric), 0.0, "pairwise",
                   "Simple" if nccl else None)


def all_to_all_time_us(p: int, nbytes: float, fabric: Fabric) -> float:
    return all_to_all_detail(p, nbytes, fabric)["time_us"]
