"""Latency and protocol terms of the what-if model, as NCCL's own tuner counts them
(docs/model.md#latency-and-protocols).

NCCL picks an (algorithm, protocol) pair by t = latency + S / bandwidth, with constants
tuned per algorithm and protocol (LL, LL128, Simple). The model takes its latencies from
the same tables and the same step counts, and the bandwidth fraction each protocol reaches,
so that small and mid sizes cost what NCCL thinks they cost; the large-size rates stay the
profile's measured ones. The network path adds the fabric's own latency (a profile's
model.net_latency_us: 0 on InfiniBand, which NCCL's tables were tuned on; more on EFA,
TCPXO) the way NCCL adds its network plugin's reported latency.

Every constant below is NVIDIA/nccl src/graph/tuning.cc at master 5067397c
(https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc); the line is beside it.
"""
from __future__ import annotations

import math

PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (master 5067397c)"

# baseLatencies, us, per protocol (LL, LL128, Simple): tuning.cc:151 (Tree, Ring), :153 (NVLS, NVLSTree)
BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)}
# hwLatencies over NVLink, us a step: tuning.cc:159 (Tree, Ring), :161 (NVLS, NVLSTree; Simple only)
HW_LAT_NVLINK_US = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (None, None, 25.0),
                    "nvls_tree": (None, None, 25.0)}
# hwLatencies over the network, us a step: tuning.cc:171 (Tree, Ring), :173 (NVLS, NVLSTree)
HW_LAT_NET_US = {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (None, None, 18.0),
                 "nvls_tree": (None, None, 20.9)}
# getNetOverhead: 1 us a ring step once the ring crosses nodes (Intel / other hosts; 2 on AMD),
# three times that for Simple: tuning.cc:228-233 (getNetOverhead), :404-410
NET_OVERHEAD_US = 1.0
# llMaxBws, GB/s of bus bandwidth LL can reach: one node by GPU generation (tuning.cc:179-182,
# the N1 column), several by host CPU (Intel/Arm row, tuning.cc:179: 39.0 on two nodes, 20.4 above)
LL_MAX_BUSBW_ONE_NODE = {"ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
LL_MAX_BUSBW_TWO_NODES, LL_MAX_BUSBW_MORE_NODES = 39.0, 20.4
# Protocol bandwidth fractions (tuning.cc:327-335): ring LL 0.5 (capped at llMaxBw), ring LL128
# 0.92; tree all_reduce 0.92 (:331), then LL 1/3.8 (capped), LL128 7/9 in one node, 120/128 across
RING_LL, RING_LL128 = 0.5, 0.92
TREE_ALL_REDUCE, TREE_LL, TREE_LL128_ONE_NODE, TREE_LL128_NODES = 0.92, 1 / 3.8, 7 / 9, 120 / 128

# treeCorrectionFactor[protocol][logSize], logSize = log2i(S >> 6): NCCL's tuner scales the
# bandwidth of Tree all_reduce below 512 MiB (logSize < 23) by it, and of NVLSTree all_reduce below
# 1 GiB (logSize < 24) on Blackwell with an x86 host: tuning.cc:623-627 (the table), :640-646 (its use).
# The mid sizes where a tree's pipeline is not yet full run at these shares of the large-size rate.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0,
              1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}

# perChMax*Bws, GB/s of bus bandwidth one channel reaches, by GPU generation and (1 node, 2 nodes, 3
# and more): tuning.cc:184-189 (Ring LL128), :191-196 (Tree LL128), :198-203 (Tree, every protocol).
# NCCL's tuner takes min(its rate, nChannels x these) (:328-335); Blackwell's Tree values were cut
# in NCCL 2.28.3 (v2.27.7: 2 x 41.4 and 2 x 36.0 across nodes).
PER_CHANNEL_MAX_GBPS = {
    ("ring", "LL128"): {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0)},
    ("tree", "LL128"): {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)},
    ("tree", "all"): {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)},
}
# Ring Simple all_reduce across nodes: latency x 1.4 once each channel carries 64 bytes a rank
# (x 1.9 below compute capability 8.0, which no profile has): tuning.cc:647-650, the ring's plateau
RING_PLATEAU = 1.4
# The bandwidths a channel may take across nodes in NCCL's graph search, GB/s, fastest first
# (NVIDIA/nccl src/graph/search.cc at master 5067397c, :1052-1053, :1058-1059, :1064-1065).
INTER_SPEEDS_GBPS = {
    "ampere": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0),
}


def nccl_net_channels(nics: int, nic_gbps: float, arch: str) -> int:
    """The channels of NCCL's ring (and tree) graph across nodes where each GPU has its own NIC:
    the search takes the fastest speed a GPU's path to its NIC carries (search.cc:1170-1173; 48
    GB/s for a 400G NIC behind PCIe Gen5, 24 for HDR behind Gen4, 96 for an 800G ConnectX-8),
    one channel a NIC at it, then ncclTopoDupChannels (search.cc:1036-1049) doubles them unless
    a channel runs under 25 GB/s, or under 50 on Hopper and later with more than 4 channels
    (at most 32, MAXCHANNELS / 2: init.cc:1177)."""
    speeds = INTER_SPEEDS_GBPS.get(arch, INTER_SPEEDS_GBPS["hopper"])
    speed = next((x for x in speeds if x <= nic_gbps + 1e-9), speeds[-1])
    ch = nics * max(1, int(nic_gbps / speed + 1e-9))
    if speed < 25.0 or (arch != "ampere" and speed < 50.0 and ch > 4):
        return ch
    return min(2 * ch, 32)


def per_channel_cap_gbps(algo: str, proto: str, N: int, arch: str, channels: int) -> float | None:
    """NCCL's tuner ceiling on a Ring LL128 or Tree rate across N nodes, bus bandwidth GB/s
    (tuning.cc:328-335); None where it sets none (Ring LL and Simple, NVLS, NVLSTree)."""
    i = 0 if N <= 1 else 1 if N == 2 else 2
    def cap(key):
        return channels * PER_CHANNEL_MAX_GBPS[key].get(arch, PER_CHANNEL_MAX_GBPS[key]["hopper"])[i]
    if algo == "ring":
        return cap(("ring", "LL128")) if proto == "LL128" else None
    if algo != "tree":
        return None
    tree = cap(("tree", "all"))  # :331, before the protocol's fraction
    if proto == "LL":
        return protocol_rate_gbps("tree", "LL", tree, N, arch)
    if proto == "LL128":
        return min(protocol_rate_gbps("tree", "LL128", tree, N, arch), cap(("tree", "LL128")))
    return tree


ASSUMPTIONS = [
    "latency as NCCL's tuner counts it (NVIDIA/nccl src/graph/tuning.cc): a base latency per algorithm and "
    "protocol plus a hardware latency per step over NVLink and over the network (ring: 2(p-1) steps for "
    "all_reduce, p-1 for all_gather / reduce_scatter, of which 2(N-1) or N-1 cross domains; tree: 2((G-1) "
    "NVLink + log2 N network) steps; NVLS: one NVLink latency, whatever the domain's size; NVLSTree: NVLS + "
    "2 log2 N network steps); the network steps add the fabric's own latency (model.net_latency_us, twice for "
    "Simple: NCCL's flush), as NCCL adds its network plugin's",
    "protocols as NCCL's tuner rates them: LL at 1/2 of the link (ring) or 1/3.8 (tree), capped at NCCL's "
    "llMaxBw; LL128 at 0.92 (ring) or 7/9 in one domain, 120/128 across (tree); Simple at the full rate; "
    "NVLS and NVLSTree run Simple only; the fastest protocol is the one NCCL runs",
    "per-channel ceilings as NCCL's tuner takes them across nodes (tuning.cc:184-203, :328-335): Ring LL128 "
    "at most channels x perChMaxRingLL128Bw, Tree at most channels x perChMaxTreeBw (and x perChMaxTreeLL128Bw "
    "for LL128), a tree moving S at half that bus rate; channels as NCCL's graph search gives one NIC a GPU on "
    "its InfiniBand / RoCE transport (search.cc: one a NIC at the NIC path's speed, doubled unless slow; 8 on "
    "400G and HDR HGX, 16 on 800G): on 4+ B200 nodes Tree reaches 8 x 24 = 192 GB/s busbw; none on EFA, "
    "TCPXO or NVL72 racks (no channel count), nor on NVLS / NVLSTree",
    "mid sizes as NCCL's tuner costs them (tuning.cc:623-646): Tree all_reduce below 512 MiB, and NVLSTree "
    "below 1 GiB on Blackwell with x86 hosts, at treeCorrectionFactor[protocol][log2(S/64)] of their rate "
    "(0.4-1.0; 0.5 for Simple at 128 KiB-2 MiB)",
    "the fabric's network terms are its profile's: net_latency_us (0 on InfiniBand and RoCE, whose NIC and "
    "verbs NCCL's tables were tuned on; 22 us on AWS EFA, fitted on the 2 x p5 sweep of "
    "aws-samples/awsome-distributed-training; 49 us on GCP TCPXO, with 332 us more on Simple's steps "
    "(net_simple_latency_us), fitted on the 2 x a3-mega sweep of lessizzmore/create-a3mega-ztan-fork), "
    "net_protocols (EFA: LL and Simple, aws/aws-ofi-nccl#76; TCPXO: the same, from its sweep) and "
    "net_ramp_MiB_per_gpu (EFA: the first 16 MiB a GPU's NIC sends at half rate, fitted on its sweep at "
    "128 MiB); net_fixed_us (6.7 us on InfiniBand and RoCE, once a Ring, Tree or all_to_all collective "
    "crosses nodes, not NVLSTree: fitted on ABCI 2.0's 8 B all_reduce on 2-16 nodes of 8 A100 over HDR, "
    "aistabci/abci2.0benchmark, 6.2-7.4 us over NCCL's tables at every node count; 0 on EFA and TCPXO, "
    "whose fitted per-step latency holds it); the fabric line above each table prints them",
    "fabric profiles: h100-hgx and the other HGX / NVL72 profiles on InfiniBand; h100-roce (400G RoCE at 40 "
    "GB/s, network terms estimates); h100-p5-efa (AWS EFA, fitted as above); b200-p6-efa (AWS EFA v4: "
    "b200-hgx's NVLink, h100-p5-efa's network terms, estimates); h100-a3mega-tcpxo (GCP TCPXO, "
    "fitted as above); gb300-nvl72 from sources (NVLink 5 ring 695 / NVLS 845 GB/s busbw on 8 x B300, "
    "NVIDIA/nccl#2140; ConnectX-8 at 96 GB/s, NVIDIA/aicr#1413) with its 72-GPU NVLS rate, ramp, rails and "
    "MoE terms carried from GB200 (estimates); b300-hgx (NVLink 5 as measured on 8 x B300, NVIDIA/nccl#2140; "
    "ConnectX-8 at 96 GB/s as gb300-nvl72; the rest as b200-hgx)",
    "--nic-gbps sets the NIC's line rate; the achieved rate keeps the profile's achieved/line ratio "
    "(400 Gb/s on h100-hgx: 48 GB/s, not 50)",
]


def lat_index(proto: str) -> int:
    if proto not in PROTOCOLS:
        raise ValueError(f"unknown protocol {proto!r}; NCCL's are {', '.join(PROTOCOLS)}")
    return PROTOCOLS.index(proto)


def log2i(n: int) -> int:
    """NCCL's log2i: floor(log2 n), 0 for n = 1."""
    return int(math.floor(math.log2(n))) if n > 1 else 0


def protocols_for(algo: str) -> tuple[str, ...]:
    """The protocols NCCL runs an algorithm with: NVLS and NVLSTree Simple only (tuning.cc:301)."""
    return ("Simple",) if algo in ("nvls", "nvls_tree") else PROTOCOLS


def inter_latency_us(algo: str, proto: str, net_latency_us: float, ppn: int,
                     net_simple_latency_us: float | None = None) -> float:
    """One network step: NCCL's hardware latency plus the fabric's latency, and for Simple once
    more (the flush of a GPU Direct receive: tuning.cc:387-391), or the fabric's own Simple
    extra where its profile gives one (net_simple_latency_us). With one rank a node NCCL takes
    the tree's network latency for every algorithm (latencies fully exposed, tuning.cc:386-388)."""
    i = lat_index(proto)
    table = HW_LAT_NET_US["tree" if ppn == 1 and algo in ("ring", "tree") else algo]
    lat = table[i]
    if lat is None:
        raise ValueError(f"NCCL runs {algo} with Simple only")
    if proto != "Simple":
        return lat + net_latency_us
    return lat + net_latency_us + (net_latency_us if net_simple_latency_us is None else net_simple_latency_us)


def nccl_latency_us(algo: str, proto: str, coll: str, p: int, G: int, N: int, net_latency_us: float = 0.0,
                    net_simple_latency_us: float | None = None) -> float:
    """NCCL's latency of one collective (tuning.cc:383-428): algo ring, tree, nvls or nvls_tree;
    coll all_reduce, all_gather or reduce_scatter; p ranks in N domains of G; the fabric's
    network latency (and Simple's extra, inter_latency_us) on every network step."""
    i = lat_index(proto)
    lat = BASE_LAT_US[algo][i]
    intra = HW_LAT_NVLINK_US[algo][i]
    if intra is None:
        raise ValueError(f"NCCL runs {algo} with Simple only")
    inter = inter_latency_us(algo, proto, net_latency_us, G, net_simple_latency_us) if N > 1 else 0.0
    if algo == "ring":
        nsteps = 2 * (p - 1) if coll == "all_reduce" else p - 1
        n_inter = 0 if N == 1 else (2 * (N - 1) if coll == "all_reduce" else N - 1)
        if N > 1:  # inter-node rings still launch nsteps x the net overhead (tuning.cc:404-410)
            intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
        return lat + (nsteps - n_inter) * intra + n_inter * inter
    if coll != "all_reduce":
        raise ValueError(f"the model runs {coll} as a ring only")
    if algo == "tree":  # tuning.cc:414-416
        return lat + 2 * ((G - 1) * intra + log2i(N) * inter)
    if algo == "nvls":  # tuning.cc:424-426: one NVLS latency whatever the domain's size
        return intra + (inter if N > 1 else 0.0)
    return lat + intra + 2 * log2i(N) * inter  # nvls_tree, tuning.cc:427-428


def protocol_rate_gbps(algo: str, proto: str, rate_gbps: float, N: int, arch: str) -> float:
    """The rate a protocol reaches where Simple reaches rate_gbps (bus bandwidth terms): NCCL's
    fractions and the LL cap (tuning.cc:327-335). Tree's 0.92 for all_reduce is the caller's."""
    if proto == "Simple" or algo in ("nvls", "nvls_tree"):
        return rate_gbps
    cap = (LL_MAX_BUSBW_ONE_NODE.get(arch, LL_MAX_BUSBW_ONE_NODE["hopper"]) if N == 1 else
           LL_MAX_BUSBW_TWO_NODES if N == 2 else LL_MAX_BUSBW_MORE_NODES)
    if algo == "ring":
        return min(cap, rate_gbps * RING_LL) if proto == "LL" else rate_gbps * RING_LL128
    if proto == "LL":
        return min(cap, rate_gbps * TREE_LL)
    return rate_gbps * (TREE_LL128_ONE_NODE if N == 1 else TREE_LL128_NODES)


def tree_correction(algo: str, proto: str, nbytes: float, arch: str | None, host_cpu: str = "x86") -> float:
    """The share of its rate NCCL's tuner gives a tree at size S (tuning.cc:640-646): Tree
    all_reduce at logSize = log2i(S >> 6) < 23, NVLSTree at < 24 on Blackwell with an x86 host;
    1 elsewhere (and below 64 B, where logSize is negative)."""
    n = int(nbytes) >> 6
    if n < 1:
        return 1.0
    log_size = log2i(n)
    if algo == "tree" and log_size < 23:
        return TREE_CORRECTION[proto][log_size]
    if algo == "nvls_tree" and log_size < 24 and arch == "blackwell" and host_cpu == "x86":
        return TREE_CORRECTION[proto][log_size]
    return 1.0
