"""all_reduce with an injected fault, for the reliability tests. COMMBENCH_FAULT=KIND:RANK:NBYTES
makes RANK misbehave at the point of that size:
  hang_setup  sleeps in setup (the others wait for it in the next collective)
  hang_op     sleeps inside the timed operation
  kill        SIGKILLs itself in setup (a lost rank)
  raise       raises a Python exception in setup (a plug-in bug on one rank)
  stop_op     SIGSTOPs itself inside the timed operation (a frozen rank at the others' step)
COMMBENCH_SLOW_SETUP_S=S makes every rank spend S seconds in each point's setup (a sweep whose
length is known, without a fault).
"""
import os
import signal
import time

from commbench.benchmarks.base import register
from commbench.benchmarks.collectives import AllReduce


def _fault(comm, point):
    spec = os.environ.get("COMMBENCH_FAULT", "")
    if not spec:
        return None
    kind, rank, nbytes = spec.split(":")
    return kind if comm.rank == int(rank) and point.nbytes == int(nbytes) else None


@register
class FaultAllReduce(AllReduce):
    name = "all_reduce_fault"

    def setup(self, comm, point):
        time.sleep(float(os.environ.get("COMMBENCH_SLOW_SETUP_S") or 0))
        kind = _fault(comm, point)
        if kind == "hang_setup":
            time.sleep(3600)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "raise":
            raise ValueError("injected fault on this rank")
        b = super().setup(comm, point)
        b.fault = kind
        return b

    def op(self, comm, b):
        inner = super().op(comm, b)
        if b.fault not in ("hang_op", "stop_op"):
            return inner

        def run():
            if b.fault == "stop_op":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)
        return run
