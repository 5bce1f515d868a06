"""mpi4py backend: numpy buffers on CPU, cupy buffers on CUDA when the MPI is CUDA-aware."""
from __future__ import annotations

import functools
import mmap
import os

import numpy as np

from commbench.backends import mpi_timeloop
from commbench.backends.timing import time_steps_with_events, time_with_events
from commbench.core.errors import UsageError

from .base import Comm, Handle, RowsExchange

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32,
              "float64": np.float64, "uint8": np.uint8}


def aligned_empty(count: int, dtype) -> np.ndarray:
    """A page-aligned host array, as OSU and nccl-tests allocate: an anonymous mmap starts
    on a page. Open MPI's shared-memory path ran a 64 KiB all_reduce in ~21 us from
    page-aligned buffers against ~60 us from malloc'd ones on the 2-core loopback."""
    nbytes = count * np.dtype(dtype).itemsize
    region = mmap.mmap(-1, max(nbytes, 1))
    return np.frombuffer(region, dtype=dtype, count=count)


class MpiRowsExchange(RowsExchange):
    """Rows picked by index travel in one MPI_Alltoallw whose datatypes name them (an
    indexed block of rows per peer), so the library copies each row once, straight from its
    place, instead of numpy gathering 100 MB into a staging buffer first. Building the
    datatypes is the pack step. On the 2-core loopback (Open MPI 5.0.11, 4 ranks, ~3.6
    copies of 4096 rows of 7392 B) pack + Alltoallv took 21.6 ms and this 20.1 ms."""

    method = "MPI_Alltoallw with indexed-row datatypes (no staging copy)"

    def pack(self):
        row = self.comm.MPI.BYTE.Create_contiguous(self.row_nbytes).Commit()
        self._types = [row]
        # Alltoallw takes byte displacements and counts in units of each peer's datatype:
        # contiguous rows are `count` rows at their byte offset; indexed ones one datatype.
        sspec = self._spec_w(row, self.src, self.stage_send, self.send_rows, self.send_counts)
        rspec = self._spec_w(row, self.dst, self.stage_recv, self.recv_rows, self.recv_counts)
        self._args = (sspec, rspec)

    def _spec_w(self, row, table, stage, rows, counts):
        MPI, n = self.comm.MPI, self.comm.size
        if rows is None:
            displs = ((np.cumsum(counts) - counts) * self.row_nbytes).tolist()
            return [MPI.buffer(self.comm.host_view(stage)), (counts.tolist(), displs), [row] * n]
        return [MPI.buffer(table), ([int(c > 0) for c in counts.tolist()], [0] * n), self._indexed(row, rows, counts)]

    def _indexed(self, row, rows, counts):
        types, off = [], 0
        for c in counts.tolist():
            if c:
                t = row.Create_indexed_block(1, rows[off:off + c].tolist()).Commit()
                self._types.append(t)
                types.append(t)
            else:
                types.append(row)
            off += c
        return types

    def run(self):
        self.comm.c.Alltoallw(*self._args)

    def unpack(self):
        for t in self._types:
            t.Free()
        self._types = []


class MpiPackedRowsExchange(RowsExchange):
    """Rows packed with numpy into one contiguous buffer, moved by one MPI_Alltoallv of
    bytes (counts and displacements per peer), unpacked with numpy."""

    method = "numpy pack into one contiguous buffer, MPI_Alltoallv of bytes, numpy unpack"


class MpiComm(Comm):
    backend = "mpi"

    def __init__(self, comm, device: str):
        from mpi4py import MPI

        super().__init__(comm.Get_rank(), comm.Get_size())
        self.MPI = MPI
        self.c = comm
        self.device = device
        if device == "cuda":
            import cupy

            self.xp = cupy
            self.timing_method = "cuda_event"
        else:
            self.xp = None

    # --- memory -----------------------------------------------------------------
    def alloc(self, count, dtype):
        if dtype not in _NP_DTYPES:
            raise UsageError(f"dtype {dtype} is not supported by backend mpi")
        if self.xp is not None:
            return self.xp.empty(count, dtype=_NP_DTYPES[dtype])
        return aligned_empty(count, _NP_DTYPES[dtype])

    def fill(self, buf, values):
        if self.xp is not None:
            buf[...] = self.xp.asarray(values, dtype=buf.dtype)
        else:
            buf[...] = values

    def to_numpy(self, buf):
        out = buf.get() if self.xp is not None else np.array(buf)
        return out.astype(np.float64)

    def host_view(self, buf):
        if self.xp is not None:
            raise UsageError("host_view needs CPU buffers")
        return buf

    def _spec(self, buf, count=None):
        """A pre-built buffer spec: mpi4py then skips re-deriving the datatype and
        re-wrapping the buffer on every call (about 0.15 us of an 8 B all_reduce)."""
        mpitype = self.MPI._typedict[buf.dtype.char]
        data = buf if self.xp is not None else self.MPI.buffer(buf)
        return [data, buf.size if count is None else count, mpitype]

    def _vspec(self, buf, counts):
        counts = np.asarray(counts, dtype=np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        data = buf if self.xp is not None else self.MPI.buffer(buf)
        return [data, (counts.tolist(), displs.tolist()), self.MPI._typedict[buf.dtype.char]]

    def _wrap(self, op):
        if self.xp is None:
            return op
        stream = self.xp.cuda.get_current_stream()

        def synced():
            op()
            stream.synchronize()
        return synced

    # --- prepared operations ----------------------------------------------------
    def _compiled(self, op, kind, send, recv, scount, rcount, mpi_op=None, arg=0):
        """CPU buffers: give the prepared call a compiled timing loop (mpi_timeloop), which
        Comm.time_ops runs in place of its Python loop -- the same per-iteration samples
        without the interpreter's ~0.4 us per call. cupy buffers keep the Python path."""
        if self.xp is not None:
            return op

        return mpi_timeloop.attach(op, self.MPI, self.c, kind, send, recv, scount, rcount, mpi_op, arg)

    def all_reduce(self, send, recv, in_place=False):
        if in_place:  # MPI_IN_PLACE: the Python loop times it (the compiled loop takes two buffers)
            return self._wrap(functools.partial(self.c.Allreduce, self.MPI.IN_PLACE, self._spec(recv), self.MPI.SUM))
        return self._compiled(
            self._wrap(functools.partial(self.c.Allreduce, self._spec(send), self._spec(recv), self.MPI.SUM)),
            "allreduce", send, recv, send.size, recv.size, self.MPI.SUM)

    def reduce_scatter(self, send, recv):
        return self._compiled(self._wrap(functools.partial(self.c.Reduce_scatter_block, self._spec(send, recv.size),
                                                           self._spec(recv), self.MPI.SUM)),
                              "reduce_scatter_block", send, recv, recv.size, recv.size, self.MPI.SUM)

    def all_gather(self, send, recv):
        return self._compiled(
            self._wrap(functools.partial(self.c.Allgather, self._spec(send), self._spec(recv, send.size))),
            "allgather", send, recv, send.size, send.size)

    def all_to_all(self, send, recv, send_counts=None, recv_counts=None):
        if send_counts is None and recv_counts is None:
            chunk = send.size // self.size
            return self._compiled(
                self._wrap(functools.partial(self.c.Alltoall, self._spec(send, chunk), self._spec(recv, chunk))),
                "alltoall", send, recv, chunk, chunk)
        return self._wrap(functools.partial(self.c.Alltoallv, self._vspec(send, send_counts),
                                            self._vspec(recv, recv_counts)))

    def broadcast(self, buf, root):
        return self._compiled(self._wrap(functools.partial(self.c.Bcast, self._spec(buf), root)),
                              "bcast", buf, None, buf.size, buf.size, arg=root)

    def send_recv(self, send, recv, peer):
        return self._compiled(self._wrap(functools.partial(self.c.Sendrecv, self._spec(send), peer, 0,
                                                           self._spec(recv), peer, 0)),
                              "sendrecv", send, recv, send.size, recv.size, arg=peer)

    def barrier_op(self):
        return self.c.Barrier

    def iall_reduce(self, send, recv):
        req = self.c.Iallreduce(self._spec(send), self._spec(recv), self.MPI.SUM)
        return Handle(req.Wait, req.Test)

    def rows_all_to_all(self, row_nbytes, src, send_rows, send_counts, dst, recv_counts, recv_rows,
                        stage_send, stage_recv, packed: bool = False):
        # packed: numpy gathers the rows into one contiguous buffer, one plain MPI_Alltoallv
        # of bytes moves it, numpy scatters the arrivals (the moe dispatcher mpi-alltoallv).
        cls = MpiPackedRowsExchange if packed else RowsExchange if self.xp is not None else MpiRowsExchange
        return cls(self, row_nbytes, src, send_rows, send_counts, dst, recv_counts, recv_rows, stage_send, stage_recv)

    # --- control ----------------------------------------------------------------
    def sync(self):
        if self.xp is not None:
            self.xp.cuda.get_current_stream().synchronize()

    def idle_barrier(self):
        import time

        req = self.c.Ibarrier()
        while not req.Test():
            time.sleep(0.0005)

    def max_over_ranks(self, values):
        out = np.array(values, dtype=np.float64)
        self.c.Allreduce(self.MPI.IN_PLACE, out, self.MPI.MAX)
        return out

    def allgather_obj(self, obj):
        return self.c.allgather(obj)

    def time_ops(self, op, iters, barrier_each=False, per_op_events=False):
        """CPU: the host clock (Comm.time_ops). cupy buffers: cupy CUDA events recorded on
        the current stream around each call (commbench.backends.timing.time_with_events). The MPI
        call blocks the host, and a CUDA-aware MPI moves device data on its own streams
        before returning; the end event is enqueued only after the call (and the stream
        synchronize each prepared op ends with) returns. So a sample spans, on the GPU's
        clock, the whole blocking call plus the current-stream work it orders -- the
        call's wall time, launch and host overhead included, not a device-only time: a
        blocking MPI call cannot be enqueued behind a stream hold (timing.time_held)."""
        if self.xp is None:
            return super().time_ops(op, iters, barrier_each)

        cuda = self.xp.cuda
        return time_with_events(op, iters, cuda.Event, cuda.get_current_stream().synchronize,
                                between=self.c.Barrier if barrier_each else None, elapsed=cuda.get_elapsed_time)

    def time_steps(self, step, iters, nlaps, barrier_each=False, hold=False):
        """cupy buffers: the laps as cupy events on the current stream (time_ops' caveat:
        the blocking MPI calls' host time is inside them, and no hold can cover them)."""
        if self.xp is None:
            return super().time_steps(step, iters, nlaps, barrier_each)

        cuda = self.xp.cuda
        return time_steps_with_events(step, iters, nlaps, cuda.Event, cuda.get_current_stream().synchronize,
                                      between=self.c.Barrier if barrier_each else None,
                                      elapsed=cuda.get_elapsed_time)


class MpiBackend:
    def __init__(self, name: str, device: str | None):
        self.name = name
        self.device = device or "cpu"
        if self.device not in ("cpu", "cuda"):
            raise UsageError(f"backend mpi: unknown device {self.device!r} (cpu or cuda)")

    def init(self, launch) -> MpiComm:
        if launch.launcher == "none" and launch.world == 1:
            # A singleton (no mpirun): Open MPI's shared-memory transport would leave its
            # 16 MiB /dev/shm/sm_segment.* behind (the launcher that would remove it is absent),
            # and one process talks only to itself.
            os.environ.setdefault("OMPI_MCA_btl", "self")
        from mpi4py import MPI

        if self.device == "cuda":
            try:
                import cupy
            except ImportError:
                raise UsageError("backend mpi with device cuda needs cupy (pip install cupy-cuda12x)") from None
            cupy.cuda.Device(launch.local_rank % cupy.cuda.runtime.getDeviceCount()).use()
        self.world = MpiComm(MPI.COMM_WORLD, self.device)
        return self.world

    def split(self, n: int) -> MpiComm | None:
        """Sub-communicator of ranks 0..n-1 (collective over the world); None outside it."""
        MPI = self.world.MPI
        if n == self.world.size:
            return self.world
        color = 0 if self.world.rank < n else MPI.UNDEFINED
        sub = self.world.c.Split(color, self.world.rank)
        return None if sub == MPI.COMM_NULL else MpiComm(sub, self.device)

    def versions(self) -> dict:
        import mpi4py
        from mpi4py import MPI

        # Some libraries end the string with its C terminator.
        return {"mpi4py": mpi4py.__version__,
                "mpi_library": MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()}

    def gpu_names(self) -> list[str]:
        if self.device != "cuda":
            return []
        import cupy

        return [cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()]

    def finalize(self) -> None:
        """MPI_Finalize now, while the watchdog still watches, rather than at interpreter exit:
        it waits for the other ranks, and a rank lost there would hang the job unseen."""
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
