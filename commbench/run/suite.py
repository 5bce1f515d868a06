"""Suite files: load, validate (before any rank communicates), apply CLI overrides, and
expand the sweep grid into points."""
from __future__ import annotations

import itertools
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from commbench.backends import BACKENDS
from commbench.benchmarks import Point, get
from commbench.core.errors import UsageError
from commbench.core.units import DTYPE_NBYTES, check_dtype, fmt_size, sweep_sizes
from commbench.core.user_files import read_user_text
from commbench.run.variants import check_baseline, of_config, parse_suite_variants

TIMING_METHODS = ("back_to_back", "barrier")
PLACEMENTS = ("out-of-place", "in-place", "both")

# Where suites are found, before the ones that ship with commbench: COMMBENCH_SUITES (suite
# files or directories of them, os.pathsep-separated), then ./suites of the current directory.
SUITES_ENV = "COMMBENCH_SUITES"
PACKAGE_SUITES = Path(__file__).resolve().parent.parent / "suites"


# --- the config: each field declares its suite key, help and check --------------------
#
# A check takes (value, key, suite name) and returns the field's value or raises a one-line
# UsageError; build_config, the unknown-key message and docs/collectives.md's suite-key table all come from the
# fields, so a key is added in one place.

def _fail(key, what, value):
    raise UsageError(f"suite key {key!r} must be {what}, got {value!r}")


def _of(kind, what):
    return lambda v, key, suite: v if isinstance(v, kind) else _fail(key, what, v)


def _choice(options):
    return lambda v, key, suite: v if isinstance(v, str) and v in options else _fail(
        key, f"one of {', '.join(options)}", v)


# An iteration count above this never ends (a billion 1 us operations is 17 minutes per
# point): refused up front, as is a value beyond what a C int of the libraries holds.
MAX_COUNT = 10**9


def _int(lo, hi=MAX_COUNT):
    def check(v, key, suite):
        if not isinstance(v, int) or isinstance(v, bool):
            _fail(key, "an integer", v)
        if v > hi:
            _fail(key, f"<= {hi}", v)
        return v if v >= lo else _fail(key, f">= {lo}", v)
    return check


def _positive(what, least=None):
    """A finite positive number, at least `least` when given (NaN and infinity would turn
    the watchdog off)."""
    import math

    def check(v, key, suite):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            _fail(key, what, v)
        if not math.isfinite(v):
            _fail(key, "a finite number", v)
        if least is not None and v < least:
            _fail(key, f"at least {least:g}", v)
        return float(v) if v > 0 else _fail(key, "positive", v)
    return check


def _names(what, nonempty, item=None, dedupe=False):
    """A list (one bare string counts as a list of one); item checks or converts each entry,
    otherwise each must be a string. dedupe: a name given twice counts once (in order)."""
    def check(v, key, suite):
        items = [v] if isinstance(v, str) else v
        if (not isinstance(items, (list, tuple)) or (nonempty and not items)
                or (item is None and not all(isinstance(x, str) for x in items))):
            _fail(key, what, v)
        out = tuple(item(x) if item else x for x in items)
        return tuple(dict.fromkeys(out)) if dedupe else out
    return check


def _worlds(v, key, suite):
    w = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    if not isinstance(w, (list, tuple)) or not w or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in w):
        _fail(key, "a non-empty list of positive integers", v)
    return tuple(sorted(set(w)))


@dataclass(frozen=True)
class Sizes:
    """A sweep's message sizes in bytes, parsed once when the config is built. from_range:
    a size that a point cannot split evenly is rounded down (nccl-tests' -b/-e/-f); a size
    listed by name is refused instead."""

    nbytes: tuple[int, ...]
    from_range: bool


def _sizes(s, key, suite) -> Sizes:
    if isinstance(s, Sizes):  # a run's own, saved (saved_table)
        if not s.nbytes or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in s.nbytes):
            _fail(key, "positive sizes in bytes", list(s.nbytes))
        return s
    if isinstance(s, dict):
        if set(s) - {"min", "max", "factor"} or not {"min", "max"} <= set(s):
            raise UsageError(f"suite key 'sizes' table needs min and max (and optional factor), got {sorted(s)}")
    elif isinstance(s, (list, tuple)):
        if not s:
            raise UsageError("suite key 'sizes' is an empty list: nothing to sweep")
    else:
        _fail(key, "a {min, max, factor} table or a list", s)
    nbytes, from_range = sweep_sizes(s)
    return Sizes(tuple(nbytes), from_range)


def _params(v, key, suite):
    if not isinstance(v, dict) or not all(isinstance(t, dict) for t in v.values()):
        raise UsageError(f"suite {suite}: 'params' must be a table of tables ([params.BENCHMARK])")
    return {bench: dict(t) for bench, t in v.items()}


def _variant_tables(v, key, suite):
    # Stored as plain tables, so the config goes into meta.json as it is.
    return {n: var.__dict__ for n, var in parse_suite_variants(v, f"suite {suite}").items()}


def _baseline(v, key, suite):
    if isinstance(v, str) or (isinstance(v, dict) and all(b in BACKENDS and isinstance(n, str) for b, n in v.items())):
        return v
    return _fail(key, f"a variant name or a table of backend = variant name ({', '.join(BACKENDS)})", v)


def _key(default=None, help="", check=None, key=None, factory=None):
    """A suite key: default, help, and the check a suite file's (or the CLI's) value passes.
    key: the name in the suite file when it differs from the field's."""
    meta = {"help": help, "check": check, "key": key}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SuiteConfig:
    name: str  # the suite file's stem, not a key in it
    description: str = _key("", "what the suite measures", lambda v, k, s: str(v))
    benchmarks: tuple = _key((), "benchmark names to run (a name given twice runs once)",
                             _names("a list of names", False, dedupe=True))
    sizes: Sizes = _key(help="{min, max, factor} or a list of sizes (K/M/G binary suffixes)", check=_sizes,
                        factory=lambda: _sizes({"min": "8", "max": "4M", "factor": 2}, "sizes", ""))
    dtypes: tuple = _key(("float32",), "element types", _names("a non-empty list", True, check_dtype))
    worlds: tuple | None = _key(None, "rank counts swept inside one launch (default: 2, 4, 8, ... up to the launch)",
                                _worlds)
    max_world: int | None = _key(None, "drop default worlds above this", _int(1))
    iters: int = _key(0, "fixed timed iterations per point (0 or absent: calibrate to min_time_ms)", _int(0))
    warmup: int = _key(5, "untimed iterations before timing", _int(0))
    min_time_ms: float = _key(50.0, "calibration target per point", _positive("a number"))
    min_iters: int = _key(5, "calibration floor", _int(1))
    max_iters: int = _key(10000, "calibration ceiling", _int(1))
    check: bool = _key(False, "validate every point's data", _of(bool, "true or false"))
    timing: str = _key("back_to_back", "back_to_back (nccl-tests: operations one after another) or barrier "
                       "(OSU: a barrier after each, untimed)", _choice(TIMING_METHODS))
    timeout_s: float = _key(300.0, "watchdog: seconds an operation may take beyond its expected time before the "
                            "run ends (at least 1: starting a phase takes that long)",
                            _positive("a number of seconds", least=1))
    cuda_graph: bool = _key(False, "GPU: capture iterations in a CUDA graph and time its replay (hides launch "
                            "overhead)", _of(bool, "true or false"))
    in_place: bool = _key(False, "nccl-tests' in-place column: all_reduce reduces its output buffer in place "
                          "(default: out of place where the backend can; rows say which in `placement`)",
                          _of(bool, "true or false"))
    placement: str | None = _key(None, "out-of-place, in-place or both: the placements a collective with a choice "
                                 "(all_reduce) is measured in, nccl-tests' two columns (default: out-of-place where "
                                 "the backend can, in-place with in_place = true)",
                                 _choice(PLACEMENTS))
    per_op_events: bool = _key(False, "GPU: an event pair around each operation inside the held batch, for tail "
                               "studies (each pair costs 1-2 us of device time at the smallest sizes), instead of "
                               "one pair around the batch", _of(bool, "true or false"))
    backend: str | None = _key(None, f"{', '.join(BACKENDS)} (default: nccl with a GPU, else mpi, else gloo: "
                               "the first that works here)", _choice(tuple(BACKENDS)))
    profile: str | None = _key(None, "hardware profile rows are compared with (built-in name or .toml path; "
                               "default: loopback on CPU)", _of(str, "a profile name or path"))
    params: dict = _key(help="per-benchmark parameter tables; a list value is a sweep axis", check=_params,
                        factory=dict)
    variants: tuple = _key(("default",), "algorithm variants to run, each as its own launch (built-in names or "
                           "[variant.NAME] tables)", _names("a non-empty list of names", True))
    variant_defs: dict = _key(help="[variant.NAME] tables: env, backend, inswitch, requires, description",
                              check=_variant_tables, key="variant", factory=dict)
    baseline: str | dict | None = _key(None, "the variant speedups are measured against: a name, or a table "
                                       "backend = name (default: the first ring variant that runs, else default)",
                                       _baseline)

    @property
    def explicit_sizes(self) -> bool:
        return not self.sizes.from_range


def _keyed_fields() -> dict:
    """suite-file key -> dataclass field, in declaration order."""
    return {f.metadata.get("key") or f.name: f for f in fields(SuiteConfig) if f.metadata.get("check")}


def suite_keys() -> dict[str, str]:
    """Every key a suite file may hold, with its help."""
    return {k: f.metadata["help"] for k, f in _keyed_fields().items()}


def key_help(name: str) -> str:
    return {f.name: f.metadata.get("help", "") for f in fields(SuiteConfig)}[name]


def suite_dirs() -> list[Path]:
    """Where suites are looked up, first match wins: COMMBENCH_SUITES (files or directories),
    ./suites (a user's own), then the suites that ship with commbench."""
    user = [Path(p) for p in os.environ.get(SUITES_ENV, "").split(os.pathsep) if p.strip()]
    return user + [Path.cwd() / "suites", PACKAGE_SUITES]


def _suite_files(d: Path) -> list[Path]:
    if d.is_file():
        return [d]
    return sorted(d.glob("*.toml")) if d.is_dir() else []


def find_suite(name: str) -> Path:
    """The suite file a name means. A name is a path when it ends in .toml or names a file;
    a directory never is a suite (a run directory named like its suite, `--out quick`, must
    not hide the suite `quick`); any other name is looked up in suite_dirs()."""
    p = Path(name)
    if p.suffix == ".toml" or (p.exists() and not p.is_dir()):
        if not p.exists():
            raise UsageError(f"suite file {name} not found")
        return p  # read_suite refuses what is not a regular file (a directory named x.toml, a FIFO)
    for d in suite_dirs():
        hit = next((f for f in _suite_files(d) if f.stem == name), None)
        if hit is not None:
            return hit
    raise UsageError(f"unknown suite {name!r} (known: {', '.join(list_suites()) or 'none'})")


def list_suites() -> list[str]:
    return sorted({f.stem for d in suite_dirs() for f in _suite_files(d)})


def shadowed(path: Path) -> Path | None:
    """The shipped suite that a suite file of the same name hides, or None: a ./suites or
    COMMBENCH_SUITES file comes first, so `quick` may not be the quick that ships."""
    shipped = PACKAGE_SUITES / f"{path.stem}.toml"
    return shipped if shipped.is_file() and Path(path).resolve() != shipped.resolve() else None


def suite_source(name: str) -> tuple[Path, Path | None]:
    """The file a suite name resolves to, and the shipped suite it hides (a name looked up,
    not a path given: a path names its own file)."""
    path = find_suite(name)
    looked_up = Path(name).suffix != ".toml" and Path(name).name == name
    return path, shadowed(path) if looked_up else None


def suite_origins() -> dict[str, tuple[Path, Path | None]]:
    """Every suite name with the file it resolves to (the first match, as find_suite looks)
    and the shipped suite that file hides."""
    first: dict[str, Path] = {}
    for d in suite_dirs():
        for f in _suite_files(d):
            first.setdefault(f.stem, f)
    return {n: (f, shadowed(f)) for n, f in sorted(first.items())}


def read_suite(name: str | None) -> dict:
    if name is None:
        return {"name": "adhoc"}
    path = find_suite(name)
    try:
        raw = tomllib.loads(read_user_text(path, "suite"))  # a regular file within a bound
    except UnicodeDecodeError:
        raise UsageError(f"suite {path}: not a text (UTF-8 TOML) file") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"suite {path}: malformed TOML: {e}") from None
    except OSError as e:
        raise UsageError(f"suite {path}: {e.strerror}") from None
    raw["name"] = path.stem
    return raw


def build_config(raw: dict, overrides: dict | None = None, param_args: list[str] | None = None) -> SuiteConfig:
    """Validate a suite table (keys as in the file); CLI overrides (by field name) win over
    its fields; override params, and --param words (param_args, read once the benchmarks
    are known), are merged into the suite's per benchmark."""
    raw = dict(raw)
    name = raw.pop("name", "adhoc")
    keyed = _keyed_fields()
    unknown = sorted(set(raw) - set(keyed))
    if unknown:
        raise UsageError(f"suite {name}: unknown key {unknown[0]!r} (known: {', '.join(keyed)})")
    overrides = overrides or {}
    kw = {"name": name}
    for key, f in keyed.items():
        value = overrides.get(f.name) if f.name != "params" else None
        if value is None and key in raw:
            value = raw[key]
        if value is not None:
            kw[f.name] = f.metadata["check"](value, key, name)
    params = kw.setdefault("params", {})
    given = parse_params(param_args, kw["benchmarks"]) if param_args and kw.get("benchmarks") else {}
    for bench, kv in [*(overrides.get("params") or {}).items(), *given.items()]:
        params.setdefault(bench, {}).update(kv)
    cfg = SuiteConfig(**kw)

    of_config(cfg)  # its variants: known, unique, non-empty names
    check_baseline(cfg)
    if not cfg.benchmarks:
        raise UsageError(f"suite {name}: no benchmarks to run (set 'benchmarks' or pass -b)")
    if cfg.min_iters > cfg.max_iters:
        raise UsageError(f"suite {name}: min_iters {cfg.min_iters} > max_iters {cfg.max_iters}")
    return cfg


def saved_table(saved: dict) -> dict:
    """A config as a run saved it (dataclass fields: meta.json's `config`, a spec's) back
    into a suite table, for build_config to check as it checks a new run's: a hand-edited or
    truncated meta.json is refused in one line, never taken as it stands."""
    if not isinstance(saved, dict) or not saved:
        raise UsageError("the run's meta.json holds no config")
    raw = {key: saved[f.name] for key, f in _keyed_fields().items() if saved.get(f.name) is not None}
    sizes = raw.get("sizes")
    if isinstance(sizes, dict) and set(sizes) == {"nbytes", "from_range"} and isinstance(sizes["nbytes"], list) \
            and isinstance(sizes["from_range"], bool):
        raw["sizes"] = Sizes(tuple(sizes["nbytes"]), sizes["from_range"])
    raw["name"] = saved.get("name") or "adhoc"
    if isinstance(raw.get("variant"), dict):
        # Saved as the variants' fields, their name among them, which a suite file gives as
        # the table's name: dropped where it is that name (another name stays, and is refused).
        raw["variant"] = {n: {k: x for k, x in d.items() if (k, x) != ("name", n)} if isinstance(d, dict) else d
                          for n, d in raw["variant"].items()}
    return raw


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_params(items: list[str], benchmarks: tuple) -> dict:
    """--param tokens=128,4096 (every benchmark that has it) or --param moe.tokens=128."""

    out: dict[str, dict] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--param {item!r}: use [BENCH.]KEY=VALUE")
        key, val = item.split("=", 1)
        values = [_value(v.strip()) for v in val.split(",") if v.strip()]
        if not values:
            raise UsageError(f"--param {item!r}: no value")
        value = values if len(values) > 1 else values[0]
        if "." in key:
            bench, key = key.split(".", 1)
            targets = [bench]
        else:
            targets = [b for b in benchmarks if key in get(b).params]
            if not targets:
                raise UsageError(f"--param {key}: no benchmark of this run has that parameter")
        for b in targets:
            out.setdefault(b, {})[key] = value
    return out


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


def placements_of(cfg: SuiteConfig) -> tuple[bool, ...]:
    """The in-place settings the sweep measures (False: out of place), from the placement
    key, or in_place (its shorthand) when placement is not given."""
    if cfg.placement is None:
        return (bool(cfg.in_place),)
    if cfg.in_place and cfg.placement != "in-place":
        raise UsageError(f"suite {cfg.name}: in_place = true and placement = {cfg.placement} disagree (in_place is "
                         f"placement = in-place)")
    return {"out-of-place": (False,), "in-place": (True,), "both": (False, True)}[cfg.placement]


def expand(cfg: SuiteConfig, launched: int, backend_dtypes: tuple) -> tuple[list, list[str]]:
    """Every point of the sweep, and notes on sizes dropped or rounded. Raises UsageError
    for a sweep that cannot run, before anything is communicated."""

    benches = [get(b) for b in cfg.benchmarks]
    for d in cfg.dtypes:
        if d not in backend_dtypes:
            raise UsageError(f"dtype {d} is not supported by this backend (it has: {', '.join(backend_dtypes)})")
    sizes = cfg.sizes.nbytes
    worlds = resolve_worlds(cfg, launched)
    placements = placements_of(cfg)
    points, notes, seen = [], [], set()
    for world in worlds:
        for bench in benches:
            if bench.whole_world_only and cfg.worlds is None and world != worlds[-1]:
                continue  # a part of the launch's ranks is not what it measures
            if world < bench.min_world or (bench.even_world and world % 2):
                need = "an even world" if bench.even_world else f">= {bench.min_world} ranks"
                if cfg.worlds is not None:  # asked for by name: say why it cannot run
                    raise UsageError(f"{bench.name} needs {need}, got world {world}")
                notes.append(f"{bench.name}: world {world} skipped (needs {need})")
                continue
            for params in _param_grid(bench, cfg.params.get(bench.name, {})):
                for dtype in cfg.dtypes if bench.sized else cfg.dtypes[:1]:
                    for nbytes in _sizes_for(bench, world, dtype, params, sizes, cfg, notes) if bench.sized else [0]:
                        # A placement axis only where the benchmark has the choice.
                        for in_place in placements if bench.placement_axis else (placements[-1],):
                            p = Point(bench.name, world, dtype, nbytes, params, in_place=in_place)
                            # A value given twice (--dtypes float32,float32) is one point: measured
                            # twice it would leave a run whose rows no reader can choose between.
                            key = (bench.name, world, dtype, nbytes, json.dumps(params, sort_keys=True, default=str),
                                   in_place)
                            if key in seen:
                                continue
                            seen.add(key)
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
