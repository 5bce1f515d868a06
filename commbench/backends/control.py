"""The control measurement: the host's own speed, measured beside every launch by work that
does not depend on what a comparison compares, so that compare can tell a change of the code
from a change of the host (runs made in blocks share the host's speed of their hour).

Two figures, both collective over the launch's world:

- cpu_loop_us: a fixed amount of CPU work (SHA-256 of an in-cache buffer, CPU_CHUNKS chunks),
  run on every rank at once, the mean time per chunk on the slowest rank;
- pingpong_us: the p50 of an 8 B exchange between ranks 0 and 1 through the backend's own
  send_recv (on the MPI backend's CPU path: the compiled timing loop, as points are timed);
  None at world 1.

Why SHA-256 (hashlib, OpenSSL's compiled code) and not a Python loop or a memcpy: `commbench
ab` may compare two interpreters, and a pure-Python loop's speed is the interpreter's own (it
changes between releases), so the sides' controls would differ with nothing moved; a hash of a
64 KiB buffer runs in C whatever the interpreter, numpy or MPI, and is compute-bound in cache.
A memcpy (numpy's, or the compiled MPI loop's on MPI_COMM_SELF) jumped between two modes 2x
apart (180 and 360 us a chunk) on an otherwise quiet 2-core VM, where the Python loop held
within 1 % between windows and the hash within 5 %.

Cost at each end of a launch, measured on that 2-core host: 0.42-0.52 s with a load average of
5.5 from other jobs; quiet, 0.17 s of hashing (5120 chunks of 33 us) and 0.15 s of exchanges.
However loaded the host, the CPU loop stops at CPU_WINDOW_MAX_S and the exchanges at their window.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

# The CPU loop's work: chunks of one hash of CPU_CHUNK_NBYTES each (33 us a chunk on a quiet
# 2-core Xeon VM), CPU_CHUNKS of them (0.17 s there), or as many as CPU_WINDOW_MAX_S holds on a
# loaded host: the figure is a mean per chunk of fixed work, so a shorter window changes how
# much it saw, not its scale. Why a window this long: the host's intruders come and go in tens
# of milliseconds (a duty-cycled neighbour that spins 20 ms and sleeps 30 ms has a 50 ms
# period); a window of several periods sees their share of the CPU, one shorter than a
# period may fall wholly into a gap.
CPU_CHUNK_NBYTES = 64 << 10
CPU_CHUNKS = 5120
CPU_WINDOW_MAX_S = 0.25
# The ping-pong's window (its iterations are sized from a short timing to fill it).
PINGPONG_WINDOW_S = 0.15
PINGPONG_NBYTES = 8
PINGPONG_CALIBRATE_ITERS = 500
PINGPONG_BATCHES = 10
PINGPONG_MIN_ITERS = 50
PINGPONG_MAX_ITERS = 50_000


def cpu_chunks_s(chunks: int = CPU_CHUNKS, nbytes: int = CPU_CHUNK_NBYTES,
                 window_max_s: float = CPU_WINDOW_MAX_S) -> np.ndarray:
    """Seconds of each SHA-256 hash of an nbytes buffer, back to back: `chunks` of them, or
    those done within window_max_s."""
    blob = memoryview(bytearray(b"\x5a" * nbytes))
    sha, clock = hashlib.sha256, time.perf_counter
    sha(blob).digest()  # the buffer in cache, the code paged in
    out = np.empty(int(chunks), dtype=np.float64)
    end = clock() + window_max_s
    for i in range(out.size):
        t0 = clock()
        sha(blob).digest()
        t1 = out[i] = clock() - t0
        if t0 + t1 > end:
            return out[:i + 1]
    return out


def mean_chunk_us(chunk_s) -> float:
    """The figure of a CPU loop: the MEAN time per chunk, microseconds. Not the min or the
    median: a neighbour that takes the core part of the time (spin 20 ms, sleep 30 ms) leaves
    most chunks untouched, so the min and the median land in its idle gaps and read as a
    quiet host; the mean counts every chunk it slowed, in proportion to the time it took."""
    t = np.asarray(chunk_s, dtype=np.float64)
    return float(t.mean() * 1e6) if t.size else float("nan")


def cpu_loop_us(comm) -> float:
    """Every rank runs the fixed work at once; the slowest rank's mean per chunk."""
    comm.barrier()
    mine = mean_chunk_us(cpu_chunks_s())
    comm.idle_barrier()  # the ranks done first wait without spinning on the others' cores
    return float(comm.max_over_ranks(np.array([mine]))[0])


def pingpong_us(comm, window_s: float = PINGPONG_WINDOW_S) -> tuple[float | None, str]:
    """p50 of an 8 B Sendrecv between ranks 0 and 1 over about window_s, the slower of the
    two ranks' p50 (None at world 1), and how it was timed. In PINGPONG_BATCHES batches, each
    sized from the last one's mean and agreed by every rank (both ends of the exchange run
    the same count): a count fixed up front from a quiet moment ran 30 times past its window
    when the host got busy."""
    if comm.size < 2:
        return None, ""
    op, mine = None, np.zeros(2)
    if comm.rank < 2:
        send, recv = comm.alloc(PINGPONG_NBYTES, "uint8"), comm.alloc(PINGPONG_NBYTES, "uint8")
        op = comm.send_recv(send, recv, 1 - comm.rank)
        t = comm.time_ops(op, PINGPONG_CALIBRATE_ITERS)
        mine[0] = t.mean()
    per_s = float(comm.max_over_ranks(mine)[0])
    samples, t0 = [], time.perf_counter()
    for _ in range(PINGPONG_BATCHES):
        n = int(min(PINGPONG_MAX_ITERS, max(PINGPONG_MIN_ITERS, window_s / PINGPONG_BATCHES / max(per_s, 1e-9))))
        if op is not None:
            t = comm.time_ops(op, n)
            samples.append(t)
            mine = np.array([t.mean(), time.perf_counter() - t0])
        per_s, spent_s = (float(x) for x in comm.max_over_ranks(mine))
        if spent_s >= window_s:  # wall time, the agreements' waits included
            break
    p50 = float(np.median(np.concatenate(samples))) * 1e6 if samples else 0.0
    loop = "compiled C loop" if getattr(op, "compiled_loop", None) is not None else "the backend's time_ops"
    return float(comm.max_over_ranks(np.array([p50]))[0]), f"{sum(map(len, samples))} exchanges, {loop}"


def measure(comm) -> dict:
    """Both figures and a line that says how they were made (rank 0's words)."""
    cpu = cpu_loop_us(comm)
    pp, how = pingpong_us(comm)
    method = (f"cpu_loop_us: mean per chunk of {CPU_CHUNKS} {hashlib.sha256.__name__} hashes of "
              f"{CPU_CHUNK_NBYTES >> 10} KiB, every rank at once, the slowest rank; pingpong_us: "
              + (f"p50 of {PINGPONG_NBYTES} B send_recv between ranks 0 and 1 ({how}), the slower rank"
                 if pp is not None else "none at world 1"))
    return {"cpu_loop_us": cpu, "pingpong_us": pp, "method": method}
