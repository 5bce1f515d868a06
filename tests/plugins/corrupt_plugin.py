"""A benchmark that corrupts one element on rank 1 after the operation: the check must
catch it and the run must fail."""
from commbench.benchmarks.base import register
from commbench.benchmarks.collectives import AllReduce


@register
class CorruptAllReduce(AllReduce):
    name = "all_reduce_corrupt"

    def op(self, comm, b):
        inner = super().op(comm, b)

        def run():
            inner()
            if comm.rank == 1:
                comm.fill(b.recv[:1], [12345.0])
        return run
