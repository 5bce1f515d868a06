"""Algorithm variants: named sets of environment variables (and the facts about them) chosen
before a communicator exists, so NCCL's ring and NVLS, or Open MPI's ring and recursive
doubling, can be measured side by side. A variant is a sweep axis, but NCCL and MPI read
their settings once per process, so each variant runs as its own launch.

Pure parts: the built-in table, validation, which variants can run where, and the
speedup / crossover maths of the side-by-side report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from commbench.analyse.speedups import pick_baseline
from commbench.backends import BACKENDS
from commbench.core.errors import UsageError

_OMPI_DYN = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}


@dataclass(frozen=True)
class Variant:
    name: str
    backend: str | None = None          # None: any backend
    env: dict = field(default_factory=dict)
    inswitch: bool = False              # the switch reduces: compare wire bandwidth, not busbw
    requires: tuple = ()                # "cuda", "nvls", "collnet", "symm_mem"
    description: str = ""
    # What the library should report using: {"ompi_component": "tuned"} or {"nccl_algo": "NVLS"}.
    expect: dict = field(default_factory=dict)


BUILTIN: dict[str, Variant] = {v.name: v for v in [
    Variant("default", None, {}, description="the library's own choice"),
    # NCCL (torch.distributed nccl): NCCL_ALGO picks the algorithm for every collective.
    Variant("nccl-ring", "nccl", {"NCCL_ALGO": "Ring"}, expect={"nccl_algo": "Ring"}, requires=("cuda",),
            description="NCCL ring"),
    Variant("nccl-tree", "nccl", {"NCCL_ALGO": "Tree"}, expect={"nccl_algo": "Tree"}, requires=("cuda",),
            description="NCCL double binary tree"),
    Variant("nccl-nvls", "nccl", {"NCCL_ALGO": "NVLS", "NCCL_NVLS_ENABLE": "1"}, inswitch=True,
            expect={"nccl_algo": "NVLS"}, requires=("cuda", "nvls"), description="NVLink SHARP (in-switch reduction)"),
    Variant("nccl-nvlstree", "nccl", {"NCCL_ALGO": "NVLSTree", "NCCL_NVLS_ENABLE": "1"}, inswitch=True,
            expect={"nccl_algo": "NVLSTree"}, requires=("cuda", "nvls"),
            description="NVLS inside the node, tree across nodes"),
    Variant("nccl-nvls-off", "nccl", {"NCCL_NVLS_ENABLE": "0"}, requires=("cuda",),
            description="NCCL with NVLS disabled (its other algorithms)"),
    Variant("nccl-collnet", "nccl", {"NCCL_ALGO": "CollNetDirect", "NCCL_COLLNET_ENABLE": "1"}, inswitch=True,
            expect={"nccl_algo": "CollNetDirect"}, requires=("cuda", "collnet"),
            description="InfiniBand SHARP through the CollNet plug-in"),
    Variant("symm-mem", "nccl", {"COMMBENCH_SYMM_MEM": "1"}, inswitch=True, requires=("cuda", "symm_mem"),
            description="PyTorch symmetric-memory multimem all_reduce (NVLS from torch)"),
    # NCCL channel / CTA limits: fewer SMs for communication, so less interference with
    # overlapped compute (the overlap benchmark's knob), at some cost in bandwidth.
    Variant("nccl-channels-2", "nccl", {"NCCL_MAX_NCHANNELS": "2"}, requires=("cuda",),
            description="NCCL limited to 2 channels"),
    Variant("nccl-channels-8", "nccl", {"NCCL_MAX_NCHANNELS": "8"}, requires=("cuda",),
            description="NCCL limited to 8 channels"),
    Variant("nccl-ctas-4", "nccl", {"NCCL_MIN_CTAS": "1", "NCCL_MAX_CTAS": "4"}, requires=("cuda",),
            description="NCCL kernels limited to 4 CTAs"),
    # Open MPI coll/tuned, forced per collective (ompi_info --param coll tuned --level 9).
    Variant("ompi-ring", "mpi", {**_OMPI_DYN, "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",
                                 "OMPI_MCA_coll_tuned_allgather_algorithm": "4"},
            expect={"ompi_component": "tuned"},
            description="Open MPI ring all_reduce and all_gather (reduce_scatter_block has no ring: default)"),
    Variant("ompi-recursive-doubling", "mpi", {**_OMPI_DYN, "OMPI_MCA_coll_tuned_allreduce_algorithm": "3",
                                               "OMPI_MCA_coll_tuned_allgather_algorithm": "3",
                                               "OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm": "2"},
            expect={"ompi_component": "tuned"}, description="Open MPI recursive doubling"),
    Variant("ompi-rabenseifner", "mpi", {**_OMPI_DYN, "OMPI_MCA_coll_tuned_allreduce_algorithm": "6",
                                         "OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm": "3"},
            expect={"ompi_component": "tuned"},
            description="Open MPI Rabenseifner all_reduce (reduce_scatter by recursive halving)"),
    Variant("ompi-linear", "mpi", {**_OMPI_DYN, "OMPI_MCA_coll_tuned_allreduce_algorithm": "1",
                                   "OMPI_MCA_coll_tuned_allgather_algorithm": "1",
                                   "OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm": "1"},
            expect={"ompi_component": "tuned"}, description="Open MPI basic linear (a reduce then a broadcast)"),
    # MPICH: one CVAR per collective.
    Variant("mpich-ring", "mpi", {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"},
            requires=("mpich",), description="MPICH ring all_reduce"),
    Variant("mpich-recursive-doubling", "mpi", {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "recursive_doubling"},
            requires=("mpich",), description="MPICH recursive doubling all_reduce"),
]}

VARIANT_KEYS = {"backend", "env", "inswitch", "requires", "description", "expect"}
KNOWN_REQUIRES = {"cuda", "nvls", "collnet", "symm_mem", "mpich", "openmpi"}

# What a variant's environment may set. A suite file (and a run's meta.json, which saves the
# variant tables) is data that people share, and every rank runs with the variant's
# environment: PYTHONPATH with COMMBENCH_PLUGINS, or LD_PRELOAD, would run whatever code the
# file names. So a variant sets the communication libraries' own settings and commbench's
# measurement settings (docs/variants.md lists them), nothing else.
VARIANT_ENV_PREFIXES = ("NCCL_", "OMPI_", "PMIX_MCA_", "UCX_", "MPICH_", "MPIR_CVAR_", "FI_", "GLOO_", "TORCH_NCCL_")
VARIANT_KNOBS = {
    "COMMBENCH_SYMM_MEM": "1: torch nccl buffers in symmetric memory, all_reduce by multimem (the symm-mem variant)",
    "COMMBENCH_COMPILED_LOOP": "0: the MPI backend times in the Python loop instead of the compiled C loop",
    "COMMBENCH_CUPY_NCCL": "0: torch nccl all_reduce in place only (no out-of-place call through cupy's NCCL)",
    "COMMBENCH_NO_HOLD": "1: GPU events on an idle stream, without the stream hold (rows say hold_method none)",
    "COMMBENCH_HOLD_CAP_S": "seconds a GPU stream hold spins at most (default 1)",
}
# Library settings that load code by name or path (a plug-in, a component directory, a
# launch agent, a file of further settings), or write a file where they are told: a
# library's own way to run a file's code or write outside the run.
_LOADS_CODE = ("PLUGIN", "COMPONENT_PATH", "PARAM_FILES", "AGENT", "MODULE_DIR", "PROVIDER_PATH", "CONF_FILE")
_WRITES = ("DEBUG_FILE", "DUMP_FILE", "LOG_FILE")
# A blocking wait makes the host wait for each collective while commbench holds the GPU
# stream until the whole batch is enqueued: every held operation would stall to the cap.
_STALLS = ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT")


def env_refusal(key: str, value: str = "") -> str | None:
    """Why a variant may not set the environment variable `key` (None: it may)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return "not an environment variable name"
    if "\0" in value:
        return "its value holds a NUL byte"
    if key in _STALLS:
        return ("a blocking wait makes the host wait for each operation while the GPU stream is held for the "
                "batch: every held operation would stall to the hold's cap")
    if key in VARIANT_KNOBS:
        return None
    if not key.startswith(VARIANT_ENV_PREFIXES):
        return ("a variant sets only the communication libraries' settings (" + ", ".join(
            p + "*" for p in VARIANT_ENV_PREFIXES) + ") and commbench's measurement settings (docs/variants.md)")
    if any(word in key.upper() for word in _LOADS_CODE):
        return "it makes the library load code from a file the suite names"
    if any(word in key.upper() for word in _WRITES):
        return "it makes the library write to a file the suite names"
    return None


def check_variant_env(env: dict, where: str, name: str) -> None:
    """The first variable of a variant's env that it may not set, refused in one line."""
    for key in sorted(env):
        why = env_refusal(str(key), str(env[key]))
        if why:
            raise UsageError(f"{where}: variant {name!r} may not set {key}: {why}")


def parse_suite_variants(table: dict, where: str) -> dict[str, Variant]:
    """[variant.NAME] tables of a suite file."""

    if not isinstance(table, dict):
        raise UsageError(f"{where}: 'variant' must be a table of [variant.NAME] tables")
    out = {}
    for name, spec in table.items():
        if not str(name).strip():
            raise UsageError(f"{where}: a variant has an empty name")
        if not isinstance(spec, dict):
            raise UsageError(f"{where}: variant {name!r} must be a table")
        env = spec.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and k for k in env):
            raise UsageError(f"{where}: variant {name!r}: 'env' must be a table of VARIABLE = \"value\"")
        check_variant_env(env, where, name)  # first: a saved table's other keys never decide it
        unknown = sorted(set(spec) - VARIANT_KEYS)
        if unknown:
            raise UsageError(f"{where}: variant {name!r} has unknown key {unknown[0]!r} "
                             f"(known: {', '.join(sorted(VARIANT_KEYS))})")
        backend = spec.get("backend")
        if backend is not None and backend not in BACKENDS:
            raise UsageError(f"{where}: variant {name!r} names unknown backend {backend!r} "
                             f"(known: {', '.join(BACKENDS)})")
        req = spec.get("requires", [])
        req = [req] if isinstance(req, str) else req
        if not isinstance(req, list) or any(r not in KNOWN_REQUIRES for r in req):
            raise UsageError(f"{where}: variant {name!r}: 'requires' must list some of {', '.join(sorted(KNOWN_REQUIRES))}")
        if not isinstance(spec.get("inswitch", False), bool):
            raise UsageError(f"{where}: variant {name!r}: 'inswitch' must be true or false")
        out[name] = Variant(name, backend, {k: str(v) for k, v in env.items()}, spec.get("inswitch", False),
                            tuple(req), str(spec.get("description", "")), dict(spec.get("expect", {})))
    return out


def resolve(names, suite_defs: dict | None = None) -> list[Variant]:
    """The variants named, from the suite's own tables first, then the built-ins."""
    names = list(names or ["default"])
    seen = set()
    out = []
    for n in names:
        if not isinstance(n, str) or not n.strip():
            raise UsageError("a variant has an empty name")
        if n in seen:
            raise UsageError(f"variant {n!r} is named twice")
        seen.add(n)
        v = (suite_defs or {}).get(n) or BUILTIN.get(n)
        if v is None:
            known = sorted(set(BUILTIN) | set(suite_defs or {}))
            raise UsageError(f"unknown variant {n!r} (known: {', '.join(known)})")
        out.append(v)
    return out


def unavailable(v: Variant, backend: str, device: str, mpi_flavor: str = "", caps: dict | None = None) -> str | None:
    """Why variant v cannot run with this backend and device here, or None when it can.
    caps: capability -> True, or the reason it is missing (nvls, collnet, symm_mem)."""
    caps = caps or {}
    if v.backend is not None and v.backend != backend:
        return f"a variant for backend {v.backend}; this run uses {backend}"
    for r in v.requires:
        if r == "cuda" and device != "cuda":
            return "needs CUDA GPUs"
        if r in ("nvls", "collnet", "symm_mem") and caps.get(r) is not True:
            if isinstance(caps.get(r), str):
                return caps[r]
            return {"nvls": "needs NVLink SHARP (NVSwitch with in-switch reduction, NCCL >= 2.17)",
                    "collnet": "needs InfiniBand SHARP and NCCL's CollNet plug-in",
                    "symm_mem": "needs torch symmetric memory with multimem support (CUDA, NVSwitch)"}[r]
        if r == "mpich" and "MPICH" not in mpi_flavor:
            return "an MPICH variant; this MPI is " + (mpi_flavor or "not MPICH")
        if r == "openmpi" and "Open MPI" not in mpi_flavor:
            return "an Open MPI variant; this MPI is " + (mpi_flavor or "not Open MPI")
    if v.name.startswith("ompi-") and mpi_flavor and "Open MPI" not in mpi_flavor:
        return "an Open MPI variant; this MPI is " + mpi_flavor
    return None


# --- planning: which variants a run launches, which it skips and why, and its baseline ----

@dataclass(frozen=True)
class VariantPlan:
    entries: tuple          # (Variant, why it cannot run here, or None), in the suite's order
    baseline: str | None    # what speedups are measured against on this backend
    note: str = ""          # why the suite's baseline was not used, when it was not

    @property
    def runnable(self) -> list[Variant]:
        return [v for v, why in self.entries if why is None]

    @property
    def skipped(self) -> dict[str, str]:
        return {v.name: why for v, why in self.entries if why is not None}

    @property
    def names(self) -> list[str]:
        return [v.name for v, _ in self.entries]


def _suite_defs(cfg) -> dict[str, Variant]:
    """The suite's [variant.NAME] tables (kept as plain tables in the config) as Variants."""
    return {n: (v if isinstance(v, Variant) else Variant(**{**v, "requires": tuple(v.get("requires", ()))}))
            for n, v in (cfg.variant_defs or {}).items()}


def of_config(cfg) -> list[Variant]:
    """The suite's variants (cfg.variants, with its [variant.NAME] tables), validated."""
    return resolve(cfg.variants, _suite_defs(cfg))


def lookup(cfg, name: str) -> Variant:
    """One variant by name: the suite's own, else a built-in one (a launch may run a built-in
    variant the suite does not list)."""
    return resolve([name], _suite_defs(cfg))[0]


def configured_baseline(cfg, backend: str) -> str | None:
    """The suite's baseline for this backend: one name for every backend, or a table
    backend = name (a backend it does not name gets the default choice)."""
    b = cfg.baseline
    return b.get(backend) if isinstance(b, dict) else b


def check_baseline(cfg) -> None:
    """Every baseline the suite names is one of its variants."""
    given = cfg.baseline.values() if isinstance(cfg.baseline, dict) else [cfg.baseline] if cfg.baseline else []
    for name in given:
        pick_baseline(list(cfg.variants), name)


def plan(cfg, backend: str, device: str, requested: str | None = None, mpi_flavor: str = "",
         caps: dict | None = None) -> VariantPlan:
    """The variants a run launches on this backend and device: the suite's (or the one
    requested with --variant), each with the reason it cannot run here or None, and the
    baseline. Pure: the MPI flavour and the GPU capabilities (nvls, collnet, symm_mem) are
    given by the caller. A suite baseline that cannot run here gives way to the default
    choice among those that can, and the note says so."""
    variants = [lookup(cfg, requested)] if requested is not None else of_config(cfg)
    entries = tuple((v, unavailable(v, backend, device, mpi_flavor, caps)) for v in variants)
    given = configured_baseline(cfg, backend)
    if requested is not None:  # one launch of several: the report from disk compares them
        return VariantPlan(entries, given)
    runs = [v.name for v, why in entries if why is None]
    why_not = dict((v.name, why) for v, why in entries).get(given)
    if given and why_not is None:
        return VariantPlan(entries, given)
    base = pick_baseline(runs) if runs else None
    note = f"baseline {given} cannot run here ({why_not}): comparing with {base}" if given and base else ""
    return VariantPlan(entries, base, note)


# --- what the library says it used ---------------------------------------------------

def ompi_selected_component(verbose_log: str, collective_comm: str = "MPI_COMM_WORLD") -> str | None:
    """From Open MPI's coll_base_verbose output, the coll component with the highest
    priority enabled for the communicator; Open MPI uses it for the collectives it has."""
    best = None
    comm_seen = False
    for line in verbose_log.splitlines():
        if "comm_select: new communicator:" in line:
            comm_seen = collective_comm in line
        elif comm_seen and "comm_select: selecting" in line and "Enabled" in line:
            try:
                comp = line.split("selecting", 1)[1].split(",")[0].strip()
                prio = int(line.split("priority", 1)[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            if comp != "self" and (best is None or prio > best[1]):
                best = (comp, prio)
    return best[0] if best else None


# NCCL's algorithm numbers in its TUNING debug lines (src/include/device.h, NCCL >= 2.19).
NCCL_ALGO_IDS = {"0": "Tree", "1": "Ring", "2": "CollNetDirect", "3": "CollNetChain", "4": "NVLS", "5": "NVLSTree",
                 "6": "PAT"}


def nccl_algorithms(debug_log: str) -> set[str]:
    """Algorithms NCCL's TUNING debug lines name ("... -> Algo 4 proto 2 ..." or "Algo NVLS")."""
    algos = set()
    for line in debug_log.splitlines():
        if "algo" not in line.lower():
            continue
        parts = line.replace(",", " ").split()
        for i, tok in enumerate(parts):
            if tok.lower() in ("algo", "algorithm") and i + 1 < len(parts):
                a = parts[i + 1]
                algos.add(NCCL_ALGO_IDS.get(a, a))
    return algos


def requested_ompi_component(env: dict) -> str | None:
    """The coll component whose parameters a variant sets (OMPI_MCA_coll_tuned_... -> tuned)."""
    for k in env:
        if k.startswith("OMPI_MCA_coll_"):
            return k[len("OMPI_MCA_coll_"):].split("_", 1)[0]
    return None
