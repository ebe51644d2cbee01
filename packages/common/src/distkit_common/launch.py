"""Rank, size and local rank of this process under mpiexec, torchrun, srun or alone."""

from __future__ import annotations

import os
from dataclasses import dataclass

# (rank, size, local rank, local size) variables, most specific launcher first.
_LAUNCHERS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in its job."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_size: int


def _int(env: dict[str, str] | os._Environ[str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value.split("(")[0].split(",")[0])
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def launch_info(env: dict[str, str] | None = None) -> LaunchInfo:
    """Read the launcher's environment (``os.environ`` unless ``env`` is given).

    Returns a single-process ``LaunchInfo("none", 0, 1, 0, 1)`` when no known
    launcher variables are set.

    Raises
    ------
    ValueError
        If a launcher variable is not an integer or the values are inconsistent.
    """
    e = os.environ if env is None else env
    for name, r, s, lr, ls in _LAUNCHERS:
        if r in e and s in e:
            info = LaunchInfo(name, _int(e, r, 0), _int(e, s, 1), _int(e, lr, 0), _int(e, ls, 1))
            if not (0 <= info.rank < info.world_size):
                raise ValueError(f"{name}: rank {info.rank} is outside world size {info.world_size}")
            return info
    return LaunchInfo("none", 0, 1, 0, 1)


def rank() -> int:
    """Global rank of this process (0 when launched alone)."""
    return launch_info().rank


def world_size() -> int:
    """Number of processes in the job (1 when launched alone)."""
    return launch_info().world_size


def local_rank() -> int:
    """Rank of this process among those on its node."""
    return launch_info().local_rank
