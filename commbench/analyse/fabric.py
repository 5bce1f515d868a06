"""The fabric the what-if model runs on: two tiers (scale-up domains of G GPUs, a scale-out
NIC), the per-profile efficiency and fixed-cost terms, where p ranks are placed, and the
small helpers every projection shares (docs/model.md).

Each tier is (alpha, B): alpha the per-step latency in us, B the per-direction bandwidth in
GB/s (1e9 B/s)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from commbench.core.errors import UsageError


@dataclass(frozen=True)
class Tier:
    name: str
    alpha_us: float
    bandwidth_gbps: float


@dataclass(frozen=True)
class Terms:
    """Per-profile efficiency and fixed-cost terms (docs/model.md gives each one's source).

    inswitch_algbw_gbps: what NVLS reaches as S/t at large S (None: no in-switch rate; a
    generic switch at the link rate is modelled instead). inswitch_ramp_nbytes_per_gpu: the
    bytes per GPU NVLS needs in flight before it runs at that rate, t = (S + ramp p) / A.
    rails: NICs of one domain that NCCL's inter-domain traffic spreads over (None: one a GPU).
    moe_*: DeepEP-style kernels run the NIC and NVLink below the NCCL rates; the NVLink
    efficiency falls by moe_nvl_falloff for each doubling of the domain's ranks above 8.
    moe_ll_fixed_us: the launch / notify cost of a low-latency kernel, paid once.
    gpu_arch: ampere, hopper or blackwell where the fabric runs NCCL (a GPU profile): its
    collectives then take NCCL's tuner latencies and protocols (latency.py); None: plain
    alpha-beta (loopback, fabric_from_rates). host_cpu: x86 or arm (Grace), which NCCL's
    tuner tells apart for NVLSTree's mid sizes on Blackwell. net_latency_us: the fabric's own latency a
    network step adds to NCCL's (InfiniBand-tuned) tables, as NCCL adds its network plugin's.
    net_protocols: the protocols NCCL runs across domains on this fabric (None: LL, LL128 and
    Simple, as on InfiniBand). net_ramp_nbytes_per_gpu: the network's bandwidth ramp, the
    first bytes a GPU's NIC sends at half its rate (0: none). net_fixed_us: what a collective
    that crosses domains pays once beyond NCCL's tables (its steps' sum), fitted where a
    profile's per-step latency is NCCL's own (InfiniBand); 0 where the fitted per-step latency
    already holds it (EFA, TCPXO). nic_channels: the nodes are boards with one NIC a GPU on NCCL's
    own InfiniBand / RoCE transport, so NCCL's graph search gives one channel a NIC and its
    tuner's per-channel ceilings apply across nodes (latency.nccl_net_channels); False where a
    network plugin presents the NICs (EFA, TCPXO) or a rack's trays hold them (NVL72).
    """
    inswitch_algbw_gbps: float | None = None
    inswitch_ramp_nbytes_per_gpu: float = 0.0
    rails: int | None = None
    moe_nic_efficiency: float = 1.0
    moe_nvl_efficiency: float = 1.0
    moe_nvl_falloff: float = 1.0
    moe_ll_fixed_us: float = 0.0
    gpu_arch: str | None = None
    host_cpu: str = "x86"  # NCCL's NVLSTree size correction runs on x86 hosts only (latency.py)
    net_latency_us: float = 0.0
    net_protocols: tuple[str, ...] | None = None  # the protocols NCCL runs across domains (None: all)
    net_ramp_nbytes_per_gpu: float = 0.0
    net_simple_latency_us: float | None = None  # Simple's extra a network step (None: net_latency_us again)
    net_fixed_us: float = 0.0  # once a collective that crosses domains, beyond NCCL's tables (latency.py)
    nic_channels: bool = False  # NCCL's per-channel ceilings apply across nodes (one channel a NIC)


@dataclass(frozen=True)
class Fabric:
    """scaleout None: a single scale-up domain. domain_gpus None: every rank shares
    one scale-up domain, whatever p."""
    scaleup: Tier
    scaleout: Tier | None
    domain_gpus: int | None
    gamma_us_per_byte: float = 0.0
    terms: Terms = Terms()


def fabric_from_rates(scaleup_gbps: float, scaleup_latency_us: float, domain_gpus: int | None,
                      scaleout_gbps: float | None = None, scaleout_latency_us: float | None = None,
                      gamma_us_per_byte: float = 0.0) -> Fabric:
    """A Fabric from per-direction rates (GB/s) and per-step latencies (us), e.g. read
    from a hardware profile."""
    def tier(name, gbps, lat):
        if not (gbps is not None and math.isfinite(gbps) and gbps > 0):
            raise UsageError(f"{name} bandwidth must be a positive GB/s figure, got {gbps!r}")
        if lat is None or not math.isfinite(lat) or lat < 0:
            raise UsageError(f"{name} latency must be a non-negative figure in us, got {lat!r}")
        return Tier(name, float(lat), float(gbps))

    if domain_gpus is not None and domain_gpus < 1:
        raise UsageError(f"ranks per scale-up domain must be >= 1, got {domain_gpus}")
    if gamma_us_per_byte < 0:
        raise UsageError(f"gamma must be >= 0 us per byte, got {gamma_us_per_byte}")
    if (scaleout_gbps is None) != (scaleout_latency_us is None):
        raise UsageError("the scale-out tier needs both a bandwidth and a latency")
    out = None if scaleout_gbps is None else tier("scaleout", scaleout_gbps, scaleout_latency_us)
    return Fabric(tier("scaleup", scaleup_gbps, scaleup_latency_us), out,
                  None if domain_gpus is None else int(domain_gpus), float(gamma_us_per_byte))


def fabric_from_profile(prof, rate: str = "achieved") -> Fabric:
    """The Fabric of a hardware profile (profiles.Profile): its achieved (or line) rates,
    latencies and model terms. The in-switch rate is busbw measured on inswitch_gpus GPUs;
    NVLS moves S in S/A whatever p (NVIDIA/nccl#1455: algbw 258-273 GB/s at 5-8 H100s), so
    A = busbw g / (2(g-1))."""
    up = prof.scaleup_achieved_gbps if rate == "achieved" else prof.scaleup_line_gbps
    out = prof.scaleout_achieved_gbps if rate == "achieved" else prof.scaleout_line_gbps
    fab = fabric_from_rates(up, prof.scaleup_latency_us or 0.0, prof.scaleup_domain_gpus,
                            out, prof.scaleout_latency_us if out else None)
    A = None
    if prof.scaleup_inswitch_achieved_gbps is not None:
        g = prof.inswitch_gpus or prof.scaleup_domain_gpus or 8
        A = prof.scaleup_inswitch_achieved_gbps * g / (2 * (g - 1))
    terms = Terms(inswitch_algbw_gbps=A, inswitch_ramp_nbytes_per_gpu=prof.inswitch_ramp_nbytes_per_gpu or 0.0,
                  rails=prof.nic_rails, moe_nic_efficiency=prof.moe_nic_efficiency or 1.0,
                  moe_nvl_efficiency=prof.moe_nvl_efficiency or 1.0, moe_nvl_falloff=prof.moe_nvl_falloff or 1.0,
                  moe_ll_fixed_us=prof.moe_ll_fixed_us or 0.0, gpu_arch=prof.gpu_arch,
                  host_cpu=prof.host_cpu or "x86",
                  net_latency_us=prof.net_latency_us or 0.0,
                  net_protocols=tuple(prof.net_protocols.split(",")) if prof.net_protocols else None,
                  net_ramp_nbytes_per_gpu=prof.net_ramp_nbytes_per_gpu or 0.0,
                  net_simple_latency_us=prof.net_simple_latency_us, net_fixed_us=prof.net_fixed_us or 0.0,
                  nic_channels=bool(prof.gpu_arch and out and not prof.net_protocols and not prof.net_latency_us
                                    and prof.scaleup_node_gpus == prof.scaleup_domain_gpus))
    return dataclasses.replace(fab, terms=terms)


def _xfer_us(nbytes: float, tier: Tier) -> float:
    return nbytes / (tier.bandwidth_gbps * 1e3)  # GB/s = 1e3 bytes per us


def _check_p(p: int) -> int:
    if isinstance(p, bool) or int(p) != p or p < 1:
        raise UsageError(f"ranks p must be an integer >= 1, got {p!r}")
    return int(p)


def ranks_per_domain(p: int, domain_gpus: int | None) -> int:
    """G, the ranks each scale-up domain holds at world p: p itself when it fits one domain
    (or the domain is unbounded), else the largest divisor of p not above domain_gpus.

    The cost formulas take one G for every domain, so p ranks are spread in equal parts
    over the fewest domains that hold them: 128 ranks on 72-GPU racks run as 2 racks of 64
    (8 GPUs of each rack idle: a power-of-two expert-parallel group does not divide 72),
    1024 as 16 x 64, 12 ranks on 8-GPU nodes as 2 x 6. A prime p above the domain size
    ends as p domains of one rank: placement() says so beside every projected row.
    """
    p = _check_p(p)
    if domain_gpus is None or p <= domain_gpus:
        return p
    return next(g for g in range(int(domain_gpus), 0, -1) if p % g == 0)


def placement(p: int, fabric: Fabric) -> dict:
    """How world p sits on the fabric's domains: domain_ranks (G), domains (N = p/G) and a
    short text, "2 x 64/72" (N domains x G ranks of the domain's GPUs), "8/72" for one
    domain, "one host" when the domain is unbounded."""
    G = ranks_per_domain(p, fabric.domain_gpus)
    N = p // G
    if fabric.domain_gpus is None:
        text = "one host"
    else:
        text = (f"{N} x " if N > 1 else "") + f"{G}/{fabric.domain_gpus}"
    return {"domain_ranks": G, "domains": N, "placement": text}


def _domain(p: int, fabric: Fabric) -> int:
    """Ranks per scale-up domain at world p (ranks_per_domain's placement rule)."""
    return ranks_per_domain(p, fabric.domain_gpus)


def _scaleout(fabric: Fabric, what: str) -> Tier:
    if fabric.scaleout is None:
        raise UsageError(f"{what} spans more than one scale-up domain but the fabric has no scale-out tier")
    return fabric.scaleout


def _flat_tier(p: int, fabric: Fabric, what: str) -> Tier:
    # A flat algorithm's ring/butterfly crosses the NIC once p exceeds a domain, and
    # every step then waits for its slowest link.
    return fabric.scaleup if p <= _domain(p, fabric) else _scaleout(fabric, what)


def _lg(p: int) -> int:
    return math.ceil(math.log2(p))
