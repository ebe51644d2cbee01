"""Tensor-parallel and data-parallel process groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist


@dataclass
class _Groups:
    group_size: int
    tp_group: Any
    dp_group: Any
    tp_ranks: list[int] = field(default_factory=list)
    dp_ranks: list[int] = field(default_factory=list)
    cpu_tp_group: Any = None
    #: the 2-D ``DeviceMesh`` of these groups, made on first use by ``_sharded.device_mesh``: it
    #: lives and dies with them (it fixes this rank's coordinate when it is made)
    mesh: Any = None


_STATE: _Groups | None = None


def _no_group() -> RuntimeError:
    return RuntimeError(
        "shardlayers: no process group; call torch.distributed.init_process_group(...) and then "
        "shardlayers.distributed.init_process_group(group_size) first"
    )


def state() -> _Groups:
    """The current groups (RuntimeError when not initialised)."""
    if _STATE is None or not dist.is_initialized():
        raise _no_group()
    return _STATE


def is_initialized() -> bool:
    """Tell whether the tensor-parallel groups exist.

    Returns
    -------
    bool
        True after :func:`init_process_group` while ``torch.distributed`` is initialised.
    """
    return _STATE is not None and dist.is_initialized()


def init_process_group(group_size: int) -> None:
    """Split the world into tensor-parallel groups of ``group_size`` consecutive ranks.

    Ranks ``[k * group_size, (k + 1) * group_size)`` form tensor-parallel group ``k``; ranks with
    the same position in their tensor-parallel group form a data-parallel group. Every rank must
    call this (it creates every group, collectively). ``torch.distributed`` must be initialised.

    Parameters
    ----------
    group_size : int
        Tensor-parallel group size; must divide the world size.

    Raises
    ------
    RuntimeError
        If ``torch.distributed`` is not initialised.
    TypeError
        If ``group_size`` is not an int.
    ValueError
        If ``group_size`` is < 1 or does not divide the world size.
    """
    global _STATE
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {group_size!r}")
    if not dist.is_initialized():
        raise _no_group()
    world = dist.get_world_size()
    if group_size < 1 or world % group_size:
        raise ValueError(f"group_size must be >= 1 and divide the world size {world}, got {group_size}")
    rank = dist.get_rank()
    need_cpu = dist.get_backend() != "gloo"
    tp_group = dp_group = cpu_group = None
    tp_ranks: list[int] = []
    dp_ranks: list[int] = []
    for k in range(world // group_size):
        ranks = list(range(k * group_size, (k + 1) * group_size))
        g = dist.new_group(ranks)
        cg = dist.new_group(ranks, backend="gloo") if need_cpu else g
        if rank in ranks:
            tp_group, cpu_group, tp_ranks = g, cg, ranks
    for i in range(group_size):
        ranks = list(range(i, world, group_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            dp_group, dp_ranks = g, ranks
    _STATE = _Groups(group_size, tp_group, dp_group, tp_ranks, dp_ranks, cpu_group)


def destroy_process_group() -> None:
    """Forget the groups created by :func:`init_process_group` (torch.distributed stays up)."""
    global _STATE
    _STATE = None


def get_group() -> Any:
    """Return the tensor-parallel process group of this rank.

    Returns
    -------
    Any
        The ``torch.distributed`` process group of this rank's tensor-parallel group.

    Raises
    ------
    RuntimeError
        If :func:`init_process_group` was not called.
    """
    return state().tp_group


def get_data_parallel_group() -> Any:
    """Return the data-parallel process group of this rank (pass it to DDP's ``process_group``).

    Returns
    -------
    Any
        The ``torch.distributed`` process group of the ranks at this rank's tensor-parallel position.

    Raises
    ------
    RuntimeError
        If :func:`init_process_group` was not called.
    """
    return state().dp_group


def get_rank() -> int:
    """Return this rank's index inside its tensor-parallel group.

    Returns
    -------
    int
        The index, in ``[0, get_group_size())``.

    Raises
    ------
    RuntimeError
        If :func:`init_process_group` was not called.
    """
    s = state()
    return s.tp_ranks.index(dist.get_rank())


def get_group_size() -> int:
    """Return the tensor-parallel group size.

    Returns
    -------
    int
        The ``group_size`` given to :func:`init_process_group`.

    Raises
    ------
    RuntimeError
        If :func:`init_process_group` was not called.
    """
    return state().group_size


def get_world_size() -> int:
    """Return the global world size (all ranks).

    Returns
    -------
    int
        ``torch.distributed``'s world size.

    Raises
    ------
    RuntimeError
        If torch.distributed is not initialised.
    """
    if not dist.is_initialized():
        raise _no_group()
    return dist.get_world_size()


def get_data_parallel_rank() -> int:
    """Return this rank's index inside its data-parallel group.

    Returns
    -------
    int
        The index, in ``[0, get_data_parallel_size())``.

    Raises
    ------
    RuntimeError
        If :func:`init_process_group` was not called.
    """
    s = state()
    return s.dp_ranks.index(dist.get_rank())


def get_data_parallel_size() -> int:
    """Return the data-parallel group size (world size / group size).

    Returns
    -------
    int
        The number of tensor-parallel groups.

    Raises
    ------
    RuntimeError
        If :func:`init_process_group` was not called.
    """
    return len(state().dp_ranks)
