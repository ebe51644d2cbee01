"""Module-level spellings of WholeGraph's ``wholegraph_pytorch`` / ``wg_torch.wm_tensor`` API.

The original passed communicators around as integer handles and offered free
functions on them (``get_rank(comm)``, ``barrier(comm)``, ...); wholemem's
:class:`WholeMemoryCommunicator` has methods, and these functions call them.
"""

from __future__ import annotations

from typing import Any

from . import _lib, _registry
from ._comm import WholeMemoryCommunicator
from ._ops import communicator_of, get_sub_tensor
from ._tensor import ChunkedTensor, NCCLTensor, WmTensor, WmTensorType


def _comm(comm: Any, what: str) -> WholeMemoryCommunicator:
    if not isinstance(comm, WholeMemoryCommunicator):
        raise TypeError(f"{what}: expected a wholemem.WholeMemoryCommunicator, got {type(comm).__name__}")
    _lib.require_init(what)
    return comm


def get_rank(comm: WholeMemoryCommunicator) -> int:
    """Return this process's rank in ``comm``.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The communicator.

    Returns
    -------
    int
        ``comm.rank``.

    Raises
    ------
    TypeError
        ``comm`` is not a communicator.
    RuntimeError
        The library was finalized or the communicator destroyed.
    """
    c = _comm(comm, "get_rank")
    c.check_alive("get_rank")
    return c.rank


def get_size(comm: WholeMemoryCommunicator) -> int:
    """Return the number of ranks of ``comm``.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The communicator.

    Returns
    -------
    int
        ``comm.size``.

    Raises
    ------
    TypeError
        ``comm`` is not a communicator.
    RuntimeError
        The library was finalized or the communicator destroyed.
    """
    c = _comm(comm, "get_size")
    c.check_alive("get_size")
    return c.size


def barrier(comm: WholeMemoryCommunicator) -> None:
    """Collective: wait until every rank of ``comm`` reaches the barrier.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The communicator.

    Raises
    ------
    TypeError
        ``comm`` is not a communicator.
    RuntimeError
        The library was finalized or the communicator destroyed.
    """
    _comm(comm, "barrier").barrier()


def destroy_communicator(comm: WholeMemoryCommunicator) -> None:
    """Collective: destroy ``comm`` (same as ``comm.destroy()``).

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The communicator; destroying it twice is harmless.

    Raises
    ------
    TypeError
        ``comm`` is not a communicator.
    """
    if not isinstance(comm, WholeMemoryCommunicator):
        raise TypeError(f"destroy_communicator: expected a wholemem.WholeMemoryCommunicator, got {type(comm).__name__}")
    comm.destroy()


def get_wm_communicator(t: Any) -> WholeMemoryCommunicator:
    """Return the communicator a wholemem tensor was created on.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        A tensor made by wholemem.

    Returns
    -------
    WholeMemoryCommunicator
        Its communicator.

    Raises
    ------
    TypeError
        ``t`` is not a wholemem tensor.
    RuntimeError
        The library was finalized or the communicator destroyed.
    """
    _lib.require_init("get_wm_communicator")
    return communicator_of(t, "get_wm_communicator")


def get_wm_tensor_type(t: Any) -> WmTensorType:
    """Return the :class:`WmTensorType` of a wholemem tensor.

    HOST or DEVICE for a ``torch.Tensor`` made by wholemem, CHUNKED or NCCL for the others.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        A tensor made by wholemem.

    Returns
    -------
    WmTensorType
        Its type.

    Raises
    ------
    TypeError
        ``t`` is not a wholemem tensor.
    """
    if isinstance(t, WmTensor):
        return t.tensor_type
    info = _registry.lookup(t)
    if info is not None:
        tensor_type: WmTensorType = info.tensor_type
        return tensor_type
    raise TypeError(f"get_wm_tensor_type: not a wholemem tensor: {type(t).__name__}")


def _start_count_to_ranges(t: Any, start: Any, count: Any, what: str) -> tuple[list[int], list[int]]:
    """WholeGraph's (start, count) sub-tensor arguments as (starts, ends); count -1 = to the end."""
    if not isinstance(start, (list, tuple)) or not isinstance(count, (list, tuple)):
        raise TypeError(f"{what}: start and count must be lists of ints")
    for v in (*start, *count):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{what}: start and count must hold ints, got {v!r}")
    dim = t.dim()
    if len(start) > dim or len(count) > dim:
        raise ValueError(f"{what}: start/count have more entries than the {dim} dimensions")
    if len(count) > len(start):
        raise ValueError(f"{what}: count has more entries ({len(count)}) than start ({len(start)})")
    starts, ends = [], []
    for i in range(dim):
        size = int(t.shape[i])
        s = int(start[i]) if i < len(start) else 0
        if s < 0 or s > size:
            raise ValueError(f"{what}: start[{i}]={s} is outside [0, {size}]")
        c = int(count[i]) if i < len(count) else -1
        if c < -1 or c > size - s:
            raise ValueError(f"{what}: count[{i}]={c} must be -1 or in [0, {size - s}] (size {size}, start {s})")
        starts.append(s)
        ends.append(size if c == -1 else s + c)
    return starts, ends


def get_sub_chunked_tensor(ct: ChunkedTensor, start: Any, count: Any) -> ChunkedTensor:
    """Return a view of ``count[d]`` entries from ``start[d]`` in each dimension of a ChunkedTensor.

    WholeGraph's ``get_sub_chunked_tensor(ct, start, count)``; missing entries mean
    the whole dimension, a count of -1 runs to the end.

    Parameters
    ----------
    ct : ChunkedTensor
        The tensor.
    start : list of int
        First entry in each dimension.
    count : list of int
        Number of entries in each dimension (-1: to the end).

    Returns
    -------
    ChunkedTensor
        The sub-tensor.

    Raises
    ------
    TypeError
        ``ct`` is not a ChunkedTensor, or start / count are not lists of ints.
    ValueError
        A start or count outside the tensor.
    """
    if not isinstance(ct, ChunkedTensor):
        raise TypeError(f"get_sub_chunked_tensor: expected a ChunkedTensor, got {type(ct).__name__}")
    starts, ends = _start_count_to_ranges(ct, start, count, "get_sub_chunked_tensor")
    out: ChunkedTensor = get_sub_tensor(ct, starts, ends)
    return out


def get_sub_nccl_tensor(nt: NCCLTensor, start: Any, count: Any) -> NCCLTensor:
    """Return a view of an NCCLTensor, as :func:`get_sub_chunked_tensor` does for a ChunkedTensor.

    WholeGraph's ``get_sub_nccl_tensor(nt, start, count)``.

    Parameters
    ----------
    nt : NCCLTensor
        The tensor.
    start : list of int
        First entry in each dimension.
    count : list of int
        Number of entries in each dimension (-1: to the end).

    Returns
    -------
    NCCLTensor
        The sub-tensor.

    Raises
    ------
    TypeError
        ``nt`` is not an NCCLTensor, or start / count are not lists of ints.
    ValueError
        A start or count outside the tensor.
    """
    if not isinstance(nt, NCCLTensor):
        raise TypeError(f"get_sub_nccl_tensor: expected an NCCLTensor, got {type(nt).__name__}")
    starts, ends = _start_count_to_ranges(nt, start, count, "get_sub_nccl_tensor")
    out: NCCLTensor = get_sub_tensor(nt, starts, ends)
    return out
