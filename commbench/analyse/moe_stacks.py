"""Named MoE kernel stacks for the what-if model (docs/model.md#kernel-stacks).

A stack is one implementation of MoE dispatch and combine (DeepEP V1's normal kernels,
DeepEP V2, Hybrid-EP, GPU-initiated low-latency kernels, CPU-proxy RDMA) with its own terms:
the fraction of the profile's achieved NVLink rate its kernels reach (and how that falls per
doubling of the domain above 8 ranks), ceilings on the NVLink rate its kernels reach (where
their SMs bound them, not the link), the fraction of the NIC rate it reaches and fixed costs
a call. Each term carries
the rows of commbench/data/published.toml it was fitted on and their source; the stacks
live in commbench/data/stacks/moe.toml.

Without a stack the model takes the profile's [model] moe_* terms, as it always did.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from commbench.core.errors import UsageError

from .fabric import Fabric, Terms

TERM_KEYS = ("nvl_efficiency", "nvl_falloff_per_doubling", "nvl_cap_gbps", "forward_cap_gbps", "nic_efficiency",
             "fixed_us", "nic_fixed_us")
_TERM_FIELDS = ("value", "fitted_on", "source", "why")
_STACK_KEYS = ("name", "aliases", "title", "kind", "note", *TERM_KEYS)
# what each term does, as the assumptions print it
TERM_TEXT = {"nvl_efficiency": "NVLink efficiency (fraction of the achieved scale-up rate) up to 8 ranks a domain",
             "nvl_falloff_per_doubling": "NVLink efficiency factor per doubling of the domain above 8 ranks",
             "nvl_cap_gbps": "ceiling on the NVLink rate (GB/s) of its kernels",
             "forward_cap_gbps": "ceiling on the NVLink rate (GB/s) of its forwarding where a call crosses domains",
             "nic_efficiency": "NIC efficiency (fraction of the achieved NIC rate)",
             "fixed_us": "fixed cost of a call (us), every dispatch and combine",
             "nic_fixed_us": "fixed cost (us) of a call that crosses domains, on top of fixed_us"}


@dataclass(frozen=True)
class Term:
    value: float
    fitted_on: tuple[str, ...]  # ids of published.toml rows; () for a term carried or set by its definition
    source: str
    why: str


@dataclass(frozen=True)
class Stack:
    name: str
    aliases: tuple[str, ...]
    title: str
    kind: str
    note: str
    terms: dict  # TERM_KEYS -> Term (nvl_cap_gbps may be absent: no ceiling)

    def value(self, key: str) -> float | None:
        t = self.terms.get(key)
        return None if t is None else t.value


@dataclass(frozen=True)
class StackTerms(Terms):
    """A fabric's Terms with a stack's MoE terms in place of the profile's (with_stack)."""
    moe_nvl_cap_gbps: float | None = None
    moe_forward_cap_gbps: float | None = None
    moe_fixed_us: float = 0.0
    moe_nic_fixed_us: float = 0.0
    moe_stack: str = ""


def stacks_file():
    return resources.files("commbench") / "data" / "stacks" / "moe.toml"


def parse_stacks(text: str, where: str) -> dict[str, Stack]:
    """The stacks of a stacks file by name; a bad entry is a UsageError naming it."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where}: not a TOML file: {e}") from None
    out: dict[str, Stack] = {}
    names: set[str] = set()
    for i, s in enumerate(doc.get("stack") or [], 1):
        at = f"{where}: stack {i} ({s.get('name', 'no name')})"
        unknown = sorted(set(s) - set(_STACK_KEYS))
        if unknown:
            raise UsageError(f"{at}: unknown key {unknown[0]}")
        for k in ("name", "title", "kind", "nvl_efficiency", "nvl_falloff_per_doubling", "nic_efficiency", "fixed_us"):
            if k not in s:
                raise UsageError(f"{at}: missing {k}")
        terms = {}
        for k in TERM_KEYS:
            if k not in s:
                continue
            t = s[k]
            if not isinstance(t, dict) or set(t) - set(_TERM_FIELDS) or not {"value", "source", "why"} <= set(t):
                raise UsageError(f"{at}: {k} must be a table of value, fitted_on, source and why")
            v = t["value"]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UsageError(f"{at}: {k}.value must be a non-negative number, got {v!r}")
            if k in ("nvl_efficiency", "nvl_falloff_per_doubling", "nic_efficiency") and not 0 < v <= 1:
                raise UsageError(f"{at}: {k}.value = {v} must be in (0, 1]")
            if k.endswith("cap_gbps") and v <= 0:
                raise UsageError(f"{at}: {k}.value must be positive, got {v}")
            terms[k] = Term(float(v), tuple(t.get("fitted_on", ())), str(t["source"]), str(t["why"]))
        stack = Stack(str(s["name"]), tuple(s.get("aliases", ())), str(s["title"]), str(s["kind"]),
                      str(s.get("note", "")), terms)
        for n in (stack.name, *stack.aliases):
            if n in names:
                raise UsageError(f"{at}: the name {n!r} is used twice")
            names.add(n)
        out[stack.name] = stack
    if not out:
        raise UsageError(f"{where}: no [[stack]] entries")
    return out


@lru_cache(maxsize=1)
def load_stacks() -> dict[str, Stack]:
    f = stacks_file()
    return parse_stacks(f.read_text(encoding="utf-8"), str(f))


def known_names() -> list[str]:
    """Every name --stack takes: each stack's own, then its aliases."""
    return [n for s in load_stacks().values() for n in (s.name, *s.aliases)]


def get_stack(name: str) -> Stack:
    """The stack a name or alias means; an unknown name is a UsageError naming the known ones."""
    for s in load_stacks().values():
        if name == s.name or name in s.aliases:
            return s
    listed = "; ".join(f"{s.name}" + (f" ({', '.join(s.aliases)})" if s.aliases else "") for s in load_stacks().values())
    raise UsageError(f"unknown MoE kernel stack {name!r}; known: {listed}")


def with_stack(fabric: Fabric, name: str | None) -> Fabric:
    """fabric with the stack's MoE terms in place of the profile's (None: fabric unchanged)."""
    if name is None:
        return fabric
    s = get_stack(name)
    base = {f.name: getattr(fabric.terms, f.name) for f in dataclasses.fields(Terms)}
    base.update(moe_nvl_efficiency=s.value("nvl_efficiency"), moe_nvl_falloff=s.value("nvl_falloff_per_doubling"),
                moe_nic_efficiency=s.value("nic_efficiency"), moe_ll_fixed_us=0.0)
    return dataclasses.replace(fabric, terms=StackTerms(
        **base, moe_nvl_cap_gbps=s.value("nvl_cap_gbps"), moe_forward_cap_gbps=s.value("forward_cap_gbps"),
        moe_fixed_us=s.value("fixed_us"), moe_nic_fixed_us=s.value("nic_fixed_us") or 0.0, moe_stack=s.name))


def nvl_rate_gbps(scaleup_gbps: float, G: int, N: int, terms: Terms) -> float:
    """The NVLink rate a MoE kernel reaches with G ranks a domain and N domains:
    e_nvl(G) x B, e_nvl(G) = moe_nvl_efficiency x falloff ^ log2(G/8) above 8 ranks, B = B_up
    bounded by a stack's ceilings: moe_nvl_cap_gbps always, moe_forward_cap_gbps where the
    call crosses domains (N > 1)."""
    e = terms.moe_nvl_efficiency * terms.moe_nvl_falloff ** max(0.0, math.log2(G / 8))
    caps = [getattr(terms, "moe_nvl_cap_gbps", None)] + ([getattr(terms, "moe_forward_cap_gbps", None)] if N > 1 else [])
    return e * min([scaleup_gbps] + [c for c in caps if c is not None])


def fixed_us(terms: Terms, low_latency: bool, crosses: bool) -> float:
    """A call's fixed cost: a stack's, paid by every call (and its nic_fixed_us by a call that
    crosses domains); else the profile's low-latency F."""
    if isinstance(terms, StackTerms):
        return terms.moe_fixed_us + (terms.moe_nic_fixed_us if crosses else 0.0)
    return terms.moe_ll_fixed_us if low_latency else 0.0


def assumption_lines(name: str | None) -> list[str]:
    """The MoE kernel terms as the model's assumptions print them: the stack's, each with its
    value, the rows it was fitted on and its source; or one line saying the profile's apply."""
    if name is None:
        known = ", ".join(s.name for s in load_stacks().values())
        return ["MoE kernel terms: each profile's [model] moe_* terms (DeepEP V1 on H800, docs/model.md#terms-per-profile); "
                f"--stack picks a kernel stack's instead ({known})"]
    s = get_stack(name)
    lines = [f"MoE kernel stack {s.name} ({s.kind}): {s.title}; its terms replace the profiles' moe_* terms"]
    for k in TERM_KEYS:
        t = s.terms.get(k)
        if t is None:
            continue
        rows = ", ".join(t.fitted_on) if t.fitted_on else "no row of its own"
        lines.append(f"{s.name} {k} = {t.value:g}: {TERM_TEXT[k]}; {t.why} (fitted on {rows}; {t.source})")
    return lines
