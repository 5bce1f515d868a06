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
from commbench.benchmarks.base import domain_sizes
from commbench.core.errors import UsageError
from commbench.core.hoststate import STEAL_PCT, WAIT_PCT

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
    profile_from_fields,
    profiles_table_rows,
    scaleup_rates_for,
)

# A variant whose name holds one of these reduces in the switch (NVLink SHARP, IB SHARP).
INSWITCH_MARKERS = ("nvls", "sharp", "collnet", "inswitch", "multimem")

# Keys ceiling_for_row always returns, in display order.
CEILING_KEYS = ("tier", "bottleneck", "ceiling_gbps", "ceiling_achieved_gbps", "compared_as", "compared_gbps",
                "pct_of_ceiling", "pct_of_achieved", "time_bound_us", "bound_busbw_gbps", "bound_achieved_busbw_gbps",
                "bound_basis", "ceiling_doubt", "ceiling_note")

# What a world-1 row says in place of a ceiling and a bandwidth verdict.
WORLD_1_NOTE = "world 1: nothing crosses a link"
# What a table's ceiling column holds: the ceiling in the row's own unit.
CEILING_COLUMN_NOTE = ("ceiling = the busbw the link's line rate allows (across nodes: the NICs that carry the "
                       "inter-node share), % of ceiling = busbw / ceiling")


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
    if world == 1:  # busbw stays as the formula gives it (nccl-tests prints it at one GPU), judged by nothing
        return _blank("scaleup", WORLD_1_NOTE)
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
    factor = float(row.get("busbw_factor") or 0.0)
    if res["pct_of_ceiling"] is not None and factor > 0:
        res["bound_busbw_gbps"], res["bound_achieved_busbw_gbps"] = _bound_busbw(
            compared_as, nbytes, factor, world, (line, bound_us), (ach, ach_bound_us))
        res["bound_basis"] = _bound_basis(profile, compared_as, on_nic, line, nodes, domains,
                                          res["bound_busbw_gbps"], bench)
    if not on_nic:
        res["ceiling_doubt"] = _scaleup_doubt(profile, int(2 * nbytes)) or None
    return res


def _bound_busbw(compared_as: str, nbytes: float, factor: float, world: int, at_line: tuple,
                 at_achieved: tuple) -> tuple:
    """The busbw a row would show at its time bound, at the line and at the achieved rate:
    the ceiling in the row's own unit, so that % of ceiling = busbw / this. Compared as
    busbw, that is the rate itself; as wire rate (in-switch), the rate x busbw / wire =
    rate x F n/(n+1); per tier, S x F over the bound (the tier that bounds it carries only
    its share of the bytes: 8 NICs of 50 GB/s allow 400 GB/s of ring busbw across nodes)."""
    out = []
    for rate, bound_us in (at_line, at_achieved):
        if compared_as == "busbw":
            out.append(rate)
        elif compared_as.startswith("wire"):
            out.append(None if rate is None else rate * factor * world / (world + 1))
        else:
            out.append(nbytes * factor / (bound_us * 1e3) if bound_us and bound_us > 0 else None)
    return tuple(out)


def _bound_basis(profile: Profile, compared_as: str, on_nic: bool, line: float, nodes: list, domains: list,
                 bound_busbw: float | None, bench) -> str | None:
    """What sets the bound busbw, in words, when it is not the line rate itself: "8 NICs
    of 50 GB/s allow at 2 nodes x 8". None for a row compared as busbw on one tier."""
    if compared_as == "busbw" or bound_busbw is None:
        return None
    link = _nic_name(profile) if on_nic else profile.scaleup_link
    if compared_as.startswith("wire"):
        return f"the {line:.4g} GB/s line rate of {link} allows in the switch (wire rate = algbw (n+1)/n)"
    g_min, g_max = domain_sizes(domains)
    n_domains = len(set(domains))
    where = "nodes" if len(set(nodes)) == n_domains else "scale-up domains"
    shape = f"{n_domains} {where} x {g_max}" if g_min == g_max else f"{n_domains} {where} of {g_min} to {g_max} ranks"
    if on_nic and math.isclose(bound_busbw, g_min * line, rel_tol=1e-6):
        return f"{g_min} NICs of {line:.4g} GB/s allow at {shape}"
    return f"{link} at {line:.4g} GB/s allows at {shape}"


def _scaleup_doubt(profile: Profile, nbytes: int) -> str:
    """Why the scale-up rate a working set of `nbytes` is compared with cannot carry a
    verdict ('' when it can): a loopback probe that was disturbed or spread too far."""
    in_cache = (profile.scaleup_in_cache_gbps is not None and profile.cache_nbytes is not None
                and nbytes <= profile.cache_nbytes)
    return (profile.scaleup_in_cache_doubt if in_cache else profile.scaleup_doubt) or ""


# A memcpy probe whose samples spread more than this ((max - min) / median) is no ceiling for
# a verdict. On the 2-core test host a quiet probe spread 0.4-10 % (4 probes of each size; the
# one at 10 % had waited 4 % of its time); beside one busy loop a core, 12-174 %, waiting 77 %
# of its time, its median 3-5x low (3 of each). tools/probe_spread.py measures it.
PROBE_SPREAD_PCT = 20.0


def probe_doubt(probe: dict, where: str) -> str:
    """Why the loopback probe of `where` (in_cache | beyond_cache) is no ceiling for a
    verdict, '' when it is: it waited for a CPU (another process held its core: the rate is
    the scheduler's) or its samples spread beyond PROBE_SPREAD_PCT."""
    what = "in-cache" if where == "in_cache" else "beyond-cache"
    why = []
    wait, steal = probe.get(f"memcpy_{where}_wait_pct"), probe.get(f"memcpy_{where}_steal_pct")
    if _num_ok(wait) and wait > WAIT_PCT:
        why.append(f"the {what} memcpy probe waited for a CPU {wait:.0f} % of its time (> {WAIT_PCT:g} %)")
    if _num_ok(steal) and steal > STEAL_PCT:
        why.append(f"CPU steal {steal:.0f} % over the {what} memcpy probe (> {STEAL_PCT:g} %)")
    spread = probe.get(f"memcpy_{where}_spread_pct")
    if _num_ok(spread) and spread > PROBE_SPREAD_PCT:
        why.append(f"the {what} memcpy probe spread {spread:.0f} % (> {PROBE_SPREAD_PCT:g} %)")
    return "; ".join(why)


def share_of_ceiling(row: dict) -> str:
    """A row's % of its ceiling, naming the ceiling in the row's own unit (busbw): "84.7%
    of the 400 GB/s busbw that 8 NICs of 50 GB/s allow at 2 nodes x 8", or "88.0% of the
    12.75 GB/s line rate" where the bound is the line rate itself; '' without a %."""
    pct, line = row.get("pct_of_ceiling"), row.get("ceiling_gbps")
    if not _num_ok(pct) or not _num_ok(line):
        return ""
    bound, basis = row.get("bound_busbw_gbps"), row.get("bound_basis")
    if _num_ok(bound) and isinstance(basis, str) and basis:
        return f"{float(pct):.1f}% of the {float(bound):.4g} GB/s busbw that {basis}"
    return f"{float(pct):.1f}% of the {float(line):.4g} GB/s line rate"


def ceiling_busbw(row: dict, achieved: bool = False):
    """The ceiling in busbw (a table's ceiling column, the busbw figure's line): the bound's
    busbw, else (rows judged before it was recorded) the line rate; achieved: at the
    typical achieved rate."""
    bound = row.get("bound_achieved_busbw_gbps" if achieved else "bound_busbw_gbps")
    return bound if _num_ok(bound) else row.get("ceiling_achieved_gbps" if achieved else "ceiling_gbps")


def _num_ok(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
        if int(row.get("world") or 0) == 1:
            row["ceiling_note"] = WORLD_1_NOTE
        return
    row.update(ceiling_for_row(profile, row, nodes), profile=profile.name)


def resolve_profile_spec(name: str | None, overrides: dict):
    """Load and check a profile before any rank starts (exit 2 on a bad file or flag)."""
    if name is None:
        if overrides:
            raise UsageError("--nic-gbps/--scaleup-GBps/--domain-gpus need --profile")
        return None
    return apply_overrides(load_profile(name), overrides)
