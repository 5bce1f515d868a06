"""Whether a result directory can take a run, said before any rank starts: a path that can
be made and written, and a filesystem with room for the planned rows (a rank that finds out
alone mid-run leaves the others waiting, and a full disk found mid-run costs the run its end)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import refuse_links

# A rough size of one row on disk (rows are 1-2 KiB; MoE rows carry per-stage fields), and of
# meta.json, the progress files and failure slots: the free-space check errs on the safe side.
ROW_NBYTES_EST = 2048
RUN_FIXED_NBYTES = 64 * 1024


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
    planned rows."""

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
