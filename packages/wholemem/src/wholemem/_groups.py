"""Communicators made from others, with pylibwholegraph's names.

A HOST / CHUNKED / DEVICE tensor lives in one node's memory, so in a job spread over
several hosts it is made on the communicator of the ranks of one node:
:func:`get_local_node_communicator` gives it (each node gets its own, with its own copy
of the tensor), while NCCL (= DISTRIBUTED) tensors span the global communicator.
:func:`split_communicator` is the general form (any grouping by a color, as
``MPI_Comm_split``).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from distkit_common.validate import check_int

from . import _lib
from ._comm import WholeMemoryCommunicator, communicator_from_process_group

_GLOBAL = "global"
_DEVICE = "device"


def _check_comm(comm: Any, what: str) -> WholeMemoryCommunicator:
    _lib.require_init(what)
    if not isinstance(comm, WholeMemoryCommunicator):
        raise TypeError(f"{what}: comm must be a wholemem.WholeMemoryCommunicator, got {type(comm).__name__}")
    comm.check_alive(what)
    return comm


def split_communicator(comm: WholeMemoryCommunicator, color: int, key: int = 0) -> WholeMemoryCommunicator | None:
    """Collective: split ``comm`` into communicators of the ranks that pass the same ``color``.

    pylibwholegraph's ``split_communicator(comm, color, key=0)``: ranks with equal
    ``color`` form one new communicator, ordered by ``key`` (ties: by their rank in
    ``comm``). Every rank of ``comm`` must call it; a rank passing a negative ``color``
    gets ``None`` (as ``MPI_UNDEFINED``). Each new communicator has its own gloo group
    (rendezvous through ``comm``'s store, or a store started on ``comm``'s rank 0 when
    ``comm`` wraps a process group), so it never clashes with ``comm`` or the default group.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The communicator to split.
    color : int
        Group of this rank; negative: none.
    key : int, default 0
        Orders the ranks in the new communicator.

    Returns
    -------
    WholeMemoryCommunicator or None
        This rank's new communicator, or None for a negative ``color``.

    Raises
    ------
    TypeError
        ``comm`` is not a communicator; ``color`` or ``key`` is not an int (raised on
        every rank when one rank passes a bad value).
    RuntimeError
        The library is not initialised, ``comm`` was destroyed, or a peer failed.
    """
    return _check_comm(comm, "split_communicator").split(color, key)


def get_global_communicator() -> WholeMemoryCommunicator:
    """Return the communicator of every rank of the ``torch.distributed`` job (collective on first use).

    Its default group; the same object on later calls, until it is destroyed or
    :func:`finalize_lib` runs.

    pylibwholegraph's ``get_global_communicator()``; ``init_process_group`` (e.g. under
    ``torchrun``) must have run, with a backend that handles CPU tensors (``"gloo"`` or
    ``"cpu:gloo,cuda:nccl"``).

    Returns
    -------
    WholeMemoryCommunicator
        The job's communicator (the same object on later calls).

    Raises
    ------
    RuntimeError
        The library or ``torch.distributed`` is not initialised.
    ValueError
        The default group has no CPU (gloo) backend.
    """
    _lib.require_init("get_global_communicator")
    if not dist.is_initialized():
        raise RuntimeError(
            "get_global_communicator: torch.distributed is not initialized (call init_process_group first, "
            "or make a communicator with create_communicator / communicator_from_mpi4py)"
        )
    comm = _lib.cached.get(_GLOBAL)
    if not isinstance(comm, WholeMemoryCommunicator) or comm.destroyed:
        comm = communicator_from_process_group()
        _lib.cached[_GLOBAL] = comm
    return comm


def get_local_node_communicator(comm: WholeMemoryCommunicator | None = None) -> WholeMemoryCommunicator:
    """Collective on first use: the communicator of the ranks of ``comm`` on this node.

    pylibwholegraph's ``get_local_node_communicator()``, which splits the global
    communicator by node; here also for any communicator. HOST, CHUNKED and DEVICE
    tensors live in one node's memory: in a job over several hosts, make them on this
    communicator (every node then holds its own tensor, filled by its own ranks), and
    NCCL (= DISTRIBUTED) tensors on ``comm``.

    Ranks are on one node when they share the host name, the boot id and ``/dev/shm``;
    they keep their order in ``comm``. Every rank of ``comm`` must call it the first
    time (the split is collective); later calls return the same communicator without
    communicating. When ``comm`` has one node, ``comm`` itself is returned.

    Parameters
    ----------
    comm : WholeMemoryCommunicator, optional
        Default: :func:`get_global_communicator` (the ``torch.distributed`` job).

    Returns
    -------
    WholeMemoryCommunicator
        The communicator of this node's ranks of ``comm``.

    Raises
    ------
    TypeError
        ``comm`` is not a communicator.
    RuntimeError
        The library is not initialised, ``comm`` was destroyed, or a peer failed.
    """
    if comm is None:
        comm = get_global_communicator()
    return _check_comm(comm, "get_local_node_communicator").node_communicator()


def create_group_communicator(group_size: int = -1, comm_stride: int = 1) -> WholeMemoryCommunicator:
    """Collective: split the ``torch.distributed`` job into groups of ``group_size`` ranks.

    pylibwholegraph's ``create_group_communicator(group_size=-1, comm_stride=1)``: ranks
    are taken in blocks of ``group_size * comm_stride`` consecutive ranks, and inside a
    block every ``comm_stride``-th rank forms a group. With 24 ranks, ``group_size=4`` and
    ``comm_stride=2`` the groups are ``[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], ...``.
    Every rank of the job must call it, with the same arguments.

    Parameters
    ----------
    group_size : int, default -1
        Ranks per group; ``-1``: one group of every rank.
    comm_stride : int, default 1
        Distance, in ranks of the job, between consecutive ranks of a group.

    Returns
    -------
    WholeMemoryCommunicator
        The group of this rank (a new communicator on every call).

    Raises
    ------
    TypeError
        ``group_size`` or ``comm_stride`` is not an int.
    ValueError
        ``group_size`` is not ``-1`` or positive, ``comm_stride < 1``, or the job's size
        is not a multiple of ``group_size * comm_stride``.
    RuntimeError
        The library or ``torch.distributed`` is not initialised, or a peer failed.
    """
    _lib.require_init("create_group_communicator")
    group_size = check_int(group_size, "group_size", lo=-1)
    comm_stride = check_int(comm_stride, "comm_stride", lo=1)
    if group_size == 0:
        raise ValueError("group_size must be -1 (every rank) or positive, got 0")
    world = get_global_communicator()
    if group_size == -1:
        group_size = world.size
    block = group_size * comm_stride
    if world.size % block != 0:
        raise ValueError(
            f"the job's {world.size} ranks are not a multiple of group_size * comm_stride = "
            f"{group_size} * {comm_stride} = {block}"
        )
    block_idx, in_block = divmod(world.rank, block)
    idx_in_group, inner = divmod(in_block, comm_stride)
    child = world.split(block_idx * comm_stride + inner, idx_in_group)
    assert child is not None  # every color here is non-negative
    return child


def get_local_device_communicator() -> WholeMemoryCommunicator:
    """Collective on first use: a communicator of this rank alone.

    pylibwholegraph's ``get_local_device_communicator()`` (the ranks of one GPU: one
    rank each); for tensors private to a rank that still use wholemem's API. The same
    object on later calls, until it is destroyed or :func:`finalize_lib` runs.

    Returns
    -------
    WholeMemoryCommunicator
        The communicator of this rank alone.

    Raises
    ------
    RuntimeError
        The library or ``torch.distributed`` is not initialised, or a peer failed.
    """
    _lib.require_init("get_local_device_communicator")
    comm = _lib.cached.get(_DEVICE)
    if not isinstance(comm, WholeMemoryCommunicator) or comm.destroyed:
        world = get_global_communicator()
        comm = world if world.size == 1 else world.split(world.rank, 0)
        assert comm is not None
        _lib.cached[_DEVICE] = comm
    return comm
