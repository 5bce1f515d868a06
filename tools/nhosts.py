"""N hosts on one machine (2 to 8), each link between two of them shapeable on its own.

Each host is a network namespace with its own hostname (cbhost-a, cbhost-b, ...: a UTS
namespace), eth0 with 198.18.0.1, .2, ... /24, its loopback up and IPv6 off, as in
tools/twohosts.py, whose pieces this reuses (the hosts, Open MPI's remote launch through
`ip netns exec`, the scratch directory, the teardown on exit, exception or SIGTERM, the
reaper after a SIGKILL). The hosts' eth0 are veths whose other ends sit on one bridge in a
hub namespace: a switch, so any host reaches any other in one hop.

Per-link shaping: each host's eth0 sends through an htb qdisc with one class per other host,
chosen by a u32 filter on the destination address. A link a<->b is a's class towards b and
b's class towards a, so `shape(a, b, rate_mbit)` slows that link alone, both ways;
`shape_host(h, rate_mbit)` slows every link of h (a slow NIC); `base_mbit` is the rate of
every link not shaped otherwise (None: no limit), so that the network, not the machine's
cores, sets the pace. What is not IPv4 to another host (ARP) goes through unshaped.

    with NHosts(5, rate_mbit=200) as nh:
        nh.shape("cbhost-b", "cbhost-d", 200 / 3)
        subprocess.run(nh.mpirun(5, ["run", "quick", "--backend", "mpi"]))

Command line: `check` (can N hosts be made here?), `links` (a measurement: every link at the
base rate, then one link and one host shaped, each link's rate measured by a socket stream),
`mpi` (a commbench run across the hosts under mpirun, one rank each), `hold` (keep them up
until Ctrl-C and print how to enter each).
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twohosts import IFNAME, ROOT, Host, TwoHosts, Unavailable, _can, _run, hold_until_ctrl_c  # noqa: E402

MAX_HOSTS = 8
LETTERS = "abcdefgh"
BRIDGE = "br0"
# "No limit" for a class: far above what a veth carries on one machine.
UNSHAPED_MBIT = 100_000
# htb's quantum only matters where classes borrow from each other, which these never do
# (each is its own root, rate = ceil); set so tc does not warn that rate/r2q is too big.
HTB_QUANTUM = 60000
BLAST_CHUNK = 64 * 1024
# Open MPI's TCP transport sends a message above its eager limit (64 KiB) by rendezvous, and
# a connection's fragments leave one at a time in order: in a bidirectional exchange one
# side's go-ahead for the other's data waits behind its own data, and over a shaped link the
# two directions run one after the other (measured: a 1 MiB Sendrecv at 200 Mbit/s took 86 ms,
# or alternately 44 and 130, where the link carries both directions at once in 43). Up to
# this size a message goes eagerly, both directions flow at once, and it takes 42 to 47 ms.
EAGER_NBYTES = 8 << 20


def class_id(dst: int) -> str:
    """The htb class on a host's eth0 for traffic to host number dst (0-based): 1:10 .. 1:17
    (tc reads the minor as hex; 1:1 is the default class, unshaped)."""
    return f"1:1{dst}"


def htb_batch(src: int, addrs, rates_mbit: dict[int, float]) -> str:
    """The `tc -batch` lines that give host src's eth0 its htb qdisc: one class per other
    host at rates_mbit[dst], a u32 filter on each destination address, and the default class
    (anything else: ARP) unshaped."""
    lines = [f"qdisc replace dev {IFNAME} root handle 1: htb default 1",
             f"class add dev {IFNAME} parent 1: classid 1:1 htb rate {UNSHAPED_MBIT}mbit quantum {HTB_QUANTUM}"]
    for dst, addr in enumerate(addrs):
        if dst == src:
            continue
        rate = f"{rates_mbit[dst]:g}mbit"
        lines += [f"class add dev {IFNAME} parent 1: classid {class_id(dst)} htb rate {rate} ceil {rate} "
                  f"quantum {HTB_QUANTUM}",
                  f"filter add dev {IFNAME} parent 1: protocol ip prio 1 u32 match ip dst {addr}/32 "
                  f"flowid {class_id(dst)}"]
    return "\n".join(lines) + "\n"


class NHosts(TwoHosts):
    def __init__(self, n: int = 3, rate_mbit: float | None = None, tag: str | None = None):
        if not 2 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be 2 to {MAX_HOSTS}, got {n}")
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        super().__init__(tag=tag)
        self.base_mbit = rate_mbit
        self.hosts = tuple(Host(f"cbnh-{self.tag}-{s}", f"cbhost-{s}", f"198.18.0.{i + 1}",
                                str(self.state / f"{s}.uts")) for i, s in enumerate(LETTERS[:n]))
        self.hub_ns = f"cbnh-{self.tag}-hub"
        # rates_mbit[(src, dst)]: what host src's class towards dst sends at now.
        self.rates_mbit = {(i, j): self._base() for i in range(n) for j in range(n) if i != j}

    def _base(self) -> float:
        return UNSHAPED_MBIT if self.base_mbit is None else float(self.base_mbit)

    def _names(self) -> dict:
        names = super()._names()
        names["netns"].append(self.hub_ns)
        return names

    def _make(self) -> None:
        if shutil.which("tc") is None:
            raise Unavailable("tc not found (iproute2): per-link shaping needs it")
        self.scratch.mkdir(mode=0o700)
        hub = self.hub_ns
        _can(["ip", "netns", "add", hub])
        self._quiet_ipv6(hub)
        # No spanning tree on a bridge without loops: its ports forward at once.
        _can(["ip", "-n", hub, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0"])
        _run(["ip", "-n", hub, "link", "set", BRIDGE, "up"])
        for h, s in zip(self.hosts, LETTERS):
            _can(["ip", "netns", "add", h.ns])
            Path(h.uts).touch()
            _can(["unshare", f"--uts={h.uts}", "hostname", h.hostname])
            self._quiet_ipv6(h.ns)
            _run(["ip", "-n", h.ns, "link", "set", "lo", "up"])
            _can(["ip", "link", "add", IFNAME, "netns", h.ns, "type", "veth", "peer", "name", f"v{s}", "netns", hub])
            _run(["ip", "-n", hub, "link", "set", f"v{s}", "master", BRIDGE, "up"])
            _run(["ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", IFNAME])
            _run(["ip", "-n", h.ns, "link", "set", IFNAME, "up"])
        addrs = [h.addr for h in self.hosts]
        for i, h in enumerate(self.hosts):
            rates = {j: self.rates_mbit[(i, j)] for j in range(len(self.hosts)) if j != i}
            p = subprocess.run(["ip", "netns", "exec", h.ns, "tc", "-batch", "-"], input=htb_batch(i, addrs, rates),
                               capture_output=True, text=True, check=False)
            if p.returncode != 0:
                raise Unavailable(f"per-link shaping (htb qdisc, u32 filter) is not available here: "
                                  f"{(p.stderr or p.stdout).strip()}")
        self._write_agent()
        self.wait_reachable()

    def wait_reachable(self, timeout_s: float = 10.0) -> None:
        """Until every host reaches host a and host a reaches every host (a refused
        connection is an answer: the address is there and the bridge carries it)."""
        probe = ("import socket,sys,time\n"
                 "end=time.monotonic()+float(sys.argv[1])\n"
                 "for addr in sys.argv[2:]:\n"
                 "    while True:\n"
                 "        try:\n"
                 "            socket.create_connection((addr,9),timeout=1).close(); break\n"
                 "        except ConnectionRefusedError: break\n"
                 "        except OSError:\n"
                 "            if time.monotonic()>end: sys.exit(f'{addr} not reached')\n"
                 "            time.sleep(0.1)\n")
        a, rest = self.hosts[0], self.hosts[1:]
        procs = [subprocess.Popen(h.cmd([sys.executable, "-c", probe, timeout_s, *args]), stderr=subprocess.PIPE,
                                  text=True)
                 for h, args in [(a, [h.addr for h in rest])] + [(h, [a.addr]) for h in rest]]
        errs = [p.communicate()[1].strip() for p in procs if p.wait() != 0]
        if errs:
            raise RuntimeError(f"hosts cannot reach each other over the bridge: {'; '.join(errs)}")

    # --- shaping --------------------------------------------------------------------
    def index(self, host) -> int:
        """A host by number (0-based), hostname (cbhost-b) or letter (b)."""
        if isinstance(host, int) and 0 <= host < len(self.hosts):
            return host
        for i, h in enumerate(self.hosts):
            if host in (h.hostname, h.ns, LETTERS[i]):
                return i
        raise ValueError(f"no host {host!r} (hosts: {', '.join(h.hostname for h in self.hosts)})")

    def _set(self, src: int, dst: int, rate_mbit: float) -> None:
        rate = f"{rate_mbit:g}mbit"
        _run(["ip", "netns", "exec", self.hosts[src].ns, "tc", "class", "change", "dev", IFNAME, "parent", "1:",
              "classid", class_id(dst), "htb", "rate", rate, "ceil", rate, "quantum", str(HTB_QUANTUM)])
        self.rates_mbit[(src, dst)] = rate_mbit

    def shape(self, a, b, rate_mbit: float | None = None) -> None:
        """The link a<->b at rate_mbit each way (None: back to the base rate); no other link
        changes."""
        i, j = self.index(a), self.index(b)
        if i == j:
            raise ValueError(f"a link joins two hosts, got {a!r} twice")
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        rate = self._base() if rate_mbit is None else float(rate_mbit)
        self._set(i, j, rate)
        self._set(j, i, rate)

    def shape_host(self, host, rate_mbit: float | None = None) -> None:
        """Every link of one host at rate_mbit (None: back to the base rate): a slow NIC."""
        i = self.index(host)
        for j in range(len(self.hosts)):
            if j != i:
                self.shape(i, j, rate_mbit)

    def reset(self) -> None:
        """Every link back to the base rate."""
        for (i, j), r in list(self.rates_mbit.items()):
            if r != self._base():
                self._set(i, j, self._base())

    def link_rates_mbit(self, links, seconds: float = 1.0) -> list[float]:
        """Measure links at once: for each (src, dst), src streams to dst over TCP for
        `seconds`; the rate dst received at, in Mbit/s (payload), from its first byte to its
        last. All streams run together, so a comparison between them is made under the same
        load on the machine."""
        pairs = [(self.index(s), self.index(d)) for s, d in links]
        recv_code = ("import socket,sys,time\n"
                     "l=socket.socket(); l.bind((sys.argv[1],0)); l.listen(1)\n"
                     "print(l.getsockname()[1], flush=True)\n"
                     "c,_=l.accept(); n=0; t0=t1=None\n"
                     "while True:\n"
                     "    b=c.recv(1<<20)\n"
                     "    if not b: break\n"
                     "    t1=time.perf_counter(); t0=t0 or t1; n+=len(b)\n"
                     "print(n*8/(t1-t0)/1e6 if t1 and t1>t0 else 0.0)\n")
        send_code = ("import socket,sys,time\n"
                     f"s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=30); b=bytes({BLAST_CHUNK})\n"
                     "end=time.perf_counter()+float(sys.argv[3])\n"
                     "while time.perf_counter()<end: s.sendall(b)\n"
                     "s.close()\n")
        recvs = [subprocess.Popen(self.hosts[d].cmd([sys.executable, "-c", recv_code, self.hosts[d].addr]),
                                  stdout=subprocess.PIPE, text=True) for _, d in pairs]
        ports = [r.stdout.readline().strip() for r in recvs]
        sends = [subprocess.Popen(self.hosts[s].cmd([sys.executable, "-c", send_code, self.hosts[d].addr, port,
                                                     seconds]))
                 for (s, d), port in zip(pairs, ports)]
        for p in sends:
            p.wait(seconds + 60)
        return [float(r.communicate(timeout=60)[0].strip() or 0.0) for r in recvs]

    # --- MPI --------------------------------------------------------------------------
    def mpirun_argv(self, np_: int, argv, per_host: int | None = None, mca: dict | None = None) -> list[str]:
        """As TwoHosts.mpirun_argv, with every message up to EAGER_NBYTES sent eagerly."""
        eager = {"btl_tcp_eager_limit": EAGER_NBYTES, "btl_tcp_max_send_size": EAGER_NBYTES}
        return super().mpirun_argv(np_, argv, per_host, {**eager, **(mca or {})})

    def hostfile(self, slots: int = 1) -> Path:
        """An Open MPI hostfile naming every host with `slots` slots (--hostfile); mpirun()
        passes the same list as --host."""
        path = self.state / "hostfile"
        path.write_text("".join(f"{h.hostname} slots={slots}\n" for h in self.hosts))
        return path


# ---------------------------------------------------------------------------------------
# command line

def _pairs(nh: NHosts):
    return [(i, j) for i in range(len(nh.hosts)) for j in range(i + 1, len(nh.hosts))]


def links(args) -> int:
    """Every link's rate in three states: all at the base rate, one link (b-c) at a third of
    it, one host (d) at a third on all its links. Each state's links are measured in one go,
    each link one way (the lower-lettered host sends)."""
    with NHosts(args.hosts, rate_mbit=args.rate_mbit) as nh:
        names = [h.hostname.split("-")[1] for h in nh.hosts]
        slow = args.rate_mbit / 3
        states = [("base", lambda: None), (f"link b-c at {slow:.0f}", lambda: nh.shape("b", "c", slow)),
                  (f"host {names[-1]} at {slow:.0f}", lambda: (nh.reset(), nh.shape_host(names[-1], slow)))]
        pairs = _pairs(nh)
        print(f"{len(nh.hosts)} hosts, base {args.rate_mbit:g} Mbit/s on every link (htb + u32 on each eth0); "
              f"Mbit/s of TCP payload, {args.seconds:g} s per stream, all links at once")
        print("  " + " ".join(f"{names[i] + '-' + names[j]:>6s}" for i, j in pairs))
        for label, act in states:
            act()
            got = nh.link_rates_mbit(pairs, args.seconds)
            print("  " + " ".join(f"{r:6.1f}" for r in got) + f"   {label}", flush=True)
    return 0


def mpi(args) -> int:
    """A commbench run across the hosts, one rank each (the run's own arguments after --)."""
    with NHosts(args.hosts, rate_mbit=args.rate_mbit) as nh:
        for spec in args.slow_link or []:
            a, b, rate = spec.split(":")[0].split("-") + [float(spec.split(":")[1])]
            nh.shape(a, b, rate)
        for spec in args.slow_host or []:
            nh.shape_host(spec.split(":")[0], float(spec.split(":")[1]))
        argv = args.run or ["run", "quick", "--backend", "mpi", "-b", "send_recv,all_reduce", "--sizes", "64K,1M"]
        t0 = time.monotonic()
        p = subprocess.run(nh.mpirun_argv(len(nh.hosts), argv), cwd=ROOT, check=False)
        print(f"{len(nh.hosts)} hosts, {time.monotonic() - t0:.1f} s, exit {p.returncode}")
        return p.returncode


def hold(args) -> int:
    with NHosts(args.hosts, rate_mbit=args.rate_mbit) as nh:
        for h in nh.hosts:
            print(f"{h.hostname} {h.addr}: {shlex.join(h.cmd(['bash']))}")
        print("mpirun across all: " + shlex.join(nh.mpirun_argv(len(nh.hosts), ["run", "quick", "--backend", "mpi"])))
        hold_until_ctrl_c()
    return 0


def check(args) -> int:
    why = NHosts.unavailable()
    if why is None:
        try:
            with NHosts(2, rate_mbit=args.rate_mbit):
                pass
        except Unavailable as e:
            why = str(e)
    print(f"n hosts: not here: {why}" if why else "n hosts: can be made here (htb + u32 per-link shaping)")
    return 3 if why else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nhosts", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    cmds = {"check": (check, "say whether N hosts with per-link shaping can be made here"),
            "links": (links, "measure every link at the base rate, then with one link and one host shaped"),
            "mpi": (mpi, "a commbench run across the hosts, one rank each (its arguments after --)"),
            "hold": (hold, "keep the hosts up until Ctrl-C")}
    for name, (_, what) in cmds.items():
        s = sub.add_parser(name, help=what)
        s.add_argument("--hosts", type=int, default=5 if name in ("links", "mpi") else 3)
        s.add_argument("--rate-mbit", type=float, default=200.0 if name == "links" else None,
                       help="the base rate of every link (default: none for check, hold and mpi; 200 for links)")
        if name == "links":
            s.add_argument("--seconds", type=float, default=2.0)
        if name == "mpi":
            s.add_argument("--slow-link", action="append", help="A-B:MBIT (hosts by letter), repeatable")
            s.add_argument("--slow-host", action="append", help="H:MBIT, repeatable")
            s.add_argument("run", nargs=argparse.REMAINDER, help="-- then commbench's arguments")
    args = p.parse_args(argv)
    if getattr(args, "run", None) and args.run[0] == "--":
        args.run = args.run[1:]
    why = NHosts.unavailable()
    if why and args.cmd != "check":
        print(f"n hosts: skipped: {why}", file=sys.stderr)
        return 3
    try:
        return cmds[args.cmd][0](args)
    except Unavailable as e:
        print(f"n hosts: skipped: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
