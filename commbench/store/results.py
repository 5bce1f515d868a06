"""The run on disk: the one object that owns a result directory's files (rows.jsonl
appended and flushed per point, results.csv), with the run's record, meta.json, kept by its
RunRecord (store/record.py), which alone writes the run's state.

Every reader (load, report, compare, plots, importers, --resume) goes through read_rows(),
which migrates old schemas (core/schema.py) and hands back rows whose `params` is always a dict.
"""
from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

from commbench.core.safe_write import LinkRefused, open_nofollow, replacing
from commbench.core.schema import (  # noqa: F401
    ROW_FIELDS,
    ROW_SCHEMA,
    SCHEMA_VERSION,
    normalize_row,
    params_dict,
    placement_of,
    point_key,
    time_cannot_be,
)
from commbench.store.record import RunRecord, Status

# What a line must hold to be a row (a report or compare reads these of every row).
_REQUIRED = ("benchmark", "world", "nbytes", "dtype", "time_us_p50")


def read_rows_checked(path: Path) -> tuple[list[dict], list[int]]:
    """Rows of one run, migrated, and the line numbers that are not rows (a truncated last
    line after a crash mid-write, bytes that are not text, JSON that is not a row)."""
    rows, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad.append(n)
                continue
            if not isinstance(row, dict) or any(k not in row for k in _REQUIRED) or \
                    not isinstance(row.get("benchmark"), str):
                bad.append(n)
                continue
            try:
                rows.append(normalize_row(row))
            except Exception:  # noqa: BLE001 (a row whose fields will not migrate is not a row)
                bad.append(n)
    return rows, bad


def read_rows(path: Path) -> list[dict]:
    """Rows of one run, migrated; lines that are not rows are skipped (read_rows_checked)."""
    return read_rows_checked(path)[0]


def new_run_dir(suite: str, root: str | Path = "results") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{suite}"
    n = 1
    while path.exists():
        n += 1
        path = Path(root) / f"{stamp}-{suite}-{n}"
    return path


# --- the run directory ----------------------------------------------------------------

class RunDir:
    """A result directory and every write to it. Rank 0 (or the importer, or the launcher
    settling a run its ranks could not) is the only writer. Rows are appended and flushed
    as each point finishes, so a crash keeps every finished point; meta.json is the run's
    record (`record`, a RunRecord), which alone writes the run's state."""

    def __init__(self, path):
        self.dir = Path(path)
        self.record = RunRecord(self.dir)
        self._rows = None
        # Called once finish() has written the run's final status (rank 0 tells its launcher).
        self.on_marked = None

    @property
    def meta(self) -> dict:
        """The record as last read or written (changed only through `record`)."""
        return self.record.meta

    @property
    def rows_path(self) -> Path:
        return self.dir / "rows.jsonl"

    @property
    def meta_path(self) -> Path:
        return self.record.path

    def holds_run(self) -> bool:
        return self.rows_path.is_file()

    def read_meta(self) -> dict:
        return self.record.read()

    def rows(self) -> list[dict]:
        return read_rows(self.rows_path) if self.rows_path.is_file() else []

    def done_keys(self) -> set[str]:
        return {r["point_key"] for r in self.rows() if r.get("point_key")}

    # --- writing ---
    def open(self, meta: dict | None = None) -> "RunDir":
        """Start (or continue) writing: meta.json now, rows appended from here on. meta: a
        record given whole (an import's; record.begin), else the one `record` holds. A torn
        last line (a kill or a full disk mid-write) is cut off first, so the next row starts
        on a line of its own. A link named rows.jsonl is refused (LinkRefused) before
        anything is written: the rows would land wherever it points."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.rows_path.is_symlink():
            raise LinkRefused(self.rows_path)
        if meta is not None:
            self.record.begin(meta)
        self.record.write()
        self._rows = os.fdopen(open_nofollow(self.rows_path, os.O_RDWR | os.O_APPEND | os.O_CREAT), "a",
                               buffering=1, encoding="utf-8")
        _repair_tail(self._rows.fileno())  # nothing buffered yet; every write appends after the cut
        return self

    def append(self, row: dict, flush: bool = True) -> None:
        """flush=False: an importer's many rows, written by the buffer (its status says
        whether it finished)."""
        if flush:
            self.append_point([row])
        else:
            self._rows.write(json.dumps(row, default=float) + "\n")

    def append_point(self, rows: list[dict]) -> None:
        """The rows of one point (one per stage) in one write: a kill between them would leave
        a point that --resume counts done (point_key) with a stage missing."""
        data = "".join(json.dumps(r, default=float) + "\n" for r in rows).encode()
        self._rows.flush()
        while data:  # a regular file takes it whole unless the disk is full (then OSError)
            data = data[os.write(self._rows.fileno(), data):]

    def write_file(self, name: str, text: str) -> None:
        """A file a benchmark leaves beside the rows (pairs_matrix.csv), written whole or
        not at all (a link of that name is replaced, not followed)."""
        if "/" in name or name in ("", ".", "..", "rows.jsonl", "meta.json", "results.csv"):
            raise ValueError(f"not a file a benchmark may write in a run directory: {name!r}")
        with replacing(self.dir / name) as f:
            f.write(text)

    def close_rows(self) -> None:
        if self._rows is not None:
            rows, self._rows = self._rows, None
            try:
                rows.close()
            except OSError:  # a full disk: the buffered tail is lost, the status must not be
                pass

    def finish(self, status: Status | str | None = None, reason: str | None = None, csv: bool = True) -> None:
        """Close the rows, write results.csv, then have the record end the run (status, or
        None: the status its variants settle to): the status comes last, so no reader sees
        a final status while results are still being written. csv=False: an interrupted
        writer that must end now (rows.jsonl holds the rows)."""
        self.close_rows()
        if csv:
            try:
                self.write_csv()
            except Exception as e:  # noqa: BLE001 (a full disk: rows.jsonl still holds every row)
                why = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
                reason = "; ".join(x for x in (reason, f"results.csv not written: {why}") if x)
        self.record.end(status, reason)
        if self.on_marked is not None:  # the launcher's drain bound starts here (run.launcher)
            self.on_marked()

    def _iter_rows(self):
        """The rows one at a time (a big run's CSV is written without holding them all)."""
        if not self.rows_path.is_file():
            return
        with open(self.rows_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and all(k in row for k in _REQUIRED) and \
                        isinstance(row.get("benchmark"), str):
                    try:
                        yield normalize_row(row)
                    except Exception:  # noqa: BLE001 (as read_rows_checked: not a row)
                        continue

    def write_csv(self) -> None:
        extra = set()
        for r in self._iter_rows():
            extra.update(r)
        fields = list(ROW_FIELDS) + sorted(extra - set(ROW_FIELDS))
        with replacing(self.dir / "results.csv", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in self._iter_rows():
                w.writerow({k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
                            for k, v in r.items()})


def _repair_tail(fd: int) -> None:
    """Cut a torn last line off the rows file open as fd (read from its end: not read whole)."""
    end = size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return
    while end > 0:
        start = max(0, end - 65536)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            os.ftruncate(fd, start + cut + 1)
            return
        end = start
    os.ftruncate(fd, 0)


def load_meta(run_dir) -> dict:
    return RunDir(run_dir).read_meta()


def write_csv(run_dir) -> None:
    RunDir(run_dir).write_csv()
