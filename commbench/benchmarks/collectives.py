"""The standard collectives. Each declares S and its busbw factor F exactly as in
README "Formulas" (nccl-tests doc/PERFORMANCE.md), and checks its result exactly."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .base import Benchmark, Point, Traffic, equal_chunked, fill_chunked, pattern_at, pattern_run, register


@dataclass
class Bufs:
    point: Point
    send: object
    recv: object
    count: int  # elements per rank-chunk as each collective defines it


def _ring(n: int) -> float:
    return (n - 1) / n


class _Collective(Benchmark):
    reduce = False  # data summed across ranks: keep it exact

    def _at(self, point, rank, offset=0):
        """values_at(lo, hi) of rank's pattern from element `offset` on (rank may be a
        function of the element index, for buffers that hold several ranks' blocks)."""
        def values_at(lo, hi):
            if not callable(rank) and not callable(offset):
                return pattern_run(lo + offset, hi - lo, rank, point.dtype, point.world, self.reduce)
            idx = np.arange(lo, hi, dtype=np.int64)
            r = rank(idx) if callable(rank) else rank
            return pattern_at(idx + (offset(idx) if callable(offset) else offset), r, point.dtype, point.world,
                              self.reduce)
        return values_at

    def _sum_at(self, point, world, offset=0):
        """values_at of the sum over every rank's pattern (what a reduction yields)."""
        parts = [self._at(point, r, offset) for r in range(world)]
        return lambda lo, hi: sum(f(lo, hi) for f in parts)

    @staticmethod
    def _const(value):
        return lambda lo, hi: np.full(hi - lo, value)


@register
class AllReduce(_Collective):
    name = "all_reduce"
    reduce = True

    def setup(self, comm, point):
        c = point.nbytes // point.elem_nbytes
        return Bufs(point, comm.alloc(c, point.dtype), comm.alloc(c, point.dtype), c)

    def fill(self, comm, b):
        # torch has no out-of-place all_reduce: its op reduces recv in place, so recv
        # starts as a copy of the input on every backend.
        fill_chunked(comm, b.send, b.count, self._at(b.point, comm.rank))
        fill_chunked(comm, b.recv, b.count, self._at(b.point, comm.rank))

    def op(self, comm, b):
        return comm.all_reduce(b.send, b.recv)

    def check(self, comm, b):
        return equal_chunked(comm, b.recv, b.count, self._sum_at(b.point, comm.size))

    def traffic(self, point):
        return Traffic(point.nbytes, 2 * _ring(point.world))


@register
class ReduceScatter(_Collective):
    name = "reduce_scatter"

    def max_count(self, point):  # one rank's block per call
        return point.nbytes // point.elem_nbytes // point.world

    def memory_nbytes(self, point):  # input S, output S/n
        return point.nbytes + point.nbytes // point.world
    reduce = True

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def setup(self, comm, point):
        k = point.nbytes // point.elem_nbytes // point.world  # S = whole input = n * output
        return Bufs(point, comm.alloc(k * point.world, point.dtype), comm.alloc(k, point.dtype), k)

    def fill(self, comm, b):
        fill_chunked(comm, b.send, b.count * comm.size, self._at(b.point, comm.rank))
        fill_chunked(comm, b.recv, b.count, self._const(-1.0))

    def op(self, comm, b):
        return comm.reduce_scatter(b.send, b.recv)

    def check(self, comm, b):
        # This rank's block of the summed input.
        return equal_chunked(comm, b.recv, b.count, self._sum_at(b.point, comm.size, offset=comm.rank * b.count))

    def traffic(self, point):
        return Traffic(point.nbytes, _ring(point.world))


@register
class AllGather(_Collective):
    name = "all_gather"

    def max_count(self, point):  # one rank's block per call
        return point.nbytes // point.elem_nbytes // point.world

    def memory_nbytes(self, point):  # input S/n, output S
        return point.nbytes + point.nbytes // point.world

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def setup(self, comm, point):
        k = point.nbytes // point.elem_nbytes // point.world  # S = whole output = n * input
        return Bufs(point, comm.alloc(k, point.dtype), comm.alloc(k * point.world, point.dtype), k)

    def fill(self, comm, b):
        fill_chunked(comm, b.send, b.count, self._at(b.point, comm.rank))
        fill_chunked(comm, b.recv, b.count * comm.size, self._const(-1.0))

    def op(self, comm, b):
        return comm.all_gather(b.send, b.recv)

    def check(self, comm, b):
        k = b.count  # block r of the output is rank r's input
        return equal_chunked(comm, b.recv, k * comm.size,
                             self._at(b.point, lambda i: i // k, offset=lambda i: -(i // k) * k))

    def traffic(self, point):
        return Traffic(point.nbytes, _ring(point.world))


@register
class AllToAll(_Collective):
    name = "all_to_all"

    def max_count(self, point):  # the per-peer chunk, and the whole buffer's offsets below 2^31 too
        return point.nbytes // point.elem_nbytes

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def setup(self, comm, point):
        k = point.nbytes // point.elem_nbytes // point.world  # S = bytes a rank sends = n * chunk
        n = point.world
        return Bufs(point, comm.alloc(k * n, point.dtype), comm.alloc(k * n, point.dtype), k)

    def fill(self, comm, b):
        fill_chunked(comm, b.send, b.count * comm.size, self._at(b.point, comm.rank))
        fill_chunked(comm, b.recv, b.count * comm.size, self._const(-1.0))

    def op(self, comm, b):
        return comm.all_to_all(b.send, b.recv)

    def check(self, comm, b):
        k, me = b.count, comm.rank  # block src of the output is block `me` of src's input
        return equal_chunked(comm, b.recv, k * comm.size,
                             self._at(b.point, lambda i: i // k, offset=lambda i: me * k - (i // k) * k))

    def traffic(self, point):
        return Traffic(point.nbytes, _ring(point.world))


@register
class Broadcast(_Collective):
    name = "broadcast"
    root = 0

    def memory_nbytes(self, point):  # one buffer
        return point.nbytes

    def setup(self, comm, point):
        c = point.nbytes // point.elem_nbytes
        return Bufs(point, None, comm.alloc(c, point.dtype), c)

    def fill(self, comm, b):
        # Non-roots start with a value the root never sends, so a missed copy shows.
        fill_chunked(comm, b.recv, b.count,
                     self._at(b.point, self.root) if comm.rank == self.root else self._const(-1.0))

    def op(self, comm, b):
        return comm.broadcast(b.recv, self.root)

    def check(self, comm, b):
        return equal_chunked(comm, b.recv, b.count, self._at(b.point, self.root))

    def traffic(self, point):
        return Traffic(point.nbytes, 1.0)


@register
class SendRecv(_Collective):
    """Ranks in pairs (0<->1, 2<->3, ...), each sending S bytes to its peer while receiving
    S from it, like osu_bibw's pairs; busbw factor 1 per direction."""

    name = "send_recv"
    min_world = 2
    even_world = True

    def validate(self, point):
        if point.world % 2:
            raise UsageError(f"send_recv pairs ranks, so it needs an even world, got {point.world}")

    def setup(self, comm, point):
        c = point.nbytes // point.elem_nbytes
        return Bufs(point, comm.alloc(c, point.dtype), comm.alloc(c, point.dtype), c)

    def fill(self, comm, b):
        fill_chunked(comm, b.send, b.count, self._at(b.point, comm.rank))
        fill_chunked(comm, b.recv, b.count, self._const(-1.0))

    def op(self, comm, b):
        return comm.send_recv(b.send, b.recv, comm.rank ^ 1)

    def check(self, comm, b):
        return equal_chunked(comm, b.recv, b.count, self._at(b.point, comm.rank ^ 1))

    def traffic(self, point):
        return Traffic(point.nbytes, 1.0)


@register
class Barrier(Benchmark):
    """Synchronisation latency only: no data, so nothing to check (check = skipped)."""

    name = "barrier"
    sized = False
    checks = False

    def setup(self, comm, point):
        return None

    def op(self, comm, b):
        return comm.barrier_op()

    def traffic(self, point):
        return Traffic(0, 0.0)
