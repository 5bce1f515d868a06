"""A compiled per-iteration timing loop for the MPI backend's plain collectives on CPU.

Why: on the 2-core loopback (Open MPI 5.0.11) an 8 B all_reduce takes ~0.27 us in a C loop,
while one call through mpi4py costs ~0.4 us more than that (argument parsing in the
binding, the interpreter's loop and clock reads): a Python loop cannot measure a small
message within 1.25x of the library. This loop is the same loop as Comm.time_ops -- one
sample per iteration, the host clock (CLOCK_MONOTONIC, the clock behind
time.perf_counter on Linux) read around the bare call, an optional MPI_Barrier after each
call outside the timed window -- run in C with the MPI call made directly. The statistics
built on it are unchanged: per-iteration samples, slowest rank per iteration.

It is built on first use with the mpicc that belongs to the running MPI (beside the
Python, mpi4py's recorded mpicc, or on PATH), cached under ~/.cache/commbench (or
$COMMBENCH_CACHE), and used only when the mpi.h it was compiled against names the same
library and version that mpi4py loaded. Anything missing or mismatched: the Python loop
(Comm.time_ops) runs instead. COMMBENCH_COMPILED_LOOP=0 turns it off; `status()` says
which loop runs and why.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from commbench.core.units import INT_MAX

SOURCE = r"""
#include <mpi.h>
#include <time.h>

#define CB_STR_(x) #x
#define CB_STR(x) CB_STR_(x)
#if defined(OMPI_MAJOR_VERSION)
const char cb_flavor[] = "CBFLAVOR[Open MPI v" CB_STR(OMPI_MAJOR_VERSION) "." CB_STR(OMPI_MINOR_VERSION) "."
                         CB_STR(OMPI_RELEASE_VERSION) "]";
#elif defined(MPICH_VERSION)
const char cb_flavor[] = "CBFLAVOR[MPICH " MPICH_VERSION "]";
#else
const char cb_flavor[] = "CBFLAVOR[unknown]";
#endif

static inline double cb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* kind: 0 Allreduce, 1 Reduce_scatter_block, 2 Allgather, 3 Alltoall, 4 Bcast, 5 Sendrecv.
 * scount/rcount: the counts each call takes; arg: root (Bcast) or peer (Sendrecv).
 * spin_s: seconds to spin after each call, inside its timed window (0: none; the regression
 * gate's planted slowdown, run/plant.py). times[i]: seconds of iteration i. Returns the first
 * MPI error code, 0 when none. */
int cb_time_ops(int kind, void *send, void *recv, int scount, int rcount, MPI_Fint fdtype, MPI_Fint fop,
                int arg, MPI_Fint fcomm, long iters, int barrier_each, double spin_s, double *times)
{
    MPI_Comm comm = MPI_Comm_f2c(fcomm);
    MPI_Datatype dt = MPI_Type_f2c(fdtype);
    MPI_Op op = MPI_Op_f2c(fop);
    int rc = 0;
    for (long i = 0; i < iters; i++) {
        double t0 = cb_now();
        switch (kind) {
        case 0: rc = MPI_Allreduce(send, recv, scount, dt, op, comm); break;
        case 1: rc = MPI_Reduce_scatter_block(send, recv, rcount, dt, op, comm); break;
        case 2: rc = MPI_Allgather(send, scount, dt, recv, rcount, dt, comm); break;
        case 3: rc = MPI_Alltoall(send, scount, dt, recv, rcount, dt, comm); break;
        case 4: rc = MPI_Bcast(send, scount, dt, arg, comm); break;
        case 5: rc = MPI_Sendrecv(send, scount, dt, arg, 0, recv, rcount, dt, arg, 0, comm, MPI_STATUS_IGNORE);
                break;
        default: return -1;
        }
        if (spin_s > 0) {
            double end = cb_now() + spin_s;
            while (cb_now() < end) {}
        }
        times[i] = cb_now() - t0;
        if (rc) return rc;
        if (barrier_each && (rc = MPI_Barrier(comm))) return rc;
    }
    return 0;
}
"""

KINDS = {"allreduce": 0, "reduce_scatter_block": 1, "allgather": 2, "alltoall": 3, "bcast": 4, "sendrecv": 5}

_lib = None
_status = "not tried"


def status() -> str:
    """'compiled: <path>' when the C loop is in use, else why not."""
    return _status


def _mpicc_candidates():
    env = os.environ.get("COMMBENCH_MPICC")
    if env:
        yield env
    here = Path(sys.executable).parent / "mpicc"
    if here.exists():
        yield str(here)
    try:
        import mpi4py

        cfg = mpi4py.get_config() or {}
        if cfg.get("mpicc"):
            yield cfg["mpicc"]
    except Exception:  # noqa: BLE001 - a missing config just means no candidate
        pass
    found = shutil.which("mpicc")
    if found:
        yield found


def _flavor_matches(so: Path, lib_version: str) -> bool:
    """The mpi.h the loop was compiled against names the library mpi4py runs on."""
    m = re.search(rb"CBFLAVOR\[([^\]]*)\]", so.read_bytes())
    flavor = m.group(1).decode() if m else "unknown"
    if flavor.startswith("Open MPI v"):
        return re.match(re.escape(flavor) + r"\b", lib_version) is not None
    if flavor.startswith("MPICH "):
        return "MPICH" in lib_version and re.search(r"\b" + re.escape(flavor[6:]) + r"\b", lib_version) is not None
    return False


def _cache_dir() -> Path:
    base = os.environ.get("COMMBENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "commbench")
    return Path(base)


def load(MPI):
    """The compiled loop library, built on first use; None (with status() saying why) when
    it cannot be built or does not match the running MPI."""
    global _lib, _status
    if _lib is not None or _status != "not tried":
        return _lib
    if os.environ.get("COMMBENCH_COMPILED_LOOP", "1").strip().lower() in ("0", "no", "off", "false"):
        _status = "python loop: COMMBENCH_COMPILED_LOOP=0"
        return None
    lib_version = MPI.Get_library_version().strip()
    why = "no mpicc beside python, in mpi4py's config or on PATH"
    for mpicc in dict.fromkeys(_mpicc_candidates()):
        key = hashlib.sha256("\0".join([SOURCE, os.path.realpath(mpicc), lib_version]).encode()).hexdigest()[:16]
        so = _cache_dir() / f"mpi_timeloop-{key}.so"
        try:
            if not so.exists():
                so.parent.mkdir(parents=True, exist_ok=True)
                tmp = so.with_name(f".{so.name}.{os.getpid()}.tmp")
                src = tmp.with_suffix(".c")
                src.write_text(SOURCE)
                try:
                    p = subprocess.run([mpicc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                                       capture_output=True, text=True, timeout=120)
                    if p.returncode != 0:
                        why = f"{mpicc} failed: {(p.stderr or p.stdout).strip()[-300:]}"
                        continue
                    os.replace(tmp, so)  # atomic: ranks building at once each install a whole file
                finally:
                    for f in (tmp, src):
                        f.unlink(missing_ok=True)
            if not _flavor_matches(so, lib_version):
                why = f"{mpicc} compiles against another MPI than the running {lib_version.splitlines()[0]!r}"
                continue
            lib = ctypes.CDLL(str(so))
            fn = lib.cb_time_ops
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_double,
                           ctypes.c_void_p]
        except (OSError, subprocess.SubprocessError) as e:
            why = f"{mpicc}: {e}"
            continue
        _lib, _status = lib, f"compiled: {so}"
        return _lib
    _status = f"python loop: {why}"
    return None


class _Loop:
    """compiled_loop(iters, barrier_each) of one prepared call. Creating one is cheap (the
    MoE dispatch prepares an all_to_all inside its timed count exchange); the addresses
    and handles are read on the first timed run."""

    __slots__ = ("fn", "MPI", "spec", "args", "spin_s")

    def __init__(self, fn, MPI, spec, spin_s: float = 0.0):
        self.fn, self.MPI, self.spec, self.args, self.spin_s = fn, MPI, spec, None, float(spin_s)

    def with_spin(self, spin_s: float) -> "_Loop":
        """The same loop with a spin of spin_s seconds after each call, inside its timed
        window (run/plant.py: the regression gate's planted slowdown)."""
        return _Loop(self.fn, self.MPI, self.spec, spin_s)

    def __call__(self, iters: int, barrier_each: bool = False) -> np.ndarray:
        times = np.empty(int(iters), dtype=np.float64)
        if not times.size:
            return times
        if self.args is None:
            MPI, (comm, kind, send, recv, scount, rcount, mpi_op, arg) = self.MPI, self.spec
            dtype = MPI._typedict[send.dtype.char]
            self.args = (KINDS[kind], send.ctypes.data, recv.ctypes.data if recv is not None else None, int(scount),
                         int(rcount), dtype.py2f(), (mpi_op or MPI.OP_NULL).py2f(), int(arg), comm.py2f())
        rc = self.fn(*self.args, times.size, int(bool(barrier_each)), self.spin_s, times.ctypes.data)
        if rc:
            raise self.MPI.Exception(rc) if rc > 0 else RuntimeError(f"mpi_timeloop: error {rc}")
        return times


def attach(op, MPI, comm, kind: str, send, recv, scount: int, rcount: int, mpi_op=None, arg: int = 0):
    """Give a prepared operation (a functools.partial) a compiled_loop(iters, barrier_each)
    that Comm.time_ops runs instead of its Python loop; the op is returned either way.
    send/recv: the contiguous numpy arrays the op reads and writes (the loop holds them)."""
    lib = _lib if _lib is not None else load(MPI)
    if lib is None or scount > INT_MAX or rcount > INT_MAX:
        return op
    op.compiled_loop = _Loop(lib.cb_time_ops, MPI, (comm, kind, send, recv, scount, rcount, mpi_op, arg))
    return op
