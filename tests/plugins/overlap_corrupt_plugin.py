"""An overlap benchmark that corrupts one element of the last bucket on rank 1 after the
overlapped run: the check must catch it and the run must fail."""
from commbench.benchmarks.base import register
from commbench.benchmarks.overlap import Overlap


@register
class CorruptOverlap(Overlap):
    name = "overlap_corrupt"

    def op(self, comm, b):
        inner = super().op(comm, b)

        def run():
            out = inner()
            if comm.rank == 1:
                comm.fill(b.recvs[-1][:1], [12345.0])
            return out
        return run
