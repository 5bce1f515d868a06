"""Files a person names on the command line (a suite file, a profile, a published-figures
table for `model --against`, a file to import), read within a bound.

Such a name can be anything the shell reaches: /dev/zero or /dev/urandom (a read that never
ends and takes all memory), a FIFO (an open that waits forever for a writer), a directory,
or a regular file far larger than any such file is. Each is refused in one line before it is
read. The check is made on the open descriptor itself (fstat), so a name swapped for
something else between a look and the read is still caught, and a FIFO is opened without
waiting (O_NONBLOCK) so that it can be refused at all.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from commbench.core.errors import UsageError

# A suite, a profile or a published-figures table: the shipped ones are a few KiB; 4 MiB is
# a thousand times that and still nothing to hold in memory.
TOML_MAX_NBYTES = 4 << 20
# A file to import (nccl-tests or OSU output, a -J JSON): a sweep's log is a few MiB even with
# every rank's NCCL INFO lines; beyond 1 GiB it is not one tool's output.
IMPORT_MAX_NBYTES = 1 << 30


def _size_text(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.4g} {unit}"
    return f"{nbytes} B"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse_stat(st: os.stat_result, path, what: str, max_nbytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {path}: is {_kind(st.st_mode)}, not a regular file: commbench reads only "
                         f"regular files here")
    if st.st_size > max_nbytes:
        raise UsageError(f"{what} {path}: {_size_text(st.st_size)}, more than the {_size_text(max_nbytes)} "
                         f"such a file may hold")


def check_user_file(path, what: str, max_nbytes: int) -> Path:
    """path, once it names a regular file (a link to one is fine) of at most max_nbytes;
    otherwise UsageError, one line starting with `what path:`. For a reader that opens the
    file itself and streams it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: cannot read: no such file") from None
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read: {e.strerror or e}") from None
    _refuse_stat(st, path, what, max_nbytes)
    return Path(path)


def read_user_bytes(path, what: str, max_nbytes: int) -> bytes:
    """The whole of a regular file of at most max_nbytes (check_user_file's refusals, made on
    the open descriptor); a file that grew past the bound while read is refused too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: cannot read: no such file") from None
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read: {e.strerror or e}") from None
    try:
        _refuse_stat(os.fstat(fd), path, what, max_nbytes)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_nbytes + 1)
        except OSError as e:
            raise UsageError(f"{what} {path}: cannot read: {e.strerror or e}") from None
    if len(data) > max_nbytes:
        raise UsageError(f"{what} {path}: more than the {_size_text(max_nbytes)} such a file may hold")
    return data


def read_user_text(path, what: str, max_nbytes: int = TOML_MAX_NBYTES) -> str:
    """read_user_bytes as UTF-8 text (UnicodeDecodeError for bytes that are not: the caller
    says what the file should have been)."""
    return read_user_bytes(path, what, max_nbytes).decode("utf-8")
