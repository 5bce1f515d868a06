"""Import the output of tools users already run (NVIDIA nccl-tests stdout or -J JSON, OSU
micro-benchmarks stdout) as commbench rows, so `report` and `compare` treat it like a run.

Every table is read by its header text, never by column position: the formats grew
columns across versions (nccl-tests -C cputime, -S timestamp, -I per-iteration columns;
OSU -f, P50/P90/P99, Validation). Bad input raises UsageError with one line naming the
file and line.

How the tools' numbers map onto a row (README "Reports, compare, import"):

- time_us_p50 and time_us_mean are the tool's time, which is a MEAN over its iterations
  (nccl-tests: the loop average; OSU: the average over iterations and ranks). The other
  percentiles come from per-iteration statistics when the file has them (nccl-tests -I
  columns, -J per-iteration objects, OSU P90/P99 columns); otherwise they equal the mean,
  and the row's `source` says so. `spread` says what the spread is known from: "std"
  (time_us_std is real) or "none" (only the mean is known).
- algbw/busbw are the tool's own numbers; busbw_factor is commbench's factor for the same
  S definition (nccl-tests' S is commbench's). OSU sizes are per peer for allgather and
  alltoall, so nbytes = size x world there (the file's size is kept as `tool_nbytes`),
  and bandwidths are computed from nbytes and the time.
- nccl-tests prints an out-of-place and an in-place half per size: the out-of-place half
  is variant "default" (what commbench measures), the in-place half variant "in-place".
- check: #wrong 0 -> "ok", N/A (unchecked) -> "skipped", > 0 -> "fail"; OSU: Validation
  Pass/Fail, else "skipped".
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from .errors import UsageError
from .results import ENV_PREFIXES, SCHEMA_VERSION

FORMATS = ("nccl-tests", "nccl-tests-json", "osu")
SOURCE_NAMES = {"nccl-tests": "nccl-tests stdout", "nccl-tests-json": "nccl-tests JSON", "osu": "OSU stdout"}

# nccl-tests binary / experiment names and OSU test titles, normalised (lower case, no
# "_perf", no spaces, dashes or underscores) -> commbench benchmark names.
_NAMES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallpersonalizedexchange": "all_to_all", "broadcast": "broadcast",
    "bcast": "broadcast", "sendrecv": "send_recv", "barrier": "barrier", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter", "hypercube": "hypercube", "alltoallv": "all_to_allv",
    "allgatherv": "all_gatherv", "gatherv": "gatherv", "scatterv": "scatterv",
    "reducescatterblock": "reduce_scatter",
}

# nccl-tests' busbw factors (its PERFORMANCE.md), used where commbench has no benchmark of that name.
_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
    "all_to_allv": lambda n: (n - 1) / n, "all_gatherv": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n, "gatherv": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n, "scatterv": lambda n: (n - 1) / n,
    "hypercube": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0, "barrier": lambda n: 0.0,
}

# nccl-tests type names -> commbench dtype names.
_NCCL_DTYPES = {"float": "float32", "half": "float16", "double": "float64", "bfloat16": "bfloat16",
                "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                "uint64": "uint64", "f8e4m3": "fp8_e4m3", "f8e5m2": "fp8_e5m2"}
_MPI_DTYPES = {"MPI_CHAR": "uint8", "MPI_BYTE": "uint8", "MPI_SIGNED_CHAR": "int8", "MPI_UNSIGNED_CHAR": "uint8",
               "MPI_INT": "int32", "MPI_FLOAT": "float32", "MPI_DOUBLE": "float64", "MPI_LONG": "int64",
               "MPI_UNSIGNED": "uint32"}
# OSU's default datatype (before OMB printed a Datatype line): float for reductions, char otherwise.
_OSU_REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter")
# OSU's size is what one rank sends to one peer (allgather: its contribution; alltoall: the
# per-peer chunk); commbench's S is the whole output / everything a rank sends.
_OSU_PER_PEER = ("all_gather", "all_to_all", "all_gatherv", "all_to_allv", "gather", "scatter")

_NCCL_LOG_RE = re.compile(r"^\S+:\d+:\d+ \[\d+\] NCCL (INFO|WARN|ERROR|TRACE)")
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                      r"\[([^\]]*)\]\s*(.*?)\s*$")
_OSU_TITLE_RE = re.compile(r"^#\s*OSU\s+(\S+)\s+(.*?)\s+Latency Test(?:\s+v?(\S+))?\s*$")


def _err(path, line, msg: str) -> UsageError:
    return UsageError(f"{path}:{line}: {msg}")


def _norm_name(text: str) -> str:
    t = Path(str(text)).name.lower()
    t = re.sub(r"\.(txt|log|out|json)$", "", t)
    t = re.sub(r"_perf(_mpi)?$", "", t)
    return re.sub(r"[\s_\-]", "", t)


def benchmark_name(text: str) -> str | None:
    """'all_reduce_perf', 'AllReduce', 'All-to-All Personalized Exchange' -> commbench name."""
    n = _norm_name(text)
    return _NAMES.get(n) or (text if text in _FACTORS else None)


def _name_from_filename(path) -> str | None:
    """A collective named anywhere in the file name (longest name first)."""
    stem = Path(path).name.lower()
    for raw in sorted(("all_reduce", "all_gather", "reduce_scatter", "alltoall", "all_to_all", "broadcast",
                       "sendrecv", "send_recv", "hypercube", "allreduce", "allgather", "reducescatter"),
                      key=len, reverse=True):
        if raw in stem:
            return benchmark_name(raw)
    for raw in ("reduce", "gather", "scatter", "bcast", "barrier"):
        if raw in stem:
            return benchmark_name(raw)
    return None


def busbw_factor(bench: str, world: int, nbytes: int = 0) -> float:
    """commbench's busbw factor F (README "algbw and busbw"), or nccl-tests' for collectives
    commbench does not run."""
    from .benchmarks import Point, registry

    b = registry().get(bench)
    if b is not None and b.sized and bench in _FACTORS:
        try:
            return float(b.traffic(Point(bench, world, "float32", max(int(nbytes), 0), {})).busbw_factor)
        except (UsageError, KeyError, ValueError, ZeroDivisionError):
            pass
    f = _FACTORS.get(bench)
    return float(f(world)) if f and world >= 1 else 1.0


def _fnum(tok):
    """A number as the tools print it ('156.2', '1.2e+04', 'nan', 'N/A' -> None)."""
    if tok is None:
        return None
    if isinstance(tok, bool):
        raise ValueError(tok)
    if isinstance(tok, (int, float)):
        return float(tok)
    t = str(tok).strip()
    if t.upper() in ("N/A", "NA", "-", ""):
        return None
    return float(t)  # 'nan', 'inf' parse too


def _check(nwrong) -> str:
    if nwrong is None or (isinstance(nwrong, float) and math.isnan(nwrong)):
        return "skipped"
    return "ok" if nwrong == 0 else "fail"


def _nccl_version(code) -> str | None:
    try:
        c = int(code)
    except (TypeError, ValueError):
        return None
    if c <= 0:
        return None
    if c >= 10000:  # 2.9 and later: major*10000 + minor*100 + patch
        return f"{c // 10000}.{c % 10000 // 100}.{c % 100}"
    return f"{c // 1000}.{c % 1000 // 100}.{c % 100}"


def _nodes(hosts: list[str]) -> list[int]:
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


def make_row(*, bench, backend, device, world, nbytes, dtype, variant="default", params=None, stage="",
             iters=None, warmup=None, clock, mean_us, stats=None, algbw=None, busbw=None, check="skipped",
             source, spread="none", extra=None) -> dict:
    """A row with every results.ROW_FIELDS field. time_us_p50 = time_us_mean = the tool's
    (mean) time; `stats` may give time_us_min/p90/p99/max/std from per-iteration data,
    anything it lacks equals the mean (std: None)."""
    params = dict(params or {})
    nbytes = int(nbytes)
    factor = busbw_factor(bench, int(world), nbytes)
    st = {k: float(v) for k, v in (stats or {}).items() if v is not None}
    t = float(mean_us)
    # Unknown extremes bracket what is known, so min <= p50 <= p90 <= p99 <= max still holds.
    known = [t] + [v for k, v in st.items() if k != "time_us_std"]
    st.setdefault("time_us_min", min(known))
    st.setdefault("time_us_max", max(known))
    if algbw is None:
        algbw = nbytes / (t * 1e-6) / 1e9 if t > 0 and nbytes > 0 else 0.0
    if busbw is None:
        busbw = algbw * factor
    key = f"{variant}|{bench}|{world}|{nbytes}|{dtype}|{json.dumps(params, sort_keys=True)}"  # as runner.point_key
    row = {
        "schema": SCHEMA_VERSION, "point_key": key, "benchmark": bench, "backend": backend, "device": device,
        "world": int(world), "nbytes": nbytes, "dtype": dtype, "variant": variant, "params": params,
        "stage": stage, "iters": None if iters is None else int(iters),
        "warmup": None if warmup is None else int(warmup), "timing": "imported", "clock": clock,
        "time_us_min": float(st.get("time_us_min", t)), "time_us_p50": t, "time_us_mean": t,
        "time_us_p90": float(st.get("time_us_p90", t)), "time_us_p99": float(st.get("time_us_p99", t)),
        "time_us_max": float(st.get("time_us_max", t)),
        "time_us_std": float(st["time_us_std"]) if "time_us_std" in st else None,
        "algbw_gbps": float(algbw), "busbw_gbps": float(busbw), "busbw_factor": factor, "check": check,
        "source": source, "spread": spread if "time_us_std" in st or spread == "none" else "none",
    }
    row.update(extra or {})
    return row


# ---------------------------------------------------------------------------------------
# nccl-tests stdout

_LEAD = ("size", "count", "type", "redop", "root")
_HALF_NAMES = ("out-of-place", "in-place")


def _nccl_header(tokens: list[str], group_line: str | None, path, lineno: int) -> dict:
    cols = list(tokens)
    ts = bool(cols) and cols[-1] == "timestamp"
    if ts:
        cols = cols[:-1]
    starts = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
    if not starts:
        raise _err(path, lineno, "nccl-tests header has no time/cputime column")
    lead = cols[:starts[0]]
    if "size" not in lead:
        raise _err(path, lineno, "nccl-tests header has no size column")
    halves = [cols[a:b] for a, b in zip(starts, starts[1:] + [len(cols)])]
    names = re.findall(r"out-of-place|in-place", group_line or "")
    if len(names) != len(halves):
        names = list(_HALF_NAMES[:len(halves)])
    for h in halves:
        if "algbw" not in h or "busbw" not in h:
            raise _err(path, lineno, f"nccl-tests header half {' '.join(h)!r} lacks algbw/busbw")
    return {"lead": lead, "halves": list(zip(names, halves)), "timestamp": ts, "ncols": len(cols),
            "line": lineno, "cputime": "cputime" in cols, "per_iter": "i_min" in cols}


class _NcclBlock:
    def __init__(self, line: int):
        self.line = line
        self.name = None
        self.ranks: dict[int, tuple] = {}
        self.run_params: dict = {}
        self.header = None
        self.group_line = None
        self.footer = False
        self.data: list[tuple[int, dict]] = []
        self.out_of_bounds = None
        self.avg_busbw = None


def _parse_nccl_params(body: str) -> dict:
    out = {}
    for key, pat in (("warmup", r"warmup iters:\s*(\d+)"), ("iters", r"(?<!warmup )(?<!agg )iters:\s*(\d+)"),
                     ("agg_iters", r"agg iters:\s*(\d+)"), ("validation", r"validation:\s*(\d+)"),
                     ("graph", r"graph:\s*(\d+)"), ("ngpus", r"nGpus\s+(\d+)"), ("nthreads", r"nThread\s+(\d+)")):
        m = re.search(pat, body)
        if m:
            out[key] = int(m.group(1))
    return out


def parse_nccl_stdout(path, text: str, world=None, benchmark=None) -> tuple[list[dict], dict]:
    lines = text.splitlines()
    blocks: list[_NcclBlock] = []
    cur = _NcclBlock(1)
    versions: dict = {}
    in_table = False

    def close(b: _NcclBlock, at: int):
        if b.header is not None:
            if not b.footer:
                raise _err(path, at, "nccl-tests table ends without its footer ('# Out of bounds values'): "
                                     "truncated output?")
            blocks.append(b)

    for i, raw in enumerate(lines, 1):
        s = raw.strip()
        if not s:
            continue
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            m = re.match(r"Collective test starting:\s*(\S+)", body)
            if m:
                if cur.header is not None or cur.ranks:
                    close(cur, i)
                    cur = _NcclBlock(i)
                cur.name = m.group(1)
                in_table = False
                continue
            m = re.search(r"nccl-tests version\s+(\S+)", body)
            if m:
                versions["nccl-tests"] = m.group(1)
                lib = re.search(r"nccl-library=(\d+)", body)
                if lib and _nccl_version(lib.group(1)):
                    versions["nccl"] = _nccl_version(lib.group(1))
                continue
            m = _RANK_RE.match(s.lstrip("#").strip()) if "Rank" in body else None
            if m:
                cur.ranks[int(m.group(1))] = (m.group(2), int(m.group(3)), m.group(4), m.group(5))
                continue
            if body.startswith("nThread"):
                cur.run_params = _parse_nccl_params(body)
                continue
            if "out-of-place" in body or "in-place" in body:
                cur.group_line = body
                continue
            toks = body.split()
            if "size" in toks and ("algbw" in toks or "busbw" in toks):
                if cur.header is not None:  # a second table in one block: keep them apart
                    close(cur, i)
                    prev, cur = cur, _NcclBlock(i)
                    cur.name, cur.ranks, cur.run_params = prev.name, prev.ranks, prev.run_params
                cur.header = _nccl_header(toks, cur.group_line, path, i)
                in_table = True
                continue
            m = re.match(r"Out of bounds values\s*:\s*(\d+)", body)
            if m:
                if cur.header is None:
                    raise _err(path, i, "nccl-tests footer without a table header before it")
                cur.footer, cur.out_of_bounds, in_table = True, int(m.group(1)), False
                continue
            m = re.match(r"Avg bus bandwidth\s*:\s*(\S+)", body)
            if m:
                try:
                    cur.avg_busbw = float(m.group(1))
                except ValueError:
                    pass
                continue
            continue
        m = re.search(r"NCCL version (\d+\.\d+\.\d+\S*)", s)
        if m:
            versions.setdefault("nccl", m.group(1).split("+")[0])
        if not in_table:
            continue  # launcher and library noise outside the table
        if _NCCL_LOG_RE.match(s):
            continue
        cur.data.append((i, _nccl_data_line(path, i, s, cur.header)))
    if cur.header is not None:
        if not cur.footer:
            raise _err(path, len(lines), "nccl-tests table ends without its footer ('# Out of bounds values'): "
                                         "truncated output?")
        blocks.append(cur)
    if not blocks:
        raise _err(path, 1, f"no nccl-tests table (a '#  size  count  type ... algbw  busbw' header) in "
                            f"{len(lines)} lines: not nccl-tests stdout")

    rows, hosts_all, gpus, worlds, notes = [], [], [], [], []
    for b in blocks:
        name = benchmark or (benchmark_name(b.name) if b.name else None) or _name_from_filename(path)
        if name is None:
            raise _err(path, b.line, "cannot tell the collective: no '# Collective test starting: X_perf' line "
                                     "and the file name names none (pass the benchmark name)")
        if b.ranks:
            n = len(b.ranks)
            if world is not None and int(world) != n:
                raise _err(path, b.line, f"the file lists {n} ranks ('#  Rank' lines), --world says {world}")
            hosts = [b.ranks[r][0] for r in sorted(b.ranks)]
            gpus += [b.ranks[r][3] for r in sorted(b.ranks)]
        elif world is not None:
            n, hosts = int(world), []
        else:
            raise _err(path, b.line, "no '#  Rank N Group G Pid P on HOST device D' lines: pass --world N")
        worlds.append(n)
        hosts_all = hosts_all or hosts
        h = b.header
        clock = "cpu_time" if h["cputime"] else "host_clock_loop_mean"
        iters = b.run_params.get("iters")
        if iters and b.run_params.get("agg_iters"):
            iters *= b.run_params["agg_iters"]
        skipped = 0
        for lineno, d in b.data:
            nbytes = d["lead"]["size"]
            if nbytes <= 0:
                skipped += 1
                continue
            dtype = _NCCL_DTYPES.get(d["lead"].get("type", "float"), d["lead"].get("type", "float"))
            params = {}
            redop, root = d["lead"].get("redop"), d["lead"].get("root")
            if redop not in (None, "sum", "none"):
                params["redop"] = redop
            if isinstance(root, int) and root > 0:
                params["root"] = root
            for half, v in d["halves"].items():
                t = v.get("time", v.get("cputime"))
                if t is None:
                    continue
                stats, spread, note = {}, "none", "all percentiles = the mean: the tool prints only an average"
                if v.get("i_min") is not None:
                    stats = {"time_us_min": v.get("i_min"), "time_us_max": v.get("i_max"),
                             "time_us_p99": v.get("i_p99")}
                    if v.get("i_cv%") is not None:
                        stats["time_us_std"] = v["i_cv%"] / 100.0 * t
                        spread = "std"
                    note = "-I per-iteration columns give min/max/p99 and std (cv); p90 = the mean"
                extra = {"tool_nbytes": nbytes, "redop": redop, "root": root, "source_line": lineno}
                if d.get("timestamp"):
                    extra["timestamp"] = d["timestamp"]
                rows.append(make_row(
                    bench=name, backend="nccl", device="cuda", world=n, nbytes=nbytes, dtype=dtype,
                    variant="default" if half == "out-of-place" else half, params=params, iters=iters,
                    warmup=b.run_params.get("warmup"), clock=clock, mean_us=t, stats=stats,
                    algbw=v.get("algbw"), busbw=v.get("busbw"), check=_check(v.get("#wrong")),
                    source=f"nccl-tests stdout ({note})", spread=spread, extra=extra))
        if skipped:
            notes.append(f"{b.name or name}: {skipped} size-0 line(s) skipped")
    meta = _meta("nccl-tests", path, rows, hosts_all, sorted(set(gpus)), max(worlds), "nccl", "cuda",
                 versions, {}, notes=notes,
                 extra={"tool": {"name": "nccl-tests", "version": versions.get("nccl-tests")},
                        "tool_settings": blocks[0].run_params,
                        "out_of_bounds": sum(b.out_of_bounds or 0 for b in blocks),
                        "tool_avg_busbw_gbps": [b.avg_busbw for b in blocks]})
    return rows, meta


def _nccl_data_line(path, lineno: int, s: str, h: dict) -> dict:
    toks = s.split()
    n = h["ncols"]
    ts = None
    if h["timestamp"] and len(toks) > n:
        toks, ts = toks[:n], " ".join(toks[n:])
    if len(toks) != n:
        what = f"{n} fields ({' '.join(h['lead'])} + {' '.join(h['halves'][0][1])} per half)"
        raise _err(path, lineno, f"malformed nccl-tests data line: expected {what}, got {len(toks)}: {s[:60]!r}")
    lead = {}
    for col, tok in zip(h["lead"], toks):
        if col in ("size", "count", "root"):
            try:
                lead[col] = int(tok)
            except ValueError:
                raise _err(path, lineno, f"malformed nccl-tests data line: {col} {tok!r} is not an integer") from None
        else:
            lead[col] = tok
    pos = len(h["lead"])
    halves = {}
    for name, cols in h["halves"]:
        vals = {}
        for col, tok in zip(cols, toks[pos:pos + len(cols)]):
            try:
                vals[col] = _fnum(tok)
            except ValueError:
                raise _err(path, lineno, f"malformed nccl-tests data line: {name} {col} {tok!r} is not a number") \
                    from None
        pos += len(cols)
        t = vals.get("time", vals.get("cputime"))
        if t is not None and not (math.isfinite(t) and t > 0):
            vals["time"] = vals["cputime"] = None  # a half that did not run
        halves[name] = vals
    return {"lead": lead, "halves": halves, "timestamp": ts}


# ---------------------------------------------------------------------------------------
# nccl-tests JSON (-J)

def _jval(v):
    """JSON scalars as nccl-tests writes them: numbers, "nan", "true"/"false" strings."""
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _jnum(v):
    v = _jval(v)
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    raise ValueError(v)


def _json_result_lines(text: str) -> list[int]:
    """Line of each element of the top-level results list (for error messages)."""
    m = re.search(r'"results"\s*:\s*\[', text)
    if not m:
        return []
    dec, pos, out = json.JSONDecoder(), m.end(), []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return out
        out.append(text.count("\n", 0, pos) + 1)
        try:
            _, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out


def _iter_stats(obj) -> dict | None:
    """Per-iteration statistics (nccl-tests -I with -J) as time_us_* fields."""
    if not isinstance(obj, dict):
        return None
    times = obj.get("times_us")
    if isinstance(times, list) and times:
        import numpy as np

        from .stats import summarize_us

        t = np.array([_jnum(x) for x in times], dtype=np.float64)
        t = t[np.isfinite(t)]
        if t.size:
            s = summarize_us(t * 1e-6)
            s.pop("time_us_p50")
            s.pop("time_us_mean")
            return s
    out = {"time_us_min": obj.get("min_us"), "time_us_max": obj.get("max_us"), "time_us_p99": obj.get("p99_us"),
           "time_us_std": obj.get("stdev_us")}
    out = {k: _jnum(v) for k, v in out.items() if v is not None}
    out = {k: v for k, v in out.items() if v is not None and math.isfinite(v)}
    return out or None


def parse_nccl_json(path, text: str, world=None, benchmark=None) -> tuple[list[dict], dict]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise _err(path, e.lineno, f"not valid JSON ({e.msg}): truncated nccl-tests -J output?") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise _err(path, 1, "not nccl-tests -J JSON (no top-level 'results' list)")
    version = doc.get("version")
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = [d for d in doc.get("devices") or [] if isinstance(d, dict)]
    hosts = [str(d.get("hostname")) for d in sorted(devices, key=lambda d: d.get("rank", 0))]
    gpus = sorted({str(d.get("device_info")) for d in devices if d.get("device_info")})
    if devices:
        n = len(devices)
        if world is not None and int(world) != n:
            raise _err(path, 1, f"the file lists {n} devices, --world says {world}")
    elif world is not None:
        n = int(world)
    else:
        raise _err(path, 1, "nccl-tests JSON without a 'devices' list: pass --world N")
    args = [str(a) for a in doc.get("args") or []]
    res = doc["results"]
    lines = None
    name = benchmark
    if name is None and args:
        name = benchmark_name(args[0])
    if name is None:
        for r in res:
            if isinstance(r, dict) and r.get("experiment_name"):
                name = benchmark_name(str(r["experiment_name"]))
                break
    name = name or _name_from_filename(path)
    if name is None:
        raise _err(path, 1, "cannot tell the collective from args, experiment_name or the file name "
                            "(pass the benchmark name)")
    iters_cfg = cfg.get("iterations")
    agg = cfg.get("aggregated_iterations")
    rows = []
    skipped = 0
    for k, r in enumerate(res):
        def bad(msg):
            nonlocal lines
            if lines is None:
                lines = _json_result_lines(text)
            return _err(path, lines[k] if k < len(lines) else 1, f"results[{k}]: {msg}")

        if not isinstance(r, dict):
            raise bad("not an object")
        try:
            nbytes = int(_jnum(r.get("size")))
        except (TypeError, ValueError):
            raise bad(f"size {r.get('size')!r} is not a number") from None
        if nbytes <= 0:
            skipped += 1
            continue
        typ = str(r.get("type", "float"))
        redop = r.get("redop")
        try:
            root = int(str(r.get("root", "-1")).strip())
        except ValueError:
            raise bad(f"root {r.get('root')!r} is not an integer") from None
        params = {}
        if redop not in (None, "sum", "none"):
            params["redop"] = redop
        if root > 0:
            params["root"] = root
        iters = r.get("actual_iterations") or ((iters_cfg or 0) * (agg or 1)) or None
        found = False
        for key, variant in (("out_of_place", "default"), ("in_place", "in-place")):
            half = r.get(key)
            if half is None:
                continue
            if not isinstance(half, dict):
                raise bad(f"{key} is neither an object nor null")
            found = True
            try:
                cpu = "cpu_time" in half
                t = _jnum(half.get("cpu_time" if cpu else "time"))
                algbw, busbw = _jnum(half.get("alg_bw")), _jnum(half.get("bus_bw"))
                nwrong = _jnum(half.get("nwrong"))
            except ValueError as e:
                raise bad(f"{key}: {e.args[0]!r} is not a number") from None
            if t is None or not math.isfinite(t) or t <= 0:
                continue
            st = _iter_stats(r.get(f"{key}_per_iter")) or _iter_stats(half.get("per_iter")) or _iter_stats(half)
            if st is None and key == "out_of_place" and r.get("in_place") is None:
                st = _iter_stats(r)
            spread = "std" if st and "time_us_std" in st else "none"
            note = ("per-iteration statistics give min/p90/p99/max/std" if st else
                    "all percentiles = the mean: no per-iteration statistics in the file")
            rows.append(make_row(
                bench=name, backend="nccl", device="cuda", world=n, nbytes=nbytes,
                dtype=_NCCL_DTYPES.get(typ, typ), variant=variant, params=params, iters=iters,
                warmup=cfg.get("warmup_iters"), clock="cpu_time" if cpu else "host_clock_loop_mean", mean_us=t,
                stats=st, algbw=algbw if algbw is not None and math.isfinite(algbw) else None,
                busbw=busbw if busbw is not None and math.isfinite(busbw) else None, check=_check(nwrong),
                source=f"nccl-tests JSON ({note})", spread=spread,
                extra={"tool_nbytes": nbytes, "redop": redop, "root": root}))
        if not found:
            raise bad("neither out_of_place nor in_place holds a result")
    versions = {}
    if _nccl_version(doc.get("nccl_version")):
        versions["nccl"] = _nccl_version(doc.get("nccl_version"))
    env = {}
    for e in doc.get("env") or []:
        if isinstance(e, str) and "=" in e:
            k, v = e.split("=", 1)
            if k.startswith(ENV_PREFIXES):
                env[k] = v
    settings = {k: _jval(v) for k, v in cfg.items()}
    meta = _meta("nccl-tests-json", path, rows, hosts, gpus, n, "nccl", "cuda", versions, env,
                 notes=[f"{skipped} size-0 result(s) skipped"] if skipped else [],
                 extra={"tool": {"name": "nccl-tests", "json_version": version}, "tool_settings": settings,
                        "command": args or None, "started": doc.get("start_time"), "finished": doc.get("end_time"),
                        "out_of_bounds": (doc.get("out_of_bounds") or {}).get("count"),
                        "tool_avg_busbw_gbps": [_jval((doc.get("average_bus_bandwidth") or {}).get("bandwidth"))]})
    return rows, meta


# ---------------------------------------------------------------------------------------
# OSU micro-benchmarks stdout

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
            m = _OSU_TITLE_RE.match(s)
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
            raise _err(path, i, f"not an OSU data line: {s[:60]!r}")
        if len(toks) != len(cur.cols):
            raise _err(path, i, f"malformed OSU data line: expected {len(cur.cols)} fields "
                                f"({', '.join(cur.cols)}), got {len(toks)}: {s[:60]!r}")
        vals = {}
        for col, tok in zip(cur.cols, toks):
            if col == "validation":
                vals[col] = tok
                continue
            try:
                vals[col] = _fnum(tok)
            except ValueError:
                raise _err(path, i, f"malformed OSU data line: {col} {tok!r} is not a number") from None
        cur.data.append((i, vals))
    if not tables:
        raise _err(path, 1, f"no '# OSU ... Latency Test' title line in {len(lines)} lines: not OSU collective "
                            f"output")
    for t in tables:
        if t.cols is None:
            raise _err(path, t.line, "OSU title without a column header after it: truncated output?")
        if not t.data:
            raise _err(path, len(lines), f"OSU table of line {t.line} has no data lines: truncated output?")
    if world is None:
        raise _err(path, tables[0].line, "OSU output does not carry the rank count: pass --world N")
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
            raise _err(path, t.line, f"OSU test {title!r} is not a collective commbench knows "
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
                    raise _err(path, lineno, "non-blocking OSU line lacks Overall(us) or Pure Comm.(us)")
                extra.update(_overlap_fields(pure, compute, overall, v.get("overlap")))
                extra.update(mode="single", bandwidth_note="algbw/busbw: the pure collective (Pure Comm.(us), "
                                                           "S = the message); time_us_*: Overall(us)")
                f = busbw_factor(name, n, nbytes)
                algbw = nbytes / (pure * 1e-6) / 1e9 if pure > 0 and nbytes > 0 else 0.0
                row = make_row(
                    bench="overlap", backend=backend, device=dev, world=n, nbytes=nbytes, dtype=dtype,
                    params={"mode": "single", "collective": name}, iters=v.get("iters"), clock="host_clock",
                    mean_us=overall, algbw=algbw, busbw=algbw * f, check=check,
                    source="OSU stdout (time = Overall(us), a mean; all percentiles = the mean; overlap_imb_pct "
                           "computed from Overall/Compute/Pure Comm.; compute_slowdown: OSU does not time the "
                           "compute alone)",
                    spread="none", extra=extra)
                row["busbw_factor"] = f
                rows.append(row)
                continue
            avg = v.get("avg")
            if avg is None:
                raise _err(path, lineno, "OSU line lacks Avg Latency(us)")
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
    meta = _meta("osu", path, rows, [], [], n, rows[0]["backend"] if rows else "mpi", device, versions, {},
                 notes=notes, extra={"tool": {"name": "OSU micro-benchmarks", "version": tables[0].version,
                                              "tests": [t.title for t in tables]}})
    return rows, meta


def _overlap_fields(pure: float, compute: float | None, overall: float, osu_pct: float | None) -> dict:
    """The overlap benchmark's fields from OSU's Overall / Compute / Pure Comm. columns.
    OSU's Compute(us) is the compute time measured WHILE the collective was in flight
    (less its MPI_Test calls); it does not time the compute alone, so compute_slowdown
    stays None. Formulas as commbench.benchmarks.overlap (OSU and IMB-NBC)."""
    out = {"t_comm_us": pure, "t_compute_us": compute, "t_overall_us": overall, "t_compute_during_us": compute,
           "overlap_osu_pct": osu_pct, "overlap_imb_pct": None, "compute_slowdown": None, "exposed_us": None,
           "exposed_pct": None}
    if compute is not None:
        denom = max(pure, compute)
        out["overlap_imb_pct"] = 100.0 * max(0.0, min(1.0, (pure + compute - overall) / denom)) if denom > 0 else 0.0
        out["exposed_us"] = overall - compute
        out["exposed_pct"] = 100.0 * (overall - compute) / pure if pure > 0 else None
    return out


# ---------------------------------------------------------------------------------------
# Detection, meta, writing

def detect_format(path, text: str) -> str:
    head = text.lstrip()[:1]
    if head in ("{", "["):
        if head == "{" and '"results"' in text and ('"nccl_version"' in text or '"config"' in text):
            return "nccl-tests-json"
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        if '"schema"' in first and '"benchmark"' in first:
            raise _err(path, 1, "already commbench rows: report or compare the run directory directly")
        raise _err(path, 1, "JSON that is not nccl-tests -J output (no 'results' and 'nccl_version')")
    for line in text.splitlines():
        s = line.strip()
        if _OSU_TITLE_RE.match(s):
            return "osu"
        if s.startswith("#") and ("Collective test starting" in s or "nccl-tests version" in s
                                  or ("algbw" in s and "busbw" in s)):
            return "nccl-tests"
    raise _err(path, 1, "not a format commbench can import (nccl-tests stdout or -J JSON, OSU collective "
                        "stdout); name it with --format if it is one")


def _meta(fmt, path, rows, hosts, gpus, world, backend, device, versions, env, notes, extra) -> dict:
    meta = {
        "schema": SCHEMA_VERSION,
        "command": ["commbench", "import", str(path)],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": "complete",
        "host": hosts[0] if hosts else None,
        "versions": versions,
        "env": env,
        "suite": f"import {SOURCE_NAMES[fmt]}",
        "backend": backend,
        "device": device,
        "world": world,
        "hosts": hosts,
        "nodes": _nodes(hosts) if hosts else None,
        "gpus": gpus,
        "points": len(rows),
        "imported_from": os.path.abspath(str(path)),
        "source_format": fmt,
        "source": SOURCE_NAMES[fmt],
        "import_notes": notes,
    }
    for k, v in extra.items():
        if v is not None or k not in meta:
            meta[k] = v
    return meta


def import_file(path, fmt: str | None = None, world: int | None = None,
                benchmark: str | None = None, in_place: bool = True) -> tuple[list[dict], dict]:
    """Rows (commbench schema) and meta of one nccl-tests (stdout or -J JSON) or OSU file.
    fmt: "nccl-tests" | "nccl-tests-json" | "osu" (None: detected from the content).
    world: rank count (required for OSU, which does not print it; checked against the
    nccl-tests rank lines). benchmark: the commbench name, when the file does not say.
    in_place: keep nccl-tests' in-place half as variant "in-place" rows (False: only the
    out-of-place half, variant "default", which is what commbench itself measures)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    if not text.strip():
        raise _err(path, 1, "empty file")
    if fmt is None:
        fmt = detect_format(path, text)
    if fmt not in FORMATS:
        raise UsageError(f"unknown import format {fmt!r} (known: {', '.join(FORMATS)})")
    if world is not None and int(world) < 1:
        raise UsageError(f"--world must be >= 1, got {world}")
    if benchmark is not None:
        benchmark = benchmark_name(benchmark) or benchmark
    parser = {"nccl-tests": parse_nccl_stdout, "nccl-tests-json": parse_nccl_json, "osu": parse_osu}[fmt]
    rows, meta = parser(path, text, world=world, benchmark=benchmark)
    if not in_place:
        rows = [r for r in rows if r["variant"] != "in-place"]
        meta["points"] = len(rows)
    if not rows:
        raise _err(path, 1, f"no data rows with a time in this {SOURCE_NAMES[fmt]} file")
    return rows, meta


def write_imported_run(rows: list[dict], meta: dict, out_dir) -> Path:
    """A commbench result directory (meta.json status complete, rows.jsonl, results.csv)."""
    from .results import RunWriter

    out = Path(out_dir)
    if (out / "rows.jsonl").exists() or (out / "meta.json").exists():
        raise UsageError(f"{out} already holds a run: choose another --out")
    meta = {**meta, "status": "running", "points": len(rows)}
    w = RunWriter(out, meta)
    for r in rows:
        w.append(r)
    w.finish("complete")
    return out


def import_to_run(paths, out=None, fmt: str | None = None, world: int | None = None,
                  benchmark: str | None = None, in_place: bool = True, root="results") -> tuple[Path, list, dict]:
    """`commbench import FILE...`: one result directory holding the rows of every file
    (e.g. all_reduce_perf.txt and alltoall_perf.txt of one machine). out: the directory
    (default results/<timestamp>-import-<first file's stem>). Returns (dir, rows, meta)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise UsageError("import needs at least one file")
    rows, metas = [], []
    for p in paths:
        r, m = import_file(p, fmt=fmt, world=world, benchmark=benchmark, in_place=in_place)
        rows += r
        metas.append(m)
    keys = [r["point_key"] for r in rows]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise UsageError(f"the files measure the same point twice ({dup}): import them into separate runs")
    meta = dict(metas[0])
    if len(metas) > 1:
        meta["imported_from"] = [m["imported_from"] for m in metas]
        meta["source_format"] = sorted({m["source_format"] for m in metas})
        meta["source"] = ", ".join(sorted({m["source"] for m in metas}))
        meta["suite"] = f"import {meta['source']}"
        meta["world"] = max(m["world"] for m in metas)
        meta["import_notes"] = [n for m in metas for n in m.get("import_notes", [])]
        meta["gpus"] = sorted({g for m in metas for g in m.get("gpus") or []})
        for m in metas:
            for k, v in (m.get("versions") or {}).items():
                meta["versions"].setdefault(k, v)
        host_sets = {tuple(m.get("hosts") or []) for m in metas if m.get("hosts")}
        if len(host_sets) > 1:
            meta["hosts"] = max(host_sets, key=len)
            meta["nodes"] = _nodes(list(meta["hosts"]))
            meta["import_notes"].append("the files list different hosts: meta.hosts is the largest set")
    meta["command"] = ["commbench", "import", *map(str, paths)]
    out_dir = Path(out) if out else default_out_dir(paths[0], root)
    write_imported_run(rows, meta, out_dir)
    return out_dir, rows, meta


def default_out_dir(path, root="results") -> Path:
    from .results import new_run_dir

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path).stem) or "import"
    return new_run_dir(f"import-{stem}", root)
