"""Join mpirun / srun / torchrun, or start N local ranks ourselves."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from commbench.backends.rendezvous import free_port
from commbench.core.errors import UsageError
from commbench.core.safe_write import LinkRefused, make_dir, open_nofollow
from commbench.core.whoami import LaunchInfo, detect, find_mpirun, local_ranks, node_ids  # noqa: F401 (the launch's facts)
from commbench.run.stops import dies_with_launcher, kill_session, note_stop, signal_session
from commbench.store.results import RunDir


def check_launcher_pid(env=None) -> None:
    """COMMBENCH_LAUNCHER_PID names the `run --np` launcher a rank must not outlive; one that
    is not an ancestor of this process was left in the shell, and would end the run at once
    (a pid that is gone) or never (another process's)."""
    env = os.environ if env is None else env
    text = env.get("COMMBENCH_LAUNCHER_PID")
    if text is None:
        return
    if not text.isdigit() or int(text) <= 1:
        raise UsageError(f"COMMBENCH_LAUNCHER_PID={text!r} is not a process id: a stale variable? unset it")
    ancestors = _ancestors()
    if ancestors is not None and int(text) not in ancestors:
        raise UsageError(f"COMMBENCH_LAUNCHER_PID={text} names no launcher of this process (it is set by `run --np` "
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


# Variables that name one launch (a job step), so the ranks of one launch on one host can
# agree, through a file, on which of them prints a message they all have. Only variables a
# launcher sets afresh for each launch: MASTER_PORT or RANK left in a shell would make an
# earlier command's marker silence this one.
JOB_KEYS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMI_KVSNAME",
            "TORCHELASTIC_RUN_ID", "COMMBENCH_LAUNCHER_PID", "COMMBENCH_LAUNCH_ID")
# Set by spawn_local: the id of the launch it made. Rank 0 records it in meta.json with every
# status it writes, so the launcher reads the state of its own launch there, never a state an
# earlier launch into the same directory (a resume, another variant) left behind.
LAUNCH_ID_ENV = "COMMBENCH_LAUNCH_ID"
# A launch of several variants with `--repeat N` alternates them repeat by repeat (A B A B):
# each launch runs the repeats up to this one (the earlier ones are in the run already).
REPEAT_UPTO_ENV = "COMMBENCH_REPEAT_UPTO"


def new_launch_id() -> str:
    """An id no other launch has: a pid alone repeats once the process is gone."""
    import time

    return f"{os.getpid()}-{time.time_ns()}"


# What rank 0 of a launch tells its launcher, in the order it happens (marked_path).
MARKS = ("started", "opened", "marked")


def marked_path(run_dir, launch_id: str, what: str = "marked") -> Path:
    """Where rank 0 of a launch tells its launcher what it did: "started" (every rank is up:
    the backend started and they have met once), "opened" (this launch took the run over:
    any status meta.json holds from then on is this launch's) and "marked" (the run's status
    is final). A file named by the launch, so a status an earlier launch left in meta.json
    (the failed run a resume continues, the variant launched before) never reads as this
    launch's. In the run's own .progress folder, not in /tmp: a launcher killed outright
    cannot remove what its ranks write after it, and the run directory is theirs to write."""
    return Path(run_dir) / ".progress" / f"launch-{launch_id}.{what}"


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


def job_key(env=None) -> str | None:
    """The launch this process is a rank of, as one string, or None where no variable names
    one (or the one that does is stale). The parent process is part of it: the ranks of one
    launch on one host share it (mpirun/prted, slurmstepd, the torchrun agent, `run --np`)."""
    env = os.environ if env is None else env
    parts = [f"{k}={env[k]}" for k in JOB_KEYS if env.get(k)]
    if "COMMBENCH_LAUNCHER_PID" in env:
        try:
            check_launcher_pid(env)
        except UsageError:
            return None
    return ";".join(parts + [f"ppid={os.getppid()}"]) if parts else None


# A marker older than this is an earlier launch's (the same stale variables, the same line):
# the ranks of one launch reach the same refusal within seconds of each other.
SAID_MARKER_FRESH_S = 30.0


def say_once(line: str, env=None, everywhere: bool = False) -> None:
    """Print a line every rank of the launch has (a refusal all ranks reach) once per host,
    from whichever rank gets there first, and let the others linger a moment. Rank 0 alone
    would not do: mpirun ends the job at the first non-zero exit, which can cut rank 0 off
    before its line is out when another rank refused first. everywhere: the command is not
    one rank of a launch (report, compare, ...): the line is printed whatever the
    environment says. Where the ranks cannot agree (no variable names the launch, or the
    launch variables themselves are bad), each prints it: twice beats never."""
    import hashlib
    import tempfile
    import time

    try:
        info = detect(env)
    except UsageError:
        info = LaunchInfo(0, 1, 0, "none")
    key = job_key(env) if info.world > 1 and not everywhere else None
    first = True
    if key is not None:
        name = os.path.join(tempfile.gettempdir(),
                            "commbench-said-" + hashlib.sha1(f"{key};{line}".encode()).hexdigest()[:20])
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
    else:
        time.sleep(1.0)


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
    here, the marker stays until the next refusal finds it stale (SAID_MARKER_FRESH_S)."""
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


@functools.lru_cache(maxsize=8)
def mpirun_banner(mpirun: str) -> str:
    """What `mpirun --version` prints ("" when it does not run): read once per process, since
    every launch of a run (one a repeat, one a variant) asks what the MPI is."""
    try:
        return subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def mpirun_command(np_: int, argv: list[str], mpirun: str | None = None) -> list[str]:
    """mpirun with what a root user and an oversubscribed host need (Open MPI flags)."""
    mpirun = mpirun or find_mpirun()
    banner = mpirun_banner(mpirun)
    cmd = [mpirun, "-np", str(np_)]
    if "Open MPI" in banner or "OpenRTE" in banner or "prte" in banner.lower():
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        if np_ > (os.cpu_count() or 1):
            cmd.append("--oversubscribe")
    return cmd + [sys.executable, "-m", "commbench"] + argv


def local_mpi_env(env: dict, mpirun: str | None = None) -> dict:
    """env for a job of ranks all on this host under Open MPI 5: its transports limited to
    shared memory and self (OMPI_MCA_btl=self,sm) unless env names them already. Why: they
    carry all of such a job's traffic anyway, and Open MPI 5 otherwise also starts its TCP
    transport, which on the 2-core loopback VM took 1.0 s of a 2-rank job's 1.2 s start
    (mpirun ... python -c 'from mpi4py import MPI'), in every launch: a run whose repeats are
    launches of their own pays it once a repeat."""
    if "OMPI_MCA_btl" in env:
        return env
    m = re.search(r"Open MPI\)?\s+v?(\d+)\.", mpirun_banner(mpirun or find_mpirun()))
    return {**env, "OMPI_MCA_btl": "self,sm"} if m and int(m.group(1)) >= 5 else env


# After SIGINT or a lost rank, how long the ranks get to mark the run and exit before
# they are killed.
GRACE_S = 10.0
# The launcher's status when it had to stop ranks that hung after the run was marked.
EXIT_TEARDOWN_HUNG = 124
# Until rank 0 says every rank started (marked_path "started": the backend is up and the
# ranks have met), no watchdog of the ranks' own runs: an MPI_Init that never returns, or an
# mpirun that waits forever on a rank that died in it, would hold the launcher without end.
# The launcher bounds that wait at the run's --timeout (the longest the backend's own
# rendezvous waits) plus this floor: starting the interpreters and importing the libraries
# on a busy host. Past it the job is stopped and the run marked failed.
STARTUP_FLOOR_S = 30.0
# The launcher's status when the ranks did not start within that bound (as timeout(1)).
EXIT_STARTUP_HUNG = 124

# `--np` starts every rank on this host: more than this many per core measures the scheduler,
# not the fabric, and far more exhausts the host (processes, ptys, memory) before a rank runs.
MAX_RANKS_PER_CORE = 16
# What one idle rank holds (interpreter, numpy, torch or MPI): the floor of its memory.
RANK_MEM_NBYTES = 150 << 20
# Processes and threads one rank may count against RLIMIT_NPROC (interpreter, backend and
# progress threads, mpirun's helpers).
THREADS_PER_RANK = 16


def local_rank_limit() -> tuple[int, str]:
    """The most ranks `--np` may start on this host, and what sets that limit."""
    import resource

    cores = os.cpu_count() or 1
    limits = [(MAX_RANKS_PER_CORE * cores, f"{MAX_RANKS_PER_CORE} per core on {cores} cores")]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                limits.append((max(1, avail // RANK_MEM_NBYTES),
                               f"{avail >> 20} MiB available at {RANK_MEM_NBYTES >> 20} MiB a rank"))
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
        limits.append((max(1, soft // THREADS_PER_RANK),
                       f"the process limit {soft} at {THREADS_PER_RANK} threads a rank"))
    return min(limits)


def check_local_ranks(np_: int) -> None:
    """Refuse, before anything starts, an --np this host cannot run."""
    if np_ < 1:
        raise UsageError(f"--np must be >= 1, got {np_}")
    most, why = local_rank_limit()
    if np_ > most:
        raise UsageError(f"--np {np_}: this host runs at most {most} local ranks ({why}); "
                         f"for more ranks use a cluster launcher (mpirun/srun/torchrun) across hosts")


def spawn_local(np_: int, backend: str, argv: list[str], out_dir: str | None = None,
                extra_env: dict | None = None, timeout_s: float = 0.0, variant: str | None = None) -> int:
    """Start np_ ranks on this host and wait; returns the worst exit status.

    mpi: one mpirun, which ends the job when a rank dies. gloo/nccl: np_ processes; when
    one exits non-zero the others would wait on it forever, so they are stopped. Ctrl-C
    (SIGINT to this launcher) is passed to the ranks, which mark the run interrupted, and so
    are SIGTERM and SIGHUP; the signal is noted (stopped_by), so a launcher of several
    launches starts no other. At the end the run's meta.json is checked: a run whose rank 0
    died before it could say so is marked failed here, and no variant is left `running`.
    timeout_s: the run's watchdog timeout, which bounds the job's start-up (STARTUP_FLOOR_S)
    and which the job gets to exit once its rank 0 has marked the run (marked_path).
    variant: the variant this launch runs, settled with the run."""
    import signal

    os.environ.setdefault("COMMBENCH_TTY", "1" if sys.stdout.isatty() else "0")
    launch_id = new_launch_id()
    # The ranks watch this pid: a launcher killed outright (SIGKILL) takes its job with it.
    base_env = {**os.environ, **(extra_env or {}), "COMMBENCH_LAUNCHER_PID": str(os.getpid()),
                LAUNCH_ID_ENV: launch_id}
    if sys.stdout.isatty():
        # Ranks under mpirun write to a pipe, which mpirun passes on a line at a time: a
        # progress bar (redrawn with "\r", no newline) would show only at the end. Rank 0
        # draws it on the launcher's terminal itself, at the terminal's width.
        base_env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
        try:
            base_env.setdefault("COMMBENCH_TTY_PATH", os.ttyname(sys.stdout.fileno()))
        except OSError:
            pass
    # Not a terminal: the job's output comes through this launcher, so a reader that leaves
    # (`| head -1`) costs only the console output; mpirun would abort on the closed pipe and
    # take the job with it.
    out = None if sys.stdout.isatty() else subprocess.PIPE
    # SIGTERM or SIGHUP to the launcher (a scheduler's stop, a closed terminal) is passed to
    # the job, which marks the run and ends; the launcher waits for it, as for Ctrl-C. Taken
    # before the job starts: one that comes while it starts stops it all the same.
    got: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _f: got.append(signum))
                for sig in (signal.SIGTERM, signal.SIGHUP)}
    procs, relays, causes = [], [], []
    try:
        if backend == "mpi":
            # Own session, so a terminal's Ctrl-C reaches the ranks once, through us.
            procs.append(subprocess.Popen(mpirun_command(np_, argv), start_new_session=True,
                                          env=local_mpi_env(base_env), stdout=out, preexec_fn=dies_with_launcher()))
        else:
            port = free_port()
            for r in range(np_):
                env = dict(base_env, RANK=str(r), WORLD_SIZE=str(np_), LOCAL_RANK=str(r),
                           LOCAL_WORLD_SIZE=str(np_), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                procs.append(subprocess.Popen([sys.executable, "-m", "commbench"] + argv, env=env,
                                              start_new_session=True, stdout=out))
        relays = [_relay(p.stdout) for p in procs if p.stdout is not None]
        status = _wait_job(procs, got, out_dir, launch_id, timeout_s, causes)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        for t in relays:  # the job's last lines; a rank's orphan holding the pipe is not waited for
            t.join(RELAY_DRAIN_S)
    interrupted = status == 130
    if got or interrupted:
        note_stop(got[0] if got else signal.SIGINT)
    if out_dir:
        why = f"{signal.Signals(got[0]).name} to the launcher stopped the job" if got else \
            (causes[0] if causes else None)
        RunDir(out_dir).settle(status, interrupted or bool(got), why,
                               ours=marked_path(out_dir, launch_id, "opened").exists(), variant=variant)
        for what in MARKS:
            marked_path(out_dir, launch_id, what).unlink(missing_ok=True)
    return status


# How long the launcher waits, after the job ended, for the rest of its output.
RELAY_DRAIN_S = 5.0


def _relay(pipe):
    """Copy a child's stdout to ours as it comes (sys.stdout drops it once its reader has
    left: cli._DroppingStdout), in a thread of its own."""
    import codecs
    import threading

    def copy():
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            try:
                sys.stdout.write(decode.decode(chunk))
                sys.stdout.flush()
            except (OSError, ValueError):
                pass  # nowhere to show it: the rows are in the run directory all the same
        pipe.close()

    t = threading.Thread(target=copy, daemon=True, name="commbench-relay")
    t.start()
    return t


def _wait_job(procs, got: list[int], out_dir=None, launch_id: str = "", timeout_s: float = 0.0,
              causes: list[str] | None = None) -> int:
    """Wait for the ranks (or mpirun); stop the rest when one fails, pass on Ctrl-C and the
    signals in `got`, and kill whatever is left GRACE_S after a stop. A job whose rank 0 has
    not said that every rank started within the start-up bound (STARTUP_FLOOR_S) is stopped,
    its cause added to `causes`. Once rank 0 has marked the run, the job gets its watchdog
    timeout (at least GRACE_S) to exit: a rank frozen in the teardown (where no rank's
    watchdog can reach it: mpirun waits for the frozen one after the others exit cleanly) is
    then stopped like any other. What the launcher knows of the run it learns from its own
    launch: the timeout it was given, and the markers its rank 0 leaves (marked_path), never
    a status in meta.json. Returns the status."""
    import signal

    interrupted, status, stop_at, forwarded = False, 0, None, None
    drain_at, next_look, causes = None, 0.0, [] if causes is None else causes
    startup_s = timeout_s + STARTUP_FLOOR_S
    start_by = time.monotonic() + startup_s if out_dir and launch_id else None
    while True:
        try:
            if out_dir and drain_at is None and stop_at is None and time.monotonic() >= next_look:
                next_look = time.monotonic() + 1.0
                if start_by is not None and any(marked_path(out_dir, launch_id, w).exists() for w in MARKS):
                    start_by = None
                if start_by is not None and time.monotonic() > start_by:
                    why = (f"the ranks did not start within {startup_s:g} s (--timeout {timeout_s:g} + "
                           f"{STARTUP_FLOOR_S:g} s to start up): a rank's MPI or backend did not start (its own "
                           f"messages, if any, are above); the job is stopped")
                    print(f"commbench: error: {why}", file=sys.stderr, flush=True)
                    causes.append(why)
                    status = status or EXIT_STARTUP_HUNG
                    for p in procs:
                        signal_session(p, signal.SIGTERM)
                    stop_at = time.monotonic() + GRACE_S
                if launch_id and marked_path(out_dir, launch_id).exists():
                    drain_at = time.monotonic() + max(GRACE_S, timeout_s)
            if drain_at is not None and stop_at is None and time.monotonic() > drain_at:
                why = f"ranks had not exited {max(GRACE_S, timeout_s):g} s after the run was marked: stopped"
                print(f"commbench: error: {why}", file=sys.stderr, flush=True)

                RunDir(out_dir).note_teardown(why)
                status = status or EXIT_TEARDOWN_HUNG
                for p in procs:
                    signal_session(p, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
            if got and forwarded is None:
                forwarded = got[0]
                for p in procs:
                    signal_session(p, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            bad = [c for c in codes if c not in (None, 0)]
            if bad and stop_at is None:
                status = status or bad[0]
                for p in procs:
                    signal_session(p, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
            if stop_at is not None and time.monotonic() > stop_at:
                for p in procs:
                    kill_session(p)
            time.sleep(0.05)
        except KeyboardInterrupt:
            if interrupted:  # a second Ctrl-C: no more waiting
                for p in procs:
                    kill_session(p)
                continue
            interrupted = True
            for p in procs:
                signal_session(p, signal.SIGINT)
            stop_at = time.monotonic() + GRACE_S
    codes = [p.wait() for p in procs]
    status = status or next((c for c in codes if c), 0)
    if interrupted:
        status = 130
    elif forwarded is not None:
        status = 128 + forwarded
    return status
