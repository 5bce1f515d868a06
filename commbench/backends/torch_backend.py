"""torch.distributed's start and end for the gloo and nccl backends: the bounded
rendezvous, the process group, the communicator it hands out (torch_dist.TorchComm),
and what this build of torch offers (symmetric memory)."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import timedelta

from commbench.backends.gpuhold import hold_cap_s
from commbench.backends.rendezvous import agent_store, check_port_free, connect_within, parse_port, prepare_rendezvous
from commbench.backends.torch_dist import TorchComm
from commbench.core.errors import UsageError


@contextlib.contextmanager
def _stderr_held():
    """The C++ library's retry warnings and stack frames while it waits for the other ranks
    go to a file, not the terminal: passed on when the rendezvous succeeds, dropped when it
    fails (its cause is one line then; COMMBENCH_DEBUG shows them: held.data)."""
    import tempfile
    from types import SimpleNamespace

    held = SimpleNamespace(data=b"")
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield held
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            held.data = f.read()
    if held.data:  # reached only when the body succeeded
        os.write(2, held.data)


# The rendezvous bound when no run's --timeout is given (the suite's default timeout_s), and
# the library's own limit on one operation (the watchdog, armed per phase, ends a hang first).
RENDEZVOUS_DEFAULT_S = 300.0


OP_TIMEOUT_S = 600.0


class TorchBackend:
    def __init__(self, name: str, device: str | None):
        self.name = name
        # How long start-up may wait for the other ranks (the run's --timeout; runner.start).
        self.rendezvous_s = RENDEZVOUS_DEFAULT_S
        self.device = device or ("cuda" if name == "nccl" else "cpu")
        if name == "nccl" and self.device != "cuda":
            raise UsageError("backend nccl runs on cuda only")
        if name == "gloo" and self.device != "cpu":
            raise UsageError("backend gloo runs on cpu here (use nccl for cuda)")

    def init(self, launch) -> TorchComm:
        import torch
        import torch.distributed as dist

        if self.device == "cuda":
            hold_cap_s()  # a bad COMMBENCH_HOLD_CAP_S is refused before any rank connects
            torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in os.environ:
                raise UsageError(f"backend {self.name} needs {key} (torchrun sets it; commbench run --np sets it)")
        addr, port = os.environ["MASTER_ADDR"], parse_port(os.environ["MASTER_PORT"], "MASTER_PORT")
        if launch.world > 1:
            prepare_rendezvous(addr, str(port))
        if launch.rank == 0 and not agent_store():
            check_port_free(port, "MASTER_PORT")
        kwargs = {}
        if self.device == "cuda":
            kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
        # The rendezvous waits for every rank at most the run's --timeout (torch's own default
        # is 10 minutes, before the watchdog is armed); the operations then get OP_TIMEOUT_S.
        bound_s = self.rendezvous_s
        if launch.rank > 0 and not agent_store():
            # torch's client retries with a back-off that can run to twice the bound: wait
            # for rank 0's store here, within it, and give torch what is left.
            t0 = time.monotonic()
            connect_within(addr, port, t0 + bound_s, bound_s, "the rendezvous (MASTER_ADDR:MASTER_PORT)").close()
            bound_s = max(1.0, bound_s - (time.monotonic() - t0))
        try:
            with _stderr_held() as held:
                dist.init_process_group(self.name, rank=launch.rank, world_size=launch.world,
                                        timeout=timedelta(seconds=bound_s), **kwargs)
        except (dist.DistError, RuntimeError, ValueError) as e:
            if os.environ.get("COMMBENCH_DEBUG"):
                os.write(2, held.data)
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise UsageError(f"backend {self.name}: rank {launch.rank} of {launch.world}: the process group at "
                             f"{addr}:{port} (MASTER_ADDR:MASTER_PORT) did not start (start-up waits at most "
                             f"{self.rendezvous_s:g} s, --timeout): {first[:300]}") from e
        try:
            from torch.distributed.distributed_c10d import _set_pg_timeout
        except ImportError:  # an older torch: its operations keep the rendezvous bound
            _set_pg_timeout = None
        if _set_pg_timeout is not None:
            _set_pg_timeout(timedelta(seconds=OP_TIMEOUT_S))
        # The ranks meet on the host before releasing a held stream (TorchComm._meet).
        host = dist.new_group(backend="gloo") if self.device == "cuda" and launch.world > 1 else None
        self.world = TorchComm(None, launch.rank, launch.world, self.name, self.device, host_group=host)
        return self.world

    def split(self, n: int) -> TorchComm | None:
        """Group of ranks 0..n-1; every rank must call it (torch creates groups collectively)."""
        if n == self.world.size:
            return self.world
        group = self.world.dist.new_group(list(range(n)))
        host = self.world.dist.new_group(list(range(n)), backend="gloo") if self.device == "cuda" else None
        if self.world.rank >= n:
            return None
        return TorchComm(group, self.world.rank, n, self.name, self.device, host_group=host)

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


def symm_mem_support() -> str | None:
    """Why the symm-mem variant cannot run here, or None when it can: it needs CUDA, torch's
    symmetric memory with the multimem all_reduce op, and a GPU whose fabric supports
    multicast (NVSwitch with NVLink SHARP)."""
    try:
        import torch
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        return f"torch has no symmetric memory ({e})"
    if not torch.cuda.is_available():
        return "needs CUDA GPUs"
    if not all(hasattr(symm_mem, f) for f in ("empty", "rendezvous")) or not hasattr(torch.ops.symm_mem,
                                                                                   "multimem_all_reduce_"):
        return f"torch {torch.__version__} lacks symm_mem.empty/rendezvous or multimem_all_reduce_"
    try:
        from torch._C._distributed_c10d import _SymmetricMemory

        if not _SymmetricMemory.has_multicast_support(torch._C._autograd.DeviceType.CUDA, 0):
            return "this GPU's fabric has no multicast (NVLink SHARP) support"
    except (ImportError, AttributeError, RuntimeError) as e:
        return f"cannot ask torch about multicast support ({e})"
    return None
