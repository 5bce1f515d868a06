"""Measurement fidelity: commbench's MPI numbers next to a C loop on the same library, in one
paired launch.

    mpirun -np 2 python tools/bench_fidelity.py [--sizes 8:16M:2] [--rounds 3] [--min-time-ms 50]
        [--ops all_reduce,all_to_all] [--methods back_to_back,barrier] [--lib build/libc_loop.so]

Per (op, method, size) and round, three measurements run one after another in the same
ranks, in an order that rotates with the round:

  C         tools/c_loop.c built as a shared library and called through ctypes (the very
            loop `build/c_loop` runs): plain blocking MPI_Allreduce (float32 SUM) or
            MPI_Alltoall, page-aligned buffers, mean time per op, slowest rank's mean.
  mpi4py    what a user writes: comm.Allreduce(a, b) / comm.Alltoall(a, b) on numpy arrays;
            back_to_back: loop total / iterations; barrier: perf_counter around each op,
            summed, Barrier after each (untimed); slowest rank's mean. Same count as C.
  commbench the real harness path: Harness(build_config({... "timing": method ...})).time_op
            on the plug-in's op with MpiComm; per-iteration samples, slowest rank per
            iteration; its p50 and mean. It calibrates its own count to --min-time-ms.

The C loop runs in-process (ctypes on the Fortran handle of COMM_WORLD, same libmpi as
mpi4py) rather than as a separate mpirun, so all three share one launch: the same rank
placement, shared-memory segments and machine state, alternating within seconds.
Each figure is the median over rounds. Targets: commbench p50 within 1.25x of C at every
size and within 1.05x from 64 KiB up; rows missing them are marked. On a shared host run
it when nothing else runs: the C figure is a mean and takes every preemption in full (the
header prints the load average).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tools" / "c_loop.c"
OPS = {"all_reduce": 0, "all_to_all": 1}
METHODS = {"back_to_back": 0, "barrier": 1}
TARGET_ALL, TARGET_LARGE, LARGE_FROM = 1.25, 1.05, 64 << 10


def find_mpicc() -> str | None:
    here = Path(sys.executable).parent / "mpicc"
    return str(here) if here.exists() else shutil.which("mpicc")


def build_lib(out: Path, mpicc: str | None = None) -> Path:
    """build/libc_loop.so from tools/c_loop.c (what `make c-loop` builds)."""
    mpicc = mpicc or find_mpicc()
    if not mpicc:
        raise SystemExit("bench_fidelity: no mpicc beside python or on PATH to build the C loop")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([mpicc, "-O2", "-shared", "-fPIC", "-DCB_NO_MAIN", "-o", str(out), str(SRC)], check=True)
    return out


def load_lib(path: Path):
    lib = ctypes.CDLL(str(path))
    lib.cb_iters.restype = ctypes.c_long
    lib.cb_iters.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_double,
                             ctypes.c_long, ctypes.c_long, ctypes.c_long]
    lib.cb_loop.restype = ctypes.c_double
    lib.cb_loop.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_long]
    return lib


def _numpy_hugepage(enabled: bool):
    """Set numpy's MADV_HUGEPAGE for large allocations; the previous setting (None: unknown)."""
    try:
        from numpy._core import multiarray as ma
    except ImportError:  # numpy < 2
        from numpy.core import multiarray as ma
    try:
        return ma._set_madvise_hugepage(enabled)
    except AttributeError:
        return None


def parse_sizes(text: str) -> list[int]:
    from commbench.core.units import parse_size, parse_sizes_arg, size_range

    spec = parse_sizes_arg(text)
    if isinstance(spec, dict):
        return size_range(parse_size(spec["min"]), parse_size(spec["max"]), spec["factor"])
    return [parse_size(s) for s in spec]


def bare_mpi4py(comm, op: str, method: str, nbytes: int, iters: int, warmup: int) -> float:
    """Mean seconds per op of the loop a user writes, slowest rank's mean."""
    from mpi4py import MPI

    count = nbytes // 4
    a, b = np.ones(count, np.float32), np.zeros(count, np.float32)
    fn = comm.Allreduce if op == "all_reduce" else comm.Alltoall
    for _ in range(warmup):
        fn(a, b)
        if method == "barrier":
            comm.Barrier()
    comm.Barrier()
    if method == "barrier":
        total, clock = 0.0, time.perf_counter
        for _ in range(iters):
            t0 = clock()
            fn(a, b)
            total += clock() - t0
            comm.Barrier()
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(a, b)
        total = time.perf_counter() - t0
    return comm.allreduce(total / iters, op=MPI.MAX)


def commbench_row(cb, op: str, method: str, nbytes: int, min_time_ms: float) -> dict:
    from commbench.benchmarks import Point, get
    from commbench.run.point_harness import Harness
    from commbench.run.suite import build_config

    bench = get(op)
    point = Point(op, cb.size, "float32", nbytes)
    bufs = bench.setup(cb, point)
    bench.fill(cb, bufs)
    harness = Harness(build_config({"name": "fidelity", "benchmarks": [op], "timing": method,
                                    "min_time_ms": min_time_ms}))
    return harness.time_op(cb, point, bench.op(cb, bufs), bench.traffic(point))


def fmt_us(v: float) -> str:
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8:16M:2", help="MIN:MAX[:FACTOR] or A,B,C (bytes, K/M suffixes)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time-ms", type=float, default=50.0, help="per measurement (C, mpi4py, commbench)")
    ap.add_argument("--ops", default="all_reduce,all_to_all")
    ap.add_argument("--methods", default="back_to_back,barrier")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lib", default=str(ROOT / "build" / "libc_loop.so"),
                    help="shared library built from tools/c_loop.c (built here when missing)")
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    methods = [m for m in args.methods.split(",") if m]
    for name, known in ((ops, OPS), (methods, METHODS)):
        bad = [x for x in name if x not in known]
        if bad:
            raise SystemExit(f"bench_fidelity: unknown {bad} (known: {', '.join(known)})")
    if args.rounds < 1:
        raise SystemExit("bench_fidelity: --rounds must be >= 1")
    sizes = parse_sizes(args.sizes)

    # numpy madvises allocations of 4 MiB and more MADV_HUGEPAGE; the heap ranges it marks
    # are later handed to the C loop's posix_memalign, which then gets 2 MiB pages by chance
    # (a 2 MiB all_to_all: ~45 us instead of ~90 on the 2-core loopback VM). Off, all three
    # run on 4 KiB pages, as the standalone build/c_loop and commbench's buffers do.
    hugepage_default = _numpy_hugepage(False)

    from mpi4py import MPI

    from commbench.backends.mpi import MpiComm

    comm = MPI.COMM_WORLD
    lib_path = Path(args.lib)
    if comm.rank == 0 and not lib_path.exists():
        build_lib(lib_path)
    comm.Barrier()
    lib = load_lib(lib_path)
    fcomm = comm.py2f()
    cb = MpiComm(comm, "cpu")
    for nb in sizes:
        if nb % (4 * comm.size):
            raise SystemExit(f"bench_fidelity: size {nb} is not a multiple of 4 B x {comm.size} ranks")

    keys = [(o, m, nb) for o in ops for m in methods for nb in sizes]
    res = {k: {"c": [], "py": [], "p50": [], "mean": []} for k in keys}
    iters = {}
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    for rnd in range(args.rounds):
        for key in keys:
            o, m, nb = key
            if key not in iters:
                iters[key] = int(lib.cb_iters(fcomm, OPS[o], METHODS[m], nb, args.min_time_ms, 5, 1_000_000,
                                              args.warmup))
                if iters[key] < 1:
                    raise SystemExit(f"bench_fidelity: C loop could not allocate {nb} B")
            n = iters[key]
            runs = [
                lambda: res[key]["c"].append(lib.cb_loop(fcomm, OPS[o], METHODS[m], nb, n, args.warmup) * 1e6),
                lambda: res[key]["py"].append(bare_mpi4py(comm, o, m, nb, n, args.warmup) * 1e6),
                lambda: (lambda row: (res[key]["p50"].append(row["time_us_p50"]),
                                      res[key]["mean"].append(row["time_us_mean"])))(
                    commbench_row(cb, o, m, nb, args.min_time_ms)),
            ]
            shift = rnd % 3
            for run in runs[shift:] + runs[:shift]:
                run()
        if comm.rank == 0:
            print(f"# round {rnd + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f} s)",
                  file=sys.stderr, flush=True)

    if comm.rank != 0:
        return 0
    from commbench.backends import mpi_timeloop

    lib_name = MPI.Get_library_version().split(",")[0].strip()
    print(f"# fidelity: {comm.size} ranks, {lib_name}, mpi4py {__import__('mpi4py').__version__}; "
          f"medians over {args.rounds} rounds, {args.min_time_ms:g} ms per measurement; "
          f"{time.perf_counter() - t_start:.0f} s; load average {load0:.2f} -> {os.getloadavg()[0]:.2f} "
          f"(the {comm.size} ranks themselves count)")
    print(f"# commbench timing loop: {mpi_timeloop.status()}")
    print(f"# 4 KiB pages for all: numpy's MADV_HUGEPAGE for >= 4 MiB arrays turned off (was {hugepage_default})")
    print("# C = tools/c_loop.c via ctypes (mean/op); mpi4py = bare loop (mean/op); "
          "commbench = Harness.time_op (per-iteration samples, slowest rank each)")
    print(f"# target: commbench p50/C <= {TARGET_ALL} at every size, <= {TARGET_LARGE} from 64K; "
          "'MISS' marks a row that misses")
    hdr = ("op", "method", "size", "C mean us", "mpi4py us", "cb p50 us", "cb mean us", "p50/C", "mean/C", "py/C", "")
    w = (10, 12, 6, 10, 10, 10, 10, 6, 6, 6, 4)
    print("  ".join(h.rjust(x) if i > 2 else h.ljust(x) for i, (h, x) in enumerate(zip(hdr, w))))
    misses = 0
    from commbench.core.units import fmt_size

    for key in keys:
        o, m, nb = key
        r = {k: float(np.median(v)) for k, v in res[key].items()}
        rp, rm, rpy = r["p50"] / r["c"], r["mean"] / r["c"], r["py"] / r["c"]
        target = TARGET_LARGE if nb >= LARGE_FROM else TARGET_ALL
        mark = "" if rp <= target else "MISS"
        misses += bool(mark)
        cells = (o, m, fmt_size(nb), fmt_us(r["c"]), fmt_us(r["py"]), fmt_us(r["p50"]), fmt_us(r["mean"]),
                 f"{rp:.3f}", f"{rm:.3f}", f"{rpy:.3f}", mark)
        print("  ".join(c.rjust(x) if i > 2 else c.ljust(x) for i, (c, x) in enumerate(zip(cells, w))), flush=True)
    print(f"# {len(keys) - misses}/{len(keys)} rows meet the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
