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


def driver_gpus(proc_dir: str = "/proc/driver/nvidia/gpus", dev_dir: str = "/dev") -> int:
    """GPUs the NVIDIA driver shows this host: its /proc list (one directory per GPU, by bus
    id), or, where a container mounts the device nodes without that list, the /dev/nvidiaN
    nodes (one per GPU: nvidiactl, nvidia-uvm and the like are not numbered)."""
    try:
        return len(os.listdir(proc_dir))
    except OSError:
        pass
    try:
        return sum(1 for n in os.listdir(dev_dir) if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        return 0


def visible_gpus(proc_dir: str = "/proc/driver/nvidia/gpus", dev_dir: str = "/dev") -> int:
    """GPUs a process on this host may use: CUDA_VISIBLE_DEVICES when set, capped by what the
    driver shows (driver_gpus), else the driver's count. The one rule for the CLI's refusals,
    `commbench list` and tools/gpu_check.py's preflight, asked without importing torch."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = driver_gpus(proc_dir, dev_dir)
    if cvd is not None:
        ids = [d for d in cvd.split(",") if d.strip()]
        # CUDA stops at the first invalid id, "-1" included.
        n = next((i for i, d in enumerate(ids) if d.strip().startswith("-")), len(ids))
        if cvd.strip() in ("", "-1") or n == 0:
            return 0
        return min(n, shown) if shown else n
    return shown


# The opt-in to several ranks on one GPU: one NCCL_HOSTID per local rank, comma-separated,
# each rank taking the one at its local rank. NCCL refuses two ranks of one host hash on one
# bus id ("Duplicate GPU detected", nccl v2.28.9-1 src/init.cc:903); the host hash is the
# hash of NCCL_HOSTID where set (src/misc/utils.cc:87-90, getHostHashOnce, read once per
# process: std::call_once at :112), so ranks with distinct ids take each other for two hosts
# and connect through the network transport (p2p and shm refuse peers of another host hash:
# src/transport/p2p.cc:143, src/transport/shm.cc:87). For correctness and host paths only:
# the two ranks share the GPU's SMs and memory bandwidth, so their times are not performance.
SHARED_GPU_ENV = "COMMBENCH_SHARED_GPU_HOSTIDS"
SHARED_GPU_MARK = "two ranks sharing one GPU: correctness and host paths only, not performance"


def shared_gpu_hostids(environ=None) -> list[str] | None:
    """The per-rank NCCL_HOSTID values of the opt-in, or None when it is not given."""
    environ = os.environ if environ is None else environ
    raw = environ.get(SHARED_GPU_ENV)
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",")]


def check_ranks_per_gpu(local_ranks: int, gpus: int, backend: str, hostids: list[str] | None = None) -> None:
    """NCCL takes one GPU per rank: more ranks on a host than it has GPUs is refused, unless
    the opt-in (SHARED_GPU_ENV) gives every local rank a distinct, non-empty NCCL_HOSTID."""
    if backend != "nccl" or local_ranks <= gpus:
        return
    if hostids is None:
        raise UsageError(f"backend nccl needs one GPU per rank: {local_ranks} ranks on this host, "
                         f"{gpus} visible GPU(s) (lower --np, or the ranks per node; {SHARED_GPU_ENV}=ID0,ID1,... "
                         f"shares a GPU for correctness checks, docs/gpu.md)")
    if len(hostids) != local_ranks or not all(hostids) or len(set(hostids)) != len(hostids):
        raise UsageError(f"{SHARED_GPU_ENV}={','.join(hostids)!r}: expected {local_ranks} distinct, non-empty "
                         f"NCCL_HOSTID values, one per rank on this host (NCCL tells ranks apart by host id and "
                         f"GPU: equal ids on one GPU are NCCL's 'Duplicate GPU detected')")


def rank_hostid(local_rank: int, environ=None) -> str | None:
    """This rank's NCCL_HOSTID under the opt-in, None without it or where it names none for
    this rank (only a run it does not concern, gloo or mpi: on nccl, check_ranks_per_gpu has
    refused such a list before any rank started). Set before the rank's first NCCL
    communicator: NCCL hashes it once per process."""
    ids = shared_gpu_hostids(environ)
    if ids is None or not 0 <= local_rank < len(ids) or not ids[local_rank]:
        return None
    return ids[local_rank]


def shared_gpu_launch_env(ranks: int, prefix: str = "commbench-rank") -> dict:
    """What a launch of `ranks` ranks sharing one GPU on a machine without a network sets,
    each variable for the reason beside it."""
    return {
        # The opt-in: rank i gets NCCL_HOSTID=<prefix>i (distinct host hashes, nccl
        # src/misc/utils.cc:87-90), so NCCL does not see a "Duplicate GPU" (src/init.cc:903).
        SHARED_GPU_ENV: ",".join(f"{prefix}{i}" for i in range(ranks)),
        # "Two hosts" meet over NCCL's bootstrap and socket transport: on loopback, which
        # exists without a network. Named, NCCL uses it or fails (src/misc/socket.cc:361-367);
        # unnamed it would try ib*, then any interface but docker/lo/virbr, first (:371-384).
        "NCCL_SOCKET_IFNAME": "lo",
        # No InfiniBand probing: the IB transport returns at once (src/transport/net_ib.cc:507,
        # :677), and the socket transport carries the ranks' traffic.
        "NCCL_IB_DISABLE": "1",
        # The ranks' host meeting (a gloo group) on loopback too: torch's gloo device uses the
        # interfaces GLOO_SOCKET_IFNAME lists (torch/csrc/distributed/c10d/init.cpp,
        # ProcessGroupGloo create_default), else the host name's address, which a machine
        # without a network may not resolve.
        "GLOO_SOCKET_IFNAME": "lo",
    }


def apply_rank_hostid(environ=None) -> str | None:
    """In a rank of a launch under the opt-in: NCCL_HOSTID set to this rank's id (by its local
    rank), before its first NCCL communicator; returns it (None elsewhere: the launcher
    itself, or no opt-in)."""
    environ = os.environ if environ is None else environ
    if SHARED_GPU_ENV not in environ:
        return None
    info = detect(environ)
    if info.launcher == "none":
        return None
    hostid = rank_hostid(info.local_rank, environ)
    if hostid is not None:
        environ["NCCL_HOSTID"] = hostid
    return hostid


# torch's ProcessGroupNCCL reads TORCH_NCCL_BLOCKING_WAIT, or its older name NCCL_BLOCKING_WAIT
# (ProcessGroupNCCL.hpp: TORCH_NCCL_BLOCKING_WAIT = {"TORCH_NCCL_BLOCKING_WAIT",
# "NCCL_BLOCKING_WAIT"}; getCvarBool in the constructor). Set, WorkNCCL::wait() blocks the host
# until the collective completes ("if (blockingWait_ || timeout != kNoTimeout) { while
# (!isCompleted()) ...", ProcessGroupNCCL.cpp), and every synchronous torch.distributed call
# waits: behind a held stream, every held operation would stall to the hold's cap.
BLOCKING_WAIT_ENVS = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
# The values torch's getCvarBool reads as true, lower-cased; the first name set decides
# (torch/csrc/distributed/c10d/Utils.hpp, getCvarBool: the list is read in reverse, so an
# earlier name overrides a later one).
_TRUE = ("1", "y", "yes", "t", "true")


def blocking_wait(environ=None) -> str | None:
    """The variable that turns torch's blocking wait on (NAME=value), or None."""
    environ = os.environ if environ is None else environ
    key = next((k for k in BLOCKING_WAIT_ENVS if k in environ), None)
    if key is None or environ[key].strip().lower() not in _TRUE:
        return None
    return f"{key}={environ[key]}"


def check_blocking_wait(environ=None) -> None:
    """A blocking wait set in the environment of an nccl run is refused in one line."""
    said = blocking_wait(environ)
    if said:
        raise UsageError(f"{said}: torch's blocking wait makes the host wait for each collective, and commbench "
                         f"holds the GPU stream while the host enqueues a batch: every held operation would stall "
                         f"to the hold's cap (unset {said.split('=')[0]})")


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
    ranks; under a cluster launcher, the ranks it put on this host) unless the shared-GPU
    opt-in gives each a distinct NCCL_HOSTID, no blocking wait on nccl, and CUDA buffers only
    on an MPI that takes them; a hold cap (COMMBENCH_HOLD_CAP_S) that is a number of seconds."""
    if device == "cuda":
        hold_cap_s()
    if backend == "nccl":
        check_blocking_wait()
        visible = visible_gpus()
        if visible:  # none: backends.availability says so
            check_ranks_per_gpu(np_ if np_ is not None else local_ranks(detect().world), visible, backend,
                                shared_gpu_hostids())
    if backend == "mpi" and device == "cuda":
        try:
            bindir = os.path.dirname(find_mpirun())
        except UsageError:
            bindir = None
        check_cuda_aware_mpi(cuda_aware, bindir)
