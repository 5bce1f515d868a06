"""OSU micro-benchmarks collective stdout (osu_allreduce, osu_alltoall, ... and the
non-blocking osu_i* tests), read by its column titles (-f adds min/max, newer versions
P50/P90/P99 and Validation).

OSU does not print the rank count, so --world gives it. Its size is what one rank sends
to one peer for allgather and alltoall, so nbytes = size x world there (commbench's S; the
file's size is kept as `tool_nbytes`). The time is OSU's average over iterations and
ranks. A non-blocking test becomes an `overlap` row (Overall, Compute, Pure Comm.)."""
from __future__ import annotations

import math
import re

from commbench.core.errors import UsageError
from commbench.core.stats import bandwidths_gbps
from .rows import benchmark_name, busbw_factor, err, fnum, make_row, run_meta
from commbench.benchmarks.overlap import overlap_imb_pct

_MPI_DTYPES = {"MPI_CHAR": "uint8", "MPI_BYTE": "uint8", "MPI_SIGNED_CHAR": "int8", "MPI_UNSIGNED_CHAR": "uint8",
               "MPI_INT": "int32", "MPI_FLOAT": "float32", "MPI_DOUBLE": "float64", "MPI_LONG": "int64",
               "MPI_UNSIGNED": "uint32"}
# OSU's default datatype (before OMB printed a Datatype line): float for reductions, char otherwise.
_OSU_REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter")
# OSU's size is what one rank sends to one peer (allgather: its contribution; alltoall: the
# per-peer chunk); commbench's S is the whole output / everything a rank sends.
_OSU_PER_PEER = ("all_gather", "all_to_all", "all_gatherv", "all_to_allv", "gather", "scatter")


OSU_TITLE_RE = re.compile(r"^#\s*OSU\s+(\S+)\s+(.*?)\s+Latency Test(?:\s+v?(\S+))?\s*$")


def _osu_columns(body: str) -> list[str]:
    """'Size           Avg Latency(us)   Min Latency(us)' -> column labels (2+ spaces apart)."""
    return [c for c in re.split(r"\s{2,}", body.strip()) if c]


def _osu_key(label: str) -> str:
    low = label.lower().replace(" ", "")
    for key, pat in (("size", "size"), ("avg", "avglatency"), ("min", "minlatency"), ("max", "maxlatency"),
                     ("iters", "iterations"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"),
                     ("overall", "overall"), ("compute", "compute"), ("init", "coll.init"),
                     ("test", "mpi_test"), ("wait", "mpi_wait"), ("pure", "purecomm"), ("overlap", "overlap"),
                     ("validation", "validation"), ("avg", "latency")):
        if low.startswith(pat):
            return key
    return low


class _OsuTable:
    def __init__(self, line, lib, title, version):
        self.line, self.lib, self.title, self.version = line, lib, title, version
        self.cols = None
        self.dtype = None
        self.data: list[tuple[int, dict]] = []


def parse_osu(path, text: str, world=None, benchmark=None) -> tuple[list[dict], dict]:
    lines = text.splitlines()
    tables: list[_OsuTable] = []
    cur = None
    for i, raw in enumerate(lines, 1):
        s = raw.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = OSU_TITLE_RE.match(s)
            if m:
                cur = _OsuTable(i, m.group(1), m.group(2), m.group(3))
                tables.append(cur)
                continue
            body = s.lstrip("#").strip()
            if cur is None:
                continue
            m = re.match(r"Datatype:\s*(\w+)", body)
            if m:
                cur.dtype = m.group(1)
                continue
            low = body.lower()
            if cur.cols is None and (low.startswith("size") or low.startswith("avg latency")):
                cur.cols = [_osu_key(c) for c in _osu_columns(body)]
            continue
        if cur is None or cur.cols is None:
            continue  # launcher noise before a table
        toks = s.split()
        if not re.match(r"^[-+]?\d", toks[0]):
            # Noise after a table ends it; inside a table (data lines follow) it is an error.
            nxt = next((l.strip() for l in lines[i:] if l.strip()), "")
            if cur.data and (not nxt or nxt.startswith("#") or not re.match(r"^[-+]?\d", nxt)):
                cur = None
                continue
            raise err(path, i, f"not an OSU data line: {s[:60]!r}")
        if len(toks) != len(cur.cols):
            raise err(path, i, f"malformed OSU data line: expected {len(cur.cols)} fields "
                                f"({', '.join(cur.cols)}), got {len(toks)}: {s[:60]!r}")
        vals = {}
        for col, tok in zip(cur.cols, toks):
            if col == "validation":
                vals[col] = tok
                continue
            try:
                vals[col] = fnum(tok)
            except ValueError:
                raise err(path, i, f"malformed OSU data line: {col} {tok!r} is not a number") from None
        cur.data.append((i, vals))
    if not tables:
        raise err(path, 1, f"no '# OSU ... Latency Test' title line in {len(lines)} lines: not OSU collective "
                            f"output")
    for t in tables:
        if t.cols is None:
            raise err(path, t.line, "OSU title without a column header after it: truncated output?")
        if not t.data:
            raise err(path, len(lines), f"OSU table of line {t.line} has no data lines: truncated output?")
    if world is None:
        raise err(path, tables[0].line, "OSU output does not carry the rank count: pass --world N")
    n = int(world)
    if n < 1:
        raise UsageError(f"{path}: --world must be >= 1, got {world}")
    rows, notes = [], []
    device = "cpu"
    for t in tables:
        title = t.title
        nonblocking = bool(re.match(r"non-?blocking\s+", title, re.IGNORECASE))
        coll_title = re.sub(r"^non-?blocking\s+", "", title, flags=re.IGNORECASE)
        name = benchmark or benchmark_name(coll_title)
        if name is None:
            raise err(path, t.line, f"OSU test {title!r} is not a collective commbench knows "
                                     f"(known: Allreduce, Allgather, Alltoall, Reduce_scatter, Broadcast, Barrier, "
                                     f"Reduce, Gather, Scatter)")
        lib = t.lib.upper()
        dev = "cuda" if "CUDA" in lib or lib in ("NCCL", "XCCL") else ("rocm" if "ROCM" in lib else "cpu")
        device = dev
        backend = "nccl" if lib in ("NCCL", "XCCL") else "mpi"
        dtype = _MPI_DTYPES.get(t.dtype or "", None) or (t.dtype.lower() if t.dtype else None) or \
            ("float32" if name in _OSU_REDUCTIONS else "uint8")
        per_peer = name in _OSU_PER_PEER
        for lineno, v in t.data:
            _check_line(path, lineno, v)
            size = int(v.get("size") or 0)
            nbytes = size * n if per_peer else size
            if name != "barrier" and nbytes <= 0:
                continue
            check = "skipped"
            if "validation" in v:
                check = "ok" if str(v["validation"]).lower().startswith("pass") else "fail"
            extra = {"tool_nbytes": size, "source_line": lineno}
            if "min" in v:
                extra["osu_min_us"], extra["osu_max_us"] = v.get("min"), v.get("max")
            if "p50" in v:
                extra["iter_p50_us"] = v["p50"]
            if nonblocking:
                overall, compute, pure = v.get("overall"), v.get("compute"), v.get("pure")
                if overall is None or pure is None:
                    raise err(path, lineno, "non-blocking OSU line lacks Overall(us) or Pure Comm.(us)")
                extra.update(_overlap_fields(pure, compute, overall, v.get("overlap")))
                extra.update(mode="single", bandwidth_note="algbw/busbw: the pure collective (Pure Comm.(us), "
                                                           "S = the message); time_us_*: Overall(us)")
                f = busbw_factor(name, n)
                algbw, busbw = bandwidths_gbps(nbytes, pure, f)
                row = make_row(
                    bench="overlap", backend=backend, device=dev, world=n, nbytes=nbytes, dtype=dtype,
                    params={"mode": "single", "collective": name}, iters=v.get("iters"), clock="host_clock",
                    mean_us=overall, algbw=algbw, busbw=busbw, check=check,
                    source="OSU stdout (time = Overall(us), a mean; all percentiles = the mean; overlap_imb_pct "
                           "computed from Overall/Compute/Pure Comm.; compute_slowdown: OSU does not time the "
                           "compute alone)",
                    spread="none", extra=extra)
                row["busbw_factor"] = f
                rows.append(row)
                continue
            avg = v.get("avg")
            if avg is None:
                raise err(path, lineno, "OSU line lacks Avg Latency(us)")
            stats = {}
            if "p90" in v:
                stats["time_us_p90"] = v["p90"]
            if "p99" in v:
                stats["time_us_p99"] = v["p99"]
            note = ("P90/P99 columns give p90/p99; min = the mean, max = p99" if stats else
                    "all percentiles = the mean: OSU prints an average")
            if "min" in v:
                note += "; osu_min_us/osu_max_us are OSU's min/max over ranks of the average, not per iteration"
            rows.append(make_row(
                bench=name, backend=backend, device=dev, world=n, nbytes=nbytes, dtype=dtype,
                iters=v.get("iters"), clock="host_clock", mean_us=avg, stats=stats, check=check,
                source=f"OSU stdout ({note})", spread="none", extra=extra))
        if per_peer:
            notes.append(f"{title}: OSU size is per peer; nbytes = size x {n} (commbench S)")
    versions = {"osu": tables[0].version} if tables[0].version else {}
    meta = run_meta("osu", path, rows, [], [], n, rows[0]["backend"] if rows else "mpi", device, versions, {},
                 notes=notes, extra={"tool": {"name": "OSU micro-benchmarks", "version": tables[0].version,
                                              "tests": [t.title for t in tables]}})
    return rows, meta


# No message is larger than this (1 PiB): a bigger size is a corrupt line, not a result.
MAX_SIZE = 1 << 50
_TIME_COLUMNS = {"avg": "Avg Latency(us)", "min": "Min Latency(us)", "max": "Max Latency(us)", "p50": "P50",
                 "p90": "P90", "p99": "P99", "overall": "Overall(us)", "pure": "Pure Comm.(us)",
                 "compute": "Compute(us)"}


def _check_line(path, lineno, v: dict) -> None:
    """Refuse, with file:line, a line no run could print: a negative, fractional or absurd
    size, a time that is not a positive finite number."""
    size = v.get("size")
    if size is None or not math.isfinite(size) or size < 0 or size != int(size) or size > MAX_SIZE:
        raise err(path, lineno, f"OSU size {size!r} is not a byte count (0 to 2^50)")
    for col, label in _TIME_COLUMNS.items():
        x = v.get(col)
        if x is not None and not (math.isfinite(x) and x > 0):
            raise err(path, lineno, f"OSU {label} {x!r} is not a positive finite time")


def _overlap_fields(pure: float, compute: float | None, overall: float, osu_pct: float | None) -> dict:
    """The overlap benchmark's fields from OSU's Overall / Compute / Pure Comm. columns.
    OSU's Compute(us) is the compute time measured WHILE the collective was in flight
    (less its MPI_Test calls); it does not time the compute alone, so compute_slowdown
    stays None."""

    out = {"t_comm_us": pure, "t_compute_us": compute, "t_overall_us": overall, "t_compute_during_us": compute,
           "overlap_osu_pct": osu_pct, "overlap_imb_pct": None, "compute_slowdown": None, "exposed_us": None,
           "exposed_pct": None}
    if compute is not None:
        out["overlap_imb_pct"] = overlap_imb_pct(pure, compute, overall)
        out["exposed_us"] = overall - compute
        out["exposed_pct"] = 100.0 * (overall - compute) / pure if pure > 0 else None
    return out

