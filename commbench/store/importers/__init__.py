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
- nccl-tests prints an out-of-place and an in-place half per size: rows say which in
  `placement` (out-of-place / in-place), as commbench's own rows do.
- check: #wrong 0 -> "ok", N/A (unchecked) -> "skipped", > 0 -> "fail"; OSU: Validation
  Pass/Fail, else "skipped".

nccl_tests and osu parse their tool's output; rows builds the rows and meta.json every
parser shares and writes the result directory; this module tells the formats apart.
"""
from __future__ import annotations

from pathlib import Path

from commbench.core.errors import UsageError
from .nccl_tests import parse_nccl_json, parse_nccl_stdout
from .osu import OSU_TITLE_RE, parse_osu
from .rows import SOURCE_NAMES, benchmark_name, default_out_dir, err, merge_metas, write_imported_run

FORMATS = ("nccl-tests", "nccl-tests-json", "osu")
_PARSERS = {"nccl-tests": parse_nccl_stdout, "nccl-tests-json": parse_nccl_json, "osu": parse_osu}


def detect_format(path, text: str) -> str:
    """The format of a file's text, from its first lines' markers."""
    head = text.lstrip()[:1]
    if head in ("{", "["):
        if head == "{" and '"results"' in text and ('"nccl_version"' in text or '"config"' in text):
            return "nccl-tests-json"
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        if '"schema"' in first and '"benchmark"' in first:
            raise err(path, 1, "already commbench rows: report or compare the run directory directly")
        raise err(path, 1, "JSON that is not nccl-tests -J output (no 'results' and 'nccl_version')")
    for line in text.splitlines():
        s = line.strip()
        if OSU_TITLE_RE.match(s):
            return "osu"
        if s.startswith("#") and ("Collective test starting" in s or "nccl-tests version" in s
                                  or ("algbw" in s and "busbw" in s)):
            return "nccl-tests"
    raise err(path, 1, "not a format commbench can import (nccl-tests stdout or -J JSON, OSU collective "
                        "stdout); name it with --format if it is one")


def import_file(path, fmt: str | None = None, world: int | None = None,
                benchmark: str | None = None, in_place: bool = True) -> tuple[list[dict], dict]:
    """Rows (commbench schema) and meta of one nccl-tests (stdout or -J JSON) or OSU file.
    fmt: "nccl-tests" | "nccl-tests-json" | "osu" (None: detected from the content).
    world: rank count (required for OSU, which does not print it; checked against the
    nccl-tests rank lines). benchmark: the commbench name, when the file does not say.
    in_place: keep nccl-tests' in-place half, as placement "in-place" rows (False: only the
    out-of-place half)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    if not text.strip():
        raise err(path, 1, "empty file")
    if fmt is None:
        fmt = detect_format(path, text)
    if fmt not in FORMATS:
        raise UsageError(f"unknown import format {fmt!r} (known: {', '.join(FORMATS)})")
    if world is not None and int(world) < 1:
        raise UsageError(f"--world must be >= 1, got {world}")
    if benchmark is not None:
        benchmark = benchmark_name(benchmark) or benchmark
    rows, meta = _PARSERS[fmt](path, text, world=world, benchmark=benchmark)
    if not in_place:
        rows = [r for r in rows if r["placement"] != "in-place"]
        meta["points"] = len(rows)
    if not rows:
        raise err(path, 1, f"no data rows with a time in this {SOURCE_NAMES[fmt]} file")
    return rows, meta


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
    meta = merge_metas(metas)
    meta["command"] = ["commbench", "import", *map(str, paths)]
    out_dir = Path(out) if out else default_out_dir(paths[0], root)
    write_imported_run(rows, meta, out_dir)
    return out_dir, rows, meta

