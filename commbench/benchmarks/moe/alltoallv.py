"""The moe dispatcher mpi-alltoallv: the host path's stages (layout, counts, pack, a2a,
unpack; combine pack, a2a, reduce), with the rows packed by numpy into one contiguous
send buffer and moved by one plain MPI_Alltoallv of bytes (counts and displacements per
peer), then unpacked by numpy. Beside mpi-alltoallw (the host path, whose derived
datatypes let the library copy each row straight from its place), it shows what the
staging copies cost."""
from __future__ import annotations

from .host import HostPath, _no_lap


class _Packed:
    """The comm, except that its row exchanges pack into a contiguous buffer."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def rows_all_to_all(self, *args):
        return self._comm.rows_all_to_all(*args, packed=True)


class AlltoallvPath(HostPath):
    name = "host"

    def dispatch(self, comm, b, lap=_no_lap) -> None:
        super().dispatch(_Packed(comm), b, lap)

    def combine(self, comm, b, lap=_no_lap) -> None:
        super().combine(_Packed(comm), b, lap)
