"""Hardware profiles: link line rates and typical achieved rates, with explicit units,
read from the built-in profiles (commbench/data/*.toml) or a user's .toml file, filled
from a probe (loopback) or overridden from the command line.

Every rate inside this module is GB/s per direction (1 GB = 1e9 bytes), the unit busbw
is compared in. Profile files must spell units and direction out, because Gb/s vs GB/s
and per-direction vs bidirectional are the two mistakes everybody makes.
"""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.user_files import read_user_text

# GB/s per unit. Lower-case b is bits, upper-case B bytes; "Gbps" is how NICs are sold.
_UNIT_GBPS = {
    "Mb/s": 1e-3 / 8, "Gb/s": 1 / 8, "Tb/s": 1e3 / 8,
    "Mbps": 1e-3 / 8, "Gbps": 1 / 8, "Tbps": 1e3 / 8,
    "MB/s": 1e-3, "GB/s": 1.0, "TB/s": 1e3,
}
# Divisor that turns a figure into "per direction" (links) or keeps a total (memory).
_DIRECTION_DIVISOR = {"per direction": 1.0, "bidirectional": 2.0, "total": 1.0}
LINK_DIRECTIONS = ("per direction", "bidirectional")
_RATE_RE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]+)\s*(.*?)\s*$")


@dataclass(frozen=True)
class Profile:
    """One hardware profile; every rate is GB/s per direction, HBM is total GB/s."""

    name: str
    description: str = ""
    scaleup_link: str = ""
    scaleup_line_gbps: float | None = None
    scaleup_achieved_gbps: float | None = None
    scaleup_inswitch_achieved_gbps: float | None = None  # NVLS busbw at large sizes on inswitch_gpus GPUs
    scaleup_domain_gpus: int | None = None  # None: the domain is one host (loopback)
    scaleup_latency_us: float | None = None
    scaleout_link: str | None = None
    scaleout_line_gbps: float | None = None
    scaleout_achieved_gbps: float | None = None
    scaleout_latency_us: float | None = None
    hbm_gbps: float | None = None
    measured: bool = False
    scaleup_in_cache_gbps: float | None = None  # loopback: memcpy rate while the working set fits the LLC
    cache_nbytes: int | None = None
    scaleup_node_gpus: int | None = None  # GPUs per node (HGX 8, NVL72 tray 4); None: unknown
    # loopback: why the probe of each rate is no ceiling for a verdict ('' when it is): ceilings.probe_doubt
    scaleup_in_cache_doubt: str = ""
    scaleup_doubt: str = ""
    notes: str = ""
    source_path: str = ""
    # [model] terms of the what-if model (model.Terms; docs/model.md names each one's source)
    inswitch_gpus: int | None = None  # GPUs scaleup.inswitch_achieved_rate was measured on
    inswitch_ramp_nbytes_per_gpu: float | None = None
    nic_rails: int | None = None
    moe_nic_efficiency: float | None = None
    moe_nvl_efficiency: float | None = None
    moe_nvl_falloff: float | None = None
    moe_ll_fixed_us: float | None = None
    gpu_arch: str | None = None  # ampere, hopper, blackwell: the fabric runs NCCL (latency.py)
    host_cpu: str | None = None  # x86 or arm: NCCL's NVLSTree size correction is x86-only (latency.py)
    net_latency_us: float | None = None  # the fabric's latency a network step adds to NCCL's tables
    net_protocols: str | None = None  # comma list of the protocols NCCL runs across domains (None: all)
    net_ramp_nbytes_per_gpu: float | None = None  # bytes a GPU's NIC sends at half rate before its full rate
    net_simple_latency_us: float | None = None  # Simple's extra a network step (None: net_latency_us again)
    net_fixed_us: float | None = None  # once a collective that crosses domains, beyond NCCL's tables
    model_sources: str = ""

    def scaleup_rates_for(self, nbytes: int) -> tuple[float | None, float | None]:
        return scaleup_rates_for(self, nbytes)


# ---------------------------------------------------------------------------------------
# Rates

def parse_rate_gbps(text, *, field: str, where: str, allow=LINK_DIRECTIONS) -> float:
    """'450 GB/s per direction', '1.8 TB/s bidirectional', '800 Gb/s per direction',
    '3.35 TB/s total' -> GB/s (per direction for links: a bidirectional figure is halved)."""
    example = f"e.g. '450 GB/s {allow[0]}'"
    if not isinstance(text, str):
        raise UsageError(f"{where}: {field} must be a string with a unit and direction ({example}), got {text!r}")
    m = _RATE_RE.match(text)
    if not m:
        raise UsageError(f"{where}: {field} = {text!r} is not a rate ({example})")
    number, unit, direction = m.groups()
    value = float(number)
    if unit not in _UNIT_GBPS:
        raise UsageError(f"{where}: {field} = {text!r}: unknown unit {unit!r} "
                         f"(known: {', '.join(_UNIT_GBPS)}; b = bits, B = bytes)")
    direction = " ".join(direction.lower().split())
    if not direction:
        raise UsageError(f"{where}: {field} = {text!r} has no direction: add {' or '.join(map(repr, allow))}")
    if direction not in allow:
        raise UsageError(f"{where}: {field} = {text!r}: direction {direction!r} is not one of "
                         f"{', '.join(map(repr, allow))}")
    if not value > 0:
        raise UsageError(f"{where}: {field} = {text!r} must be positive")
    return value * _UNIT_GBPS[unit] / _DIRECTION_DIVISOR[direction]


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def format_rate(gbps: float | None) -> str:
    """450 -> '450 GB/s per direction (3600 Gb/s)'."""
    if gbps is None:
        return "-"
    return f"{_num(gbps)} GB/s per direction ({_num(gbps * 8)} Gb/s)"


# ---------------------------------------------------------------------------------------
# Profile files

_TOP_KEYS = ("name", "description", "measured", "scaleup", "scaleout", "hbm", "sources", "model")
# [model]: key -> (kind, Profile field); an efficiency must also be <= 1
_MODEL_KEYS = {"inswitch_gpus": ("int", "inswitch_gpus"),
               "inswitch_ramp_MiB_per_gpu": ("number", "inswitch_ramp_nbytes_per_gpu"),
               "nic_rails": ("int", "nic_rails"),
               "moe_nic_efficiency": ("number", "moe_nic_efficiency"),
               "moe_nvl_efficiency": ("number", "moe_nvl_efficiency"),
               "moe_nvl_falloff_per_doubling": ("number", "moe_nvl_falloff"),
               "moe_low_latency_fixed_us": ("number", "moe_ll_fixed_us"),
               "gpu_arch": ("str", "gpu_arch"),
               "host_cpu": ("str", "host_cpu"),
               "net_latency_us": ("number0", "net_latency_us"),
               "net_protocols": ("str", "net_protocols"),
               "net_ramp_MiB_per_gpu": ("number0", "net_ramp_nbytes_per_gpu"),
               "net_simple_latency_us": ("number0", "net_simple_latency_us"),
               "net_fixed_us": ("number0", "net_fixed_us"),
               "sources": ("str", "model_sources")}
GPU_ARCHS = ("ampere", "hopper", "blackwell")  # NCCL's tuner tables by GPU generation (latency.py)
HOST_CPUS = ("x86", "arm")  # the host CPU NCCL's tuner tells apart (tuning.cc:643-646)
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
# Profile files are every data/*.toml but these (the published figures `model --against` reads).
_NOT_PROFILES = ("published",)
_SCALEUP_KEYS = ("link", "line_rate", "achieved_rate", "inswitch_achieved_rate", "domain_gpus", "node_gpus",
                 "latency_us")
_SCALEOUT_KEYS = ("link", "line_rate", "achieved_rate", "latency_us")
_HBM_KEYS = ("bandwidth",)
_SOURCES_KEYS = ("notes",)


def _data_dir():
    return resources.files("commbench") / "data"


def list_profiles() -> list[str]:
    """Names of the built-in profiles."""
    d = _data_dir()
    return sorted(p.name[:-len(".toml")] for p in d.iterdir()
                  if p.name.endswith(".toml") and p.name[:-len(".toml")] not in _NOT_PROFILES)


def _check_keys(table: dict, known: tuple, prefix: str, where: str) -> None:
    for k in table:
        if k not in known:
            raise UsageError(f"{where}: unknown key {prefix}{k} (known: {', '.join(prefix + x for x in known)})")


def _table(doc: dict, key: str, where: str, required: bool) -> dict | None:
    if key not in doc:
        if required:
            raise UsageError(f"{where}: missing required table [{key}]")
        return None
    if not isinstance(doc[key], dict):
        raise UsageError(f"{where}: {key} must be a table [{key}], got {doc[key]!r}")
    return doc[key]


def _get(table: dict, key: str, prefix: str, where: str, kind: str, required: bool):
    """One typed field: kind is 'str', 'bool', 'int' (> 0), 'number' (> 0) or 'rate'."""
    field = prefix + key
    if key not in table:
        if required:
            raise UsageError(f"{where}: missing required field {field}")
        return None
    v = table[key]
    if kind == "str":
        if not isinstance(v, str):
            raise UsageError(f"{where}: {field} must be a string, got {v!r}")
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise UsageError(f"{where}: {field} must be true or false, got {v!r}")
        return v
    if kind in ("int", "number", "number0"):
        ok = isinstance(v, int) if kind == "int" else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok:
            raise UsageError(f"{where}: {field} must be {'an integer' if kind == 'int' else 'a number'}, got {v!r}")
        if kind == "number0" and not (v >= 0 and math.isfinite(v)):  # a latency that may be 0
            raise UsageError(f"{where}: {field} must be a finite number >= 0, got {v!r}")
        if kind != "number0" and not v > 0:
            raise UsageError(f"{where}: {field} must be positive, got {v!r}")
        return v if kind == "int" else float(v)
    return parse_rate_gbps(v, field=field, where=where)


def _profile_from_doc(doc: dict, where: str) -> Profile:
    _check_keys(doc, _TOP_KEYS, "", where)
    name = _get(doc, "name", "", where, "str", True)
    description = _get(doc, "description", "", where, "str", False) or ""
    measured = bool(_get(doc, "measured", "", where, "bool", False))
    # A measured profile has its rates filled at run time, so they are optional in the file.
    need = not measured

    up = _table(doc, "scaleup", where, True)
    _check_keys(up, _SCALEUP_KEYS, "scaleup.", where)
    if up.get("domain_gpus") == "host":
        domain = None
    else:
        domain = _get(up, "domain_gpus", "scaleup.", where, "int", True)
    line = _get(up, "line_rate", "scaleup.", where, "rate", need)
    achieved = _get(up, "achieved_rate", "scaleup.", where, "rate", need)
    _check_achieved(line, achieved, "scaleup", where)

    out = _table(doc, "scaleout", where, False)
    out_fields = {}
    if out is not None:
        _check_keys(out, _SCALEOUT_KEYS, "scaleout.", where)
        out_fields = dict(
            scaleout_link=_get(out, "link", "scaleout.", where, "str", True),
            scaleout_line_gbps=_get(out, "line_rate", "scaleout.", where, "rate", True),
            scaleout_achieved_gbps=_get(out, "achieved_rate", "scaleout.", where, "rate", True),
            scaleout_latency_us=_get(out, "latency_us", "scaleout.", where, "number", True),
        )
        _check_achieved(out_fields["scaleout_line_gbps"], out_fields["scaleout_achieved_gbps"], "scaleout", where)

    hbm = _table(doc, "hbm", where, need)
    hbm_gbps = None
    if hbm is not None:
        _check_keys(hbm, _HBM_KEYS, "hbm.", where)
        bw = _get(hbm, "bandwidth", "hbm.", where, "str", need)
        hbm_gbps = None if bw is None else parse_rate_gbps(bw, field="hbm.bandwidth", where=where, allow=("total",))

    src = _table(doc, "sources", where, False) or {}
    _check_keys(src, _SOURCES_KEYS, "sources.", where)
    notes = _get(src, "notes", "sources.", where, "str", False) or ""

    model = _table(doc, "model", where, False) or {}
    _check_keys(model, tuple(_MODEL_KEYS), "model.", where)
    terms = {}
    for key, (kind, field) in _MODEL_KEYS.items():
        v = _get(model, key, "model.", where, kind, False)
        if v is not None and key.startswith("moe_n") and v > 1:
            raise UsageError(f"{where}: model.{key} = {v} must be at most 1 (a fraction of the achieved rate)")
        if v is not None and key == "gpu_arch" and v not in GPU_ARCHS:
            raise UsageError(f"{where}: model.gpu_arch = {v!r}; choose one of {', '.join(GPU_ARCHS)}")
        if v is not None and key == "host_cpu" and v not in HOST_CPUS:
            raise UsageError(f"{where}: model.host_cpu = {v!r}; choose one of {', '.join(HOST_CPUS)}")
        if v is not None and key == "net_protocols":
            names = [x.strip() for x in v.split(",")]
            if not names or any(x not in NCCL_PROTOCOLS for x in names) or "Simple" not in names:
                raise UsageError(f"{where}: model.net_protocols = {v!r}: a comma list of {', '.join(NCCL_PROTOCOLS)} "
                                 "with Simple in it")
            v = ",".join(names)
        if v is not None and key in ("inswitch_ramp_MiB_per_gpu", "net_ramp_MiB_per_gpu"):
            v = v * (1 << 20)
        terms[field] = v if v is not None or kind != "str" or key in ("gpu_arch", "host_cpu", "net_protocols") else ""

    return profile_from_fields(dict(
        **terms,
        name=name, description=description, measured=measured,
        scaleup_link=_get(up, "link", "scaleup.", where, "str", True),
        scaleup_line_gbps=line, scaleup_achieved_gbps=achieved,
        scaleup_inswitch_achieved_gbps=_get(up, "inswitch_achieved_rate", "scaleup.", where, "rate", False),
        scaleup_domain_gpus=domain,
        scaleup_node_gpus=_get(up, "node_gpus", "scaleup.", where, "int", False),
        scaleup_latency_us=_get(up, "latency_us", "scaleup.", where, "number", need),
        hbm_gbps=hbm_gbps, notes=notes, source_path=where, **out_fields,
    ), where)


# A field's annotation -> what a saved value of it may be (bool is no number here).
_FIELD_KINDS = {"str": (str,), "bool": (bool,), "float | None": (int, float, type(None)),
                "int | None": (int, type(None)), "str | None": (str, type(None))}


def profile_from_fields(fields: dict, where: str = "profile") -> Profile:
    """A Profile from its fields as saved (dataclasses.asdict: meta.json's `ceilings`, a run's
    spec): the one way back from a dict. A name it lacks, a field it does not know or a value
    of the wrong kind is refused in one line; a field it lacks takes its default (a run saved
    before that field existed)."""
    if not isinstance(fields, dict):
        raise UsageError(f"{where}: a profile's fields must be a table, got {type(fields).__name__}")
    known = Profile.__dataclass_fields__
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise UsageError(f"{where}: unknown profile field {unknown[0]!r}")
    if not fields.get("name") or not isinstance(fields["name"], str):
        raise UsageError(f"{where}: a profile's fields lack its name")
    for k, v in fields.items():
        kinds = _FIELD_KINDS[str(known[k].type)]
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            raise UsageError(f"{where}: profile field {k} = {v!r} is not a {str(known[k].type)}")
    return Profile(**fields)


def _check_achieved(line, achieved, tier: str, where: str) -> None:
    # The usual cause is a bidirectional figure written as per direction.
    if line is not None and achieved is not None and achieved > line * (1 + 1e-9):
        raise UsageError(f"{where}: {tier}.achieved_rate ({_num(achieved)} GB/s per direction) exceeds "
                         f"{tier}.line_rate ({_num(line)} GB/s per direction): is one of them bidirectional?")


def parse_profile_text(text: str, where: str) -> Profile:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where}: not valid TOML: {e}") from None
    return _profile_from_doc(doc, where)


def load_profile(name_or_path) -> Profile:
    """A built-in profile by name, or a .toml profile file by path. The loopback built-in
    comes back with rates None (measured=True) until loopback_profile fills them."""
    p = Path(name_or_path)
    if isinstance(name_or_path, Path) or p.suffix == ".toml" or p.is_file():
        if not p.exists() and not p.is_symlink():
            raise UsageError(f"profile file {p} not found")
        try:
            text = read_user_text(p, "profile file")  # a regular file within a bound (not a FIFO, /dev/zero)
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"profile file {p}: cannot read: {e}") from None
        return parse_profile_text(text, str(p))
    name = str(name_or_path)
    known = list_profiles()
    if name not in known:
        raise UsageError(f"unknown profile {name!r} (known: {', '.join(known)}; or give a path to a .toml file)")
    res = _data_dir() / f"{name}.toml"
    return parse_profile_text(res.read_text(encoding="utf-8"), str(res))


def loopback_profile(memcpy_in_cache_gbps: float, memcpy_beyond_cache_gbps: float, cache_nbytes: int,
                     latency_us: float) -> Profile:
    """The loopback profile with rates from a probe: single-thread memcpy in bytes copied
    per second (not a STREAM read + write figure), inside and beyond the last-level cache,
    and the MPI library's 0-byte latency. Line and achieved rate are both the measurement."""
    if not (memcpy_in_cache_gbps > 0 and memcpy_beyond_cache_gbps > 0):
        raise ValueError("memcpy rates must be positive")
    if cache_nbytes < 0 or latency_us < 0:
        raise ValueError("cache size and latency must not be negative")
    base = load_profile("loopback")
    measured = (f"Measured here: memcpy {_num(memcpy_in_cache_gbps)} GB/s in cache, "
                f"{_num(memcpy_beyond_cache_gbps)} GB/s beyond a {cache_nbytes} B cache; "
                f"latency floor {latency_us:.3g} us.")
    return replace(base, scaleup_line_gbps=float(memcpy_beyond_cache_gbps),
                   scaleup_achieved_gbps=float(memcpy_beyond_cache_gbps),
                   scaleup_in_cache_gbps=float(memcpy_in_cache_gbps), cache_nbytes=int(cache_nbytes),
                   scaleup_latency_us=float(latency_us), notes=f"{base.notes} {measured}".strip())


def scaleup_rates_for(profile: Profile, nbytes: int) -> tuple[float | None, float | None]:
    """(line, achieved) scale-up GB/s for a per-rank working set of `nbytes`: a loopback
    profile copies at the in-cache rate while the working set fits the last-level cache."""
    if (profile.scaleup_in_cache_gbps is not None and profile.cache_nbytes is not None
            and nbytes <= profile.cache_nbytes):
        return profile.scaleup_in_cache_gbps, profile.scaleup_in_cache_gbps
    return profile.scaleup_line_gbps, profile.scaleup_achieved_gbps


# ---------------------------------------------------------------------------------------
# Overrides (CLI)

_OVERRIDE_KEYS = {
    "nic_gbps": "scale-out NIC, Gb/s per direction (as NICs are sold: 800 -> 100 GB/s)",
    "scaleup_GBps": "scale-up link, GB/s per direction",
    "domain_gpus": "GPUs in one scale-up domain",
    "hbm_GBps": "HBM, GB/s total",
}


def _positive(key: str, value, integer: bool = False):
    try:
        if isinstance(value, bool):
            raise ValueError
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"override {key}={value!r} is not a number") from None
    if not (v > 0 and math.isfinite(v)):  # inf would make every time 0 and every share 0 %
        raise UsageError(f"override {key}={value!r} must be a positive finite number")
    if integer:
        if v != int(v):
            raise UsageError(f"override {key}={value!r} must be a whole number")
        return int(v)
    return v


def apply_overrides(profile: Profile, overrides: dict, nic_keeps_ratio: bool = False) -> Profile:
    """CLI overrides; a None value means "not given". An overridden scale-up rate becomes both
    the line and the achieved rate, since the user gave one number; an overridden NIC rate is
    a line rate: with nic_keeps_ratio (the what-if model) achieved at the profile's own
    achieved/line ratio, else (and where the profile has no NIC) line = achieved. The notes
    say which."""
    changes, said = {}, []
    for key, value in overrides.items():
        if key not in _OVERRIDE_KEYS:
            raise UsageError(f"unknown profile override {key!r} (known: {', '.join(_OVERRIDE_KEYS)})")
        if value is None:
            continue
        if key == "nic_gbps":
            gbps = _positive(key, value) / 8
            if nic_keeps_ratio and profile.scaleout_line_gbps and profile.scaleout_achieved_gbps:
                # the profile's NIC reaches a share of its line rate (NDR 400G: 48 of 50 GB/s); a
                # faster NIC of the same stack is taken to reach the same share, not its line rate
                ratio = profile.scaleout_achieved_gbps / profile.scaleout_line_gbps
                changes.update(scaleout_line_gbps=gbps, scaleout_achieved_gbps=gbps * ratio)
                said.append(f"scale-out overridden: line {format_rate(gbps)}, achieved {format_rate(gbps * ratio)} "
                            f"(the profile's achieved/line ratio, {ratio:.3g})")
            else:
                changes.update(scaleout_line_gbps=gbps, scaleout_achieved_gbps=gbps)
                said.append(f"scale-out overridden: line = achieved = {format_rate(gbps)}")
            if profile.scaleout_link is None:
                changes["scaleout_link"] = f"{_num(gbps * 8)}G NIC"
        elif key == "scaleup_GBps":
            gbps = _positive(key, value)
            # A fixed rate replaces the size-dependent loopback rates too.
            changes.update(scaleup_line_gbps=gbps, scaleup_achieved_gbps=gbps, scaleup_in_cache_gbps=None,
                           cache_nbytes=None, scaleup_in_cache_doubt="", scaleup_doubt="")
            said.append(f"scale-up overridden: line = achieved = {format_rate(gbps)}")
        elif key == "domain_gpus":
            changes["scaleup_domain_gpus"] = _positive(key, value, integer=True)
            said.append(f"scale-up domain overridden: {changes['scaleup_domain_gpus']} GPUs")
        else:
            changes["hbm_gbps"] = _positive(key, value)
            said.append(f"HBM overridden: {_num(changes['hbm_gbps'])} GB/s total")
    if not changes:
        return profile
    return replace(profile, **changes, notes=" ".join([profile.notes, *[s + "." for s in said]]).strip())


# ---------------------------------------------------------------------------------------
# Tables

def profiles_table_rows(profiles) -> list[dict]:
    """String cells for `commbench ceilings`; profiles may be Profile objects or names."""
    rows = []
    for p in profiles:
        if not isinstance(p, Profile):
            p = load_profile(p)
        measured = "measured" if p.measured else "-"

        def rate(x, scale=1.0):
            return _num(x * scale) if x is not None else measured

        def nic(x, scale=1.0):
            return _num(x * scale) if x is not None else "-"

        rows.append({
            "profile": p.name,
            "scale-up link": p.scaleup_link,
            "line GB/s/dir": rate(p.scaleup_line_gbps),
            "achieved GB/s/dir": rate(p.scaleup_achieved_gbps),
            "bidir GB/s": rate(p.scaleup_line_gbps, 2),
            "domain": "one host" if p.scaleup_domain_gpus is None else f"{p.scaleup_domain_gpus} GPUs",
            "NIC": p.scaleout_link or "-",
            "NIC Gb/s/dir": nic(p.scaleout_line_gbps, 8),
            "NIC GB/s/dir": nic(p.scaleout_line_gbps),
            "NIC achieved GB/s/dir": nic(p.scaleout_achieved_gbps),
            "HBM TB/s": nic(p.hbm_gbps, 1e-3),
        })
    return rows


def default_profile_name(device: str, gpu_names: list[str]) -> str | None:
    """loopback for CPU ranks; on GPUs the built-in profile whose GPU the device names."""
    if device == "cpu":
        return "loopback"
    name = (gpu_names or [""])[0].upper()
    for key, prof in (("GB300", "gb300-nvl72"), ("GB200", "gb200-nvl72"), ("B200", "b200-hgx"), ("B300", "b300-hgx"),
                      ("H200", "h200-hgx"), ("H800", "h800-hgx"), ("H100", "h100-hgx"), ("A100", "a100-hgx")):
        if key in name:
            return prof
    return None
