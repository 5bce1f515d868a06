"""The torch backends' rendezvous address (MASTER_ADDR, MASTER_PORT) across hosts.

torch.distributed's env:// rendezvous meets at MASTER_ADDR:MASTER_PORT, where rank 0's
TCPStore listens. Across hosts that must be an address of rank 0's host which every rank
reaches: rank 0's hostname need not resolve on the other hosts (nor to the network they
share), and 127.0.0.1 reaches only ranks on rank 0's own host. Under an MPI launch the
ranks agree on one by trying rank 0's addresses (agree_master); under torchrun each rank
checks the one it was given (check_master_reachable). Either way an address some rank
cannot reach is one line, at once, not torch's rendezvous timeout.
"""
from __future__ import annotations

import importlib.util
import os
import socket

from commbench.core.errors import UsageError
from commbench.core.whoami import LaunchInfo, world_mismatch

# How long a rank waits for rank 0's host to answer a connection: a refusal or a route
# error comes back at once; silence this long means the packets go nowhere.
REACH_TIMEOUT_S = 5.0


def interface_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of this host's interfaces that are up, loopback last;
    empty where the kernel cannot be asked (not Linux)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocgifaddr, iff_up, iff_loopback = 0x8913, 0x8915, 0x1, 0x8
    found = []
    try:
        names = socket.if_nameindex()
    except OSError:
        return []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in names:
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s, siocgifflags, req)[16:18])[0]
                addr = socket.inet_ntoa(fcntl.ioctl(s, siocgifaddr, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            if flags & iff_up:
                found.append((bool(flags & iff_loopback), name, addr))
    return [(name, addr) for _, name, addr in sorted(found, key=lambda f: f[0])]


def hostname_address() -> str | None:
    """The address this host's name resolves to, when that is one of its own non-loopback
    addresses: what gloo binds to by default (else it falls back to the loopback, which
    no other host reaches)."""
    import socket

    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    mine = {a for _, a in interface_addresses() if not a.startswith("127.")}
    return next((i[4][0] for i in infos if i[4][0] in mine), None)


def candidate_addresses() -> list[str]:
    """Rank 0's addresses to offer, best first: the one its hostname resolves to (what a
    cluster's DNS names it by), then every other interface's in the kernel's order, the
    loopback last (enough when every rank runs on this host)."""
    import socket

    first = hostname_address()
    rest = [a for _, a in interface_addresses() if a != first]
    return ([first] if first else []) + rest or [socket.gethostname()]


def interface_toward(addr: str) -> str | None:
    """The interface whose address this host sends from to reach addr (a route lookup: a
    UDP socket's connect() sends nothing), or None when there is no route."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(addr), 9))
            src = s.getsockname()[0]
    except OSError:
        return None
    return next((name for name, a in interface_addresses() if a == src), None)


def _reach(addr: str, port: int, token: bytes | None, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """None when addr:port answers (with token, when one is given: the listener is rank 0's,
    not another process's on a host that happens to hold the same address), else why not.
    token None: a refused connection counts as an answer (the host is there; rank 0 has
    not started listening yet)."""
    import socket

    try:
        ip = socket.gethostbyname(addr)
    except OSError as e:
        return f"{addr} does not resolve ({e.strerror or e})"
    try:
        with socket.create_connection((ip, port), timeout=timeout_s) as c:
            if token is None:
                return None
            got = b""
            while len(got) < len(token):
                chunk = c.recv(len(token) - len(got))
                if not chunk:
                    break
                got += chunk
            return None if got == token else "another process answers there, not rank 0"
    except ConnectionRefusedError:
        return None if token is None else "connection refused"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as e:
        return e.strerror or str(e)


class _Answer:
    """Rank 0's short-lived listener on the rendezvous port: it answers every connection
    with a random token, so a rank knows it reached rank 0."""

    def __init__(self, port: int):
        import secrets
        import socket
        import threading

        self.token = secrets.token_bytes(16)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        import threading

        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._answer, args=(c,), daemon=True).start()

    def _answer(self, c):
        try:
            # The caller hangs up first: the port's closed connections wait out TIME_WAIT on
            # its side, not here, where the rendezvous is about to listen again.
            c.settimeout(REACH_TIMEOUT_S)
            c.sendall(self.token)
            c.recv(1)
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        import socket

        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# Set by agree_master: the address was already reached by every rank.
_AGREED: tuple[str, int] | None = None


def agree_master(comm, rank: int) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT for ranks that share an MPI communicator (mpirun, srun):
    rank 0 offers its addresses (MASTER_ADDR alone, when given) and a port it listens on;
    every rank tries them all at once; the first, in rank 0's interface order, that every
    rank reached is the one. None reached by all: a UsageError naming, per address, the
    ranks that could not reach it and why."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    given = os.environ.get("MASTER_ADDR")
    offer, answer = None, None
    if rank == 0:
        port = os.environ.get("MASTER_PORT")
        try:
            answer = _Answer(int(port) if port else 0)
            addrs = [given] if given else candidate_addresses()
            offer = {"addrs": addrs, "port": answer.port, "token": answer.token}
        except (OSError, ValueError) as e:
            offer = {"error": f"rank 0 cannot listen on port {port or '(any)'}: {getattr(e, 'strerror', None) or e}"}
    try:
        offer = comm.bcast(offer, root=0)
        if "error" in offer:
            raise UsageError(offer["error"])
        with ThreadPoolExecutor(max_workers=len(offer["addrs"])) as pool:
            mine = list(pool.map(lambda a: _reach(a, offer["port"], offer["token"]), offer["addrs"]))
        everyone = comm.allgather((socket.gethostname(), mine))
    finally:
        if answer is not None:
            answer.close()
    global _AGREED
    for i, addr in enumerate(offer["addrs"]):
        if all(got[i] is None for _, got in everyone):
            _AGREED = (addr, offer["port"])
            return _AGREED
    why = "; ".join(f"{addr}: " + ", ".join(f"rank {r} ({host}) {got[i]}" for r, (host, got) in enumerate(everyone)
                                           if got[i] is not None)
                    for i, addr in enumerate(offer["addrs"]))
    hint = ("give --master-addr an address of rank 0's host that every host reaches" if not given else
            "--master-addr (MASTER_ADDR) must be an address of rank 0's host that every host reaches")
    raise UsageError(f"no rendezvous address that every rank reaches on port {offer['port']} ({why}): {hint}")


def prepare_rendezvous(addr: str, port_text: str) -> None:
    """Before init_process_group on a rank of a multi-rank launch: the address checked,
    and gloo told which interface to use where it would fall back to the loopback."""
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"MASTER_PORT must be a port number, got {port_text!r}") from None
    if _AGREED != (addr, port):
        check_master_reachable(addr, port)
    # gloo binds to the address this host's name resolves to, or to the loopback when the
    # name resolves to none of its own: then the other hosts could not connect back. The
    # interface this host reaches rank 0 through is one they reach it on.
    if "GLOO_SOCKET_IFNAME" not in os.environ and hostname_address() is None:
        iface = interface_toward(addr)
        if iface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = iface


def check_master_reachable(addr: str, port: int) -> None:
    """Under a launcher without MPI (torchrun, a rank per host started by hand): fail at
    once, in one line, when MASTER_ADDR cannot be reached, rather than wait out the
    rendezvous timeout. A refusal is fine: the host is there and rank 0 may not be
    listening yet."""
    why = _reach(addr, port, None)
    if why is not None:
        raise UsageError(f"cannot reach the rendezvous address {addr}:{port} (MASTER_ADDR/--master-addr): {why}; "
                         f"it must be an address of rank 0's host that every host reaches")


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

        why = world_mismatch(info, MPI.COMM_WORLD.Get_size(), torch_backend=True)
        if why:
            raise UsageError(why)
        # Not rank 0's hostname: another host may not resolve it (rendezvous.agree_master).
        addr, port = agree_master(MPI.COMM_WORLD, info.rank)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    elif info.launcher == "srun":
        raise UsageError(f"srun started {info.world} ranks and mpi4py is not installed to agree on a rendezvous: "
                         f"set MASTER_ADDR (an address of rank 0's host that every host reaches; or --master-addr) "
                         f"and MASTER_PORT")


def _mpi_importable() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def free_port() -> int:
    """A port for rank 0 to listen on, chosen below the kernel's ephemeral range where one is
    free: a port from that range (what bind(0) hands out) can be taken, between this choice
    and rank 0's listen, as the local end of any outgoing connection on the host (the ranks'
    own gloo connections among them), and the launch then fails with "port in use"."""
    import random

    lo = _ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(32):
        port = pick.randrange(max(1024, lo - 12000), lo)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(2048, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


# --- bounded start-up: every wait before the watchdog is armed ends by the run's --timeout ----

def parse_port(text: str, name: str) -> int:
    """A TCP port from a variable or flag named `name`, or one line naming it."""
    try:
        port = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{name} must be a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"{name}={port} is not a TCP port (1-65535)")
    return port


def agent_store() -> bool:
    """Under torchrun the agent's own store already listens on MASTER_PORT, by design."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("true", "1")


def check_port_free(port: int, name: str) -> None:
    """Rank 0 is about to listen on port: one line naming `name` when another process
    already does (torch's store and JAX's coordinator fail there with a trace, or a crash)."""
    import errno
    import socket

    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of a previous run is no conflict
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"{name}: port {port} is in use on this host (another process listens there): "
                                 f"choose another") from None
            if e.errno != errno.EADDRNOTAVAIL:
                raise UsageError(f"{name}: cannot listen on port {port}: {e.strerror or e}") from None
        finally:
            s.close()


# The bytes of the start-up meeting (meet): a rank's hello, and rank 0's answers.
_GO, _OFF = b"go", b"no"


def meet(addr: str, port: int, rank: int, world: int, bound_s: float, what: str) -> None:
    """Every rank of the launch meets at addr:port before a library that cannot be stopped
    (JAX's coordinator aborts the process, with a C++ trace, when a task never registers) is
    started there. Rank 0 listens; the others connect, retrying until bound_s; rank 0 waits
    bound_s for all of them, then tells each to go on, or that the meeting is off. Either
    way every rank ends within about bound_s, with one line naming who did not come. The
    listener is closed before the library takes the port (the callers hang up first, so no
    connection lingers in TIME_WAIT on rank 0's side)."""
    import socket
    import struct
    import time

    deadline = time.monotonic() + bound_s
    if rank == 0:
        check_port_free(port, what)
        if world == 1:
            return
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("", port))
        srv.listen(world)
        came: dict[int, socket.socket] = {}
        try:
            while len(came) < world - 1 and time.monotonic() < deadline:
                srv.settimeout(max(0.05, deadline - time.monotonic()))
                try:
                    c, _ = srv.accept()
                except (TimeoutError, socket.timeout):
                    break
                c.settimeout(REACH_TIMEOUT_S)
                try:
                    got = c.recv(4)
                    r = struct.unpack("!i", got)[0] if len(got) == 4 else -1
                except (OSError, struct.error):
                    r = -1
                if 0 < r < world and r not in came:
                    came[r] = c
                else:
                    c.close()
            answer = _GO if len(came) == world - 1 else _OFF
            for c in came.values():
                try:
                    c.sendall(answer)
                    c.recv(1)  # the caller hangs up first
                except OSError:
                    pass
        finally:
            for c in came.values():
                c.close()
            srv.close()
        if answer == _OFF:
            missing = [r for r in range(1, world) if r not in came]
            raise UsageError(f"{what} {addr}:{port}: rank 0 waited {bound_s:g} s (--timeout) for the other ranks; "
                             f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {world} never "
                             f"came: start every rank, or check the address")
        return
    with connect_within(addr, port, deadline, bound_s, what) as c:
        try:
            c.sendall(struct.pack("!i", rank))
            # Rank 0 waits up to its own bound for the last rank: as long, and a little more.
            c.settimeout(bound_s + REACH_TIMEOUT_S)
            answer = c.recv(len(_GO))
        except OSError:
            answer = b""
    if answer == _GO:
        return
    raise UsageError(f"{what} {addr}:{port}: rank 0 gave up waiting for another rank (within --timeout "
                         f"{bound_s:g} s): start every rank")


def connect_within(addr: str, port: int, deadline: float, bound_s: float, what: str):
    """A connection to rank 0's listener at addr:port, retried until the monotonic
    deadline (rank 0 may start later than this rank), or one line saying why not."""
    import socket
    import time

    why = "no rank 0 there"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise UsageError(f"{what} {addr}:{port}: rank 0 did not answer within {bound_s:g} s (--timeout) "
                             f"({why}): start rank 0, or check the address")
        try:
            return socket.create_connection((addr, port), timeout=min(REACH_TIMEOUT_S, left))
        except (ConnectionRefusedError, TimeoutError, socket.timeout) as e:
            why = "connection refused" if isinstance(e, ConnectionRefusedError) else "no answer"
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        except OSError as e:  # no route, no such host: waiting does not help
            raise UsageError(f"{what} {addr}:{port}: cannot reach it: {e.strerror or e}") from None
