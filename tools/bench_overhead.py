"""Harness overhead: commbench's 8-byte all_reduce p50 against a bare mpi4py loop, in one
launch, alternating rounds so both see the same machine state.

    mpirun -np 2 python tools/bench_overhead.py [--rounds 5] [--iters 20000] [--nbytes 8]

The bare loop is what a user writes: `comm.Allreduce(a, b)` on numpy float32 arrays, timed
as loop total / iterations (no per-iteration clock). commbench is the real harness path
(MpiComm + all_reduce plug-in + Harness.time_op) with per-iteration timing and the
slowest rank per iteration. Both figures are printed per round, and their medians.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--nbytes", type=int, default=8)
    args = ap.parse_args()

    from mpi4py import MPI

    from commbench.backends.mpi import MpiComm
    from commbench.benchmarks import Point, get
    from commbench.run.point_harness import Harness
    from commbench.run.suite import build_config

    comm = MPI.COMM_WORLD
    count = args.nbytes // 4
    a, b = np.ones(count, np.float32), np.zeros(count, np.float32)

    cb = MpiComm(comm, "cpu")
    bench = get("all_reduce")
    point = Point("all_reduce", comm.size, "float32", args.nbytes)
    bufs = bench.setup(cb, point)
    bench.fill(cb, bufs)
    harness = Harness(build_config({"name": "overhead", "benchmarks": ["all_reduce"], "iters": args.iters,
                                    "warmup": 200}))
    bare, ours = [], []
    for _ in range(args.rounds):
        for _ in range(200):
            comm.Allreduce(a, b)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            comm.Allreduce(a, b)
        bare.append((time.perf_counter() - t0) / args.iters * 1e6)
        row = harness.time_op(cb, point, bench.op(cb, bufs), bench.traffic(point))
        ours.append(row["time_us_p50"])
    if comm.rank == 0:
        for i, (x, y) in enumerate(zip(bare, ours)):
            print(f"round {i}: bare mpi4py loop mean {x:.3f} us   commbench p50 {y:.3f} us")
        print(f"median: bare mpi4py {np.median(bare):.3f} us, commbench p50 {np.median(ours):.3f} us, "
              f"ratio commbench/bare {np.median(ours) / np.median(bare):.3f}  "
              f"({args.nbytes} B all_reduce, {comm.size} ranks, {MPI.Get_library_version().splitlines()[0].strip()})")


if __name__ == "__main__":
    main()
