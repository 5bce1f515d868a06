"""The what-if model held against published figures: `commbench model --against FILE`.

A table of published figures (commbench/data/published.toml by default; docs/model.md) is
run through the model row by row. Each published value turns into a time exactly as its
source defines it (nccl-tests busbw, DeepEP's NVLink and "logical" RDMA GB/s), the model
projects the same case, and the ratio projected / published time says how far off it is:
below 1 the model is too fast. Rows marked `fit` set a profile rate or term; the verdict
rests on the `held-out` rows only.
"""
from __future__ import annotations

import math
import statistics
import tomllib
from importlib import resources
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.user_files import read_user_text
from commbench.moe import accounting
from commbench.moe.shape import DEEPSEEK_V3

from . import model as M
from .profiles import load_profile

BOUND_RATIO = 1.5  # every held-out row within 1/1.5 .. 1.5 of its published time
MEDIAN_BAND = (0.85, 1.15)  # each group's held-out median ratio
NVL_PEERS = 8  # DeepEP's NVLink domain (NUM_MAX_NVL_PEERS): a node of its internode kernels
GROUPS = ("moe-normal", "moe-low-latency", "all_reduce-intra", "all_reduce-multi")
USES = ("fit", "held-out")
MEASURES = ("busbw_GBps", "time_us", "deepep_nvl_GBps", "deepep_rdma_GBps")
ALGORITHMS = {"all_reduce": ("nccl-default", "ring", "tree", "nvls"),
              "moe": ("deepep-normal", "deepep-low-latency")}
_KIND_MEASURES = {"all_reduce": ("busbw_GBps", "time_us"), "moe": ("time_us", "deepep_nvl_GBps", "deepep_rdma_GBps")}
_NVLS_ALGO = {"nvls": "inswitch"}
# DeepSeek-V3 / DeepEP test shape unless a row says otherwise
MOE_DEFAULTS = {"hidden": DEEPSEEK_V3.hidden, "experts": DEEPSEEK_V3.experts, "topk": DEEPSEEK_V3.topk,
                "groups": DEEPSEEK_V3.max_groups}
_REQUIRED = ("id", "group", "use", "source", "hardware", "profile", "kind", "algorithm", "world", "measure",
             "published")
_OPTIONAL = ("note", "nbytes", "tokens", "stage", *MOE_DEFAULTS)


def default_table() -> Path:
    return Path(str(resources.files("commbench") / "data" / "published.toml"))


def load_table(path) -> list[dict]:
    """The rows of a published-figures file, each checked; a bad row is a UsageError naming it."""
    p = Path(path)
    try:
        doc = tomllib.loads(read_user_text(p, "--against"))
    except OSError as e:
        raise UsageError(f"--against {p}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"--against {p}: not a TOML file: {e}") from None
    rows = doc.get("figure")
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"--against {p}: no [[figure]] rows")
    seen = set()
    for i, r in enumerate(rows, 1):
        where = f"--against {p}: figure {i} ({r.get('id', 'no id')})"
        for k in _REQUIRED:
            if k not in r:
                raise UsageError(f"{where}: missing {k}")
        for k in r:
            if k not in _REQUIRED + _OPTIONAL:
                raise UsageError(f"{where}: unknown key {k}")
        if r["id"] in seen:
            raise UsageError(f"{where}: id used twice")
        seen.add(r["id"])
        for k, allowed in (("group", GROUPS), ("use", USES), ("measure", MEASURES), ("kind", tuple(ALGORITHMS))):
            if r[k] not in allowed:
                raise UsageError(f"{where}: {k} = {r[k]!r}; choose one of {', '.join(allowed)}")
        if r["algorithm"] not in ALGORITHMS[r["kind"]]:
            raise UsageError(f"{where}: algorithm {r['algorithm']!r}; for {r['kind']} choose one of "
                             f"{', '.join(ALGORITHMS[r['kind']])}")
        for k in ("world", "nbytes", "tokens", *MOE_DEFAULTS):
            if k in r and (isinstance(r[k], bool) or not isinstance(r[k], int) or r[k] < 1):
                raise UsageError(f"{where}: {k} must be a positive integer, got {r[k]!r}")
        v = r["published"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise UsageError(f"{where}: published must be a positive number, got {v!r}")
        if r["world"] < 2:  # one rank sends nothing: no time to model, nor a bus bandwidth
            raise UsageError(f"{where}: world must be at least 2, got {r['world']}: at one rank nothing crosses a link")
        if r["measure"] == "deepep_rdma_GBps" and r["world"] < 2 * NVL_PEERS:
            raise UsageError(f"{where}: a deepep_rdma_GBps row is internode: world must be at least "
                             f"{2 * NVL_PEERS} (two nodes of {NVL_PEERS}), got {r['world']}")
        need = ("nbytes",) if r["kind"] == "all_reduce" else ("tokens", "stage")
        for k in need:
            if k not in r:
                raise UsageError(f"{where}: a {r['kind']} row needs {k}")
        if r["kind"] == "moe" and r["stage"] not in ("dispatch", "combine"):
            raise UsageError(f"{where}: stage must be dispatch or combine, got {r['stage']!r}")
        if r["measure"] not in _KIND_MEASURES[r["kind"]]:
            raise UsageError(f"{where}: measure {r['measure']} does not fit a {r['kind']} row")
    return rows


# ------------------------------------------------------------------ byte definitions

def _moe_shape(r: dict) -> dict:
    return {k: r.get(k, d) for k, d in MOE_DEFAULTS.items()}


def _row_bytes(r: dict) -> int:
    return accounting.token_bytes(_moe_shape(r)["hidden"], "fp8" if r["stage"] == "dispatch" else "bf16")


def expected_groups_hit(E: int, N: int, K: int, M: int) -> float:
    """Distinct groups (nodes) a token reaches under DeepEP's test routing: the M groups with
    the highest best score, then the top K experts of those (tests/test_internode.py: scores
    i.i.d., group_idx = topk(group max), topk_idx = topk(masked scores)). Walking the experts
    from the best down, the chosen groups are the first M seen, so a token reaches
    min(M, D_K) groups, D_K the distinct groups among the K best experts of all E, whose law
    is exact by inclusion-exclusion: P(D = d) = C(N, d) sum_i (-1)^i C(d, i) C((d-i) a, K) / C(E, K),
    a = E/N experts a group."""
    a = E // N
    total = math.comb(E, K)
    exp = 0.0
    for d in range(1, min(N, K) + 1):
        covers = sum((-1) ** i * math.comb(d, i) * math.comb((d - i) * a, K) for i in range(d + 1))
        exp += min(M, d) * math.comb(N, d) * covers / total
    return exp


def published_bytes(r: dict) -> float:
    """The bytes the row's source divides by its time (MEASURES at the top of published.toml)."""
    p = r["world"]
    if r["measure"] == "busbw_GBps":
        return r["nbytes"] * 2 * (p - 1) / p
    s = _moe_shape(r)
    E, K, T = s["experts"], s["topk"], r["tokens"]
    if r["measure"] == "deepep_nvl_GBps":  # rows a rank receives from all P ranks, its own included
        return p * T * accounting.q_at_least_one(E, E / p, K) * _row_bytes(r)
    N = p // NVL_PEERS
    return T * expected_groups_hit(E, N, K, min(N, s["groups"])) * _row_bytes(r)


def published_time_us(r: dict) -> float:
    if r["measure"] == "time_us":
        return float(r["published"])
    return published_bytes(r) / (r["published"] * 1e3)


def _in_unit(r: dict, t_us: float) -> float:
    """A time in the row's published unit."""
    return t_us if r["measure"] == "time_us" else published_bytes(r) / (t_us * 1e3)


# ------------------------------------------------------------------ projection

def project_row(r: dict, fabrics: dict) -> dict:
    """The model's projection of one row: time_us, algorithm (what NCCL would run, or the
    kernel case), bound and why."""
    name = r["profile"]
    if name not in fabrics:
        fabrics[name] = M.fabric_from_profile(load_profile(name))
    fab = fabrics[name]
    if r["kind"] == "all_reduce":
        if r["algorithm"] == "nccl-default":
            d = M.nccl_pick(r["world"], r["nbytes"], fab)
            return {"time_us": d["time_us"], "algorithm": d["nccl"], "bound": d["bound"], "why": d["why"]}
        d = M.all_reduce_detail(_NVLS_ALGO.get(r["algorithm"], r["algorithm"]), r["world"], r["nbytes"], fab)
        return {"time_us": d["time_us"], "algorithm": d["nccl"] or r["algorithm"], "bound": d["bound"],
                "why": f"forced {r['algorithm']}"}
    s = _moe_shape(r)
    ll = r["algorithm"] == "deepep-low-latency"
    case = "flat" if ll else "node_limited"
    d = M.moe_time_us(case, r["tokens"], s["hidden"], None, s["experts"], s["topk"], r["world"], None,
                      s["groups"], fab, stage=r["stage"], low_latency=ll)
    return {"time_us": d["time_us"], "algorithm": case + (" + fixed cost" if ll else ""), "bound": d["bound"],
            "why": f"NIC {d['nic_us']:.0f} us, NVLink {d['nvl_us']:.0f} us, latency {d['latency_us']:.0f} us"}


def check(rows: list[dict]) -> list[dict]:
    """Every row with published_time_us, projected_time_us, ratio (projected / published
    time), projected (in the published unit), algorithm, bound, why."""
    fabrics: dict = {}
    out = []
    for r in rows:
        t_pub = published_time_us(r)
        d = project_row(r, fabrics)
        if not (t_pub > 0 and d["time_us"] > 0 and math.isfinite(t_pub) and math.isfinite(d["time_us"])):
            raise UsageError(f"figure {r['id']}: no time to compare (published {t_pub:.4g} us, projected "
                             f"{d['time_us']:.4g} us): check its world, size and shape")
        out.append({**r, "published_time_us": t_pub, "projected_time_us": d["time_us"],
                    "ratio": d["time_us"] / t_pub, "projected": _in_unit(r, d["time_us"]),
                    "algorithm_modelled": d["algorithm"], "bound": d["bound"], "why": d["why"]})
    return out


def within(ratio: float) -> bool:
    return 1 / BOUND_RATIO <= ratio <= BOUND_RATIO


def summary(checked: list[dict]) -> dict:
    """held_within (n, N), all_within (n, N), medians {group: held-out median ratio},
    medians_ok {group: bool}, ok (every held-out row within the bound and every median in band,
    and at least one row held out: a table whose rows all set the model tests nothing)."""
    held = [c for c in checked if c["use"] == "held-out"]
    medians = {g: statistics.median(c["ratio"] for c in held if c["group"] == g)
               for g in GROUPS if any(c["group"] == g for c in held)}
    medians_ok = {g: MEDIAN_BAND[0] <= m <= MEDIAN_BAND[1] for g, m in medians.items()}
    held_n = sum(within(c["ratio"]) for c in held)
    return {"held_within": (held_n, len(held)), "all_within": (sum(within(c["ratio"]) for c in checked), len(checked)),
            "medians": medians, "medians_ok": medians_ok,
            "ok": bool(held) and held_n == len(held) and all(medians_ok.values())}
