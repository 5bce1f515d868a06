"""What every backend communicator offers.

Collective methods PREPARE an operation and return a zero-argument callable that runs it
once: buffer specs and argument parsing happen at preparation, outside the timed loop,
which is how the harness adds no overhead to a small-message latency.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

Op = Callable[[], None]


class Handle:
    """A started non-blocking operation."""

    def __init__(self, wait: Callable[[], object], test: Callable[[], bool] | None = None):
        self._wait = wait
        self._test = test

    def wait(self) -> None:
        self._wait()

    def test(self) -> bool:
        """Poll for completion (gives an MPI library a chance to progress)."""
        return bool(self._test()) if self._test else False


class RowsExchange:
    """An all-to-all of table rows picked by index, in three timed steps (MoE dispatch and
    combine): pack() gathers the rows into send order, run() is the all-to-all call, and
    unpack() places arrivals. This host version gathers into and scatters out of staging
    buffers with numpy; a backend that can describe scattered rows to its library (MPI
    datatypes) overrides it so the library moves rows straight from and to their places.

    src, dst: 2-D uint8 host arrays (rows x row_nbytes). send_rows: rows of src in send
    order, grouped by destination, send_counts[d] of them for rank d; None: the rows are
    already in stage_send. recv_rows[j]: the row of dst where the j-th arriving row goes
    (arrivals grouped by source, recv_counts[s] from rank s); None: they stay in stage_recv.
    """

    method = "host gather/scatter (numpy) around the all_to_all"

    def __init__(self, comm, row_nbytes, src, send_rows, send_counts, dst, recv_counts, recv_rows,
                 stage_send, stage_recv):
        self.comm, self.src, self.send_rows, self.dst, self.recv_rows = comm, src, send_rows, dst, recv_rows
        self.row_nbytes = row_nbytes
        self.send_counts = np.asarray(send_counts, dtype=np.int64)
        self.recv_counts = np.asarray(recv_counts, dtype=np.int64)
        self.stage_send, self.stage_recv = stage_send, stage_recv
        self._op = None

    def pack(self) -> None:
        if self.send_rows is not None:
            send = self.comm.host_view(self.stage_send).reshape(-1, self.row_nbytes)
            # mode="clip": with the default mode="raise", take() into an out= buffer goes
            # through a temporary copy (4x slower for a 100 MB gather); indices are valid.
            np.take(self.src, self.send_rows, axis=0, out=send[:self.send_rows.size], mode="clip")
        self._op = self.comm.all_to_all(self.stage_send, self.stage_recv, self.send_counts * self.row_nbytes,
                                        self.recv_counts * self.row_nbytes)

    def run(self) -> None:
        self._op()

    def unpack(self) -> None:
        if self.recv_rows is not None:
            recv = self.comm.host_view(self.stage_recv).reshape(-1, self.row_nbytes)
            self.dst[self.recv_rows] = recv[:self.recv_rows.size]


class Comm:
    """Base communicator: rank, size and the host-clock timing loop."""

    backend: str = ""
    device: str = "cpu"
    timing_method = "host_clock"
    # The run asks for nccl-tests' in-place column (suite key in_place): the output buffer
    # is the input.
    in_place: bool = False

    def out_of_place_all_reduce(self, dtype: str) -> bool:
        """Can this backend reduce into a buffer other than its input? (MPI can; torch's
        all_reduce only works in place.)"""
        return True

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size

    # --- memory -----------------------------------------------------------------
    def alloc(self, count: int, dtype: str):
        raise NotImplementedError

    def fill(self, buf, values: np.ndarray) -> None:
        raise NotImplementedError

    def to_numpy(self, buf) -> np.ndarray:
        raise NotImplementedError

    def host_view(self, buf) -> np.ndarray:
        """A numpy view sharing a CPU buffer's memory (no copy), for host-side packing."""
        raise NotImplementedError

    # --- prepared operations ----------------------------------------------------
    def all_reduce(self, send, recv, in_place: bool = False) -> Op:
        """in_place: reduce recv in place (send unused)."""
        raise NotImplementedError
    def reduce_scatter(self, send, recv) -> Op: raise NotImplementedError
    def all_gather(self, send, recv) -> Op: raise NotImplementedError
    def all_to_all(self, send, recv, send_counts=None, recv_counts=None) -> Op: raise NotImplementedError
    def broadcast(self, buf, root: int) -> Op: raise NotImplementedError
    def send_recv(self, send, recv, peer: int) -> Op: raise NotImplementedError
    def barrier_op(self) -> Op: raise NotImplementedError

    def rows_all_to_all(self, row_nbytes, src, send_rows, send_counts, dst, recv_counts, recv_rows,
                        stage_send, stage_recv) -> RowsExchange:
        return RowsExchange(self, row_nbytes, src, send_rows, send_counts, dst, recv_counts, recv_rows, stage_send, stage_recv)

    # --- non-blocking -----------------------------------------------------------
    def iall_reduce(self, send, recv) -> Handle: raise NotImplementedError

    # --- control ----------------------------------------------------------------
    def barrier(self) -> None:
        self.barrier_op()()

    def sync(self) -> None:
        """Wait for the device to finish queued work (no-op on CPU)."""

    def idle_barrier(self) -> None:
        """A barrier for ranks left out of a smaller world: they must not busy-poll, or on
        an oversubscribed host they steal the cores the measured ranks run on."""
        self.barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def min_over_ranks(self, values: np.ndarray) -> np.ndarray:
        return -self.max_over_ranks(-np.asarray(values, dtype=np.float64))

    def allgather_obj(self, obj) -> list:
        raise NotImplementedError

    def time_ops(self, op: Op, iters: int, barrier_each: bool = False, per_op_events: bool = False) -> np.ndarray:
        """Per-iteration seconds, host clock: operations back to back (nccl-tests), or with
        a barrier after each, outside the timed window (OSU's collective tests).

        The loop body is the bare call between two clock reads: perf_counter costs
        about 0.05 us, which is why it is read once per iteration and nothing else is.

        An op carrying a compiled_loop(iters, barrier_each) (the MPI backend's plain
        collectives on CPU, backends/mpi_timeloop.py) runs that instead: the same loop in C,
        samples and clock (CLOCK_MONOTONIC) alike, without the interpreter's call cost.
        """
        compiled = getattr(op, "compiled_loop", None)
        if compiled is not None:
            return compiled(iters, barrier_each)
        times = np.empty(iters, dtype=np.float64)
        clock = time.perf_counter
        if barrier_each:
            barrier = self.barrier_op()
            for i in range(iters):
                t0 = clock()
                op()
                times[i] = clock() - t0
                barrier()
            return times
        for i in range(iters):
            t0 = clock()
            op()
            times[i] = clock() - t0
        return times

    def time_steps(self, step: Callable[[Callable[[], None]], None], iters: int, nlaps: int,
                   barrier_each: bool = False, hold: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The multi-stage form of time_ops: step(lap) runs one iteration and calls lap()
        after each of its first nlaps stages (moe: layout, counts, pack, a2a; overlap: the
        buckets started, the compute). Returns per-iteration seconds (iters,) and each
        stage's seconds (iters, nlaps), from one clock read per lap. The host clock here (hold
        means nothing to it); a device backend brackets the same laps with events on its
        stream, behind a hold when asked."""
        marks = np.empty((iters, nlaps + 2), dtype=np.float64)
        clock = time.perf_counter
        barrier = self.barrier_op() if barrier_each else None
        for i in range(iters):
            row, j = marks[i], [1]

            def lap(row=row, j=j):
                row[j[0]] = clock()
                j[0] += 1
            row[0] = clock()
            step(lap)
            row[-1] = clock()
            if j[0] != nlaps + 1:
                raise RuntimeError(f"a timed step called lap() {j[0] - 1} times, expected {nlaps}")
            if barrier is not None:
                barrier()
        return marks[:, -1] - marks[:, 0], np.diff(marks[:, :-1], axis=1)
