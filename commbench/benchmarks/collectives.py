"""The standard collectives. Each declares S and its busbw factor F exactly as in
docs/collectives.md#algbw-and-busbw (nccl-tests doc/PERFORMANCE.md), and checks its result exactly."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commbench.core.errors import UsageError

from .base import Benchmark, Point, domain_sizes, equal_chunked, fill_chunked, pattern_at, pattern_run, register


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

    def placement(self, comm, point):
        return "out-of-place"  # a send and a receive buffer (in place: all_reduce only)

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


class _Blocked(_Collective):
    """S splits into one block per rank (reduce_scatter, all_gather, all_to_all): a size
    must be a multiple of n elements, and the ring's (n-1)/n of S crosses the links."""

    def unit_nbytes(self, world, elem_nbytes, params):
        return world * elem_nbytes

    def max_count(self, point):  # one rank's block per call
        return point.nbytes // point.elem_nbytes // point.world

    def memory_nbytes(self, point):  # S on one side, S/n on the other
        return point.nbytes + point.nbytes // point.world

    def busbw_factor(self, world):
        return _ring(world)


@register
class AllReduce(_Collective):
    name = "all_reduce"
    formula = "busbw = algbw x 2(n-1)/n"
    reduce = True
    placement_axis = True  # MPI_IN_PLACE, or a send and a receive buffer

    def setup(self, comm, point):
        c = point.nbytes // point.elem_nbytes
        return Bufs(point, comm.alloc(c, point.dtype), comm.alloc(c, point.dtype), c)

    def placement(self, comm, point):
        """Out of place where the backend can (MPI; NCCL through cupy), unless the run asks
        for the in-place column; torch.distributed's all_reduce works in place only."""
        if point.in_place or comm.in_place or not comm.out_of_place_all_reduce(point.dtype):
            return "in-place"
        return "out-of-place"

    def fill(self, comm, b):
        # In place, recv holds the input; out of place, a value the sum never takes, so a
        # reduction that missed recv shows in the check.
        fill_chunked(comm, b.send, b.count, self._at(b.point, comm.rank))
        in_place = self.placement(comm, b.point) == "in-place"
        fill_chunked(comm, b.recv, b.count, self._at(b.point, comm.rank) if in_place else self._const(-1.0))

    def op(self, comm, b):
        return comm.all_reduce(b.send, b.recv, in_place=self.placement(comm, b.point) == "in-place")

    def check(self, comm, b):
        return equal_chunked(comm, b.recv, b.count, self._sum_at(b.point, comm.size))

    def busbw_factor(self, world):
        return 2 * _ring(world)


@register
class ReduceScatter(_Blocked):
    name = "reduce_scatter"
    formula = "S = whole input; busbw = algbw x (n-1)/n"
    reduce = True

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


@register
class AllGather(_Blocked):
    name = "all_gather"
    formula = "S = whole output; busbw = algbw x (n-1)/n"

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


@register
class AllToAll(_Blocked):
    name = "all_to_all"
    formula = "S = bytes a rank sends; busbw = algbw x (n-1)/n"

    def max_count(self, point):  # the per-peer chunk, and the whole buffer's offsets below 2^31 too
        return point.nbytes // point.elem_nbytes

    def memory_nbytes(self, point):  # send and receive, S each
        return 2 * point.nbytes

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

    # ceiling hooks
    def tier_nbytes(self, row, world, domains, inswitch):
        # Within one domain (or in-switch) the ring-like S x F holds. Across domains, S =
        # bytes a rank sends: (P-G)/P of it leaves the domain, (G-1)/P stays on scale-up.
        g_min, g_max = domain_sizes(domains)
        if inswitch or g_min == len(domains):
            return super().tier_nbytes(row, world, domains, inswitch)
        nbytes = float(row.get("nbytes") or 0)
        return nbytes * (g_max - 1) / world, nbytes * (world - g_min) / world


@register
class Broadcast(_Collective):
    name = "broadcast"
    formula = "busbw = algbw"
    root = 0

    def placement(self, comm, point):
        return "in-place"  # one buffer: the root's is sent, the others' received into

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

    def busbw_factor(self, world):
        return 1.0


@register
class SendRecv(_Collective):
    """Ranks in pairs (0<->1, 2<->3, ...), each sending S bytes to its peer while receiving
    S from it, like osu_bibw's pairs; busbw factor 1 per direction."""

    name = "send_recv"
    formula = "S per direction; busbw = algbw"
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

    def busbw_factor(self, world):
        return 1.0

    # ceiling hooks: point-to-point, so nothing reduces in a switch, and each pair's link
    # carries the whole busbw, whichever tier it is on.
    inswitch_applies = False

    def tier_nbytes(self, row, world, domains, inswitch):
        # Pairs 0<->1, 2<->3, ...: a pair split across domains goes through the NIC.
        nbytes = float(row.get("nbytes") or 0)
        pairs = [(domains[r], domains[r ^ 1]) for r in range(0, world - 1, 2)]
        return (nbytes if any(a == b for a, b in pairs) else 0.0,
                nbytes if any(a != b for a, b in pairs) else 0.0)

    def busbw_is_link_rate(self, scaleup_nbytes, scaleout_nbytes):
        return True


@register
class Barrier(Benchmark):
    """Synchronisation latency only: no data, so nothing to check (check = skipped)."""

    name = "barrier"
    formula = "latency only"
    sized = False
    checks = False

    def setup(self, comm, point):
        return None

    def op(self, comm, b):
        return comm.barrier_op()

    def busbw_factor(self, world):
        return 0.0

    # ceiling hooks: no data, so the ceiling is the latency floor alone.
    inswitch_applies = False

    def latency_only(self, row):
        return True
