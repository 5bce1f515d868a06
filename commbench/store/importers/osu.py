"""OSU micro-benchmarks stdout: the collectives (osu_allreduce, osu_alltoall, ...,
osu_barrier, and the non-blocking osu_i* tests) and the point-to-point osu_latency, osu_bw
and osu_bibw (send_recv rows, world 2), read by their column titles (-f adds min/max, newer
versions P50/P90/P99 and Validation). Other OSU tests in a log are said in the notes.

OSU does not print the rank count of a collective, so --world gives it. Its size is what one rank sends
to one peer for allgather and alltoall, so nbytes = size x world there (commbench's S; the
file's size is kept as `tool_nbytes`). The time is OSU's average over iterations and
ranks. A non-blocking test becomes an `overlap` row (Overall, Compute, Pure Comm.)."""
from __future__ import annotations

import math
import re

from commbench.benchmarks.overlap import overlap_imb_pct
from commbench.core.stats import bandwidths_gbps

from .rows import Notes, benchmark_name, busbw_factor, err, fnum, make_row, numbered_lines, quote, run_meta

_MPI_DTYPES = {"MPI_CHAR": "uint8", "MPI_BYTE": "uint8", "MPI_SIGNED_CHAR": "int8", "MPI_UNSIGNED_CHAR": "uint8",
               "MPI_INT": "int32", "MPI_FLOAT": "float32", "MPI_DOUBLE": "float64", "MPI_LONG": "int64",
               "MPI_UNSIGNED": "uint32"}
# OSU's default datatype (before OMB printed a Datatype line): float for reductions, char otherwise.
_OSU_REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter")
# OSU's size is what one rank sends to one peer (allgather: its contribution; alltoall: the
# per-peer chunk); commbench's S is the whole output / everything a rank sends.
_OSU_PER_PEER = ("all_gather", "all_to_all", "all_gatherv", "all_to_allv", "gather", "scatter")


# Every OSU test's title: "# OSU MPI Allreduce Latency Test v5.9", "# OSU MPI-CUDA Bandwidth
# Test v7.5", "# OSU MPI_Accumulate latency Test v5.6.3" (library, test, version). The test's
# name is empty or ends with a non-space: a lazy `(.*?)` before `\s+Test` would read each
# run of spaces again from each of its characters (hours for a 1 MB line).
OSU_TITLE_RE = re.compile(r"^#\s*OSU\s+(MPI-\w+|MPI|NCCL|XCCL|OpenSHMEM|UPC\+\+|UPC|\S+?)[\s_](|.*?\S)\s+Test"
                          r"(?:\s+v?(\S+))?\s*$", re.IGNORECASE)
_OSU_RE = re.compile(r"#\s*OSU\s", re.IGNORECASE)
_TEST_RE = re.compile(r"Test", re.IGNORECASE)


def osu_title(line: str):
    """OSU_TITLE_RE's match of a line, or None. A title's last or last but one word is
    'Test': a line without it is no title, said before the pattern, which would try each
    way to end the library's name in the line's first word and read the rest after each."""
    if not _OSU_RE.match(line):
        return None
    if not any(_TEST_RE.fullmatch(w) for w in line.rsplit(None, 2)[1:]):
        return None
    return OSU_TITLE_RE.match(line)

# OSU's point-to-point tests (two ranks) as send_recv rows: the title -> (pattern, how OSU's
# number gives the row's time).
_PT2PT = {
    "latency": ("ping-pong", "osu_latency: one-way latency = half the mean round trip of a ping-pong between "
                             "2 ranks"),
    "bandwidth": ("unidirectional", "osu_bw: time = size / OSU's bandwidth (rank 0 sends windows of back-to-back "
                                    "messages to rank 1; a pipelined time per message, not a latency)"),
    "bi-directional bandwidth": ("bidirectional", "osu_bibw: time = 2 x size / OSU's bandwidth (both directions' "
                                                  "bytes over the window's time; S per direction)"),
}
_PT2PT["bidirectional bandwidth"] = _PT2PT["bi-directional bandwidth"]

OSU_TIME_MEASURED = "OSU: the average over ranks of each rank's mean over its iterations"
OSU_OVERLAP_MEASURED = "OSU: Overall(us), the average over ranks of each rank's mean over its iterations"


def _osu_columns(body: str) -> list[str]:
    """'Size           Avg Latency(us)   Min Latency(us)' -> column labels (2+ spaces apart)."""
    return [c for c in re.split(r"\s{2,}", body.strip()) if c]


def _osu_key(label: str) -> str:
    low = label.lower().replace(" ", "")
    for key, pat in (("size", "size"), ("avg", "avglatency"), ("min", "minlatency"), ("max", "maxlatency"),
                     ("iters", "iterations"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"),
                     ("overall", "overall"), ("compute", "compute"), ("init", "coll.init"),
                     ("test", "mpi_test"), ("wait", "mpi_wait"), ("pure", "purecomm"), ("overlap", "overlap"),
                     ("validation", "validation"), ("avg", "latency"), ("bw", "bandwidth(mb/s)")):
        if low.startswith(pat):
            return key
    return low


class _OsuTable:
    def __init__(self, line, lib, title, version):
        self.line, self.lib, self.title, self.version = line, lib, title, version
        self.shown = title if len(title) <= 80 else title[:77] + "..."  # the title as messages quote it
        self.cols = None
        self.dtype = None
        self.buffers = None  # "-d cuda": "D D", "H D", ...
        self.kind, self.name, self.pattern = None, None, None
        self.rows = self.skipped = self.zero = 0


_LATENCY_RE = re.compile("latency", re.IGNORECASE)
# "Send Buffer on DEVICE (D) and Receive Buffer on HOST (H)": only each word's first letter is
# kept. In two patterns: as one, `(\w+).*` would read the rest of the line again for each
# shorter match of the first word.
_SEND_RE = re.compile(r"Send Buffer on (\w)", re.IGNORECASE)
_RECEIVE_RE = re.compile(r".*Receive Buffer on (\w+)", re.IGNORECASE)
_NONBLOCKING_RE = re.compile("non-?blocking", re.IGNORECASE)


def _classify(t: _OsuTable, benchmark) -> None:
    """What the table is: a collective ("coll"), its non-blocking form ("overlap"), a
    point-to-point test commbench reads as send_recv ("pt2pt"), or one it does not import."""
    title = t.title.strip()
    low = title.lower()
    if low in _PT2PT:
        t.kind, t.name, t.pattern = "pt2pt", "send_recv", low
        return
    words = title.split()  # "[Non-blocking] <collective> Latency", read by words: linear in the title
    if len(words) >= 2 and _LATENCY_RE.fullmatch(words[-1]):
        nonblocking = len(words) > 2 and _NONBLOCKING_RE.fullmatch(words[0]) is not None
        name = benchmark_name(" ".join(words[nonblocking:-1]))
        if name is not None and name != "send_recv":
            t.kind, t.name = ("overlap" if nonblocking else "coll"), benchmark or name
            return
    t.kind = "unknown"


def parse_osu(path, lines, world=None, benchmark=None, emit=None) -> dict:
    """Stream an OSU stdout (an iterable of lines): each row goes to emit(row) as its line is
    read; returns the run's meta. A line that is not a row inside a table (an MPI library's
    warning) is said in the notes and the table goes on."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    tables: list[_OsuTable] = []
    cur = None
    notes = Notes()
    nlines = 0
    for i, s in numbered_lines(lines):
        nlines = i
        s = s.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = osu_title(s)
            if m:
                cur = _OsuTable(i, m.group(1), m.group(2), m.group(3))
                _classify(cur, benchmark)
                tables.append(cur)
                continue
            body = s.lstrip("#").strip()
            if cur is None:
                continue
            m = re.match(r"Datatype:\s*(\w+)", body)
            if m:
                cur.dtype = m.group(1)
                continue
            m = _SEND_RE.match(body)
            m2 = m and _RECEIVE_RE.match(body, m.end())
            if m2:
                cur.buffers = f"{m.group(1)[0].upper()} {m2.group(1)[0].upper()}"
                continue
            low = body.lower()
            if cur.cols is None and (low.startswith("size") or low.startswith("avg latency")):
                cur.cols = [_osu_key(c) for c in _osu_columns(body)]
            continue
        toks = s.split()
        numeric = bool(re.match(r"^[-+]?(\d|\.\d)", toks[0]))
        if cur is None or cur.cols is None:
            notes.unknown(i, s, " (before any OSU table)" if numeric else "")
            continue
        if not numeric:
            notes.unknown(i, s, f" (inside the OSU table of line {cur.line})" if cur.rows or cur.skipped else "")
            continue
        if cur.kind == "unknown":
            cur.skipped += 1
            continue
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
                raise err(path, i, f"malformed OSU data line: {col} {quote(tok)} is not a number") from None
        _emit_row(path, i, vals, cur, world, emit)
    if not tables:
        raise err(path, 1, f"no '# OSU ... Test' title line in {nlines} lines: not OSU output")
    known = [t for t in tables if t.kind != "unknown"]
    for t in tables:
        if t.kind == "unknown":
            notes.add(f"line {t.line}: OSU test {t.shown!r} is not one commbench imports (collectives, osu_latency, "
                      f"osu_bw, osu_bibw): its {t.skipped} data line(s) skipped")
            continue
        if t.cols is None:
            raise err(path, t.line, "OSU title without a column header after it: truncated output?")
        if not t.rows and not t.zero:
            raise err(path, nlines, f"OSU table of line {t.line} has no data lines: truncated output?")
        if t.zero:
            notes.add(f"line {t.line}: {t.shown}: {t.zero} size-0 line(s) skipped")
        if t.name in _OSU_PER_PEER:
            notes.add(f"{t.shown}: OSU size is per peer; nbytes = size x {world} (commbench S)")
        if t.kind == "pt2pt":
            notes.add(f"line {t.line}: OSU {t.shown} (point-to-point, 2 ranks) as send_recv rows, pattern "
                      f"{_PT2PT[t.pattern][0]}" + (f" (world 2, not --world {world}: the test runs on exactly two "
                                                   f"ranks)" if world is not None and int(world) != 2 else ""))
    if not known:
        names = ", ".join(f"{t.shown!r} (line {t.line})" for t in tables)
        raise err(path, tables[0].line, f"no OSU test commbench imports: {names} (it imports the collectives, "
                                         f"osu_latency, osu_bw and osu_bibw)")
    first = known[0]
    device = _device(first)
    backend = "nccl" if first.lib.upper() in ("NCCL", "XCCL") else "mpi"
    worlds = [2 if t.kind == "pt2pt" else int(world) for t in known]
    versions = {"osu": first.version} if first.version else {}
    return run_meta("osu", path, sum(t.rows for t in known), [], [], max(worlds), backend, device, versions, {},
                    notes=notes.lines(), extra={"tool": {"name": "OSU micro-benchmarks", "version": first.version,
                                                         "tests": [t.title for t in tables]}})


def _device(t: _OsuTable) -> str:
    lib = t.lib.upper()
    if t.buffers is not None:
        return "cpu" if t.buffers == "H H" else ("rocm" if "ROCM" in lib else "cuda")
    return "cuda" if "CUDA" in lib or lib in ("NCCL", "XCCL") else ("rocm" if "ROCM" in lib else "cpu")


def _emit_row(path, lineno: int, v: dict, t: _OsuTable, world, emit) -> None:
    """The row of one OSU data line."""
    if t.kind == "pt2pt":
        n = 2  # osu_latency, osu_bw and osu_bibw run on exactly two ranks
    elif world is None:
        raise err(path, t.line, "OSU output does not carry the rank count: pass --world N")
    else:
        n = int(world)
    name = t.name
    if "size" not in v:
        if name != "barrier":
            raise err(path, lineno, f"OSU {t.shown} line without a Size column")
        v["size"] = 0.0
    _check_line(path, lineno, v)
    dev = _device(t)
    backend = "nccl" if t.lib.upper() in ("NCCL", "XCCL") else "mpi"
    dtype = _MPI_DTYPES.get(t.dtype or "", None) or (t.dtype.lower() if t.dtype else None) or \
        ("float32" if name in _OSU_REDUCTIONS else "uint8")
    size = int(v["size"])
    nbytes = size * n if name in _OSU_PER_PEER else size
    if name != "barrier" and nbytes <= 0:
        t.zero += 1  # osu_latency's size 0 line: no bytes, no point (said in the notes)
        return
    check = "skipped"
    if "validation" in v:
        check = "ok" if str(v["validation"]).lower().startswith("pass") else "fail"
    extra = {"tool_nbytes": size, "source_line": lineno}
    if t.buffers:
        extra["osu_buffers"] = t.buffers
    if "min" in v:
        extra["osu_min_us"], extra["osu_max_us"] = v.get("min"), v.get("max")
    if "p50" in v:
        extra["iter_p50_us"] = v["p50"]
    t.rows += 1
    if t.kind == "overlap":
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
            source="OSU stdout (time = Overall(us), a mean; min/p90/p99/max are not in the file; overlap_imb_pct "
                   "computed from Overall/Compute/Pure Comm.; compute_slowdown: OSU does not time the compute "
                   "alone)", time_measured=OSU_OVERLAP_MEASURED, spread="none", extra=extra)
        row["busbw_factor"] = f
        emit(row)
        return
    stats = {k: v[c] for k, c in (("time_us_p90", "p90"), ("time_us_p99", "p99")) if c in v}
    if t.kind == "pt2pt":
        pattern, measured = _PT2PT[t.pattern]
        if t.pattern == "latency":
            mean = v.get("avg")
            if mean is None:
                raise err(path, lineno, "osu_latency line lacks Latency (us)")
            algbw = None
        else:
            bw = v.get("bw")
            if bw is None or not (math.isfinite(bw) and bw > 0):
                raise err(path, lineno, f"OSU Bandwidth (MB/s) {bw!r} is not a positive finite number")
            extra["osu_bw_mbps"] = bw
            per_dir_mbps = bw / 2 if pattern == "bidirectional" else bw
            mean = size / per_dir_mbps  # bytes / (1e6 B/s) = us
            algbw = per_dir_mbps / 1000.0
        emit(make_row(
            bench="send_recv", backend=backend, device=dev, world=n, nbytes=nbytes, dtype=dtype,
            params={"pattern": pattern}, iters=v.get("iters"), clock="host_clock", mean_us=mean, algbw=algbw,
            stats=stats if t.pattern == "latency" else None, check=check,
            source=f"OSU {t.title} stdout ({measured}; "
                   + ("P90/P99 columns give p90/p99" if stats and t.pattern == "latency" else
                      "min/p90/p99/max are not in the file") + ")",
            time_measured=f"OSU: {measured}", spread="none", extra=extra))
        return
    avg = v.get("avg")
    if avg is None:
        raise err(path, lineno, "OSU line lacks Avg Latency(us)")
    note = "P90/P99 columns give p90/p99" if stats else "only the average: min/p90/p99/max are not in the file"
    if "min" in v:
        note += "; osu_min_us/osu_max_us are OSU's min/max over ranks of the average, not per iteration"
    emit(make_row(
        bench=name, backend=backend, device=dev, world=n, nbytes=nbytes, dtype=dtype,
        iters=v.get("iters"), clock="host_clock", mean_us=avg, stats=stats, check=check,
        source=f"OSU stdout ({note})", time_measured=OSU_TIME_MEASURED, spread="none", extra=extra))


# No message is larger than this (1 PiB): a bigger size is a corrupt line, not a result.
MAX_SIZE = 1 << 50
_TIME_COLUMNS = {"avg": "Avg Latency(us)", "bw": "Bandwidth (MB/s)", "min": "Min Latency(us)",
                 "max": "Max Latency(us)", "p50": "P50", "p90": "P90", "p99": "P99", "overall": "Overall(us)", "pure": "Pure Comm.(us)",
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

