"""Rank, size, local rank and node of this process under mpiexec, torchrun, srun or alone.

Every distkit package that needs to know where a process sits (which GPU a
rank binds to, which ranks share a host) reads it here, so one launcher's
quirks are handled once:

======== ================= ================= ============================= ==========================
launcher rank              size              local rank / local size       node
======== ================= ================= ============================= ==========================
Open MPI OMPI_COMM_WORLD_* OMPI_COMM_WORLD_* OMPI_COMM_WORLD_LOCAL_*       (not exported by Open MPI)
torchrun RANK              WORLD_SIZE        LOCAL_RANK, LOCAL_WORLD_SIZE  GROUP_RANK
MPICH    PMI_RANK          PMI_SIZE          MPI_LOCALRANKID, _LOCALNRANKS
PMIx     PMIX_RANK         PMIX_SIZE         PMIX_LOCAL_RANK, _LOCAL_SIZE
SLURM    SLURM_PROCID      SLURM_NTASKS      SLURM_LOCALID, tasks of this  SLURM_NODEID
                                             node (SLURM_TASKS_PER_NODE)
======== ================= ================= ============================= ==========================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

# (name, rank, size, local rank, local size, node rank) variables, most specific launcher first.
_LAUNCHERS: tuple[tuple[str, str, str, str, str, str], ...] = (
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "",
    ),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ""),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE", ""),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"),
)


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in its job.

    Parameters
    ----------
    launcher : str
        ``"openmpi"``, ``"torchrun"``, ``"mpich"``, ``"pmix"``, ``"slurm"`` or ``"none"``.
    rank : int
        Global rank, in ``[0, world_size)``.
    world_size : int
        Number of processes in the job.
    local_rank : int
        Rank among the processes on this node.
    local_size : int
        Number of this job's processes on this node.
    node_rank : int or None
        Index of this process's node when the launcher says it (torchrun, SLURM),
        else ``None``: group ranks by :func:`distkit_common.node.node_key` then.
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    node_rank: int | None = None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        # SLURM writes repeated counts as "4(x2)" and lists as "4,2": the first count
        return int(value.split("(")[0].split(",")[0])
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


_SLURM_COUNTS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _slurm_tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """Tasks on node ``node`` from SLURM_TASKS_PER_NODE ("2(x3),1" = 2, 2, 2, 1)."""
    seen = 0
    for part in tasks_per_node.split(","):
        m = _SLURM_COUNTS.match(part.strip())
        if m is None:
            return None
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if node < seen + repeat:
            return count
        seen += repeat
    return None


def launch_info(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read the launcher's environment.

    Parameters
    ----------
    env : mapping of str to str, optional
        The environment to read; ``os.environ`` when None.

    Returns
    -------
    LaunchInfo
        What the first launcher whose rank and size variables are set says, or
        ``LaunchInfo("none", 0, 1, 0, 1)`` when no known launcher variables are set.

    Raises
    ------
    ValueError
        If a launcher variable is not an integer or the rank is outside the world size.

    Examples
    --------
    >>> launch_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
    ...              "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    LaunchInfo(launcher='openmpi', rank=1, world_size=4, local_rank=1, local_size=2, node_rank=None)
    """
    e: Mapping[str, str] = os.environ if env is None else env
    for name, r, s, lr, ls, nr in _LAUNCHERS:
        if r in e and s in e:
            local_size = _int(e, ls, 1)
            node = _int(e, nr, -1) if nr else -1
            if name == "slurm" and ls not in e and node >= 0 and "SLURM_TASKS_PER_NODE" in e:
                local_size = _slurm_tasks_on_node(e["SLURM_TASKS_PER_NODE"], node) or local_size
            info = LaunchInfo(
                name, _int(e, r, 0), _int(e, s, 1), _int(e, lr, 0), local_size, node if node >= 0 else None
            )
            if not (0 <= info.rank < info.world_size):
                raise ValueError(f"{name}: rank {info.rank} is outside world size {info.world_size}")
            return info
    return LaunchInfo("none", 0, 1, 0, 1)


def rank() -> int:
    """Global rank of this process.

    Returns
    -------
    int
        ``launch_info().rank``: 0 when launched alone.

    Raises
    ------
    ValueError
        As :func:`launch_info`.
    """
    return launch_info().rank


def world_size() -> int:
    """Number of processes in the job.

    Returns
    -------
    int
        ``launch_info().world_size``: 1 when launched alone.

    Raises
    ------
    ValueError
        As :func:`launch_info`.
    """
    return launch_info().world_size


def local_rank() -> int:
    """Rank of this process among those on its node.

    Returns
    -------
    int
        ``launch_info().local_rank``: 0 when launched alone.

    Raises
    ------
    ValueError
        As :func:`launch_info`.
    """
    return launch_info().local_rank


def local_size() -> int:
    """Number of this job's processes on this node.

    Returns
    -------
    int
        ``launch_info().local_size``: 1 when launched alone.

    Raises
    ------
    ValueError
        As :func:`launch_info`.
    """
    return launch_info().local_size
