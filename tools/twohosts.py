"""Two hosts on one machine: a multi-node commbench run without a cluster.

Each host is a network namespace with its own hostname (a UTS namespace), an address on
a veth pair (eth0, 198.18.0.1 and 198.18.0.2: 198.18.0.0/15 is reserved for benchmarking,
so nothing outside this machine is ever addressed) and its loopback up. The file system
is shared, as a cluster's is. Open MPI reaches the second host through `ip netns exec`
where it would use ssh (plm_rsh_agent, which Open MPI 5 reads as plm_ssh_agent), so no
sshd is needed.

A shaped link (rate_mbit, delay_ms) limits each host's eth0 with a tbf qdisc (a token
bucket; kernels built without netem, or without the police action, still have it). A
delay needs more than tbf: the two hosts are then joined through a third namespace, the
wire, in which a small process holds every frame for delay_ms before passing it on
(`wire` below), so each direction gets the rate and the one-way delay a cable would.

    with TwoHosts() as th:
        subprocess.run(th.mpirun(4, ["run", "quick", "--backend", "mpi"]))

What runs on the hosts keeps its temporary files (TMPDIR: Open MPI's session directories,
PMIx's rendezvous sockets) and Open MPI's shared-memory segments in a scratch directory of
its set of hosts (/dev/shm/cb2h-TAG), so a killed launch leaves nothing in /tmp or /dev/shm
and two sets, with the same hostnames, never meet there. Everything made is torn down on
exit, also after an exception or SIGTERM; after a SIGKILL, which no handler sees, a reaper
started with the set (a process of its own session, `reap`) tears it down as soon as the
owner is gone, and a fixture left behind anyway (the reaper killed too) is removed by the
next one. TwoHosts.unavailable() says, in one line, why namespaces cannot be
made here (not root, no `ip`, ...).

Command line: `check` (can two hosts be made here?), `demo` (what `make two-hosts` runs:
2 and 4 ranks on mpi and gloo, checks on, each run's hosts and nodes), `hold` (keep two
hosts up until Ctrl-C and print how to use them), `wire` (the delay line, run inside the
wire namespace).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE_ROOT = Path("/run/commbench-twohosts")
# A set's scratch directory (TMPDIR and shared-memory segments of what runs on its hosts):
# in memory where the machine has /dev/shm, as Open MPI's segments would be.
SCRATCH_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else STATE_ROOT
SUBNET = "198.18.0.0/24"
ADDRS = ("198.18.0.1", "198.18.0.2")
HOSTNAMES = ("cbhost-a", "cbhost-b")
IFNAME = "eth0"
# A token bucket must hold one whole frame; a bigger bucket lets a burst out at once after
# an idle gap, which would read as a shorter delay in a fit.
TBF_BURST = 1514


# What the shaped link should show in an alpha-beta fit of gloo's all_reduce between one rank
# on each host. gloo's ring runs two steps for two ranks (reduce-scatter, then all-gather, S/2
# each way per step), and each step waits a round trip: the receiver's ready-to-receive note
# goes one way, the data comes back (gloo's unbound-buffer protocol). So t = 4 d + S / B:
# alpha = 4 one-way delays, and B = the payload rate. tbf counts whole frames: each 1514-byte
# frame of a 1500-byte MTU carries 1448 bytes of TCP payload (Ethernet, IPv4 and TCP headers
# with timestamps around it), and the acks of the other direction's data share the bucket
# (one 66-byte frame per two full ones).
GLOO_TWO_RANK_ALL_REDUCE_DELAYS = 4
PAYLOAD_SHARE = 1448 / (1514 + 66 / 2)


def link_model(rate_mbit: float, delay_ms: float) -> dict:
    """The alpha (us) and bandwidth (GB/s) a fit of that all_reduce should recover."""
    return {"alpha_us": GLOO_TWO_RANK_ALL_REDUCE_DELAYS * delay_ms * 1e3,
            "bandwidth_gbps": rate_mbit * PAYLOAD_SHARE / 8e3}


def cpu_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of this machine's CPUs so far (/proc/stat); (0, 0) where that
    cannot be read."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (fields[7], sum(fields)) if len(fields) == 8 else (0, 0)


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the CPU time between two cpu_ticks() that the hypervisor took (steal: this
    virtual machine's CPUs had work, the host ran something else). 0 on bare metal. While it
    takes more than a per cent or so, frames leave the delay line late and ranks wake late by
    milliseconds, which a fit reads as a longer delay or a slower link."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def profile_file(path) -> Path:
    """A hardware profile for runs over the shaped link. The loopback profile (the default on
    CPUs) measures its latency floor with 2,100 exchanges between ranks 0 and 1, which over
    a link with milliseconds of delay takes tens of seconds; this one is written down. Its
    scale-up figures stand for the shared memory between ranks on one host; the scale-out
    tier comes from --nic-gbps."""
    path = Path(path)
    path.write_text('name = "two-hosts"\n'
                    'description = "Two network namespaces on one machine (tools/twohosts.py)"\n'
                    '[scaleup]\nlink = "shared memory"\ndomain_gpus = "host"\n'
                    'line_rate = "5 GB/s per direction"\nachieved_rate = "5 GB/s per direction"\nlatency_us = 1\n'
                    '[hbm]\nbandwidth = "10 GB/s total"\n')
    return path


class Unavailable(RuntimeError):
    """Two hosts cannot be made here; the message says why, in one line."""


def _run(argv, check=True, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))}: {(p.stderr or p.stdout).strip()}")
    return p


def hold_until_ctrl_c() -> None:
    """Keep the hosts up until the user presses Ctrl-C (the shell commands printed above)."""
    print("Ctrl-C tears them down.", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def _can(argv) -> None:
    """_run, where a refusal means the machine cannot make two hosts."""
    try:
        _run(argv)
    except RuntimeError as e:
        raise Unavailable(f"cannot make two hosts here: {e}") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Host:
    ns: str          # network namespace (ip netns)
    hostname: str    # in its own UTS namespace
    addr: str        # on eth0
    uts: str         # bind-mounted UTS namespace file

    def cmd(self, argv) -> list[str]:
        """argv run on this host: its network and UTS namespaces (the rest is shared)."""
        return ["ip", "netns", "exec", self.ns, "nsenter", f"--uts={self.uts}", "--", *map(str, argv)]


class TwoHosts:
    def __init__(self, rate_mbit: float | None = None, delay_ms: float = 0.0, tag: str | None = None):
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must not be negative, got {delay_ms}")
        self.rate_mbit, self.delay_ms = rate_mbit, float(delay_ms)
        # The pid names the owner; the random part keeps two sets of one process (or of a
        # process that reuses a dead one's pid) apart.
        self.tag = tag or f"{os.getpid():x}{secrets.token_hex(2)}"
        self.state = STATE_ROOT / self.tag
        self.hosts = tuple(Host(f"cb2h-{self.tag}-{s}", h, a, str(self.state / f"{s}.uts"))
                           for s, h, a in zip("ab", HOSTNAMES, ADDRS))
        self.wire_ns = f"cb2h-{self.tag}-w" if self.delay_ms > 0 else None
        self.agent = self.state / "agent"
        # Short: PMIx puts unix sockets (108 bytes of path at most) two levels below it.
        self.scratch = SCRATCH_ROOT / f"cb2h-{self.tag}"
        self._wire: subprocess.Popen | None = None
        self._reaper: subprocess.Popen | None = None
        self._old_term = None

    # --- can it be done here --------------------------------------------------------
    @staticmethod
    def unavailable() -> str | None:
        """Why two hosts cannot be made here, or None. Only what can be known without
        making anything; up() raises Unavailable for what shows when it tries."""
        if not sys.platform.startswith("linux"):
            return f"network namespaces are Linux only (this is {sys.platform})"
        if os.geteuid() != 0:
            return "making network namespaces needs root (ip netns add, unshare --uts)"
        missing = [t for t in ("ip", "nsenter", "unshare") if shutil.which(t) is None]
        if missing:
            return f"{', '.join(missing)} not found (ip is in iproute2, nsenter and unshare in util-linux)"
        return None

    # --- up -------------------------------------------------------------------------
    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self) -> TwoHosts:
        why = self.unavailable()
        if why:
            raise Unavailable(why)
        if self.rate_mbit is not None and shutil.which("tc") is None:
            raise Unavailable("tc not found (iproute2): the shaped link needs it")
        remove_stale()
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "owner").write_text(str(os.getpid()))
        (self.state / "names.json").write_text(json.dumps(self._names()))
        # Before anything is made: whatever up() makes, the reaper removes once this process
        # is gone without tearing it down (SIGKILL). Its own session: a signal to this
        # process's group does not reach it.
        self._reaper = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "reap", "--owner",
                                         str(os.getpid()), str(self.state)], start_new_session=True,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        # SIGTERM (a CI job cancelled, a test timeout) must still tear down: it becomes a
        # KeyboardInterrupt, which unwinds through down(). Only a handler-less main thread
        # can take it over.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)):
            self._old_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        return self

    def _names(self) -> dict:
        return {"netns": [h.ns for h in self.hosts] + ([self.wire_ns] if self.wire_ns else []),
                "uts": [h.uts for h in self.hosts], "dirs": [str(self.scratch)]}

    def _make(self) -> None:
        # What the kernel or the container may refuse (namespaces, a veth) makes two hosts
        # unavailable here; anything failing once they exist is an error.
        self.scratch.mkdir(mode=0o700)
        for h in self.hosts:
            _can(["ip", "netns", "add", h.ns])
            Path(h.uts).touch()
            _can(["unshare", f"--uts={h.uts}", "hostname", h.hostname])
            self._quiet_ipv6(h.ns)
            _run(["ip", "-n", h.ns, "link", "set", "lo", "up"])
        a, b = self.hosts
        if self.wire_ns is None:
            _can(["ip", "link", "add", IFNAME, "netns", a.ns, "type", "veth", "peer", "name", IFNAME, "netns", b.ns])
        else:
            w = self.wire_ns
            _can(["ip", "netns", "add", w])
            self._quiet_ipv6(w)
            for h, end in ((a, "wa"), (b, "wb")):
                _can(["ip", "link", "add", IFNAME, "netns", h.ns, "type", "veth", "peer", "name", end, "netns", w])
                _run(["ip", "-n", w, "link", "set", end, "up"])
        for h in self.hosts:
            _run(["ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", IFNAME])
            _run(["ip", "-n", h.ns, "link", "set", IFNAME, "up"])
        if self.rate_mbit is not None:
            self.shape(self.rate_mbit)
        if self.wire_ns is not None:
            with open(self.state / "wire.log", "w") as log:
                self._wire = subprocess.Popen(
                    ["ip", "netns", "exec", self.wire_ns, sys.executable, str(Path(__file__).resolve()), "wire",
                     "--delay-ms", str(self.delay_ms), "wa", "wb"], stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            (self.state / "wire.pid").write_text(str(self._wire.pid))
        self._write_agent()
        self.wait_reachable()

    @staticmethod
    def _quiet_ipv6(ns: str) -> None:
        # IPv4 only: MPI and gloo would otherwise also find fe80:: addresses on eth0.
        script = ("for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; "
                  "do [ -w $f ] && echo 1 > $f; done; true")
        _run(["ip", "netns", "exec", ns, "sh", "-c", script])

    def shape(self, rate_mbit: float) -> None:
        """Each host's eth0 sends at most rate_mbit (a tbf qdisc; its queue holds two seconds
        of traffic, so the rate comes from the bucket, not from drops)."""
        limit = max(64 * 1024, int(rate_mbit * 1e6 / 8 * 2.0))
        for h in self.hosts:
            p = _run(["ip", "netns", "exec", h.ns, "tc", "qdisc", "replace", "dev", IFNAME, "root", "tbf",
                      "rate", f"{rate_mbit:g}mbit", "burst", str(TBF_BURST), "limit", str(limit)], check=False)
            if p.returncode != 0:
                raise Unavailable(f"tc qdisc tbf is not available here: {(p.stderr or p.stdout).strip()}")

    def _write_agent(self) -> None:
        """Open MPI's remote launch: called as `agent HOST COMMAND...`, like ssh, and, like
        ssh, the command is one string for a shell on that host."""
        cases = "\n".join(f"  {h.hostname}|{h.addr}) exec {shlex.join(h.cmd(['/bin/sh', '-c']))} \"$*\" ;;"
                          for h in self.hosts)
        self.agent.write_text(f"""#!/bin/sh
# Written by tools/twohosts.py: ssh's place for Open MPI (plm_rsh_agent) on two namespaces.
while [ "${{1#-}}" != "$1" ]; do shift; done  # options an ssh would take
host=$1; shift
case "$host" in
{cases}
  *) echo "twohosts agent: unknown host $host" >&2; exit 255 ;;
esac
""")
        self.agent.chmod(0o755)

    def wait_reachable(self, timeout_s: float = 10.0) -> None:
        """Until host b reaches host a's eth0 (a refused connection is an answer: the
        address is there and the link carries it)."""
        a, b = self.hosts
        probe = ("import socket,sys,time\n"
                 "end=time.monotonic()+float(sys.argv[2])\n"
                 "while True:\n"
                 "    try:\n"
                 "        socket.create_connection((sys.argv[1],9),timeout=1).close(); break\n"
                 "    except ConnectionRefusedError: break\n"
                 "    except OSError:\n"
                 "        if time.monotonic()>end: sys.exit(1)\n"
                 "        time.sleep(0.1)\n")
        p = _run(b.cmd([sys.executable, "-c", probe, a.addr, str(timeout_s)]), check=False)
        if p.returncode != 0:
            raise RuntimeError(f"{b.hostname} cannot reach {a.addr} over the new link: {p.stderr.strip()}")

    # --- use ------------------------------------------------------------------------
    def link(self, up: bool) -> None:
        """Take the link down (as a pulled cable: both hosts lose it) or bring it back."""
        ns, dev = (self.hosts[0].ns, IFNAME) if self.wire_ns is None else (self.wire_ns, "wa")
        _run(["ip", "-n", ns, "link", "set", dev, "up" if up else "down"])
        if up:
            self.wait_reachable()

    def mpirun_argv(self, np_: int, argv, per_host: int | None = None, mca: dict | None = None) -> list[str]:
        """mpirun on host a, ranks filling host a then host b and so on (per_host each,
        default np_ over the hosts, rounded up), remote launch through the agent, TCP between
        the hosts."""
        per = per_host or max(1, -(-np_ // len(self.hosts)))
        mpirun = find_mpirun()
        # The two hosts share this machine's cores: ranks that wait by yielding leave them
        # to the ranks (and the delay line) that have work.
        # Session directories (TMPDIR, which the daemon on host b inherits through the agent)
        # and shared-memory segments go to the scratch directory: a launch killed with its
        # hosts leaves nothing behind, and another set's cbhost-a never finds them.
        opts = {"plm_rsh_agent": str(self.agent), "btl": "self,sm,tcp", "btl_tcp_if_include": SUBNET,
                "oob_tcp_if_include": SUBNET, "mpi_yield_when_idle": 1, "btl_sm_backing_directory": str(self.scratch),
                **(mca or {})}
        cmd = ["env", f"TMPDIR={self.scratch}", mpirun, "--allow-run-as-root",
               "--host", ",".join(f"{h.hostname}:{per}" for h in self.hosts), "-np", str(np_)]
        for k, v in opts.items():
            cmd += ["--mca", k, str(v)]
        return self.hosts[0].cmd(cmd + [sys.executable, "-m", "commbench", *map(str, argv)])

    def mpirun(self, np_: int, argv, per_host=None, mca=None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.mpirun_argv(np_, argv, per_host, mca), capture_output=True, text=True, check=False,
                              cwd=kw.pop("cwd", ROOT), env=kw.pop("env", _env()), **kw)

    def torch_ranks(self, np_: int, argv, master_addr: str | None = None, port: int | None = None,
                    env: dict | None = None, nice: int = 0, **popen) -> list[subprocess.Popen]:
        """np_ ranks started the way torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
        MASTER_PORT in the environment), half on each host; master_addr is passed as
        --master-addr (default host a's address). nice < 0: the ranks run ahead of the
        machine's other processes when they wake (root only)."""
        per = (np_ + 1) // 2
        port = port or 29500 + os.getpid() % 2000
        addr = master_addr or self.hosts[0].addr
        procs = []
        for r in range(np_):
            e = dict(_env(), RANK=str(r), WORLD_SIZE=str(np_), LOCAL_RANK=str(r % per),
                     LOCAL_WORLD_SIZE=str(per), MASTER_PORT=str(port), TMPDIR=str(self.scratch), **(env or {}))
            host = self.hosts[r // per]
            prio = ["nice", "-n", str(nice)] if nice else []
            procs.append(subprocess.Popen(host.cmd([*prio, sys.executable, "-m", "commbench", *map(str, argv),
                                                    "--master-addr", addr]),
                                          env=e, cwd=ROOT, start_new_session=True, **popen))
        return procs

    def rank_pids(self) -> list[tuple[str, int]]:
        """(hostname, pid) of every commbench rank running on the two hosts (not mpirun or
        its daemons)."""
        out = []
        for h in self.hosts:
            for pid in _run(["ip", "netns", "pids", h.ns], check=False).stdout.split():
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"commbench" in argv and b"-m" in argv and not Path(argv[0].decode()).name.startswith(
                        ("mpirun", "prte", "mpiexec")):
                    out.append((h.hostname, int(pid)))
        return out

    def kill_all(self) -> None:
        """SIGKILL whatever runs on the two hosts (a launch that cannot end by itself: an
        mpirun waiting for a daemon on the far side of a dead link)."""
        for h in self.hosts:
            for pid in _run(["ip", "netns", "pids", h.ns], check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass

    # --- down -----------------------------------------------------------------------
    def down(self) -> None:
        """Remove everything up() made; never raises, safe to call twice."""
        if self._wire is not None and self._wire.poll() is None:
            self._wire.terminate()
            try:
                self._wire.wait(5)
            except subprocess.TimeoutExpired:
                self._wire.kill()
        self._wire = None
        if self.state.exists():
            teardown_dir(self.state)
        if self._reaper is not None:  # nothing left for it to do
            self._reaper.kill()
            self._reaper.wait()
            self._reaper = None
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


def _env() -> dict:
    e = dict(os.environ)
    e.pop("COMMBENCH_TTY", None)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH", "")) if p)
    return e


def find_mpirun() -> str:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else (shutil.which("mpirun") or "mpirun")


def teardown_dir(state: Path) -> None:
    """Remove the namespaces, UTS files, delay line and scratch directory one fixture
    recorded in its state dir."""
    try:
        names = json.loads((state / "names.json").read_text())
    except (OSError, ValueError):
        names = {"netns": [], "uts": []}
    try:
        pid = int((state / "wire.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
    for ns in names.get("netns", []):
        # Whatever still runs on a host (ranks, daemons mpirun left behind when it was
        # killed) would keep the namespace alive after `ip netns del`: it goes first.
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        # Deleting a namespace deletes its veth ends (and with them the peers).
        _run(["ip", "netns", "del", ns], check=False)
    for f in names.get("uts", []):
        _run(["umount", f], check=False)
    for d in names.get("dirs", []):
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)


def remove_stale() -> None:
    """Fixtures whose owner process is gone (killed before it could tear down)."""
    if not STATE_ROOT.is_dir():
        return
    for d in STATE_ROOT.iterdir():
        try:
            owner = int((d / "owner").read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            continue
        teardown_dir(d)


# How often the reaper looks for its owner where the kernel cannot tell it (no pidfd).
REAP_POLL_S = 0.2


def reap(owner: int, state: Path) -> int:
    """Wait for the owner of a set of hosts to end, then remove what it left (nothing, when
    it tore the set down itself: the state directory is gone)."""
    import select

    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        fd = None  # already gone
    except (AttributeError, OSError):  # no pidfd here: look twice a second
        while _alive(owner):
            time.sleep(REAP_POLL_S)
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has ended
        os.close(fd)
    if state.exists():
        teardown_dir(state)
    return 0


# ---------------------------------------------------------------------------------------
# The delay line (runs inside the wire namespace)

SOL_PACKET, PACKET_VNET_HDR, ETH_P_ALL, PACKET_OUTGOING = 263, 15, 3, 4


def wire(delay_ms: float, ifs: list[str]) -> int:
    """Pass every frame between two interfaces, each delay_ms after it arrived: a cable
    with a one-way delay. Frames keep their virtio-net header (PACKET_VNET_HDR), so the
    kernel's large TCP segments and unfinished checksums pass as they are, as on the veth
    itself; frames this process sends are seen again as outgoing and skipped."""
    import collections
    import select

    delay = delay_ms / 1e3
    socks = []
    for name in ifs:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        s.bind((name, 0))
        s.setblocking(False)
        socks.append(s)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # A cable's delay does not depend on how busy the host is: the delay line runs before
    # every ordinary process, so a frame leaves when it is due, not when a loaded machine
    # gets round to it (it sleeps in between, so it takes little).
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    except (AttributeError, OSError):
        pass
    held = [collections.deque(), collections.deque()]  # held[i]: frames from socks[i], due out of the other
    while True:
        heads = [q[0][0] for q in held if q]
        wait = max(0.0, min(heads) - time.monotonic()) if heads else None
        ready, _, _ = select.select(socks, [], [], wait)
        now = time.monotonic()
        for i, s in enumerate(socks):
            if s not in ready:
                continue
            while True:
                try:
                    data, addr = s.recvfrom(1 << 17)
                except BlockingIOError:
                    break
                if addr[2] != PACKET_OUTGOING:
                    held[i].append((now + delay, data))
        for i, q in enumerate(held):
            while q and q[0][0] <= now:
                try:
                    socks[1 - i].send(q.popleft()[1])
                except OSError:  # the far end is down: the frame is lost, as on a cable
                    pass


# ---------------------------------------------------------------------------------------
# demo: what `make two-hosts` runs

def demo(args) -> int:
    """2 and 4 ranks across the two hosts on mpi and on gloo, checks on; each run's hosts
    and nodes as meta.json records them, and the tiers of its rows. gloo starts once the
    way torchrun would (a rank per process, --master-addr given) and once under mpirun
    (the address found by trying rank 0's)."""
    with TwoHosts() as th:
        a, b = th.hosts
        print(f"two hosts: {a.hostname} {a.addr} and {b.hostname} {b.addr} ({IFNAME}, veth)", flush=True)
        out = Path(tempfile.mkdtemp(prefix="twohosts-", dir=args.out))
        sweep = ["run", "quick", "--check", "--sizes", "4K,64K", "-b", "all_reduce,all_to_all,send_recv",
                 "--profile", "loopback", "--nic-gbps", "10", "--timeout", "60"]
        bad = 0
        for backend, np_, how in (("mpi", 2, "mpirun"), ("mpi", 4, "mpirun"), ("gloo", 2, "--master-addr"),
                                  ("gloo", 4, "mpirun")):
            d = out / f"{backend}-np{np_}"
            argv = sweep + ["--backend", backend, "--worlds", str(np_), "--out", d]
            t0 = time.monotonic()
            if how == "mpirun":
                p = th.mpirun(np_, argv, timeout=300)
                code, err = p.returncode, p.stderr
            else:
                procs = th.torch_ranks(np_, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                codes = [pr.wait(300) for pr in procs]
                code = next((c for c in codes if c), 0)
                err = "".join(pr.stderr.read() for pr in procs)
            meta, rows = _meta(d), _rows(d)
            tiers = sorted({str(r.get("tier")) for r in rows})
            checks = sorted({str(r.get("check")) for r in rows})
            ok = (code == 0 and meta.get("status") == "complete" and len(set(meta.get("nodes") or [])) == 2
                  and checks == ["ok"])
            bad += not ok
            print(f"{backend:4s} np {np_} ({how:13s}) {'ok  ' if ok else 'FAIL'} {time.monotonic() - t0:5.1f} s  "
                  f"hosts {meta.get('hosts')} nodes {meta.get('nodes')} ranks_per_node {meta.get('ranks_per_node')}; "
                  f"{len(rows)} rows, checks {checks}, tiers {tiers}", flush=True)
            if not ok:
                print("  " + "\n  ".join(err.strip().splitlines()[-8:]), flush=True)
        print(f"runs: {out}")
        return 1 if bad else 0


def _meta(d: Path) -> dict:
    try:
        return json.loads((Path(d) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def _rows(d: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (Path(d) / "rows.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


LINK_SIZES = "1K,8K,32K,96K,192K"
# The ranks of the link check run at this niceness: a rank woken by data on a busy machine
# would otherwise start late by milliseconds, which the fit reads as delay.
LINK_NICE = -20
# A fit made while the hypervisor took more than this share of the CPU time (steal_share)
# does not measure the link alone.
STEAL_LIMIT = 0.01


def link_argv(tmp: Path, rate_mbit: float, out: Path) -> list:
    """The run the link check makes: gloo all_reduce over LINK_SIZES, 2 ranks, judged
    against a NIC of the link's rate."""
    return ["run", "quick", "--backend", "gloo", "-b", "all_reduce", "--sizes", LINK_SIZES, "--iters", "20",
            "--warmup", "3", "--profile", profile_file(Path(tmp) / "profile.toml"), "--nic-gbps",
            f"{rate_mbit / 1e3:g}", "--timeout", "60", "--out", out]


def realtime_when_started(procs, run_dir: Path, timeout_s: float = 120.0) -> bool:
    """Once the run has started (meta.json written: interpreters loaded, the group formed),
    move every thread of the ranks to real-time priority (SCHED_FIFO 1): from there on a rank
    woken by data runs at once, not when a busy machine gets round to it, and the fit sees
    the link rather than the machine's other work. Not before: a real-time rank loading
    torch would hold a core from everything else for seconds. False if the run did not
    start in time (the caller's wait then says why)."""
    end = time.monotonic() + timeout_s
    while not (Path(run_dir) / "meta.json").exists():
        if time.monotonic() > end or any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.05)
    for p in procs:
        for tid in os.listdir(f"/proc/{p.pid}/task") if Path(f"/proc/{p.pid}").exists() else []:
            try:
                os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(1))
            except OSError:
                pass
    return True


def link_check(args) -> int:
    """gloo's all_reduce between the two hosts over a link of known rate and delay, and the
    alpha-beta fit of it next to what the link implies (link_model)."""
    from commbench.analyse.analysis import fit_table
    from commbench.store.load import load

    with TwoHosts(rate_mbit=args.rate_mbit, delay_ms=args.delay_ms) as th:
        tmp = Path(tempfile.mkdtemp(prefix="twohosts-link-", dir=args.out))
        out = tmp / "run"
        argv = link_argv(tmp, args.rate_mbit, out)
        t0, ticks = time.monotonic(), cpu_ticks()
        procs = th.torch_ranks(2, argv, nice=LINK_NICE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        realtime_when_started(procs, out)
        codes = [p.wait(300) for p in procs]
        stolen = steal_share(ticks, cpu_ticks())
        if any(codes):
            print("".join(p.stderr.read() for p in procs)[-2000:], file=sys.stderr)
            return 1
        fit = fit_table(load(str(out))).iloc[0]
        want = link_model(args.rate_mbit, args.delay_ms)
        print(f"link: tbf {args.rate_mbit:g} Mbit/s, one-way delay {args.delay_ms:g} ms; gloo all_reduce "
              f"{LINK_SIZES}, 2 ranks ({time.monotonic() - t0:.1f} s): {out}")
        print(f"  alpha     {fit['alpha_us'] / 1e3:8.2f} ms   expected {want['alpha_us'] / 1e3:6.2f} ms "
              f"(4 one-way delays)  {100 * (fit['alpha_us'] / want['alpha_us'] - 1):+.1f}%")
        print(f"  bandwidth {fit['bandwidth_gbps'] * 8e3:8.2f} Mbit/s expected {want['bandwidth_gbps'] * 8e3:6.2f} "
              f"(payload of {args.rate_mbit:g})  {100 * (fit['bandwidth_gbps'] / want['bandwidth_gbps'] - 1):+.1f}%")
        print(f"  fit error rms {fit['rms_rel_err_pct']:.1f}%")
        print(f"  CPU time taken by the hypervisor (steal) during the run: {100 * stolen:.1f}%"
              + ("  (over 1%: frames and wake-ups were late; run it again)" if stolen > STEAL_LIMIT else ""))
        return 0


def hold(args) -> int:
    with TwoHosts(rate_mbit=args.rate_mbit, delay_ms=args.delay_ms) as th:
        a, b = th.hosts
        print(f"{a.hostname} {a.addr}: {shlex.join(a.cmd(['bash']))}")
        print(f"{b.hostname} {b.addr}: {shlex.join(b.cmd(['bash']))}")
        print("mpirun across both: " + shlex.join(th.mpirun_argv(2, ["run", "quick", "--backend", "mpi"])))
        hold_until_ctrl_c()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="twohosts", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="say whether two hosts can be made here")
    d = sub.add_parser("demo", help="2 and 4 ranks across two hosts, mpi and gloo (make two-hosts)")
    d.add_argument("--out", default=str(ROOT / "results"), help="parent of the run directories")
    h = sub.add_parser("hold", help="keep two hosts up until Ctrl-C")
    h.add_argument("--rate-mbit", type=float)
    h.add_argument("--delay-ms", type=float, default=0.0)
    k = sub.add_parser("link", help="fit alpha and bandwidth over a link of known rate and delay")
    k.add_argument("--rate-mbit", type=float, default=20.0)
    k.add_argument("--delay-ms", type=float, default=10.0)
    k.add_argument("--out", default=str(ROOT / "results"), help="parent of the run directory")
    r = sub.add_parser("reap", help="tear a set down once its owner is gone (started by the set itself)")
    r.add_argument("--owner", type=int, required=True)
    r.add_argument("state")
    w = sub.add_parser("wire", help="the delay line (inside the wire namespace)")
    w.add_argument("--delay-ms", type=float, required=True)
    w.add_argument("ifs", nargs=2)
    args = p.parse_args(argv)
    if args.cmd == "wire":
        return wire(args.delay_ms, args.ifs)
    if args.cmd == "reap":
        return reap(args.owner, Path(args.state))
    why = TwoHosts.unavailable()
    if args.cmd == "check":
        print(f"two hosts: not here: {why}" if why else "two hosts: can be made here")
        return 3 if why else 0
    try:
        return {"demo": demo, "link": link_check, "hold": hold}[args.cmd](args)
    except Unavailable as e:
        print(f"two hosts: skipped: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
