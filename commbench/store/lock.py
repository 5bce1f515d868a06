"""One writer per run directory: an exclusive flock on <run>/.lock."""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import LinkRefused, open_nofollow


class RunLock:
    """An exclusive flock on <run>/.lock, held by the launcher (`run --np`) or by rank 0
    (under an external launcher) for the whole run. The kernel drops it when its holder
    dies, so a killed run never leaves a stale lock behind. The holder's pid and host are
    written in the file, for the refusal's message."""

    def __init__(self, path):
        self.dir = Path(path)
        self._fd = None

    @property
    def path(self) -> Path:
        return self.dir / ".lock"

    def acquire(self) -> "RunLock":
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
