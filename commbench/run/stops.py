"""How the launcher of `run --np` stops: the signal that stopped it (so a launcher of several
launches, variants or repeats, starts no launch after it), signals to a job's sessions, and
an mpirun that does not outlive the launcher."""
from __future__ import annotations

import contextlib
import os
import signal
import sys

# The signal (SIGINT, SIGTERM, SIGHUP) that stopped a launch of this launcher, once one has.
_STOPPED: list[int] = []

# linux/prctl.h: the signal the kernel sends a process when its parent dies.
PR_SET_PDEATHSIG = 1


def note_stop(signum: int) -> None:
    """The launcher was told to stop (Ctrl-C, SIGTERM, SIGHUP): no further launch starts."""
    _STOPPED.append(int(signum))


def stopped_by() -> int | None:
    """The signal that stopped this launcher, or None."""
    return _STOPPED[0] if _STOPPED else None


def exit_status(signum: int) -> int:
    """A launcher's exit status after signum stopped it: 128 + its number, as a shell says."""
    return 128 + int(signum)


@contextlib.contextmanager
def noting_stops():
    """While a launcher runs several launches: SIGTERM and SIGHUP between two of them are
    noted (stopped_by) rather than fatal, and Ctrl-C too, so the run is marked as a stop
    inside a launch leaves it, not left half-recorded (while a job runs, spawn_local takes
    the signals itself and passes them to the job)."""
    previous = {sig: signal.signal(sig, lambda signum, _f: note_stop(signum))
                for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except KeyboardInterrupt:
        note_stop(signal.SIGINT)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def dies_with_launcher():
    """A preexec_fn that has the kernel SIGKILL mpirun when this launcher dies (Linux's
    PR_SET_PDEATHSIG), or None where that is not available. Why: the ranks watch the
    launcher's pid and end on their own, but mpirun (prterun) does not, and one whose ranks
    died in MPI_Init (a mistyped OMPI_MCA_pml) waits for them forever, an orphan; nothing of
    the launcher runs after a SIGKILL to stop it. SIGKILL, as such a prterun ignores SIGTERM.
    The ranks, in process groups of their own, are not killed with it: they see the launcher
    gone and mark the run before they end (their stderr, a pipe to mpirun, is gone by then;
    the guard marks the run all the same).
    libc is looked up here, before the fork; the child only makes the call (a preexec_fn
    runs between fork and exec, where little is safe)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    launcher, kill = os.getpid(), int(signal.SIGKILL)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, kill)
        if os.getppid() != launcher:  # the launcher died before the call took hold
            os._exit(1)
    return preexec


def signal_session(p, sig) -> None:
    """Send sig to a rank (or mpirun), and SIGCONT to its session's process group: a rank
    stopped (SIGSTOP, a debugger) would otherwise hold the signal unread until it is killed."""
    if p.poll() is not None:
        return
    p.send_signal(sig)
    try:
        os.killpg(p.pid, signal.SIGCONT)
    except OSError:
        pass


def kill_session(p) -> None:
    """SIGKILL a rank, or mpirun with the ranks it started: each was started in a session of
    its own, whose process group has the child's pid."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        p.kill()
