"""What every importer shares: the tools' names for the collectives, the row builder, the
run's meta.json (one file's and several files' merged) and the writer of the result
directory."""
from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

from commbench.benchmarks import registry
from commbench.core.errors import UsageError
from commbench.core.schema import SCHEMA_VERSION, placement_of, point_key
from commbench.core.stats import bandwidths_gbps
from commbench.core.whoami import node_ids
from commbench.store.record import Status
from commbench.store.results import RunDir, new_run_dir

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

# nccl-tests' busbw factors (its PERFORMANCE.md) for the collectives commbench does not
# run; a collective it runs takes its factor from its benchmark (busbw_factor below).
_FACTORS = {
    "all_to_allv": lambda n: (n - 1) / n, "all_gatherv": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n, "gatherv": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n, "scatterv": lambda n: (n - 1) / n,
    "hypercube": lambda n: (n - 1) / n, "reduce": lambda n: 1.0,
}


def err(path, line, msg: str) -> UsageError:
    """Bad input: one line naming the file and the line."""
    return UsageError(f"{path}:{line}: {msg}")


def quote(v, limit: int = 40) -> str:
    """v as a message quotes it: its repr, cut to `limit` characters (a field of a file may
    be megabytes long)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 3] + "..."


# Launchers' line prefixes: Open MPI --tag-output "[1,0]<stdout>:" (after a --timestamp-output
# date when there is one) and srun -l "0: ". A line's prefix is cut before it is read, so a
# tagged log reads like an untagged one.
_PREFIX_RE = re.compile(r"^(?:[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \d{4})?\[\d+,\d+\]<std(?:out|err)>:\s?"
                        r"|^\d+: ")


def strip_prefix(line: str) -> str:
    """The line without a launcher's prefix ("[1,0]<stdout>:", "0: ")."""
    return _PREFIX_RE.sub("", line, count=1)


def numbered_lines(lines):
    """(line number, text without its launcher prefix and line end) of an iterable of lines
    (an open file streams: nothing holds the whole file)."""
    for i, raw in enumerate(lines, 1):
        yield i, strip_prefix(raw.rstrip("\r\n"))


class Notes:
    """What a parser could not read, said with line numbers (the first few quoted, the rest
    counted), and counts of lines it knows to be noise (NCCL's log)."""

    QUOTED = 10

    def __init__(self):
        self.items: list[str] = []
        self._unknown: list[str] = []
        self._unknown_more = 0
        self._unknown_last = 0
        self.counts: dict[str, list[int]] = {}

    def add(self, text: str) -> None:
        self.items.append(text)

    def unknown(self, lineno: int, line: str, where: str = "") -> None:
        if len(self._unknown) < self.QUOTED:
            self._unknown.append(f"line {lineno}: not understood{where}, skipped: {line.strip()[:100]!r}")
        else:
            self._unknown_more += 1
            self._unknown_last = lineno

    def count(self, what: str, lineno: int) -> None:
        c = self.counts.setdefault(what, [0, lineno, lineno])
        c[0] += 1
        c[2] = lineno

    def lines(self) -> list[str]:
        out = list(self._unknown)
        if self._unknown_more:
            out.append(f"{self._unknown_more} more line(s) not understood, skipped (the last at line "
                       f"{self._unknown_last})")
        for what, (n, first, last) in self.counts.items():
            out.append(f"{n} {what} line(s) skipped (lines {first}-{last})" if n > 1 else
                       f"1 {what} line skipped (line {first})")
        return out + self.items


def _norm_name(text: str) -> str:
    t = Path(str(text)).name.lower()
    t = re.sub(r"\.(txt|log|out|json)$", "", t)
    t = re.sub(r"_perf(_mpi)?$", "", t)
    return re.sub(r"[\s_\-]", "", t)


def benchmark_name(text: str) -> str | None:
    """'all_reduce_perf', 'AllReduce', 'All-to-All Personalized Exchange' -> commbench name."""
    return _NAMES.get(_norm_name(text)) or (text if text in _NAMES.values() else None)


def name_from_filename(path) -> str | None:
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


def busbw_factor(bench: str, world: int) -> float:
    """The busbw factor F (docs/collectives.md#algbw-and-busbw): the benchmark's own for a collective
    commbench runs, nccl-tests' for one it does not; 1 where neither knows it."""

    if world < 1:
        return 1.0
    b = registry().get(bench)
    if b is not None:
        return float(b.busbw_factor(world))
    f = _FACTORS.get(bench)
    return float(f(world)) if f else 1.0


def fnum(tok):
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


def check_status(nwrong) -> str:
    """A row's check from the tool's count of wrong values (None or nan: not checked)."""
    if nwrong is None or (isinstance(nwrong, float) and math.isnan(nwrong)):
        return "skipped"
    return "ok" if nwrong == 0 else "fail"


def make_row(*, bench, backend, device, world, nbytes, dtype, variant="default", params=None, stage="",
             iters=None, warmup=None, clock, mean_us, stats=None, algbw=None, busbw=None, check="skipped",
             source, time_measured, spread="none", extra=None, in_place: bool = False) -> dict:
    """A row with every results.ROW_FIELDS field. time_us_p50 = time_us_mean = the tool's
    (mean) time, the number reports and compare read; `stats` may give
    time_us_min/p90/p99/max/std from per-iteration data. A statistic the tool did not give
    is NaN, never another number standing in for it. time_measured says how the tool
    measured its time (the report's footer)."""

    params = dict(params or {})
    nbytes = int(nbytes)
    factor = busbw_factor(bench, int(world))
    st = {k: float(v) for k, v in (stats or {}).items() if v is not None}
    t = float(mean_us)
    if algbw is None:
        algbw = bandwidths_gbps(nbytes, t, factor)[0]
    if busbw is None:
        busbw = algbw * factor
    placement = placement_of(bench, in_place)
    nan = float("nan")
    row = {
        "schema": SCHEMA_VERSION, "point_key": point_key(bench, world, nbytes, dtype, params, variant, placement),
        "benchmark": bench, "backend": backend, "device": device,
        "world": int(world), "nbytes": nbytes, "dtype": dtype, "variant": variant, "placement": placement,
        "params": params,
        "stage": stage, "iters": None if iters is None else int(iters),
        "warmup": None if warmup is None else int(warmup), "timing": "imported", "clock": clock,
        "time_us_min": st.get("time_us_min", nan), "time_us_p50": t, "time_us_mean": t,
        "time_us_p90": st.get("time_us_p90", nan), "time_us_p99": st.get("time_us_p99", nan),
        "time_us_max": st.get("time_us_max", nan),
        "time_us_std": st["time_us_std"] if "time_us_std" in st else None,
        "algbw_gbps": float(algbw), "busbw_gbps": float(busbw), "busbw_factor": factor, "check": check,
        "source": source, "time_measured": time_measured,
        "spread": spread if "time_us_std" in st or spread == "none" else "none",
    }
    row.update(extra or {})
    return row


# ---------------------------------------------------------------------------------------
# meta.json

def run_meta(fmt, path, nrows, hosts, gpus, world, backend, device, versions, env, notes, extra) -> dict:
    """meta.json of one imported file; `extra` adds to it, or replaces where not None."""

    meta = {
        "schema": SCHEMA_VERSION,
        "command": ["commbench", "import", str(path)],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": hosts[0] if hosts else None,
        "versions": versions,
        "env": env,
        "suite": f"import {SOURCE_NAMES[fmt]}",
        "backend": backend,
        "device": device,
        "world": world,
        "hosts": hosts,
        "nodes": node_ids(hosts) if hosts else None,
        "gpus": gpus,
        "points": nrows,
        "imported_from": os.path.abspath(str(path)),
        "source_format": fmt,
        "source": SOURCE_NAMES[fmt],
        "import_notes": notes,
    }
    for k, v in extra.items():
        if v is not None or k not in meta:
            meta[k] = v
    return meta


def merge_metas(metas: list[dict]) -> dict:
    """One meta.json for the rows of several files (the first file's, widened)."""

    meta = dict(metas[0])
    if len(metas) == 1:
        return meta
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
        meta["nodes"] = node_ids(list(meta["hosts"]))
        meta["import_notes"].append("the files list different hosts: meta.hosts is the largest set")
    return meta


# ---------------------------------------------------------------------------------------
# The result directory

def write_imported_run(rows: list[dict], meta: dict, out_dir) -> Path:
    """A commbench result directory (meta.json status complete, rows.jsonl, results.csv)."""
    run = RunDir(out_dir)
    if run.rows_path.exists() or run.meta_path.exists():
        raise UsageError(f"{run.dir} already holds a run: choose another --out")
    run.open({**meta, "points": len(rows)})
    for r in rows:
        run.append(r)
    run.finish(Status.COMPLETE)
    return run.dir


def default_out_dir(path, root="results") -> Path:
    """results/<timestamp>-import-<the file's stem>."""

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path).stem) or "import"
    return new_run_dir(f"import-{stem}", root)
