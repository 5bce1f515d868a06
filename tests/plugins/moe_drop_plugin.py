"""MoE variants whose dispatch loses or misroutes a row on rank 1: the check must fail."""
from commbench.benchmarks.base import register
from commbench.benchmarks.moe import MoE


@register
class MoEDropRow(MoE):
    name = "moe_drop_row"

    def dispatch(self, comm, b, *lap):
        per = super().dispatch(comm, b, *lap)
        if comm.rank == 1:
            comm.host_view(b.recv_d).reshape(-1, b.rb_d)[0] = 0  # a row that never arrived
        return per


@register
class MoEMisroute(MoE):
    name = "moe_misroute"

    def dispatch(self, comm, b, *lap):
        per = super().dispatch(comm, b, *lap)
        if comm.rank == 1:
            rows = comm.host_view(b.recv_d).reshape(-1, b.rb_d)
            rows[[0, -1]] = rows[[-1, 0]]  # two rows swapped: right bytes, wrong places
        return per
