"""The row schema: its version and fields, the key that identifies a point, a row's params
and placement, the migrations from older versions, and what a row's time cannot be. Every
layer reads rows; store/results.py writes and reads them through these."""
from __future__ import annotations

import json
import math

from commbench.core.errors import UsageError

# Versions of the row format (pyperf/asv keep theirs the same way: a number and a
# migration per step, applied on read, so old run directories keep loading):
#   1: `timing` held the clock (host_clock, cuda_event, ...).
#   2: `timing` is the method (back_to_back | barrier); the clock moved to `clock`.
#   3: `placement` (in-place | out-of-place) on collective rows, in the point key; an
#      imported nccl-tests in-place half is variant default with placement in-place (it
#      was variant "in-place").
SCHEMA_VERSION = 3

# The row schema: name -> what it holds. Benchmarks add their own fields after these
# (moe's stage times, overlap's t_comm ...); these are what every row has.
ROW_SCHEMA: dict[str, str] = {
    "schema": "row format version (SCHEMA_VERSION)",
    "point_key": "what identifies the point in its run (point_key()); the rows of one point (one per stage) share it",
    "benchmark": "benchmark name (the registry's)",
    "backend": "mpi, gloo, nccl, or the tool an imported row came from",
    "device": "cpu or cuda",
    "world": "ranks taking part",
    "nbytes": "S, bytes as the benchmark defines it (docs/collectives.md#algbw-and-busbw)",
    "dtype": "element type",
    "variant": "algorithm variant (default: the library's own choice)",
    "placement": "in-place (the output buffer is the input) or out-of-place, as nccl-tests' two columns; "
                 "None where it does not apply",
    "params": "benchmark parameters (a dict)",
    "stage": "timed stage of a multi-stage benchmark ('' for one)",
    "iters": "timed iterations",
    "warmup": "untimed iterations before them",
    "timing": "back_to_back (nccl-tests) or barrier (OSU); imported for imports",
    "clock": "what took the time: host_clock, host_clock_compiled_loop, cuda_event, cuda_event_held, cuda_graph, "
             "jax_compiled_loop; imports: host_clock_loop_mean or cpu_time (nccl-tests), host_clock (OSU)",
    "time_us_min": "fastest sample, us",
    "time_us_p50": "median sample, us (the slowest rank per iteration)",
    "time_us_mean": "mean sample, us",
    "time_us_p90": "90th percentile, us",
    "time_us_p99": "99th percentile, us",
    "time_us_max": "slowest sample, us",
    "time_us_std": "standard deviation of the samples, us",
    "algbw_gbps": "S / p50, GB/s (1e9 B/s)",
    "busbw_gbps": "algbw x the benchmark's busbw factor, GB/s",
    "busbw_factor": "F of docs/collectives.md#algbw-and-busbw",
    "check": "ok, fail or skipped",
}
ROW_FIELDS = tuple(ROW_SCHEMA)
# Fields a row carries only where they apply. A row without one (every row written before it
# existed) reads as it is, absent meaning "not so": no version step, no migration.
OPTIONAL_ROW_SCHEMA: dict[str, str] = {
    "planted_delay_pct": "the regression gate's test hook (run/plant.py) slowed this point on purpose, by this "
                         "share of its operation's median time: not a measurement of the code",
    "routed_nbytes": "moe low-latency: the routed rows' bytes of the rank that sends the most (its own included)",
    "sent_nbytes": "moe low-latency: the bytes that rank's exchange sends (routed rows, count headers, any padding)",
    "padding_factor": "moe low-latency: sent_nbytes / routed_nbytes (1.0: only the routed rows travel)",
    "launch": "the id of the launch that measured the row ('<pid>-<ns since the epoch>' of its start): repeats "
              "with different ids ran in fresh processes; absent on imports and older rows",
}


def point_key(benchmark: str, world: int, nbytes: int, dtype: str, params: dict, variant: str = "default",
              placement: str | None = None) -> str:
    """What identifies a point across a run, its variants, its resumption and its imports."""
    key = f"{variant}|{benchmark}|{int(world)}|{int(nbytes)}|{dtype}|{json.dumps(params or {}, sort_keys=True)}"
    return f"{key}|{placement}" if placement else key


# What identifies a row in its run: its point and, for a benchmark measured in stages (moe's
# dispatch and combine), the stage. A point is measured once and its rows are written
# together, so --resume counts a point done by its point_key; readers find a row twice by both.
ROW_KEY = ("point_key", "stage")


def row_key(row: dict) -> tuple:
    return row.get("point_key"), row.get("stage") or ""


def params_dict(value) -> dict:
    """A row's params as a dict: older writers and CSV files hold a JSON string."""
    if isinstance(value, dict):
        return value
    if value is None or (isinstance(value, float) and value != value) or value == "":
        return {}
    if isinstance(value, str):
        try:
            out = json.loads(value)
        except ValueError:
            out = None
        if isinstance(out, dict):
            return out

    raise UsageError(f"params {value!r} is not a JSON object")


def _migrate_1(row: dict) -> dict:
    if "clock" not in row:
        row["clock"], row["timing"] = row.get("timing"), "back_to_back"
    return row


# Collectives that nccl-tests (and commbench) run in place or out of place.
_PLACED = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv", "gather",
           "scatter", "reduce", "all_gatherv", "all_to_allv")


def placement_of(benchmark: str, in_place: bool = False) -> str | None:
    """A collective's placement label (None: not such a collective)."""
    if benchmark not in _PLACED:
        return None
    return "in-place" if in_place else "out-of-place"


def _migrate_2(row: dict) -> dict:
    bench, variant = row.get("benchmark"), row.get("variant") or "default"
    if row.get("source"):  # imported: nccl-tests' in-place half was the variant
        row["placement"] = placement_of(bench, in_place=variant == "in-place")
        if variant == "in-place":
            row["variant"] = "default"
    else:  # a broadcast has one buffer; torch.distributed reduced in place
        row["placement"] = placement_of(bench, in_place=bench == "broadcast" or (
            bench == "all_reduce" and row.get("backend") in ("gloo", "nccl")))
    row["point_key"] = None  # rebuilt with the placement
    return row


_MIGRATIONS = {1: _migrate_1, 2: _migrate_2}


def normalize_row(row: dict) -> dict:
    """Bring a row read from disk to SCHEMA_VERSION (in place) and its params to a dict."""
    v = int(row.get("schema") or 1)
    while v < SCHEMA_VERSION:
        row = _MIGRATIONS[v](row)
        v += 1
    row["schema"] = max(v, int(row.get("schema") or 1))
    row["params"] = params_dict(row.get("params"))
    row.setdefault("variant", "default")
    if not row.get("point_key") and {"benchmark", "world", "nbytes", "dtype"} <= set(row):
        row["point_key"] = point_key(row["benchmark"], row["world"], row["nbytes"], row["dtype"], row["params"],
                                     row["variant"], row.get("placement"))
    return row


def time_cannot_be(row: dict) -> bool:
    """A p50 that no measurement gives: 0, negative, NaN, inf or not a number at all. Such a
    row (a hand-edited file, a broken import, a clock that went backwards) would compare as
    "-100 %" or divide by zero; readers leave it out and say so."""
    v = row.get("time_us_p50")
    try:
        v = float(v)
    except (TypeError, ValueError):
        return True
    return not (v > 0 and math.isfinite(v))


def per_params(fn):
    """fn(params) computed once per distinct params (a dict or its JSON text): a run of 300k
    rows has a few hundred. The key holds each value's type, so 1 and 1.0 stay apart."""
    seen: dict = {}

    def call(params):
        try:
            key = tuple(sorted((k, type(v), v) for k, v in params.items())) if isinstance(params, dict) else params
            hash(key)
        except TypeError:
            return fn(params)
        if key not in seen:
            seen[key] = fn(params)
        return seen[key]
    return call


def has(v) -> bool:
    """Is there a value (not None, NaN or "")?"""
    try:
        return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) != ""
    except TypeError:
        return True
