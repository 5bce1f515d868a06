"""The ceiling a measured row is compared with: which tier (scale-up links, scale-out
NIC) bounds it under a hardware profile, the line and achieved rates there, and how close
the row comes to them.

What a row moves on each tier is its benchmark's to say (Benchmark's ceiling hooks:
latency_only, tier_nbytes, busbw_is_link_rate, tier_note, inswitch_applies); a row of a
benchmark the registry does not know (an imported gather) is judged as ring-like traffic
of S x busbw_factor. Rates are GB/s per direction, as in profiles.
"""
from __future__ import annotations

import math

from commbench.benchmarks import Benchmark, registry
from commbench.core.errors import UsageError

# The profile names that callers reach through this module (ceilings.load_profile, ...):
# loading a profile and judging rows against it go together at every call site.
from .profiles import (  # noqa: F401
    LINK_DIRECTIONS,
    Profile,
    apply_overrides,
    format_rate,
    list_profiles,
    load_profile,
    loopback_profile,
    parse_profile_text,
    parse_rate_gbps,
    profiles_table_rows,
    scaleup_rates_for,
)

# A variant whose name holds one of these reduces in the switch (NVLink SHARP, IB SHARP).
INSWITCH_MARKERS = ("nvls", "sharp", "collnet", "inswitch", "multimem")

# Keys ceiling_for_row always returns, in display order.
CEILING_KEYS = ("tier", "bottleneck", "ceiling_gbps", "ceiling_achieved_gbps", "compared_as", "compared_gbps",
                "pct_of_ceiling", "pct_of_achieved", "time_bound_us", "ceiling_note")


# ---------------------------------------------------------------------------------------
# Topology

def domains_of_ranks(node_of_rank: list[int], domain_gpus: int | None, *, node_gpus: int | None = None) -> list[int]:
    """Scale-up domain of each rank. None (loopback): the node. Otherwise whole nodes are
    packed into domains in order of first appearance, domain_gpus // node size nodes each.
    The node size is the most ranks on one node, or node_gpus when given (a node running
    fewer ranks than it has GPUs still fills its share of the domain)."""
    nodes = list(node_of_rank)
    if domain_gpus is None:
        return nodes
    order: dict = {}
    counts: dict = {}
    for n in nodes:
        order.setdefault(n, len(order))
        counts[n] = counts.get(n, 0) + 1
    per_node = max(counts.values(), default=1)
    if node_gpus:
        per_node = max(per_node, node_gpus)
    nodes_per_domain = max(1, domain_gpus // per_node)
    return [order[n] // nodes_per_domain for n in nodes]


def is_inswitch(row) -> bool:
    """Does the row's variant reduce in the switch: flagged so (a missing flag may read
    as nan in a DataFrame row), or named so (nvls, sharp, ...)?"""
    flag = row.get("inswitch")
    if flag is not None and not (isinstance(flag, float) and math.isnan(flag)) and bool(flag):
        return True
    variant = str(row.get("variant") or "").lower()
    return any(m in variant for m in INSWITCH_MARKERS)


def benchmark_of(row):
    """The row's benchmark from the registry; the base Benchmark (ring-like defaults) for
    a name it does not know."""

    return registry().get(row.get("benchmark")) or Benchmark()


# ---------------------------------------------------------------------------------------
# Ceilings

def _blank(tier=None, note=None) -> dict:
    out = dict.fromkeys(CEILING_KEYS)
    out.update(tier=tier, ceiling_note=note)
    return out


def _nic_name(profile: Profile) -> str:
    link = profile.scaleout_link or "NIC"
    return link if "nic" in link.lower() else f"{link} NIC"


def _tier_name(up_nbytes: float, out_nbytes: float) -> str:
    if out_nbytes <= 0:
        return "scaleup"
    return "scaleout" if up_nbytes <= 0 else "scaleup+scaleout"


def ceiling_for_row(profile: Profile, row: dict, node_of_rank: list[int]) -> dict:
    """The link ceiling a measured row is compared with; see CEILING_KEYS. Never raises
    for a row the profile cannot judge: values are None and ceiling_note says why."""
    world = int(row.get("world") or 0)
    nodes = list(node_of_rank)[:world]
    if world < 1 or len(nodes) < world:
        return _blank(note=f"node_of_rank covers {len(nodes)} ranks, the row has {world}")
    domains = domains_of_ranks(nodes, profile.scaleup_domain_gpus, node_gpus=profile.scaleup_node_gpus)
    n_domains = len(set(domains))
    multi = n_domains > 1
    bench = benchmark_of(row)
    nbytes = float(row.get("nbytes") or 0)
    inswitch = is_inswitch(row) and bench.inswitch_applies

    if multi and profile.scaleout_line_gbps is None:
        what = "hosts" if profile.scaleup_domain_gpus is None else "scale-up domains"
        return _blank("scaleout", f"ranks span {n_domains} {what} and profile {profile.name} has no scale-out tier")
    if profile.scaleup_line_gbps is None:
        return _blank("scaleout" if multi else "scaleup",
                      f"profile {profile.name} is measured at run time and has no rates yet")

    if bench.latency_only(row):
        lat = [profile.scaleup_latency_us] + ([profile.scaleout_latency_us] if multi else [])
        lat = [x for x in lat if x is not None]
        out = _blank("scaleout" if multi else "scaleup", "latency only: no bytes to compare with a link rate")
        out["bottleneck"] = _nic_name(profile) if multi else profile.scaleup_link
        out["time_bound_us"] = max(lat) if lat else None
        return out
    if world == 1:
        return _blank("scaleup", "one rank: nothing crosses a link")

    # Loopback: a rank's send and receive buffers (~2x nbytes) decide in or beyond cache.
    up_line, up_ach = scaleup_rates_for(profile, int(2 * nbytes))
    out_line, out_ach = profile.scaleout_line_gbps, profile.scaleout_achieved_gbps
    up_b, out_b = bench.tier_nbytes(row, world, domains, inswitch)
    note = bench.tier_note(nodes, domains) if multi else None
    if bench.busbw_is_link_rate(up_b, out_b):
        compared_as = "wire_bw = algbw*(n+1)/n" if inswitch else "busbw"
        compared = _row_compared(row, world, inswitch)
    else:
        compared_as, compared = "per-tier bytes", None

    if up_b <= 0 and out_b <= 0:
        return _blank(_tier_name(up_b, out_b), "no bytes cross a link")

    # GB/s = 1e3 bytes/us.
    t_up = up_b / (up_line * 1e3) if up_b > 0 else 0.0
    t_out = out_b / (out_line * 1e3) if out_b > 0 and out_line else 0.0
    on_nic = t_out > t_up
    line, ach = (out_line, out_ach) if on_nic else (up_line, up_ach)
    bound_us = max(t_up, t_out)
    ach_bound_us = max(up_b / (up_ach * 1e3) if up_b > 0 else 0.0,
                       out_b / (out_ach * 1e3) if out_b > 0 and out_ach else 0.0)
    time_us = row.get("time_us_p50")
    res = _blank(_tier_name(up_b, out_b), note)
    res.update(bottleneck=_nic_name(profile) if on_nic else profile.scaleup_link, ceiling_gbps=line,
               ceiling_achieved_gbps=ach, compared_as=compared_as, time_bound_us=bound_us)
    if compared is None and time_us and time_us > 0:
        compared = (out_b if on_nic else up_b) / (time_us * 1e3)
    res["compared_gbps"] = compared
    if compared is not None and compared_as != "per-tier bytes":
        res["pct_of_ceiling"] = compared / line * 100
        res["pct_of_achieved"] = compared / ach * 100
    elif time_us and time_us > 0:
        res["pct_of_ceiling"] = bound_us / time_us * 100
        res["pct_of_achieved"] = ach_bound_us / time_us * 100
    if res["pct_of_ceiling"] is not None and res["pct_of_ceiling"] > 100:
        res["ceiling_note"] = ("above the line rate: an in-switch or tree algorithm the variant does not "
                               "name, or a profile below the hardware")
    return res


def _row_compared(row: dict, world: int, inswitch: bool) -> float | None:
    if inswitch:
        algbw = row.get("algbw_gbps")
        return None if algbw is None else float(algbw) * (world + 1) / world
    busbw = row.get("busbw_gbps")
    return None if busbw is None else float(busbw)


def add_ceiling(row: dict, profile, nodes: list[int]) -> None:
    """The row's tier, ceiling and % of it (ceiling_for_row), under the profile's name."""
    if profile is None:
        row.update({k: None for k in CEILING_KEYS}, profile=None)
        return
    row.update(ceiling_for_row(profile, row, nodes), profile=profile.name)


def resolve_profile_spec(name: str | None, overrides: dict):
    """Load and check a profile before any rank starts (exit 2 on a bad file or flag)."""
    if name is None:
        if overrides:
            raise UsageError("--nic-gbps/--scaleup-GBps/--domain-gpus need --profile")
        return None
    return apply_overrides(load_profile(name), overrides)
