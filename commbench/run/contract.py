"""What `run --np`'s launcher and the ranks it starts say to each other, and what the ranks
of one launch say to each other, all in one module: a rank imports this, never the
launcher (run/launcher.py), so either side can change its own workings without the other.

The launcher tells its ranks, in their environment:
- LAUNCH_ID_ENV: the id of this launch; rank 0 records it in meta.json beside every status
  it writes, and names the marker files by it.
- LAUNCHER_PID_ENV: the launcher's pid; a rank ends when it is gone (never an orphan).
- REPEAT_UPTO_ENV: the last repeat this launch runs (variants alternating repeat by repeat).
- RUN_LOCK_ENV: the run directory whose lock the launcher holds for its ranks.

Rank 0 tells its launcher, by files in the run's .progress folder (marked_path): every rank
started, the run is opened by this launch, the run is marked.

The ranks of a launch tell each other, also in .progress: where each one is (rank_path, a
file every rank touches each HEARTBEAT_S: its heartbeat), and why one failed (failure_path,
written into space taken at start-up, slot_path, so a full disk cannot silence it); and, in
/tmp, which of them prints a line they all have (say_once)."""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import LinkRefused, make_dir, open_nofollow
from commbench.core.whoami import LaunchInfo, detect
from commbench.store.lock import RunLock

# --- the environment the launcher gives its ranks ------------------------------------------

# The id of the launch spawn_local made. Rank 0 records it in meta.json with every status it
# writes, so the launcher reads the state of its own launch there, never a state an earlier
# launch into the same directory (a resume, another variant) left behind.
LAUNCH_ID_ENV = "COMMBENCH_LAUNCH_ID"
# The `run --np` launcher a rank must not outlive.
LAUNCHER_PID_ENV = "COMMBENCH_LAUNCHER_PID"
# A launch of several variants with `--repeat N` alternates them repeat by repeat (A B A B):
# each launch runs the repeats up to this one (the earlier ones are in the run already).
REPEAT_UPTO_ENV = "COMMBENCH_REPEAT_UPTO"
# The run directory whose one-writer lock the launcher holds (store.lock.RunLock): its
# ranks must not take it again, nor refuse the directory as busy.
RUN_LOCK_ENV = "COMMBENCH_RUN_LOCK"


def new_launch_id() -> str:
    """An id no other launch has: a pid alone repeats once the process is gone."""
    return f"{os.getpid()}-{time.time_ns()}"


def launch_id_or_new(env=None) -> str:
    """The id the launcher gave this launch, or a fresh one where no `run --np` started it
    (the ranks then agree on rank 0's)."""
    env = os.environ if env is None else env
    return env.get(LAUNCH_ID_ENV) or new_launch_id()


def launcher_pid(env=None) -> int | None:
    """The pid of the launcher this rank must not outlive, or None (another tool's launch)."""
    env = os.environ if env is None else env
    pid = env.get(LAUNCHER_PID_ENV, "")
    return int(pid) if pid.isdigit() and int(pid) > 1 else None


def check_launcher_pid(env=None) -> None:
    """LAUNCHER_PID_ENV names the `run --np` launcher a rank must not outlive; one that is
    not an ancestor of this process was left in the shell, and would end the run at once (a
    pid that is gone) or never (another process's)."""
    env = os.environ if env is None else env
    text = env.get(LAUNCHER_PID_ENV)
    if text is None:
        return
    if not text.isdigit() or int(text) <= 1:
        raise UsageError(f"{LAUNCHER_PID_ENV}={text!r} is not a process id: a stale variable? unset it")
    ancestors = _ancestors()
    if ancestors is not None and int(text) not in ancestors:
        raise UsageError(f"{LAUNCHER_PID_ENV}={text} names no launcher of this process (it is set by `run --np` "
                         f"for its ranks): a stale variable? unset it")


def _ancestors() -> set[int] | None:
    """The pids above this process, or None where /proc cannot tell (not Linux)."""
    if not Path("/proc/self/stat").exists():
        return None
    pid, seen = os.getppid(), set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return seen


def repeat_upto(repeat: int, env=None) -> int:
    """The last repeat this launch runs: all of them, unless the launcher alternates
    variants repeat by repeat (REPEAT_UPTO_ENV)."""
    env = os.environ if env is None else env
    try:
        upto = int(env.get(REPEAT_UPTO_ENV) or repeat)
    except ValueError:
        upto = repeat
    return max(1, min(repeat, upto))


def hold_for_launch(path) -> RunLock:
    """The launcher takes the run's lock and tells its ranks (the environment) that the
    writer they would otherwise lock out is their own launch."""
    lock = RunLock(path).acquire()
    os.environ[RUN_LOCK_ENV] = str(Path(path).resolve())
    return lock


def held_by_my_launcher(path) -> bool:
    return os.environ.get(RUN_LOCK_ENV) == str(Path(path).resolve())


# --- files in the run's .progress folder ---------------------------------------------------
# In the run's own folder, not in /tmp: a launcher killed outright cannot remove what its
# ranks write after it, and the run directory is theirs to write.

PROGRESS_DIR = ".progress"
# What rank 0 of a launch tells its launcher, in the order it happens (marked_path).
MARKS = ("started", "opened", "marked")
# How often each rank's guardian touches its progress file (its heartbeat) and looks for
# the others' failure files: a failure elsewhere ends a rank within about this long.
HEARTBEAT_S = 0.5
# Bytes set aside per rank for its failure file (a JSON line with a one-line cause).
FAILURE_SLOT_NBYTES = 1024


def progress_dir(run_dir) -> Path:
    return Path(run_dir) / PROGRESS_DIR


def marked_path(run_dir, launch_id: str, what: str = "marked") -> Path:
    """Where rank 0 of a launch tells its launcher what it did: "started" (every rank is up:
    the backend started and they have met once), "opened" (this launch took the run over:
    any status meta.json holds from then on is this launch's) and "marked" (the run's status
    is final). A file named by the launch, so a status an earlier launch left in meta.json
    (the failed run a resume continues, the variant launched before) never reads as this
    launch's."""
    return progress_dir(run_dir) / f"launch-{launch_id}.{what}"


def say_marked(what: str, run_dir) -> None:
    """Rank 0: every rank started, the run is opened by this launch, or it is marked
    (complete, failed, interrupted); the launcher that started this launch gives the ranks
    the run's timeout to exit once marked. Nothing to do under a launcher of another tool."""
    launch_id = os.environ.get(LAUNCH_ID_ENV, "")
    if launch_id and all(c.isalnum() or c == "-" for c in launch_id):
        path = marked_path(run_dir, launch_id, what)
        try:
            make_dir(path.parent)
            os.close(open_nofollow(path, os.O_CREAT | os.O_WRONLY))
        except (OSError, LinkRefused):
            pass


def rank_path(progress: Path, rank: int) -> Path:
    """Where a rank says where it is (JSON: step, where, time, pid); its mtime is the rank's
    heartbeat."""
    return progress / f"rank-{rank}"


def slot_path(progress: Path, rank: int) -> Path:
    """The space a rank takes at start-up for its failure file (FAILURE_SLOT_NBYTES)."""
    return progress / f".slot-{rank}"


def failure_path(progress: Path, launch_id: str, rank: int) -> Path:
    """Where a rank of a launch writes why it failed (JSON: rank, reason): named by the
    launch, so an earlier launch's failure in the same directory is not this one's."""
    return progress / f"failed-{launch_id}-rank-{rank}"


def failure_paths(progress: Path, launch_id: str) -> list[Path]:
    """The failure files of every rank of a launch, in name order."""
    return sorted(progress.glob(f"failed-{launch_id}-rank-*"))


# --- one line, once per host ---------------------------------------------------------------

# Variables that name one launch (a job step), so the ranks of one launch on one host can
# agree, through a file, on which of them prints a message they all have. Only variables a
# launcher sets afresh for each launch: MASTER_PORT or RANK left in a shell would make an
# earlier command's marker silence this one.
JOB_KEYS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMI_KVSNAME",
            "TORCHELASTIC_RUN_ID", LAUNCHER_PID_ENV, LAUNCH_ID_ENV)
# A marker older than this is an earlier launch's (the same stale variables, the same line):
# the ranks of one launch reach the same refusal within seconds of each other.
SAID_MARKER_FRESH_S = 30.0


def job_key(env=None) -> str | None:
    """The launch this process is a rank of, as one string, or None where no variable names
    one (or the one that does is stale). The parent process is part of it: the ranks of one
    launch on one host share it (mpirun/prted, slurmstepd, the torchrun agent, `run --np`)."""
    env = os.environ if env is None else env
    parts = [f"{k}={env[k]}" for k in JOB_KEYS if env.get(k)]
    if LAUNCHER_PID_ENV in env:
        try:
            check_launcher_pid(env)
        except UsageError:
            return None
    return ";".join(parts + [f"ppid={os.getppid()}"]) if parts else None


def said_path(key: str, line: str) -> str:
    """The marker the ranks of one launch on one host agree through on who prints `line`."""
    return os.path.join(tempfile.gettempdir(),
                        "commbench-said-" + hashlib.sha1(f"{key};{line}".encode()).hexdigest()[:20])


def say_once(line: str, env=None, everywhere: bool = False) -> None:
    """Print a line every rank of the launch has (a refusal all ranks reach) once per host,
    from whichever rank gets there first, and let the others linger a moment. Rank 0 alone
    would not do: mpirun ends the job at the first non-zero exit, which can cut rank 0 off
    before its line is out when another rank refused first. everywhere: the command is not
    one rank of a launch (report, compare, ...): the line is printed whatever the
    environment says. Where the ranks cannot agree (no variable names the launch, or the
    launch variables themselves are bad), each prints it: twice beats never."""
    try:
        info = detect(env)
    except UsageError:
        info = LaunchInfo(0, 1, 0, "none")
    key = job_key(env) if info.world > 1 and not everywhere else None
    first = True
    if key is not None:
        name = said_path(key, line)
        try:
            if time.time() - os.stat(name).st_mtime > SAID_MARKER_FRESH_S:
                os.unlink(name)
        except OSError:
            pass
        try:
            os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            first = False
        except OSError:
            first = info.rank == 0
        _count_said(name, _host_ranks(env))
    if first:
        print(line, file=sys.stderr, flush=True)
        if key is not None:
            _clear_said(name, _host_ranks(env))
    else:
        time.sleep(1.0)


# How long the rank that printed waits for the host's other ranks to count themselves in
# before it removes the marker itself: the launcher may end the job (mpirun at the first
# non-zero exit) before a late rank reaches _count_said, which would leave the marker behind.
SAID_WAIT_S = 3.0
# Where the launcher does not say how many ranks run here, no rank can tell it is the last:
# the printing rank gives the others this long to find the marker, then removes it.
SAID_WAIT_UNKNOWN_S = 1.0


def _clear_said(name: str, host_ranks: int | None) -> None:
    """Wait (bounded) until the last rank of the host has removed the marker, then remove it
    if it is still there, so a refusal leaves nothing in /tmp however the launch ends."""
    deadline = time.monotonic() + (SAID_WAIT_S if host_ranks is not None else SAID_WAIT_UNKNOWN_S)
    while os.path.lexists(name) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        os.unlink(name)
    except OSError:
        pass


def _host_ranks(env) -> int | None:
    """How many ranks of this launch run on this host, where the launcher says (as
    whoami.local_ranks, from env)."""
    env = os.environ if env is None else env
    for k in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        if env.get(k, "").isdigit():
            return int(env[k])
    return None


def _count_said(name: str, host_ranks: int | None) -> None:
    """Each rank adds a byte to the marker; the last rank of the host to arrive removes it,
    so a refusal leaves nothing in /tmp. Where the launcher does not say how many ranks run
    here, or ends the job before every rank arrived, the rank that printed removes it
    (_clear_said); one left by a killed launch goes when the next refusal finds it stale."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        os.write(fd, b".")  # one byte with O_APPEND: the ranks' appends never overwrite each other
        arrived = os.fstat(fd).st_size
    except OSError:
        return
    finally:
        os.close(fd)
    if host_ranks is not None and arrived >= host_ranks:
        try:
            os.unlink(name)
        except OSError:
            pass
