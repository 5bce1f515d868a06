"""Import the output of tools users already run (NVIDIA nccl-tests stdout or -J JSON, OSU
micro-benchmarks stdout) as commbench rows, so `report` and `compare` treat it like a run.

Every table is read by its header text, never by column position: the formats grew
columns across versions (nccl-tests -C cputime, -S timestamp, -I per-iteration columns;
OSU -f, P50/P90/P99, Validation). Bad input raises UsageError with one line naming the
file and line.

How the tools' numbers map onto a row (docs/import.md):

- time_us_p50 and time_us_mean are the tool's time, which is a MEAN over its iterations
  (nccl-tests: rank 0's loop average; OSU: the average over ranks of their means); the
  row's `time_measured` says which, and the report's footer shows it. The other
  statistics come from per-iteration statistics when the file has them (nccl-tests -I
  columns, -J per-iteration objects, OSU P90/P99 columns); otherwise they are NaN, never
  another number standing in, and the row's `source` says so. `spread` says what the spread is known from: "std"
  (time_us_std is real) or "none" (only the mean is known).
- algbw/busbw are the tool's own numbers; busbw_factor is commbench's factor for the same
  S definition (nccl-tests' S is commbench's). OSU sizes are per peer for allgather and
  alltoall, so nbytes = size x world there (the file's size is kept as `tool_nbytes`),
  and bandwidths are computed from nbytes and the time.
- nccl-tests prints an out-of-place and an in-place half per size: rows say which in
  `placement` (out-of-place / in-place), as commbench's own rows do.
- check: #wrong 0 -> "ok", N/A (unchecked) -> "skipped", > 0 -> "fail"; OSU: Validation
  Pass/Fail, else "skipped".

nccl_tests, nccl_json and osu parse their tool's output, each row handed on as it is read;
rows builds the rows and meta.json every parser shares; this module tells the formats apart
and streams the rows into the result directory.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.user_files import IMPORT_MAX_NBYTES, check_user_file

from ..record import Status
from ..results import RunDir
from .nccl_json import parse_nccl_json
from .nccl_tests import parse_nccl_stdout
from .osu import osu_title, parse_osu
from .rows import SOURCE_NAMES, benchmark_name, default_out_dir, err, merge_metas, numbered_lines, write_imported_run  # noqa: F401

FORMATS = ("nccl-tests", "nccl-tests-json", "osu")
_TEXT_PARSERS = {"nccl-tests": parse_nccl_stdout, "osu": parse_osu}
# A file that starts with "[" is JSON only if it parses as JSON; larger ones are logs whose
# first line is a tag ("[host:rank] ...", "[user@host]$ ...").
_JSON_ARRAY_MAX_NBYTES = 64 << 20


# What a benchmark, dtype or variant name read from a file may hold: it becomes part of a
# figure's file name and of a figure's labels, so nothing that names a folder ("/", ".."), a
# mathtext formula ("$", "\\") or needs quoting.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
NAME_RULE = "1 to 64 ASCII letters, digits and . _ + -, starting with a letter or digit"


def check_name(where, what: str, name) -> None:
    """Refuse (UsageError, one line) a name from input that is not a plain name."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise UsageError(f"{where}: {what} {name!r} is not a plain name: a name is {NAME_RULE}")


def _check_row_names(path, row: dict) -> None:
    for what in ("benchmark", "dtype", "variant"):
        check_name(path, what, row.get(what))
    if row.get("stage"):
        check_name(path, "stage", row["stage"])


def _is_json(path, first: str) -> bool:
    if first == "{":
        return True
    if first != "[" or Path(path).stat().st_size > _JSON_ARRAY_MAX_NBYTES:
        return False
    try:
        json.loads(Path(path).read_text(encoding="utf-8", errors="replace"))
    except ValueError:
        return False
    except RecursionError:  # nested too deep for Python: JSON, refused by the JSON reader
        return True
    return True


def _text_format(path, lines) -> str | None:
    """The text format from the first line that marks one (launcher prefixes cut)."""
    for _, line in numbered_lines(lines):
        s = line.strip()
        if osu_title(s):
            return "osu"
        if s.startswith("#") and ("Collective test starting" in s or "nccl-tests version" in s
                                  or ("algbw" in s and "busbw" in s)):
            return "nccl-tests"
    return None


def _json_format(path, text: str) -> str:
    head = text.lstrip()[:1]
    if head == "{" and '"results"' in text and ('"nccl_version"' in text or '"config"' in text):
        return "nccl-tests-json"
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if '"schema"' in first and '"benchmark"' in first:
        raise err(path, 1, "already commbench rows: report or compare the run directory directly")
    raise err(path, 1, "JSON that is not nccl-tests -J output (no 'results' and 'nccl_version')")


_NOT_A_FORMAT = ("not a format commbench can import (nccl-tests stdout or -J JSON, OSU stdout: no nccl-tests "
                 "table header and no '# OSU ... Test' title); name it with --format if it is one")


def detect_format(path, text: str) -> str:
    """The format of a file's text, from its first lines' markers."""
    first = text.lstrip()[:1]
    if first == "{" or (first == "[" and _parses(text)):
        return _json_format(path, text)
    fmt = _text_format(path, text.splitlines())
    if fmt is None:
        raise err(path, 1, _NOT_A_FORMAT)
    return fmt


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    except RecursionError:  # nested too deep for Python: JSON, refused by the JSON reader
        return True
    return True


def _first_char(path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                return line.lstrip()[0]
    return ""


def import_stream(path, emit, fmt: str | None = None, world: int | None = None, benchmark: str | None = None,
                  in_place: bool = True) -> dict:
    """Read one nccl-tests (stdout or -J JSON) or OSU file, each row to emit(row) as it is
    read (a text file streams: memory does not grow with its size); returns its meta.
    fmt: "nccl-tests" | "nccl-tests-json" | "osu" (None: detected from the content).
    world: rank count (required for OSU collectives, which do not print it; for nccl-tests
    it overrides the '#  Rank' lines, which a poster may have cut). benchmark: the commbench
    name, when the file does not say. in_place: keep nccl-tests' in-place half, as placement
    "in-place" rows (False: only the out-of-place half)."""
    p = Path(path)
    check_user_file(p, "import", IMPORT_MAX_NBYTES)  # a regular file (not a FIFO, /dev/zero), within a bound
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown import format {fmt!r} (known: {', '.join(FORMATS)})")
    if world is not None and int(world) < 1:
        raise UsageError(f"--world must be >= 1, got {world}")
    if benchmark is not None:
        benchmark = benchmark_name(benchmark) or benchmark
        check_name("--benchmark", "benchmark", benchmark)
    try:
        first = _first_char(p)
        if not first:
            raise err(path, 1, "empty file")
        count = [0]

        def keep(row):
            _check_row_names(path, row)  # a -J file's `type`, an OSU Datatype line: names from the file
            if in_place or row["placement"] != "in-place":
                count[0] += 1
                emit(row)

        if fmt == "nccl-tests-json" or (fmt is None and _is_json(p, first)):
            text = p.read_text(encoding="utf-8", errors="replace")
            fmt = fmt or _json_format(path, text)
            meta = parse_nccl_json(path, text, world=world, benchmark=benchmark, emit=keep)
        else:
            if fmt is None:
                with open(p, encoding="utf-8", errors="replace") as f:
                    fmt = _text_format(path, f)
                if fmt is None:
                    raise err(path, 1, _NOT_A_FORMAT)
            with open(p, encoding="utf-8", errors="replace") as f:
                meta = _TEXT_PARSERS[fmt](path, f, world=world, benchmark=benchmark, emit=keep)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    meta["points"] = count[0]
    if not count[0]:
        raise err(path, 1, f"no data rows with a time in this {SOURCE_NAMES[fmt]} file")
    return meta


def import_file(path, fmt: str | None = None, world: int | None = None,
                benchmark: str | None = None, in_place: bool = True) -> tuple[list[dict], dict]:
    """Rows (commbench schema) and meta of one file, in memory (import_stream's rows, kept)."""
    rows: list[dict] = []
    meta = import_stream(path, rows.append, fmt=fmt, world=world, benchmark=benchmark, in_place=in_place)
    return rows, meta


def import_to_run(paths, out=None, fmt: str | None = None, world: int | None = None,
                  benchmark: str | None = None, in_place: bool = True, root="results") -> tuple[Path, dict]:
    """`commbench import FILE...`: one result directory holding the rows of every file
    (e.g. all_reduce_perf.txt and alltoall_perf.txt of one machine). Rows stream to
    rows.jsonl as they are read; meta.json says `running` until results.csv is written and
    only then the final status: `complete`, or `interrupted` (Ctrl-C) / `failed` with the
    rows read so far. A file that is refused leaves no directory behind. out: the directory
    (default results/<timestamp>-import-<first file's stem>). Returns (dir, meta); meta has
    `benchmarks` (the names imported) and `points`."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise UsageError("import needs at least one file")
    for p in paths:
        check_user_file(p, "import", IMPORT_MAX_NBYTES)
    out_dir = Path(out) if out else default_out_dir(paths[0], root)
    run = RunDir(out_dir)
    if run.rows_path.exists() or run.meta_path.exists():
        raise UsageError(f"{run.dir} already holds a run: choose another --out")
    created = not run.dir.exists()
    run.open({"command": ["commbench", "import", *map(str, paths)],
              "imported_from": [str(Path(p).resolve()) for p in paths]})
    keys: set[str] = set()
    benches: set[str] = set()

    def emit(row):
        k = row["point_key"]
        if k in keys:
            raise UsageError(f"the files measure the same point twice ({k}): import them into separate runs")
        keys.add(k)
        benches.add(row["benchmark"])
        run.append(row, flush=False)

    metas = []
    try:
        for p in paths:
            metas.append(import_stream(p, emit, fmt=fmt, world=world, benchmark=benchmark, in_place=in_place))
    except UsageError:
        run.close_rows()
        _remove_run(run, created)
        raise
    except KeyboardInterrupt:
        run.close_rows()  # what rows.jsonl holds is what the reason counts (a row's write may have been cut)
        run.finish(Status.INTERRUPTED, f"interrupted during the import, after {_count_lines(run.rows_path)} rows",
                   csv=False)
        raise
    except BaseException as e:
        run.finish(Status.FAILED, f"the import failed after {len(keys)} rows: {type(e).__name__}: {e}", csv=False)
        raise
    meta = merge_metas(metas)
    meta["command"] = ["commbench", "import", *map(str, paths)]
    meta["points"] = len(keys)
    meta["benchmarks"] = sorted(benches)
    run.record.begin(meta)
    try:
        run.finish(Status.COMPLETE)
    except KeyboardInterrupt:
        run.record.interrupted(f"interrupted while writing results.csv; rows.jsonl holds all {len(keys)} rows")
        raise
    return run.dir, meta


def _count_lines(path) -> int:
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
    return n


def _remove_run(run: RunDir, created: bool) -> None:
    """A refused import leaves nothing: the files it wrote, and the directory if it made it."""
    if created:
        shutil.rmtree(run.dir, ignore_errors=True)
        return
    for f in (run.rows_path, run.meta_path, run.dir / "results.csv", run.dir / "meta.json.tmp"):
        f.unlink(missing_ok=True)
