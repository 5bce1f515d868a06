"""The what-if model held against published figures: `commbench model --against FILE`.

A table of published figures (commbench/data/published.toml by default; docs/model.md) is
run through the model row by row. Each published value turns into a time exactly as its
source defines it (nccl-tests busbw, DeepEP's NVLink and "logical" RDMA GB/s), the model
projects the same case, and the ratio projected / published time says how far off it is:
below 1 the model is too fast. Rows marked `fit` set a profile rate or term; the verdict
rests on the `held-out` rows only.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import tomllib
from importlib import resources
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.user_files import read_user_text
from commbench.moe import accounting
from commbench.moe.shape import DEEPSEEK_V3

from . import latency as L
from . import model as M
from . import moe_stacks as MS
from .profiles import load_profile

BOUND_RATIO = 1.5  # a held-out row is "within" when 1/1.5 .. 1.5 of its published time
HELD_SHARE = 0.9  # the verdict: at least 90 % of the held-out rows within BOUND_RATIO (issue 38)
MEDIAN_BAND = (0.8, 1.25)  # and each class's (and MoE stack's) held-out median ratio in this band
CLOSE_RATIO = 1.25  # the summary also counts rows within 1/1.25 .. 1.25
NVL_PEERS = 8  # DeepEP's NVLink domain (NUM_MAX_NVL_PEERS): a node of its internode kernels
GROUPS = ("moe-normal", "moe-low-latency", "all_reduce-intra", "all_reduce-multi", "all_gather-intra",
          "all_gather-multi", "reduce_scatter-intra", "reduce_scatter-multi", "all_to_all-intra", "all_to_all-multi")
USES = ("fit", "held-out")
MEASURES = ("busbw_GBps", "time_us", "deepep_nvl_GBps", "deepep_rdma_GBps")
ALGORITHMS = {"all_reduce": ("nccl-default", "ring", "tree", "nvls"),
              "all_gather": ("nccl-default",), "reduce_scatter": ("nccl-default",), "all_to_all": ("nccl-default",),
              "moe": ("deepep-normal", "deepep-low-latency", "hierarchical")}
# a MoE row's algorithm -> (the model's accounting case, low-latency kernels): DeepEP's tests route
# node-limited (top-4 groups); V2's and Hybrid-EP's tests route top-k of all experts, one NIC copy per
# remote node they reach (hierarchical)
_MOE_CASE = {"deepep-normal": ("node_limited", False), "deepep-low-latency": ("flat", True),
             "hierarchical": ("hierarchical", False)}
DTYPES = ("fp8", "bf16")
_KIND_MEASURES = {"all_reduce": ("busbw_GBps", "time_us"), "all_gather": ("busbw_GBps", "time_us"),
                  "reduce_scatter": ("busbw_GBps", "time_us"), "all_to_all": ("busbw_GBps", "time_us"),
                  "moe": ("time_us", "deepep_nvl_GBps", "deepep_rdma_GBps")}
# nccl-tests' bus bandwidth factor (docs/collectives.md): all_reduce 2(n-1)/n, the others (n-1)/n
_BUSBW_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1}
_NVLS_ALGO = {"nvls": "inswitch"}
# DeepSeek-V3 / DeepEP test shape unless a row says otherwise
MOE_DEFAULTS = {"hidden": DEEPSEEK_V3.hidden, "experts": DEEPSEEK_V3.experts, "topk": DEEPSEEK_V3.topk,
                "groups": DEEPSEEK_V3.max_groups}
_REQUIRED = ("id", "group", "use", "source", "hardware", "profile", "kind", "algorithm", "world", "measure",
             "published")
_OPTIONAL = ("note", "nbytes", "tokens", "stage", "stack", "dtype", "domain_gpus", "fabric", "protocols", *MOE_DEFAULTS)
# The classes the verdict judges (issue 38): collective x tier x fabric, and each MoE kernel stack.
# Inside one domain the fabric is NVLink; across domains the scale-out network's.
SCALEOUT_FABRICS = ("InfiniBand", "RoCE", "EFA", "TCPXO")


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
        for k in ("world", "nbytes", "tokens", "domain_gpus", *MOE_DEFAULTS):
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
        need = ("tokens", "stage") if r["kind"] == "moe" else ("nbytes",)
        for k in need:
            if k not in r:
                raise UsageError(f"{where}: a {r['kind']} row needs {k}")
        if r["kind"] == "moe" and r["stage"] not in ("dispatch", "combine"):
            raise UsageError(f"{where}: stage must be dispatch or combine, got {r['stage']!r}")
        if r["measure"] not in _KIND_MEASURES[r["kind"]]:
            raise UsageError(f"{where}: measure {r['measure']} does not fit a {r['kind']} row")
        _check_moe_keys(r, where)
        _check_placement_keys(r, where)
    return rows


def _check_placement_keys(r: dict, where: str) -> None:
    """domain_gpus (the ranks a scale-up domain held in the run, where it placed fewer than the
    profile's domain: 2 x 4 GB300 across node pools) and fabric (the scale-out network the run
    crossed, where the profile's own name does not say it)."""
    g = r.get("domain_gpus")
    if g is not None and (r["world"] % g or g >= r["world"]):
        raise UsageError(f"{where}: domain_gpus = {g} must divide world {r['world']} and be below it "
                         "(a row inside one domain needs no domain_gpus)")
    if "fabric" in r and r["fabric"] not in SCALEOUT_FABRICS:
        raise UsageError(f"{where}: fabric = {r['fabric']!r}; choose one of {', '.join(SCALEOUT_FABRICS)}")
    if "protocols" in r:
        got = str(r["protocols"]).split(",")
        if r["kind"] == "moe" or not got or any(x not in L.PROTOCOLS for x in got):
            raise UsageError(f"{where}: protocols = {r['protocols']!r}: the NCCL protocols the run enabled "
                             f"(NCCL_PROTO), a comma list of {', '.join(L.PROTOCOLS)}, on a collective row")


def _check_moe_keys(r: dict, where: str) -> None:
    """stack (a kernel stack's name, moe_stacks) and dtype (a dispatch row's, fp8 unless given)."""
    if ("stack" in r or "dtype" in r) and r["kind"] != "moe":
        raise UsageError(f"{where}: stack and dtype are keys of moe rows")
    if "stack" in r:
        try:
            MS.get_stack(r["stack"])
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
    if "dtype" in r and (r["dtype"] not in DTYPES or r["stage"] != "dispatch"):
        raise UsageError(f"{where}: dtype is a dispatch row's, {' or '.join(DTYPES)} (combine is bf16), "
                         f"got {r['dtype']!r} on a {r['stage']} row")


# ------------------------------------------------------------------ byte definitions

def _moe_shape(r: dict) -> dict:
    return {k: r.get(k, d) for k, d in MOE_DEFAULTS.items()}


def _row_bytes(r: dict) -> int:
    return accounting.token_bytes(_moe_shape(r)["hidden"], r.get("dtype", "fp8") if r["stage"] == "dispatch" else "bf16")


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
    if r["measure"] == "busbw_GBps":  # nccl-tests: busbw = algbw x the collective's factor
        return r["nbytes"] * _BUSBW_STEPS[r.get("kind", "all_reduce")] * (p - 1) / p
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

_COLLECTIVE_DETAIL = {"all_gather": "all_gather_detail", "reduce_scatter": "reduce_scatter_detail",
                      "all_to_all": "all_to_all_detail"}


def project_row(r: dict, fabrics: dict) -> dict:
    """The model's projection of one row: time_us, algorithm (what NCCL would run, or the
    kernel case), bound and why."""
    name = r["profile"]
    if name not in fabrics:
        fabrics[name] = M.fabric_from_profile(load_profile(name))
    fab = fabrics[name]
    if "domain_gpus" in r:  # the run's own placement: fewer ranks a domain than the profile's
        fab = dataclasses.replace(fab, domain_gpus=r["domain_gpus"])
    if "protocols" in r:  # the run set NCCL_PROTO: NCCL runs those protocols across domains, not the fabric's
        fab = dataclasses.replace(fab, terms=dataclasses.replace(
            fab.terms, net_protocols=tuple(str(r["protocols"]).split(","))))
    if r["kind"] == "all_reduce":
        if r["algorithm"] == "nccl-default":
            d = M.nccl_pick(r["world"], r["nbytes"], fab)
            return {"time_us": d["time_us"], "algorithm": M.nccl_label(d), "bound": d["bound"], "why": d["why"]}
        d = M.all_reduce_detail(_NVLS_ALGO.get(r["algorithm"], r["algorithm"]), r["world"], r["nbytes"], fab)
        return {"time_us": d["time_us"], "algorithm": M.nccl_label(d) if d["nccl"] else r["algorithm"],
                "bound": d["bound"], "why": f"forced {r['algorithm']}"}
    if r["kind"] in _COLLECTIVE_DETAIL:  # NCCL runs these as a ring (pairwise for all_to_all)
        d = getattr(M, _COLLECTIVE_DETAIL[r["kind"]])(r["world"], r["nbytes"], fab)
        return {"time_us": d["time_us"], "algorithm": M.nccl_label(d), "bound": d["bound"],
                "why": f"latency {d['latency_us']:.0f} us, NVLink {d['nvl_us']:.0f} us, NIC {d['nic_us']:.0f} us"}
    s = _moe_shape(r)
    case, ll = _MOE_CASE[r["algorithm"]]
    stack = MS.get_stack(r["stack"]).name if "stack" in r else None
    d = M.moe_time_us(case, r["tokens"], s["hidden"], _row_bytes(r), s["experts"], s["topk"], r["world"], None,
                      s["groups"], MS.with_stack(fab, stack), stage=r["stage"], low_latency=ll)
    name = case + (" + fixed cost" if ll and stack is None else "") + (f", {stack}" if stack else "")
    return {"time_us": d["time_us"], "algorithm": name, "bound": d["bound"],
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


def close(ratio: float) -> bool:
    return 1 / CLOSE_RATIO <= ratio <= CLOSE_RATIO


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summary(checked: list[dict]) -> dict:
    """held_within (n, N), held_close (n within 1.25x, N), all_within (n, N), medians {group:
    held-out median ratio} (printed, not judged), classes (class_summary), class_misses (every
    class that fails: its median outside MEDIAN_BAND, or no held-out row), absent (classes of the
    grid no row covers), ok (at least HELD_SHARE of the held-out rows within the bound, every
    class's held-out median in band, no class without held-out rows, and at least one row held
    out: a table whose rows all set the model tests nothing)."""
    held = [c for c in checked if c["use"] == "held-out"]
    medians = {g: statistics.median(c["ratio"] for c in held if c["group"] == g)
               for g in GROUPS if any(c["group"] == g for c in held)}
    classes = class_summary(checked)
    misses = {k: ("no held-out row" if v["median"] is None else f"median {v['median']:.2f}")
              for k, v in classes.items()
              if v["median"] is None or not MEDIAN_BAND[0] <= v["median"] <= MEDIAN_BAND[1]}
    held_n = sum(within(c["ratio"]) for c in held)
    return {"held_within": (held_n, len(held)), "held_close": (sum(close(c["ratio"]) for c in held), len(held)),
            "all_within": (sum(within(c["ratio"]) for c in checked), len(checked)),
            "medians": medians, "classes": classes, "class_misses": misses, "absent": absent_classes(classes),
            "ok": bool(held) and held_n >= HELD_SHARE * len(held) and not misses}


def fabric_of(r: dict) -> str:
    """A row's fabric: NVLink inside one domain (the row's domain_gpus, else its profile's), else
    the row's fabric key, else its profile's scale-out fabric (EFA, TCPXO and RoCE by the
    profile's link or name, InfiniBand otherwise)."""
    prof = load_profile(r["profile"])
    G = M.ranks_per_domain(r["world"], r.get("domain_gpus", prof.scaleup_domain_gpus))
    if G >= r["world"]:
        return "NVLink"
    if "fabric" in r:
        return r["fabric"]
    link = (prof.scaleout_link or "").lower()
    for key, name in (("efa", "EFA"), ("tcpxo", "TCPXO"), ("roce", "RoCE")):
        if key in link or key in prof.name:
            return name
    return "InfiniBand"


def class_of(r: dict) -> tuple[str, str]:
    """A row's class (issue 38): (group, fabric) for a collective (all_gather-multi, RoCE), ("moe",
    the kernel stack) for a MoE row ("profile terms" for one without a stack)."""
    if r["kind"] == "moe":
        return "moe", (MS.get_stack(r["stack"]).name if "stack" in r else "profile terms")
    return r["group"], fabric_of(r)


def class_grid() -> list[tuple[str, str]]:
    """Every class a complete table would cover: each collective group inside a domain on NVLink,
    across domains on each scale-out fabric, and each MoE kernel stack."""
    out = [(g, "NVLink") if g.endswith("-intra") else (g, f) for g in GROUPS if not g.startswith("moe")
           for f in ((None,) if g.endswith("-intra") else SCALEOUT_FABRICS)]
    return [k for k in out if k[1] is not None] + [("moe", n) for n in MS.load_stacks()]


def absent_classes(classes: dict) -> list[tuple[str, str]]:
    return [k for k in class_grid() if k not in classes]


def class_summary(checked: list[dict]) -> dict:
    """Per class (class_of; docs/model.md): fit rows, held-out rows, how many within 1.5x and
    1.25x, and the held-out median ratio (None without held-out rows)."""
    out: dict = {}
    for c in checked:
        d = out.setdefault(class_of(c), {"fit": 0, "held": []})
        if c["use"] == "held-out":
            d["held"].append(c["ratio"])
        else:
            d["fit"] += 1
    return {k: {"fit": v["fit"], "held": len(v["held"]), "within": sum(within(x) for x in v["held"]),
                "close": sum(close(x) for x in v["held"]), "median": _median(v["held"])}
            for k, v in sorted(out.items())}


def stack_summary(checked: list[dict]) -> dict:
    """Per MoE kernel stack (the classes ("moe", stack) of class_summary): held-out rows, how many
    within 1.5x and within 1.25x, and their median ratio (None without held-out rows)."""
    return {k[1]: {"fit": v["fit"], "held": v["held"], "within_1_5": v["within"], "within_1_25": v["close"],
                   "median": v["median"]} for k, v in class_summary(checked).items() if k[0] == "moe"}
