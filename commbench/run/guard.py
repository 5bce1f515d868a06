"""Every rank's guardian thread: the per-operation watchdog and the signal handling that
keep a stuck or dying run from hanging or losing what it finished.

Why a thread: a rank stuck inside a blocking MPI or gloo call never returns to the
interpreter, so neither a Python signal handler nor an exception can reach it. The
guardian can: it is woken by the deadline or by the bytes the C-level signal handler
writes to a wakeup pipe, records the failure (rank 0 marks meta.json) and ends the
process with os._exit.

Progress files: each rank writes where it is (point index and phase) to
<run>/.progress/rank-N at every phase change, never inside a timed loop. On a timeout the
guardian reads them to name the ranks that did not arrive.

Heartbeats: every guardian touches its progress file twice a second, so a rank that sits at
the same step as the others but has stopped (SIGSTOP, a node frozen, a process stuck outside
Python with the interpreter held) is told apart from a collective that hangs with every rank
alive.

Failure files: a rank whose Python code raises writes its one-line cause to
<run>/.progress/failed-<launch>-rank-N before it dies. Every guardian looks for them twice a
second, so the other ranks end within about a second instead of waiting out the watchdog in
a collective the failed rank will never join, and rank 0 records which rank failed and why.
The space for that file is taken at start-up, so a full disk cannot silence it.

The launcher: a rank started by `commbench run --np` watches its launcher's pid and ends
when the launcher is gone (killed with SIGKILL, say), rather than run on as an orphan.

The files' names and the launcher's variables are the launch's contract (run/contract.py).
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from commbench.core.safe_write import LinkRefused, make_dir, open_nofollow, write_atomic
from commbench.run.contract import (
    FAILURE_SLOT_NBYTES,
    HEARTBEAT_S,
    LAUNCH_ID_ENV,
    failure_path,
    failure_paths,
    launcher_pid,
    marked_path,
    progress_dir,
    rank_path,
    slot_path,
)

EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_SIGNAL_BASE = 128
EXIT_PEER_FAILED = 1
EXIT_LAUNCHER_GONE = 129
# How often the guardian wakes: failure files, heartbeats and the launcher are looked at
# this often, so a failure elsewhere ends this rank within about this long.
POLL_S = HEARTBEAT_S
# A failing rank lingers this long after writing its failure file, so the others' guardians
# (polling every 0.5 s) read the cause before a launcher kills them for the failed exit.
FAILURE_LINGER_S = 1.5
# How long a rank stopped by a signal waits for rank 0 to mark the run before it exits.
MARK_WAIT_S = 2.0


class Guard:
    def __init__(self, rank: int, world: int, run_dir: Path | None, timeout_s: float, on_fatal=None,
                 launch: str = ""):
        self.rank, self.world = rank, world
        self.launch = launch  # failure files of an earlier launch into the same directory are not this one's
        self.timeout_s = float(timeout_s)
        self.on_fatal = on_fatal  # rank 0: (status, reason) -> None, marks meta.json
        self.progress_dir = progress_dir(run_dir) if run_dir else None
        self._lock = threading.Lock()
        self._deadline = None
        self._where = "starting"
        self._step = 0
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)
        self._stopped = False
        self._thread = None
        # Ranks 0..members-1 take part in the current world (the rank-count sweep): only they
        # can be late for its operations.
        self.members = world
        self._slot = None  # the failure file's space, taken while the disk still has it
        # Set by spawn_local: the launcher this rank must not outlive.
        self.launcher_pid = launcher_pid()

    # --- main thread ---------------------------------------------------------------
    def start(self) -> None:
        if self.progress_dir is not None:
            try:
                make_dir(self.progress_dir)
            except (OSError, LinkRefused):  # a link named .progress: nothing is written where it points
                self.progress_dir = None
        if self.progress_dir is not None:
            try:
                self._slot = write_atomic(slot_path(self.progress_dir, self.rank), b" " * FAILURE_SLOT_NBYTES)
            except OSError:
                pass
        # The C-level handler writes the signal number to the pipe even while the main
        # thread sits in a blocking call; the Python-level handler itself does nothing.
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, lambda *_: None)
        self._thread = threading.Thread(target=self._watch, name="commbench-guard", daemon=True)
        self._thread.start()

    def arm(self, where: str, budget_s: float = 0.0) -> None:
        """Enter a phase: it must finish within timeout + budget (the time its operations
        are expected to take); `where` names it in any failure message."""
        with self._lock:
            self._where = where
            self._step += 1
            # Rank 0 fires first: it owns meta.json and can see which ranks did not arrive;
            # the others follow a little later, so every rank still ends in bounded time.
            grace = 0.0 if self.rank == 0 else min(5.0, 0.5 * self.timeout_s)
            self._deadline = time.monotonic() + self.timeout_s + max(0.0, budget_s) + grace
        self._write_progress(where)

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def idle(self, where: str) -> None:
        """Wait with no deadline of this rank's own (outside a smaller world, for as long as
        its sweep takes): named, so a failure message says where, and ended by a peer's
        failure file like any other wait."""
        with self._lock:
            self._where = where
            self._deadline = None
        self._write_progress(where)

    def stop(self) -> None:
        self._stopped = True
        self.disarm()
        if self._slot is not None:
            self._slot.unlink(missing_ok=True)
            self._slot = None
        try:
            os.write(self._wfd, b"\0")
        except OSError:
            pass
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)

    # --- failure files -------------------------------------------------------------
    def report_failure(self, reason: str) -> None:
        """This rank is failing with `reason`: tell the others (failure file), and give them
        a moment to read it before this process exits."""
        if not self._write_failure(reason):
            return
        if self.world > 1:
            time.sleep(FAILURE_LINGER_S)

    def _write_failure(self, reason: str) -> bool:
        if self.progress_dir is None:
            return False
        data = json.dumps({"rank": self.rank, "reason": reason[:FAILURE_SLOT_NBYTES - 100]}).encode()
        final = failure_path(self.progress_dir, self.launch, self.rank)
        try:
            write_atomic(final, data)
        except OSError:
            # A full disk: overwrite the space taken at start-up (no new blocks), then rename.
            try:
                if self._slot is None:
                    return False
                with os.fdopen(open_nofollow(self._slot, os.O_RDWR), "r+b") as f:
                    f.write(data)
                    f.truncate(len(data))
                os.replace(self._slot, final)
            except (OSError, LinkRefused):
                return False
        return True

    def peer_failure(self) -> tuple[int, str] | None:
        """(rank, reason) of another rank's failure in this launch, if one was reported."""
        if self.progress_dir is None:
            return None
        for f in failure_paths(self.progress_dir, self.launch):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if d.get("rank") != self.rank:
                return int(d["rank"]), str(d.get("reason"))
        return None

    # --- progress files ------------------------------------------------------------
    def _write_progress(self, where: str) -> None:
        if self.progress_dir is None:
            return
        try:
            write_atomic(rank_path(self.progress_dir, self.rank),
                         json.dumps({"step": self._step, "where": where, "time": time.time(), "pid": os.getpid()}))
        except OSError:
            pass

    def _heartbeat(self) -> None:
        if self.progress_dir is None:
            return
        try:
            os.utime(rank_path(self.progress_dir, self.rank), follow_symlinks=False)
        except OSError:
            pass

    def silent(self, stale_s: float) -> list[int]:
        """Other ranks whose heartbeat is older than stale_s: stopped, frozen or gone."""
        if self.progress_dir is None:
            return []
        now, out = time.time(), []
        for r in range(min(self.members, self.world)):
            if r == self.rank:
                continue
            try:
                if now - rank_path(self.progress_dir, r).stat().st_mtime > stale_s:
                    out.append(r)
            except OSError:
                out.append(r)
        return out

    def launcher_gone(self) -> bool:
        """Has the launcher that started this rank exited (a zombie counts as gone)?"""
        pid = self.launcher_pid
        if pid is None:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat[stat.rfind(")") + 2:][:1] in ("Z", "X")
        except FileNotFoundError:
            return True
        except OSError:
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                return True
            except OSError:
                return False

    def behind(self) -> list[int] | None:
        """Ranks whose last recorded step is behind this rank's (they did not arrive), or
        None when that is not knowable (no shared run directory)."""
        if self.progress_dir is None:
            return None
        late = []
        for r in range(min(self.members, self.world)):
            try:
                step = json.loads(rank_path(self.progress_dir, r).read_text())["step"]
            except (OSError, ValueError, KeyError):
                late.append(r)
                continue
            if step < self._step:
                late.append(r)
        return late

    # --- guardian thread -----------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopped:
            with self._lock:
                deadline = self._deadline
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            ready, _, _ = select.select([self._rfd], [], [], wait)
            if self._stopped:
                return
            if ready:
                data = os.read(self._rfd, 64)
                sigs = [b for b in data if b]
                if sigs:
                    self._fatal_signal(sigs[0])
                continue
            self._heartbeat()
            if self.launcher_gone():
                with self._lock:
                    where = self._where
                self._end("failed", f"the launcher (pid {self.launcher_pid}) is gone, so its job stops (at {where})",
                          EXIT_LAUNCHER_GONE)
            peer = self.peer_failure()
            if peer is not None:
                self._end("failed", f"rank {peer[0]} failed: {peer[1]}", EXIT_PEER_FAILED)
            with self._lock:
                deadline, where = self._deadline, self._where
            if deadline is not None and time.monotonic() > deadline:
                self._fatal_timeout(where)

    def _fatal_timeout(self, where: str) -> None:
        late = self.behind()
        if late is None:
            who = "which ranks did not arrive is not knowable here"
        else:
            # A rank at the same step whose heartbeat stopped has not arrived either: it is
            # stopped or frozen inside the operation the others wait in.
            silent = [r for r in self.silent(max(1.5, min(5.0, 0.75 * self.timeout_s))) if r not in late]
            if late or silent:
                who = "ranks not arrived: " + ", ".join(map(str, sorted(late + silent)))
                if silent:
                    who += (" (" + ", ".join(map(str, silent)) + " reached this step but stopped responding: "
                            "stopped, frozen or gone)")
            else:
                who = "every rank reached this step and is alive: the operation itself hangs"
        reason = f"timeout: no progress for {self.timeout_s:g} s at {where}; {who}"
        # Tell every rank, including those with no deadline of their own (waiting outside a
        # smaller world): they end on the failure file instead of waiting forever.
        self._write_failure(reason)
        self._end("failed", reason, EXIT_TIMEOUT)

    def _fatal_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        with self._lock:
            where = self._where
        if signum == signal.SIGINT:
            self._end("interrupted", f"interrupted (SIGINT) at {where}", EXIT_SIGNAL_BASE + signum, wait_mark=True)
        peer = self.peer_failure()
        if peer is not None:  # the launcher stops the job because that rank failed: say why
            self._end("failed", f"rank {peer[0]} failed: {peer[1]}", EXIT_SIGNAL_BASE + signum, wait_mark=True)
        self._end("failed", f"terminated by {name} at {where} (a rank was lost, or the launcher or "
                            f"scheduler stopped the job)", EXIT_SIGNAL_BASE + signum, wait_mark=True)

    def _await_mark(self) -> None:
        """A rank other than 0 stopped by a signal waits (bounded) for rank 0 to mark the run:
        mpirun ends the whole job with SIGKILL at the first rank that exits on a signal, which
        would cut rank 0 off while it writes the run's status and leave it "running"."""
        launch_id = os.environ.get(LAUNCH_ID_ENV, "")
        if self.rank == 0 or self.on_fatal is not None or self.progress_dir is None or not launch_id:
            return  # under another tool's launcher rank 0 leaves no mark to wait for
        mark = marked_path(self.progress_dir.parent, launch_id)
        deadline = time.monotonic() + MARK_WAIT_S
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _end(self, status: str, reason: str, code: int, wait_mark: bool = False) -> None:
        try:
            try:
                print(f"commbench: error: rank {self.rank}: {reason}", file=sys.stderr, flush=True)
            except OSError:  # nowhere to say it (mpirun gone with its launcher): the run is marked all the same
                pass
            if wait_mark:
                self._await_mark()
            if self.on_fatal is not None:
                self.on_fatal(status, reason)
        finally:
            os._exit(code)


@contextmanager
def teardown_bound(limit_s: float):
    """A kernel timer around the backend's teardown: the watchdog is a Python thread, and a
    library call that keeps the interpreter's lock while it waits (MPI_Finalize behind a
    lost link) would keep it from ever running. SIGALRM with its default action ends the
    process whatever holds the lock; the run is already marked by then."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, limit_s))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
