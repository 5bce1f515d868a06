"""The standard collectives. Each declares S and its busbw factor F exactly as in
README "Formulas" (nccl-tests doc/PERFORMANCE.md), and checks its result exactly."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .base import Benchmark, Point, Traffic, pattern, register


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

    def _pat(self, point, count, rank, salt=0):
        return pattern(count, rank, point.dtype, point.world, self.reduce, salt)


@register
class AllReduce(_Collective):
    name = "all_reduce"
    reduce = True

    def setup(self, comm, point):
        c = point.nbytes // point.elem_nbytes
        return Bufs(point, comm.alloc(c, point.dtype), comm.alloc(c, point.dtype), c)

    def fill(self, comm, b):
        data = self._pat(b.point, b.count, comm.rank)
        # torch has no out-of-place all_reduce: its op reduces recv in place, so recv
        # starts as a copy of the input on every backend.
        comm.fill(b.send, data)
        comm.fill(b.recv, data)

    def op(self, comm, b):
        return comm.all_reduce(b.send, b.recv)

    def check(self, comm, b):
        want = sum(self._pat(b.point, b.count, r) for r in range(comm.size))
        return np.array_equal(comm.to_numpy(b.recv), want)

    def traffic(self, point):
        return Traffic(point.nbytes, 2 * _ring(point.world))


@register
class ReduceScatter(_Collective):
    name = "reduce_scatter"
    reduce = True

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def setup(self, comm, point):
        k = point.nbytes // point.elem_nbytes // point.world  # S = whole input = n * output
        return Bufs(point, comm.alloc(k * point.world, point.dtype), comm.alloc(k, point.dtype), k)

    def fill(self, comm, b):
        comm.fill(b.send, self._pat(b.point, b.count * comm.size, comm.rank))
        comm.fill(b.recv, np.full(b.count, -1.0))

    def op(self, comm, b):
        return comm.reduce_scatter(b.send, b.recv)

    def check(self, comm, b):
        k, n = b.count, comm.size
        want = sum(self._pat(b.point, k * n, r) for r in range(n))[comm.rank * k:(comm.rank + 1) * k]
        return np.array_equal(comm.to_numpy(b.recv), want)

    def traffic(self, point):
        return Traffic(point.nbytes, _ring(point.world))


@register
class AllGather(_Collective):
    name = "all_gather"

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def setup(self, comm, point):
        k = point.nbytes // point.elem_nbytes // point.world  # S = whole output = n * input
        return Bufs(point, comm.alloc(k, point.dtype), comm.alloc(k * point.world, point.dtype), k)

    def fill(self, comm, b):
        comm.fill(b.send, self._pat(b.point, b.count, comm.rank))
        comm.fill(b.recv, np.full(b.count * comm.size, -1.0))

    def op(self, comm, b):
        return comm.all_gather(b.send, b.recv)

    def check(self, comm, b):
        want = np.concatenate([self._pat(b.point, b.count, r) for r in range(comm.size)])
        return np.array_equal(comm.to_numpy(b.recv), want)

    def traffic(self, point):
        return Traffic(point.nbytes, _ring(point.world))


@register
class AllToAll(_Collective):
    name = "all_to_all"

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def setup(self, comm, point):
        k = point.nbytes // point.elem_nbytes // point.world  # S = bytes a rank sends = n * chunk
        n = point.world
        return Bufs(point, comm.alloc(k * n, point.dtype), comm.alloc(k * n, point.dtype), k)

    def fill(self, comm, b):
        comm.fill(b.send, self._pat(b.point, b.count * comm.size, comm.rank))
        comm.fill(b.recv, np.full(b.count * comm.size, -1.0))

    def op(self, comm, b):
        return comm.all_to_all(b.send, b.recv)

    def check(self, comm, b):
        k, n, me = b.count, comm.size, comm.rank
        want = np.concatenate([self._pat(b.point, k * n, src)[me * k:(me + 1) * k] for src in range(n)])
        return np.array_equal(comm.to_numpy(b.recv), want)

    def traffic(self, point):
        return Traffic(point.nbytes, _ring(point.world))


@register
class Broadcast(_Collective):
    name = "broadcast"
    root = 0

    def setup(self, comm, point):
        c = point.nbytes // point.elem_nbytes
        return Bufs(point, None, comm.alloc(c, point.dtype), c)

    def fill(self, comm, b):
        # Non-roots start with a value the root never sends, so a missed copy shows.
        data = self._pat(b.point, b.count, self.root) if comm.rank == self.root else np.full(b.count, -1.0)
        comm.fill(b.recv, data)

    def op(self, comm, b):
        return comm.broadcast(b.recv, self.root)

    def check(self, comm, b):
        return np.array_equal(comm.to_numpy(b.recv), self._pat(b.point, b.count, self.root))

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
        comm.fill(b.send, self._pat(b.point, b.count, comm.rank))
        comm.fill(b.recv, np.full(b.count, -1.0))

    def op(self, comm, b):
        return comm.send_recv(b.send, b.recv, comm.rank ^ 1)

    def check(self, comm, b):
        return np.array_equal(comm.to_numpy(b.recv), self._pat(b.point, b.count, comm.rank ^ 1))

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
