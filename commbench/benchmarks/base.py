"""The plug-in contract every benchmark follows (nccl-tests' four functions, in Python).

A benchmark never imports torch or mpi4py: it works through the communicator (`comm`)
that its backend hands it, whose collective methods return prepared zero-argument
operations.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from commbench.core.errors import UsageError
from commbench.core.units import DTYPE_NBYTES

# Largest integer each dtype holds exactly: check data stays below it so results compare exactly.
EXACT_INT_LIMIT = {"float32": 1 << 24, "bfloat16": 256, "float16": 2048, "int32": 1 << 31,
                   "float64": 1 << 53, "uint8": 255}


@dataclass(frozen=True)
class Param:
    """A benchmark parameter a suite or `--param` may set; a list value makes it a sweep axis."""

    default: Any
    help: str
    kind: type = int
    choices: tuple = ()
    minimum: float | None = None

    def coerce(self, bench: str, key: str, value):
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if self.kind is int and isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if self.kind is float and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if self.kind is bool and isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            value = value.lower() in ("true", "1")
        if not isinstance(value, self.kind) or (self.kind is int and isinstance(value, bool)):
            raise UsageError(f"{bench}: param {key} must be {self.kind.__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise UsageError(f"{bench}: param {key}={value!r} is not one of {', '.join(map(str, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{bench}: param {key}={value!r} must be >= {self.minimum}")
        return value


@dataclass(frozen=True)
class Traffic:
    """What one operation moves: S as docs/collectives.md#algbw-and-busbw defines it for this benchmark, and F."""

    nbytes: int
    busbw_factor: float


@dataclass
class Point:
    """One measured point of a sweep."""

    benchmark: str
    world: int
    dtype: str
    nbytes: int
    params: dict = field(default_factory=dict)
    in_place: bool = False  # nccl-tests' in-place column, where the benchmark has the choice

    @property
    def elem_nbytes(self) -> int:
        return DTYPE_NBYTES[self.dtype]

    def key(self) -> tuple:
        return (self.benchmark, self.world, self.dtype, self.nbytes, tuple(sorted(self.params.items())),
                self.in_place)


class Benchmark:
    """Base class. Subclasses set `name` and implement setup/fill/op/check/traffic."""

    name: str = ""
    params: dict[str, Param] = {}
    sized: bool = True  # False: one point per world, nbytes 0 (barrier)
    checks: bool = True  # False: nothing to verify (barrier); rows say check=skipped
    min_world: int = 1
    even_world: bool = False
    # Measured on the largest world of the launch only, unless the suite names its worlds
    # (pairs: a smaller world would be a part of the cluster's matrix).
    whole_world_only: bool = False
    host_only_on: tuple = ()  # backends on which it works on host memory: refused there with GPU buffers

    def refusal(self, backend: str, device: str, params: dict) -> str | None:
        """Why this backend cannot run the benchmark with these params (the suite's table,
        values or sweep lists), said before any rank starts; None when it can."""
        return None

    def nodes_refusal(self, point: Point, node_count: int | None) -> str | None:
        """Why this point cannot run on its ranks spread over `node_count` nodes, said where
        the node count is first known: at the launcher from --np and --ranks-per-node, else
        on every rank once hostnames group them, before anything is measured (None: not
        known). None when it can."""
        return None

    def skip_reason(self, comm, point: Point) -> str | None:
        """Why this point cannot run on this comm (its backend, device, node count), asked
        on every rank before setup; the point is then skipped and the run goes on. Every
        rank must give the same answer. None: it runs."""
        return None

    def unit_nbytes(self, world: int, elem_nbytes: int, params: dict) -> int:
        """Granularity of S: a size must be a multiple of this to split evenly."""
        return elem_nbytes

    def canonical_params(self, params: dict) -> dict:
        """Params with those that do not apply reset to defaults, so a cartesian sweep
        does not measure the same point twice."""
        return params

    stages = 1  # timed rows per point (moe: dispatch and combine)

    def memory_nbytes(self, point: Point) -> int:
        """Bytes of buffers one rank holds for this point (send + receive by default)."""
        return 2 * point.nbytes

    def max_count(self, point: Point) -> int:
        """The largest count (elements, or bytes for byte buffers) one call passes the
        library: MPI takes C ints there unless it has MPI-4 large-count calls."""
        return point.nbytes // point.elem_nbytes

    def plan_nbytes(self, point: Point) -> int:
        """Bytes one operation moves per rank, for --dry-run's rough time."""
        t = self.traffic(point)
        return int(t.nbytes * max(t.busbw_factor, 1.0))

    def validate(self, point: Point) -> None:
        """Raise UsageError for a point that cannot run (called before any rank communicates)."""

    def setup(self, comm, point: Point) -> Any:
        """Allocate once per point; returns the buffers object passed to the others."""
        raise NotImplementedError

    def fill(self, comm, bufs) -> None:
        """Write fresh verifiable data."""

    def op(self, comm, bufs) -> Callable[[], None]:
        """A prepared callable that runs ONE operation."""
        raise NotImplementedError

    def check(self, comm, bufs) -> bool:
        """After fill + one op: does this rank hold exactly the expected result?"""
        return True

    # Can the run choose the placement (suite key placement: out-of-place, in-place, both)?
    # Only then is placement a sweep axis of this benchmark's points.
    placement_axis = False

    def placement(self, comm, point: Point) -> str | None:
        """in-place or out-of-place, as nccl-tests' two columns (None: not a collective with
        buffers); rows say it, and it is part of the point key."""
        return None

    def busbw_factor(self, world: int) -> float:
        """F of docs/collectives.md#algbw-and-busbw: busbw = algbw x F. The one place each benchmark's factor
        lives; importers and the what-if model ask the registry for it."""
        raise NotImplementedError

    def traffic(self, point: Point) -> Traffic:
        """What one operation moves: S (the point's size; none for an unsized benchmark) and F."""
        return Traffic(point.nbytes if self.sized else 0, self.busbw_factor(point.world))

    def measure(self, harness, comm, point: Point, bufs) -> list[dict]:
        """Time the point; returns row fragments. Most benchmarks keep the harness default;
        a multi-stage one (MoE dispatch/combine) times each stage."""
        return [harness.time_op(comm, point, self.op(comm, bufs), self.traffic(point))]

    # --- ceiling hooks ----------------------------------------------------------------
    # How ceilings.ceiling_for_row judges this benchmark's rows against a hardware
    # profile. A row of a benchmark the registry does not know (an imported gather) is
    # judged by these defaults: ring-like traffic of S x the row's busbw_factor.

    inswitch_applies = True  # False: a variant named nvls, sharp, ... moves the same bytes (no reduction to offload)

    def latency_only(self, row: dict) -> bool:
        """No bytes to compare with a link rate: the row is judged by the latency floor."""
        return float(row.get("nbytes") or 0) <= 0

    def tier_nbytes(self, row: dict, world: int, domains: list, inswitch: bool) -> tuple[float, float]:
        """Bytes the most loaded rank moves per direction on (scale-up, scale-out) links in
        one operation of `row`, its `world` ranks in the scale-up `domains` (one entry a
        rank). One NIC per GPU is assumed. Ring-like: S x F in all (in-switch, S (n+1)/n:
        each rank sends S once and receives the result once); across domains each channel
        crosses a domain boundary once and the channels spread over the domain's G NICs,
        so a NIC carries 1/G of it."""
        nbytes = float(row.get("nbytes") or 0)
        total = nbytes * (world + 1) / world if inswitch else nbytes * float(row.get("busbw_factor") or 0.0)
        g_min, g_max = domain_sizes(domains)
        if g_min == len(domains):  # one domain: every byte rides the scale-up links
            return total, 0.0
        return total * (g_max - 1) / g_max, total / g_min

    def busbw_is_link_rate(self, scaleup_nbytes: float, scaleout_nbytes: float) -> bool:
        """Is the row's busbw (algbw (n+1)/n in-switch) what its bottleneck link carries, so
        the ceiling compares it directly? Yes when one tier carries every byte (one domain,
        or one rank per domain); otherwise the ceiling compares each tier's bytes over the
        row's time."""
        return scaleup_nbytes <= 0 or scaleout_nbytes <= 0

    def tier_note(self, nodes: list, domains: list) -> str | None:
        """A caveat on the ceiling of a row whose ranks span several scale-up domains."""
        return None

    # --- presentation --------------------------------------------------------------------
    # How `commbench report`, report.md/report.html, the figures and the analysis tables show
    # this benchmark's rows. The tables, figures and report sections are a view of the report
    # layer, named here and registered there (commbench.report.views.register_view): the
    # generic collective view (a latency/busbw table by size, busbw and latency figures) by
    # default. Rows that no registered benchmark claims (an imported nccl-tests gather) get
    # the defaults through for_rows().

    view: str = "collective"
    # Each row times one operation moving S bytes, so busbw, alpha-beta fits, variant and
    # in-switch comparisons and busbw scaling apply.
    collective_rows: bool = True
    # S and F in words (docs/collectives.md#algbw-and-busbw), shown under the generic table.
    formula: str = ""

    def describe(self, params: dict) -> str:
        """A point's params in a table cell or a legend."""
        return " ".join(f"{k}={v}" for k, v in params.items())

    def scaling_metric(self, rows) -> tuple | None:
        """Weak scaling's per-rank throughput: (metric name, one value per row of the
        DataFrame rows). None: busbw_gbps when collective_rows. Groups keep nbytes in their
        key only when `sized` (an unsized benchmark's bytes follow from its params and
        world, so they grow with it)."""
        return None


def domain_sizes(domains: list) -> tuple[int, int]:
    """The fewest and the most ranks in one scale-up domain (`domains`: one entry a rank)."""
    sizes = [list(domains).count(d) for d in set(domains)]
    return min(sizes), max(sizes)


def pattern_at(idx, rank, dtype: str, world: int, reduce: bool, salt: int = 0) -> np.ndarray:
    """Integer-valued check data at element positions `idx` of rank `rank` (both may be
    arrays): it identifies rank and position, and stays small enough that a sum over
    `world` ranks is exact in `dtype` (bfloat16 holds integers only up to 256)."""
    limit = EXACT_INT_LIMIT[dtype]
    modulus = max(2, min(251, (limit // max(world, 1)) if reduce else limit))
    return ((np.asarray(idx, dtype=np.int64) * 7 + np.asarray(rank, dtype=np.int64) * 13 + salt)
            % modulus).astype(np.float64)


def pattern(count: int, rank: int, dtype: str, world: int, reduce: bool, salt: int = 0) -> np.ndarray:
    return pattern_run(0, count, rank, dtype, world, reduce, salt)


def pattern_run(start: int, count: int, rank: int, dtype: str, world: int, reduce: bool, salt: int = 0) -> np.ndarray:
    """pattern_at over positions start..start+count-1, by repeating one period (the values
    repeat every `modulus` positions): memory-speed, where the modular arithmetic per
    element costs ~5 ns, 2.5 s per pass over a 2 GiB float32 buffer."""
    limit = EXACT_INT_LIMIT[dtype]
    modulus = max(2, min(251, (limit // max(world, 1)) if reduce else limit))
    period = pattern_at(np.arange(start, start + min(modulus, count), dtype=np.int64), rank, dtype, world, reduce, salt)
    return np.resize(period, count) if count > period.size else period


# Fill and check walk a buffer in chunks of this many elements, so the float64 expected
# values and their temporaries cost tens of MiB, not several times the message (a 2 GiB float32
# buffer would need 4 GiB of float64 expectations at once, and twice that in temporaries).
CHUNK_ELEMS = 1 << 20


def fill_chunked(comm, buf, count: int, values_at) -> None:
    """buf[lo:hi] = values_at(lo, hi), chunk by chunk."""
    for lo in range(0, count, CHUNK_ELEMS):
        hi = min(lo + CHUNK_ELEMS, count)
        comm.fill(buf[lo:hi], values_at(lo, hi))


def equal_chunked(comm, buf, count: int, values_at) -> bool:
    """Does buf hold exactly values_at(lo, hi) everywhere? Chunk by chunk."""
    for lo in range(0, count, CHUNK_ELEMS):
        hi = min(lo + CHUNK_ELEMS, count)
        if not np.array_equal(comm.to_numpy(buf[lo:hi]), values_at(lo, hi)):
            return False
    return True


_REGISTRY: dict[str, Benchmark] = {}


def register(cls):
    """Class decorator: add a benchmark to the registry; duplicate names are refused."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY:
        raise ValueError(f"benchmark {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def registry() -> dict[str, Benchmark]:
    """Every registered benchmark. The built-in ones registered when this package was
    imported (benchmarks/__init__.py); out-of-tree ones are imported here."""
    import importlib
    import os

    # Out-of-tree benchmarks: COMMBENCH_PLUGINS=pkg.module,other.module registers them too.
    for mod in filter(None, os.environ.get("COMMBENCH_PLUGINS", "").split(",")):
        try:
            importlib.import_module(mod.strip())
        except ImportError as e:
            raise UsageError(f"COMMBENCH_PLUGINS: cannot import {mod!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 (a plug-in's own bug, a syntax error: named, in one line)
            raise UsageError(f"COMMBENCH_PLUGINS: plug-in {mod.strip()!r} failed to load: "
                             f"{type(e).__name__}: {e}") from e
    return dict(_REGISTRY)


def get(name: str) -> Benchmark:
    reg = registry()
    if name not in reg:
        raise UsageError(f"unknown benchmark {name!r} (known: {', '.join(sorted(reg))})")
    return reg[name]


def for_rows(name: str) -> Benchmark:
    """The benchmark whose presentation shows rows named `name`: the registered one,
    else the generic defaults (rows imported from a tool's benchmark commbench lacks)."""
    return registry().get(name) or Benchmark()
