"""MoE variants whose dispatch loses or misroutes a row on rank 1: the check must fail.
moe_drop_row / moe_misroute corrupt the host path (mpi), moe_torch_drop_row /
moe_torch_misroute the torch path (gloo, nccl)."""
from commbench.benchmarks.base import register
from commbench.benchmarks.moe import MoE


@register
class MoEDropRow(MoE):
    name = "moe_drop_row"

    def dispatch(self, comm, b, *lap):
        super().dispatch(comm, b, *lap)
        if comm.rank == 1:
            comm.host_view(b.recv_d).reshape(-1, b.plan.rb_d)[0] = 0  # a row that never arrived


@register
class MoEMisroute(MoE):
    name = "moe_misroute"

    def dispatch(self, comm, b, *lap):
        super().dispatch(comm, b, *lap)
        if comm.rank == 1:
            rows = comm.host_view(b.recv_d).reshape(-1, b.plan.rb_d)
            rows[[0, -1]] = rows[[-1, 0]]  # two rows swapped: right bytes, wrong places


# The torch path: the rows as the experts read them (a device tensor; grouped by expert
# for expert copies, by source for rank copies).

@register
class MoETorchDropRow(MoE):
    name = "moe_torch_drop_row"

    def dispatch(self, comm, b, *lap):
        super().dispatch(comm, b, *lap)
        if comm.rank == 1:
            b.state.received[0] = 0


@register
class MoETorchMisroute(MoE):
    name = "moe_torch_misroute"

    def dispatch(self, comm, b, *lap):
        super().dispatch(comm, b, *lap)
        if comm.rank == 1:
            rows = b.state.received
            rows[[0, -1]] = rows[[-1, 0]]
