"""Writes into a run or report directory that never go through a symbolic link found there.

A result directory is often writable by others (a shared results folder, an unpacked
archive, a copied run): whoever can create a file in it can plant a link named like a file
commbench writes (meta.json.tmp -> ~/.bashrc, rows.jsonl -> /elsewhere). A write that
follows it changes, or creates, a file outside the directory with the user's rights. Every
write into a run directory or a report directory goes through this module:

- write_atomic / replacing: a whole file, written to a temporary of a fresh name created
  exclusively (O_CREAT | O_EXCL | O_NOFOLLOW: an existing name, a link included, is never
  opened) and renamed over the file's name. The rename replaces a link of that name itself,
  never the file it points to; a reader sees the old file or the new one, never half.
- open_nofollow: a file written in place (rows appended, a lock): a link there is refused
  (LinkRefused), the file it names is left alone.
- make_dir: a folder inside the directory (figures/, .progress/); a link there is refused.

The directory named by the user (`--out DIR`) may itself be a link: that is the user's own
choice. What is refused is a link found inside it.
"""
from __future__ import annotations

import errno
import hashlib
import os
import secrets
from contextlib import contextmanager
from pathlib import Path

from commbench.core.errors import UsageError

# Fresh temporary names tried before giving up (each one a random 64-bit suffix: a clash is
# someone planting names, not chance).
_TEMP_TRIES = 16


class LinkRefused(UsageError):
    """A symbolic link where commbench writes a file or a folder: one line naming it, exit 2
    at the command line (a run that meets one mid-run fails with this as its reason). Not an
    OSError, so a handler for a full disk or a read-only place never takes it for one."""

    def __init__(self, path):
        super().__init__(f"{path}: is a symbolic link: commbench does not write through a link in a run or report "
                         f"directory (remove it, or choose another directory)")
        self.path = Path(path)


def open_nofollow(path, flags: int, mode: int = 0o644) -> int:
    """os.open(path, flags) that refuses a symbolic link as the last part of path
    (LinkRefused), dangling or not; the descriptor is not inherited by child processes."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        # ELOOP: the link itself; a link met with O_CREAT | O_EXCL reads EEXIST.
        if e.errno in (errno.ELOOP, errno.EEXIST, errno.EMLINK) and os.path.islink(path):
            raise LinkRefused(path) from None
        raise


def _create_temp(path: Path, mode: int) -> tuple[Path, int]:
    """A new, empty temporary beside path: (its path, a descriptor open for writing)."""
    for _ in range(_TEMP_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}", str(path))


@contextmanager
def replacing(path, text: bool = True, newline: str | None = None, encoding: str = "utf-8", mode: int = 0o644):
    """with replacing(path) as f: write f, and path is replaced by what was written once the
    block ends without an error (a temporary of a fresh name, renamed over path: a link named
    path is replaced, not followed). On an error the temporary is removed and path is left
    as it was. text=False: f takes bytes."""
    path = Path(path)
    tmp, fd = _create_temp(path, mode)
    try:
        with os.fdopen(fd, "w" if text else "wb", encoding=encoding if text else None,
                       newline=newline if text else None) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path, data, mode: int = 0o644) -> Path:
    """Replace path with data (bytes, or str written as UTF-8) in one rename; see replacing.
    Returns path."""
    path = Path(path)
    with replacing(path, text=False, mode=mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


def refuse_links(folder, names) -> None:
    """LinkRefused for the first of names that is a link inside folder: said before a
    command starts writing there (a run's ranks, say), not halfway through."""
    for name in names:
        if (Path(folder) / name).is_symlink():
            raise LinkRefused(Path(folder) / name)


def make_dir(path) -> Path:
    """mkdir -p path, refusing a link as path (LinkRefused): a folder commbench makes inside
    a run or report directory, whose files would otherwise land where the link points."""
    path = Path(path)
    if path.is_symlink():
        raise LinkRefused(path)
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():  # made by someone else between the test and the mkdir
        raise LinkRefused(path)
    return path


# What a file name made from data may hold: nothing that names another folder ("/", ".."
# alone) or needs quoting in a shell or a markdown link.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")
FILE_NAME_MAX_CHARS = 120


def file_name(text: str) -> str:
    """A name from data (a benchmark's, a dtype's) as one plain file name that stays in its
    folder: every other character becomes "_", and a name that had to change (or is too
    long) gets a short hash of the original, so two names never share a file."""
    text = str(text)
    plain = "".join(c if c in _NAME_CHARS else "_" for c in text).lstrip(".")
    if plain == text and 0 < len(text) <= FILE_NAME_MAX_CHARS:
        return text
    return f"{plain[:FILE_NAME_MAX_CHARS - 9] or '_'}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
