"""Suite files: load, validate (before any rank communicates), apply CLI overrides, and
expand the sweep grid into points."""
from __future__ import annotations

import functools
import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError
from .units import DTYPE_NBYTES, check_dtype, fmt_size, parse_size, size_range

SUITE_KEYS = {
    "description": "what the suite measures",
    "benchmarks": "benchmark names to run",
    "sizes": "{min, max, factor} or a list of sizes (K/M/G binary suffixes)",
    "dtypes": "element types",
    "worlds": "rank counts swept inside one launch (default: 2, 4, 8, ... up to the launch)",
    "max_world": "drop default worlds above this",
    "iters": "fixed timed iterations per point (0 or absent: calibrate to min_time_ms)",
    "warmup": "untimed iterations before timing",
    "min_time_ms": "calibration target per point",
    "min_iters": "calibration floor",
    "max_iters": "calibration ceiling",
    "check": "validate every point's data",
    "timeout_s": "watchdog: seconds an operation may take beyond its expected time before the run ends",
    "timing": "back_to_back (nccl-tests: operations one after another) or barrier (OSU: a barrier after each, untimed)",
    "cuda_graph": "GPU: capture iterations in a CUDA graph and time its replay (hides launch overhead)",
    "backend": "mpi, gloo or nccl",
    "profile": "hardware profile rows are compared with (built-in name or .toml path; default: loopback on CPU)",
    "params": "per-benchmark parameter tables; a list value is a sweep axis",
    "variants": "algorithm variants to run, each as its own launch (built-in names or [variant.NAME] tables)",
    "variant": "[variant.NAME] tables: env, backend, inswitch, requires, description",
    "baseline": "the variant speedups are measured against (default: the ring one, else default)",
}


TIMING_METHODS = ("back_to_back", "barrier")


@dataclass(frozen=True)
class SuiteConfig:
    name: str
    description: str = ""
    benchmarks: tuple = ()
    sizes: object = field(default_factory=lambda: {"min": "8", "max": "4M", "factor": 2})
    dtypes: tuple = ("float32",)
    worlds: tuple | None = None
    max_world: int | None = None
    iters: int = 0
    warmup: int = 5
    min_time_ms: float = 50.0
    min_iters: int = 5
    max_iters: int = 10000
    check: bool = False
    timing: str = "back_to_back"
    timeout_s: float = 300.0
    cuda_graph: bool = False
    backend: str | None = None
    profile: str | None = None
    params: dict = field(default_factory=dict)
    variants: tuple = ("default",)
    variant_defs: dict = field(default_factory=dict)
    baseline: str | None = None

    @property
    def explicit_sizes(self) -> bool:
        return isinstance(self.sizes, (list, tuple))


def suite_dirs() -> list[Path]:
    return [Path.cwd() / "suites", Path(__file__).resolve().parent.parent / "suites"]


def find_suite(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise UsageError(f"suite file {name} not found")
        return p
    for d in suite_dirs():
        if (d / f"{name}.toml").is_file():
            return d / f"{name}.toml"
    raise UsageError(f"unknown suite {name!r} (known: {', '.join(list_suites()) or 'none'})")


def list_suites() -> list[str]:
    seen = {}
    for d in suite_dirs():
        for f in sorted(d.glob("*.toml")) if d.is_dir() else []:
            seen.setdefault(f.stem, f)
    return sorted(seen)


def read_suite(name: str | None) -> dict:
    if name is None:
        return {"name": "adhoc"}
    path = find_suite(name)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"suite {path}: malformed TOML: {e}") from None
    except OSError as e:
        raise UsageError(f"suite {path}: {e.strerror}") from None
    raw["name"] = path.stem
    return raw


def _type(key, value, kinds, what):
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))):
        raise UsageError(f"suite key {key!r} must be {what}, got {value!r}")
    return value


def build_config(raw: dict, overrides: dict | None = None) -> SuiteConfig:
    """Validate a suite table; CLI overrides (already typed) win over its fields."""
    raw = dict(raw)
    name = raw.pop("name", "adhoc")
    unknown = sorted(set(raw) - set(SUITE_KEYS))
    if unknown:
        raise UsageError(f"suite {name}: unknown key {unknown[0]!r} (known: {', '.join(SUITE_KEYS)})")
    merged = {**raw, **{k: v for k, v in (overrides or {}).items() if v is not None and k != "params"}}
    params = {k: dict(v) for k, v in raw.get("params", {}).items()} if isinstance(raw.get("params", {}), dict) else raw["params"]
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        raise UsageError(f"suite {name}: 'params' must be a table of tables ([params.BENCHMARK])")
    for bench, kv in ((overrides or {}).get("params") or {}).items():
        params.setdefault(bench, {}).update(kv)

    kw = {"name": name, "params": params}
    if "description" in merged:
        kw["description"] = str(merged["description"])
    if "benchmarks" in merged:
        b = merged["benchmarks"]
        b = [b] if isinstance(b, str) else b
        if not isinstance(b, list) or not all(isinstance(x, str) for x in b):
            raise UsageError(f"suite key 'benchmarks' must be a list of names, got {merged['benchmarks']!r}")
        kw["benchmarks"] = tuple(b)
    if "sizes" in merged:
        s = merged["sizes"]
        if isinstance(s, dict):
            extra = set(s) - {"min", "max", "factor"}
            if extra or not {"min", "max"} <= set(s):
                raise UsageError(f"suite key 'sizes' table needs min and max (and optional factor), got {sorted(s)}")
            kw["sizes"] = dict(s)
        elif isinstance(s, (list, tuple)) and not isinstance(s, str):
            if not s:
                raise UsageError("suite key 'sizes' is an empty list: nothing to sweep")
            kw["sizes"] = list(s)
        else:
            raise UsageError(f"suite key 'sizes' must be a {{min, max, factor}} table or a list, got {s!r}")
    if "dtypes" in merged:
        d = merged["dtypes"]
        d = [d] if isinstance(d, str) else d
        if not isinstance(d, list) or not d:
            raise UsageError(f"suite key 'dtypes' must be a non-empty list, got {merged['dtypes']!r}")
        kw["dtypes"] = tuple(check_dtype(x) for x in d)
    if "worlds" in merged:
        w = merged["worlds"]
        w = [w] if isinstance(w, int) and not isinstance(w, bool) else w
        if not isinstance(w, list) or not w or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in w):
            raise UsageError(f"suite key 'worlds' must be a non-empty list of positive integers, got {merged['worlds']!r}")
        kw["worlds"] = tuple(sorted(set(w)))
    for key, lo in (("max_world", 1), ("iters", 0), ("warmup", 0), ("min_iters", 1), ("max_iters", 1)):
        if key in merged:
            v = _type(key, merged[key], int, "an integer")
            if v < lo:
                raise UsageError(f"suite key {key!r} must be >= {lo}, got {v}")
            kw[key] = v
    if "timeout_s" in merged:
        v = _type("timeout_s", merged["timeout_s"], (int, float), "a number of seconds")
        if v <= 0:
            raise UsageError(f"suite key 'timeout_s' must be positive, got {v}")
        kw["timeout_s"] = float(v)
    if "min_time_ms" in merged:
        v = _type("min_time_ms", merged["min_time_ms"], (int, float), "a number")
        if v <= 0:
            raise UsageError(f"suite key 'min_time_ms' must be positive, got {v}")
        kw["min_time_ms"] = float(v)
    if "check" in merged:
        kw["check"] = _type("check", merged["check"], bool, "true or false")
    if "timing" in merged:
        kw["timing"] = _type("timing", merged["timing"], str, "back_to_back or barrier")
        if kw["timing"] not in TIMING_METHODS:
            raise UsageError(f"suite key 'timing' must be one of {', '.join(TIMING_METHODS)}, got {kw['timing']!r}")
    if "cuda_graph" in merged:
        kw["cuda_graph"] = _type("cuda_graph", merged["cuda_graph"], bool, "true or false")
    if "backend" in merged:
        kw["backend"] = _type("backend", merged["backend"], str, "a backend name")
    if "profile" in merged:
        kw["profile"] = _type("profile", merged["profile"], str, "a profile name or path")
    if "variant" in merged:
        from .variants import parse_suite_variants

        kw["variant_defs"] = {n: v.__dict__ for n, v in parse_suite_variants(merged["variant"], f"suite {name}").items()}
    if "variants" in merged:
        vs = merged["variants"]
        vs = [vs] if isinstance(vs, str) else vs
        if not isinstance(vs, (list, tuple)) or not vs:
            raise UsageError(f"suite key 'variants' must be a non-empty list of names, got {merged['variants']!r}")
        kw["variants"] = tuple(vs)
    if "baseline" in merged:
        kw["baseline"] = _type("baseline", merged["baseline"], str, "a variant name")
    cfg = SuiteConfig(**kw)
    from .variants import pick_baseline

    resolve_variants(cfg)
    if cfg.baseline:
        pick_baseline(list(cfg.variants), cfg.baseline)
    if not cfg.benchmarks:
        raise UsageError(f"suite {name}: no benchmarks to run (set 'benchmarks' or pass -b)")
    if cfg.min_iters > cfg.max_iters:
        raise UsageError(f"suite {name}: min_iters {cfg.min_iters} > max_iters {cfg.max_iters}")
    return cfg


def resolve_variants(cfg: SuiteConfig):
    """The suite's Variant objects (validated: known, unique, non-empty names)."""
    from .variants import Variant, resolve

    defs = {n: (v if isinstance(v, Variant) else Variant(**{**v, "requires": tuple(v.get("requires", ()))}))
            for n, v in (cfg.variant_defs or {}).items()}
    return resolve(cfg.variants, defs)


def resolve_sizes(cfg: SuiteConfig) -> list[int]:
    if cfg.explicit_sizes:
        return sorted({parse_size(s) for s in cfg.sizes})
    s = cfg.sizes
    return size_range(parse_size(s["min"]), parse_size(s["max"]), s.get("factor", 2))


def resolve_worlds(cfg: SuiteConfig, launched: int) -> list[int]:
    if cfg.worlds is not None:
        too_big = [w for w in cfg.worlds if w > launched]
        if too_big:
            raise UsageError(f"world {too_big[0]} asked but only {launched} rank(s) launched")
        return list(cfg.worlds)
    # Default: powers of two from 2, plus the launch itself (rank-count sweep in one launch).
    cap = min(launched, cfg.max_world or launched)
    worlds = [w for w in (2 ** i for i in range(1, 31)) if w <= cap]
    if cap not in worlds:
        worlds.append(cap)
    return sorted(set(worlds))


def _param_grid(bench, raw: dict) -> list[dict]:
    unknown = sorted(set(raw) - set(bench.params))
    if unknown:
        known = ", ".join(bench.params) or "none"
        raise UsageError(f"{bench.name}: unknown param {unknown[0]!r} (known: {known})")
    axes = []
    for key, spec in bench.params.items():
        values = raw.get(key, spec.default)
        values = values if isinstance(values, list) else [values]
        if not values:
            raise UsageError(f"{bench.name}: param {key} is an empty sweep")
        axes.append([(key, spec.coerce(bench.name, key, v)) for v in values])
    out, seen = [], set()
    for combo in itertools.product(*axes):
        params = bench.canonical_params(dict(combo))
        key = tuple(sorted(params.items()))
        if key not in seen:
            seen.add(key)
            out.append(params)
    return out


def expand(cfg: SuiteConfig, launched: int, backend_dtypes: tuple) -> tuple[list, list[str]]:
    """Every point of the sweep, and notes on sizes dropped or rounded. Raises UsageError
    for a sweep that cannot run, before anything is communicated."""
    from .benchmarks import Point, get

    benches = [get(b) for b in cfg.benchmarks]
    for d in cfg.dtypes:
        if d not in backend_dtypes:
            raise UsageError(f"dtype {d} is not supported by this backend (it has: {', '.join(backend_dtypes)})")
    sizes = resolve_sizes(cfg)
    worlds = resolve_worlds(cfg, launched)
    points, notes = [], []
    for world in worlds:
        for bench in benches:
            if world < bench.min_world or (bench.even_world and world % 2):
                need = "an even world" if bench.even_world else f">= {bench.min_world} ranks"
                if cfg.worlds is not None:  # asked for by name: say why it cannot run
                    raise UsageError(f"{bench.name} needs {need}, got world {world}")
                notes.append(f"{bench.name}: world {world} skipped (needs {need})")
                continue
            for params in _param_grid(bench, cfg.params.get(bench.name, {})):
                for dtype in cfg.dtypes if bench.sized else cfg.dtypes[:1]:
                    for nbytes in _sizes_for(bench, world, dtype, params, sizes, cfg, notes) if bench.sized else [0]:
                        p = Point(bench.name, world, dtype, nbytes, params)
                        bench.validate(p)
                        points.append(p)
    for name in cfg.params:
        if name not in cfg.benchmarks:
            raise UsageError(f"params given for {name!r}, which the suite does not run")
    if not points:
        raise UsageError(f"suite {cfg.name}: the sweep has no points")
    return points, notes


def _sizes_for(bench, world, dtype, params, sizes, cfg, notes) -> list[int]:
    """A size must split evenly: an explicit size that does not is rejected; a size from a
    min/max range is rounded down to the nearest multiple (as nccl-tests does); a size
    below one unit is skipped. Every rounding or skip is noted."""
    unit = bench.unit_nbytes(world, DTYPE_NBYTES[dtype], params)
    out = []
    for s in sizes:
        if s < unit:
            notes.append(f"{bench.name} world {world} {dtype}: {fmt_size(s)} B is below one unit of "
                         f"{unit} B, skipped")
            continue
        if s % unit:
            if cfg.explicit_sizes:
                raise UsageError(f"{bench.name}: size {s} B cannot be split evenly over world {world} x "
                                 f"{DTYPE_NBYTES[dtype]} B {dtype} (a multiple of {unit} B): rejected")
            notes.append(f"{bench.name} world {world} {dtype}: {s} B rounded down to {s - s % unit} B")
            s -= s % unit
        out.append(s)
    return sorted(set(out))



# --- the plan: memory and a rough time per point, before anything runs ----------------

# A rough rate for the time estimate of --dry-run: the order of a shared-memory copy; a real
# fabric is faster, so the estimate errs long. The latency is the order of an MPI call.
PLAN_GBPS = 5.0
PLAN_ALPHA_S = 2e-6
PLAN_SETUP_S = 0.01


def _mem_available_nbytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _local_ranks(world: int) -> int:
    import os

    for k in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        v = os.environ.get(k, "")
        if v.isdigit():
            return int(v)
    return world if not any(os.environ.get(k) for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                                                         "RANK")) else 1


def fmt_mem(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


INT_MAX = 2**31 - 1


@functools.lru_cache(maxsize=1)
def mpi_large_count() -> bool:
    """Does the MPI library speak MPI-4 (large-count calls, which mpi4py then uses)? Asked
    in a child process: importing mpi4py here would initialise MPI in the launcher."""
    import subprocess
    import sys

    code = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_version()[0])"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        return int(out.strip() or 0) >= 4
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False


def plan(cfg: SuiteConfig, points: list, world: int, device: str, check_counts: bool = False) -> list[dict]:
    """Per point: buffer bytes per rank (the benchmark's own estimate) and a rough time.
    Refuses, before any rank starts, a sweep whose largest point does not fit this host's
    available memory with every local rank holding its buffers, and (check_counts: the
    mpi backend) a call whose count overflows a C int."""
    from .benchmarks import get

    out = []
    for p in points:
        bench = get(p.benchmark)
        if check_counts and bench.max_count(p) > INT_MAX and not mpi_large_count():
            raise UsageError(
                f"{p.benchmark} {fmt_size(p.nbytes)} {p.dtype} at world {p.world} passes {bench.max_count(p)} "
                f"elements in one call, over the 2^31-1 an MPI count holds without MPI-4 large-count calls, "
                f"which this MPI library lacks: use a wider dtype or a smaller size")
        mem = int(bench.memory_nbytes(p))
        op_s = PLAN_ALPHA_S + bench.plan_nbytes(p) / (PLAN_GBPS * 1e9)
        if cfg.iters:
            t = (cfg.iters + cfg.warmup) * op_s
        else:
            t = cfg.warmup * op_s + min(max(cfg.min_time_ms / 1e3, cfg.min_iters * op_s), cfg.max_iters * op_s)
        out.append({"point": p, "mem_nbytes": mem, "est_s": t * bench.stages + PLAN_SETUP_S})
    if device == "cpu" and out:
        avail = _mem_available_nbytes()
        big = max(out, key=lambda r: r["mem_nbytes"])
        local = min(_local_ranks(world), world)
        if avail is not None and big["mem_nbytes"] * local > avail:
            p = big["point"]
            raise UsageError(
                f"{p.benchmark} {fmt_size(p.nbytes)} at world {p.world} needs about {fmt_mem(big['mem_nbytes'])} "
                f"per rank, {fmt_mem(big['mem_nbytes'] * local)} for {local} ranks on this host, which has "
                f"{fmt_mem(avail)} available: lower the sizes or the ranks per host")
    return out


def print_plan(cfg: SuiteConfig, plan_rows: list[dict], world: int, backend: str) -> None:
    """--dry-run: the points, memory per rank and a rough time, without communicating."""
    print(f"suite {cfg.name}: {len(plan_rows)} points on {world} ranks, backend {backend}")
    print(f"{'benchmark':16s} {'world':>5s} {'size':>8s} {'dtype':9s} {'mem/rank':>10s} {'~time':>8s}  params")
    for r in plan_rows:
        p = r["point"]
        params = " ".join(f"{k}={v}" for k, v in p.params.items())
        print(f"{p.benchmark:16s} {p.world:5d} {fmt_size(p.nbytes):>8s} {p.dtype:9s} "
              f"{fmt_mem(r['mem_nbytes']):>10s} {r['est_s']:7.2f}s  {params}")
    total = sum(r["est_s"] for r in plan_rows)
    peak = max((r["mem_nbytes"] for r in plan_rows), default=0)
    print(f"total: about {total:.0f} s (rough: {PLAN_GBPS:g} GB/s and {PLAN_ALPHA_S * 1e6:g} us an operation, "
          f"plus set-up), peak buffers {fmt_mem(peak)} per rank")
