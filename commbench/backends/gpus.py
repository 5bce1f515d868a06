"""What the GPU path needs to know before any rank starts, asked without importing torch,
cupy or mpi4py: how many GPUs this host shows, and whether the MPI library can take CUDA
buffers. A wrong answer here is a hang or a segmentation fault later (NCCL's "Duplicate GPU
detected" on two ranks sharing a GPU; a non-CUDA-aware MPI_Allreduce reading a device
pointer), so both are refused up front in one line."""
from __future__ import annotations

import os
import subprocess

from commbench.backends.gpuhold import hold_cap_s
from commbench.core.errors import UsageError
from commbench.core.whoami import detect, find_mpirun, local_ranks


def visible_gpus(proc_dir: str = "/proc/driver/nvidia/gpus") -> int:
    """GPUs a process on this host may use: CUDA_VISIBLE_DEVICES when set, else the
    driver's list."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [d for d in cvd.split(",") if d.strip()]
        # CUDA stops at the first invalid id, "-1" included.
        n = next((i for i, d in enumerate(ids) if d.strip().startswith("-")), len(ids))
        if cvd.strip() in ("", "-1") or n == 0:
            return 0
        try:
            return min(n, len(os.listdir(proc_dir)))
        except OSError:
            return n
    try:
        return len(os.listdir(proc_dir))
    except OSError:
        return 0


def check_ranks_per_gpu(local_ranks: int, gpus: int, backend: str) -> None:
    """NCCL takes one GPU per rank: more ranks on a host than it has GPUs is refused."""
    if backend == "nccl" and local_ranks > gpus:
        raise UsageError(f"backend nccl needs one GPU per rank: {local_ranks} ranks on this host, "
                         f"{gpus} visible GPU(s) (lower --np, or the ranks per node)")


def _run(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        return p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def mpi_cuda_support(bindir: str | None = None) -> tuple[bool | None, str]:
    """(True, how) / (False, how) when the MPI library says whether it takes CUDA buffers,
    (None, why) when it cannot be asked. Open MPI answers through ompi_info (the same flag
    MPIX_Query_cuda_support reads: opal_built_with_cuda_support); MPICH through its
    configure line (mpichversion) and MPIR_CVAR_ENABLE_GPU."""
    import shutil

    def tool(name):
        if bindir and os.path.exists(os.path.join(bindir, name)):
            return os.path.join(bindir, name)
        return shutil.which(name)

    ompi = tool("ompi_info")
    if ompi:
        out = _run([ompi, "--parsable", "--all"])
        for line in out.splitlines():
            if line.endswith(("built_with_cuda_support:value:true", "built_with_cuda_support:value:false")):
                yes = line.endswith("true")
                return yes, f"ompi_info: built_with_cuda_support {'true' if yes else 'false'}"
    mpich = tool("mpichversion")
    if mpich:
        if os.environ.get("MPIR_CVAR_ENABLE_GPU", "").strip() in ("0", "false"):
            return False, "MPIR_CVAR_ENABLE_GPU=0"
        out = _run([mpich])
        if out:
            yes = "--with-cuda" in out
            return yes, f"mpichversion: {'configured' if yes else 'not configured'} --with-cuda"
    return None, "neither ompi_info nor mpichversion answered"


def check_cuda_aware_mpi(given: bool, bindir: str | None = None) -> str:
    """Refuse CUDA buffers on an MPI that is not CUDA-aware, or whose answer is unknown
    unless the user says it is (--cuda-aware-mpi). Returns how the answer was had."""
    if given:
        return "--cuda-aware-mpi"
    yes, how = mpi_cuda_support(bindir)
    if yes:
        return how
    if yes is False:
        raise UsageError(f"backend mpi with device cuda needs a CUDA-aware MPI, and this one is not ({how}): "
                         f"use --backend nccl, or an MPI built with CUDA")
    raise UsageError(f"backend mpi with device cuda needs a CUDA-aware MPI, and this one cannot be asked ({how}): "
                     f"pass --cuda-aware-mpi if it is")


def check_gpu_path(backend: str, device: str, np_: int | None, cuda_aware: bool) -> None:
    """Before any rank initialises: one GPU per NCCL rank on this host (np_: a local launch's
    ranks; under a cluster launcher, the ranks it put on this host), and CUDA buffers only on
    an MPI that takes them; a hold cap (COMMBENCH_HOLD_CAP_S) that is a number of seconds."""
    if device == "cuda":
        hold_cap_s()
    if backend == "nccl":
        visible = visible_gpus()
        if visible:  # none: backends.availability says so
            check_ranks_per_gpu(np_ if np_ is not None else local_ranks(detect().world), visible, backend)
    if backend == "mpi" and device == "cuda":
        try:
            bindir = os.path.dirname(find_mpirun())
        except UsageError:
            bindir = None
        check_cuda_aware_mpi(cuda_aware, bindir)
