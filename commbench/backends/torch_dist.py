"""torch.distributed backend: gloo on CPU, nccl on CUDA."""
from __future__ import annotations

import functools
import os
from datetime import timedelta

import numpy as np

from ..errors import UsageError
from .base import Comm, Handle


class TorchComm(Comm):
    def __init__(self, group, rank, size, backend: str, device: str):
        import torch
        import torch.distributed as dist

        super().__init__(rank, size)
        self.torch = torch
        self.dist = dist
        self.group = group
        self.backend = backend
        self.device = device
        self.tdev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        self.timing_method = "cuda_event" if device == "cuda" else "host_clock"
        self._dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                        "int32": torch.int32, "float64": torch.float64, "uint8": torch.uint8}
        # all_gather_single replaces all_gather_into_tensor in newer torch.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    # --- memory -----------------------------------------------------------------
    def alloc(self, count, dtype):
        return self.torch.empty(count, dtype=self._dtypes[dtype], device=self.tdev)

    def fill(self, buf, values):
        buf.copy_(self.torch.from_numpy(np.ascontiguousarray(values)).to(buf.dtype))

    def to_numpy(self, buf):
        return buf.detach().to("cpu", self.torch.float64).numpy()

    def host_view(self, buf):
        if self.device != "cpu":
            raise UsageError("host_view needs CPU buffers")
        return buf.numpy()

    # --- prepared operations ----------------------------------------------------
    def all_reduce(self, send, recv):
        # torch has no out-of-place all_reduce: reduce recv in place (benchmarks fill it
        # with the input), as nccl-tests' in-place column does.
        return functools.partial(self.dist.all_reduce, recv, group=self.group)

    def reduce_scatter(self, send, recv):
        return functools.partial(self._reduce_scatter, recv, send, group=self.group)

    def all_gather(self, send, recv):
        return functools.partial(self._all_gather, recv, send, group=self.group)

    def all_to_all(self, send, recv, send_counts=None, recv_counts=None):
        return functools.partial(self.dist.all_to_all_single, recv, send,
                                 None if recv_counts is None else [int(c) for c in recv_counts],
                                 None if send_counts is None else [int(c) for c in send_counts],
                                 group=self.group)

    def broadcast(self, buf, root):
        # Sub-groups are always ranks 0..n-1, so group rank == global rank.
        return functools.partial(self.dist.broadcast, buf, root, group=self.group)

    def send_recv(self, send, recv, peer):
        dist = self.dist
        ops = [dist.P2POp(dist.isend, send, peer, self.group), dist.P2POp(dist.irecv, recv, peer, self.group)]

        def run():
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return run

    def barrier_op(self):
        return functools.partial(self.dist.barrier, group=self.group)

    def iall_reduce(self, send, recv):
        work = self.dist.all_reduce(recv, group=self.group, async_op=True)
        return Handle(work.wait, work.is_completed)

    def iall_to_all(self, send, recv, send_counts=None, recv_counts=None):
        work = self.dist.all_to_all_single(recv, send,
                                           None if recv_counts is None else [int(c) for c in recv_counts],
                                           None if send_counts is None else [int(c) for c in send_counts],
                                           group=self.group, async_op=True)
        return Handle(work.wait, work.is_completed)

    # --- control ----------------------------------------------------------------
    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def max_over_ranks(self, values):
        t = self.torch.tensor(np.asarray(values, dtype=np.float64), device=self.tdev)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        return t.cpu().numpy()

    def allgather_obj(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def time_ops(self, op, iters, barrier_each=False, cuda_graph=False):
        if self.device != "cuda":
            return super().time_ops(op, iters, barrier_each)
        # CUDA events around each operation on the current stream: host clocks would time
        # the launch, not the collective.
        ev = self.torch.cuda.Event
        starts = [ev(enable_timing=True) for _ in range(iters)]
        ends = [ev(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            op()
            ends[i].record()
            if barrier_each:
                self.dist.barrier(group=self.group)
        self.torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) for s, e in zip(starts, ends)], dtype=np.float64) * 1e-3


class TorchBackend:
    def __init__(self, name: str, device: str | None):
        self.name = name
        self.device = device or ("cuda" if name == "nccl" else "cpu")
        if name == "nccl" and self.device != "cuda":
            raise UsageError("backend nccl runs on cuda only")
        if name == "gloo" and self.device != "cpu":
            raise UsageError("backend gloo runs on cpu here (use nccl for cuda)")

    def init(self, launch) -> TorchComm:
        import torch
        import torch.distributed as dist

        if self.device == "cuda":
            torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in os.environ:
                raise UsageError(f"backend {self.name} needs {key} (torchrun sets it; commbench run --np sets it)")
        kwargs = {}
        if self.device == "cuda":
            kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(self.name, rank=launch.rank, world_size=launch.world,
                                timeout=timedelta(seconds=600), **kwargs)
        self.world = TorchComm(None, launch.rank, launch.world, self.name, self.device)
        return self.world

    def split(self, n: int) -> TorchComm | None:
        """Group of ranks 0..n-1; every rank must call it (torch creates groups collectively)."""
        if n == self.world.size:
            return self.world
        group = self.world.dist.new_group(list(range(n)))
        if self.world.rank >= n:
            return None
        return TorchComm(group, self.world.rank, n, self.name, self.device)

    def versions(self) -> dict:
        import torch

        out = {"torch": torch.__version__}
        if self.device == "cuda":
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            out["cuda"] = torch.version.cuda
        return out

    def gpu_names(self) -> list[str]:
        if self.device != "cuda":
            return []
        import torch

        return [torch.cuda.get_device_name()]

    def finalize(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
