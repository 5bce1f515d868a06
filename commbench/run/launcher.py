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
from commbench.core.whoami import find_mpirun
from commbench.run.contract import LAUNCH_ID_ENV, LAUNCHER_PID_ENV, MARKS, marked_path, new_launch_id
from commbench.run.stops import dies_with_launcher, kill_session, note_stop, signal_session
from commbench.store.record import RunRecord


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
    base_env = {**os.environ, **(extra_env or {}), LAUNCHER_PID_ENV: str(os.getpid()),
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
        RunRecord(out_dir).settle_launch(sys.argv[1:], status, interrupted or bool(got), why,
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

                RunRecord(out_dir).note_teardown(why)
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
