"""The seed API's module-level functions: gather, scatter, local parts, views, plan.

Each is a thin wrapper: a wholemem object (:class:`ChunkedTensor`, :class:`NCCLTensor`)
does the work in its method of the same name; a plain tensor (HOST, DEVICE, their
views, any CPU tensor) goes to ``_plain``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _lib, _plain
from ._comm import WholeMemoryCommunicator
from ._tensor import WmTensor, check_ranges

WmAny = Any  # torch.Tensor | ChunkedTensor | NCCLTensor


def gather(t: WmAny, indices: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read rows ``indices`` of ``t``: ``out[i] = t[indices[i]]``.

    Collective for NCCL tensors (every rank calls it, with its own indices). Rows are copied
    bit for bit, so a plain tensor may also have a dtype without a distkit code (``uint16``,
    ``uint32``, ``uint64``, the ``float8`` types).

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        Any wholemem tensor (or any CPU tensor).
    indices : torch.Tensor or numpy.ndarray
        1-D int64 or int32 row indices in ``[0, t.shape[0])``, on the CPU (or, for a
        GPU-resident tensor, on its GPU).
    out : torch.Tensor, optional
        Contiguous ``[len(indices), *t.shape[1:]]`` tensor of ``t``'s dtype, on ``t.device``.

    Returns
    -------
    torch.Tensor
        The rows, ``[len(indices), *t.shape[1:]]`` (``out`` when given).

    Raises
    ------
    IndexError
        An index is negative or ``>= t.shape[0]`` (named in the message).
    TypeError
        Indices not int32/int64, or ``out`` of the wrong dtype.
    ValueError
        Indices not 1-D or on another device; ``out`` of the wrong shape/device.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    _lib.require_init("gather")
    if isinstance(t, WmTensor):
        return t.gather(indices, out)
    _plain.check_target(t, "gather")
    return _plain.gather(t, indices, out)


def scatter(t: WmAny, indices: Any, values: Any) -> None:
    """Write ``values[i]`` into row ``indices[i]`` of ``t`` (last duplicate wins).

    Collective for NCCL tensors. For HOST / CHUNKED tensors the write is visible to
    every rank immediately; call ``comm.barrier()`` before others read it.
    Like :func:`gather`, a plain tensor may have any dtype of 1, 2, 4 or 8 bytes.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        Any wholemem tensor (or any CPU tensor).
    indices : torch.Tensor or numpy.ndarray
        1-D int64 or int32 row indices in ``[0, t.shape[0])``, on the CPU (or, for a
        GPU-resident tensor, on its GPU).
    values : torch.Tensor or numpy.ndarray
        ``[len(indices), *t.shape[1:]]`` of ``t``'s dtype, on ``t.device``. With duplicate
        indices on a GPU-resident tensor, any one of the duplicates wins.

    Raises
    ------
    IndexError
        An index is negative or ``>= t.shape[0]``.
    TypeError
        Indices not int32/int64, or values of another dtype.
    ValueError
        Wrong shape or device of indices / values, or a plain tensor ``t`` whose elements
        share memory (an ``expand`` or overlapping ``as_strided`` view).
    RuntimeError
        Library finalized or communicator destroyed.
    """
    _lib.require_init("scatter")
    if isinstance(t, WmTensor):
        t.scatter(indices, values)
        return
    _plain.check_target(t, "scatter")
    _plain.scatter(t, indices, values)


def get_partition_plan(t: Any, total_entry_count: int | None = None) -> tuple[int, int, int, int]:
    """The row partition plan, as WholeGraph's ``get_partition_plan``.

    Rows (dim 0) are split evenly: with ``k = ceil(N / size)``, rank r owns rows
    ``[r*k, min(N, (r+1)*k))``.

    Parameters
    ----------
    t : wholemem tensor or WholeMemoryCommunicator
        A tensor made by :func:`create_wm_tensor` (N = ``t.shape[0]``), or a communicator
        together with ``total_entry_count``.
    total_entry_count : int, optional
        N; required with a communicator, and must equal ``t.shape[0]`` with a tensor.

    Returns
    -------
    local_start : int
        This rank's first row (N for ranks past the end).
    local_entry_count : int
        Its number of rows.
    entry_per_rank : int
        ``k``.
    total_entry_count : int
        N. Ranks past the end get ``local_start = N`` and 0 rows (the original
        could return a negative count).

    Raises
    ------
    TypeError
        ``t`` is a plain tensor, or ``total_entry_count`` is not an int.
    ValueError
        ``total_entry_count`` is missing for a communicator, negative, or differs from
        ``t.shape[0]``.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    if total_entry_count is not None and (
        isinstance(total_entry_count, bool) or not isinstance(total_entry_count, int)
    ):
        raise TypeError(f"get_partition_plan: total_entry_count must be an int, got {total_entry_count!r}")
    _lib.require_init("get_partition_plan")
    if isinstance(t, WholeMemoryCommunicator):
        t.check_alive("get_partition_plan")
        if total_entry_count is None:
            raise ValueError("get_partition_plan: total_entry_count is required when a communicator is given")
        comm, n = t, int(total_entry_count)
    else:
        comm = communicator_of(t, "get_partition_plan")
        n = int(t.shape[0])
        if total_entry_count is not None and total_entry_count != n:
            raise ValueError(f"get_partition_plan: total_entry_count={total_entry_count} but t.shape[0]={n}")
    if n < 0:
        raise ValueError(f"get_partition_plan: total_entry_count must be >= 0, got {n}")
    k = (n + comm.size - 1) // comm.size
    start = min(comm.rank * k, n)
    end = min(k * (comm.rank + 1), n)
    return start, max(0, end - start), k, n


def communicator_of(t: Any, what: str) -> WholeMemoryCommunicator:
    """The communicator of a wholemem tensor.

    Raises
    ------
    TypeError
        ``t`` is not a wholemem tensor.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    if isinstance(t, WmTensor):
        t.check_alive(what)
        return t.comm
    comm: WholeMemoryCommunicator = _plain.require_info(t, what).comm
    return comm


def get_local_tensor(t: WmAny) -> tuple[torch.Tensor, int]:
    """Return this rank's rows of ``t`` (under the partition plan) and the index of the first one.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        A wholemem tensor.

    Returns
    -------
    (torch.Tensor, int)
        A tensor sharing memory with ``t`` (writes go into ``t``) and its first row in ``t``.

    Raises
    ------
    TypeError
        ``t`` is not a wholemem tensor.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    _lib.require_init("get_local_tensor")
    if isinstance(t, WmTensor):
        return t.get_local_tensor()
    return _plain.local_part(t, "get_local_tensor")


def get_sub_tensor(t: WmAny, starts: Any, ends: Any) -> WmAny:
    """Return a view of rows (and, for 2-D tensors, columns) ``[starts[d], ends[d])``; -1 = to the end.

    The view shares memory with ``t``; gather / scatter / get_local_tensor work on it
    with view-relative indices.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        A wholemem tensor.
    starts : list of int
        First row (and column) of the view.
    ends : list of int
        End (exclusive) of each range; -1 runs to the end.

    Returns
    -------
    torch.Tensor, ChunkedTensor or NCCLTensor
        The view, of ``t``'s kind.

    Raises
    ------
    TypeError
        starts / ends not lists of ints.
    ValueError
        A range outside the tensor, or a column range on a tensor with more than 2 dims.
    """
    _lib.require_init("get_sub_tensor")
    if isinstance(t, WmTensor):
        return t.get_sub_tensor(starts, ends)
    _plain.check_target(t, "get_sub_tensor")
    return _plain.sub_tensor(t, check_ranges(tuple(t.shape), starts, ends))


def get_tensor_view(t: WmAny, device: Any) -> WmAny:
    """Return the tensor as seen from ``device`` (WholeGraph's ``get_tensor_view``).

    - ``'cpu'``: host-memory tensors themselves (HOST tensors are normal CPU tensors;
      host CHUNKED / NCCL objects); GPU-resident tensors have no CPU view.
    - ``'cuda'`` / ``'cuda:N'``: a HOST tensor (or any view of one) becomes a CUDA tensor
      over the same shared pages: the segment is page-locked and mapped for the GPUs
      with ``cudaHostRegister`` (once per process, undone when the last such view dies);
      kernels read and write host memory over PCIe/NVLink, and writes are shared with
      every rank exactly like the CPU tensor's. A host CHUNKED tensor becomes a
      :class:`ChunkedTensor` whose ops run the CUDA kernels over its mapped chunks.
      GPU-resident tensors are returned as they are on their own device.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        A wholemem tensor (or a view of one).
    device : str or torch.device
        ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.

    Returns
    -------
    torch.Tensor, ChunkedTensor or NCCLTensor
        The view from ``device`` (``t`` itself where it already lives there).

    Raises
    ------
    RuntimeError
        A CUDA device without a usable GPU (CPU-only machine, torch without CUDA or a
        build without nvcc), or the library is finalized.
    ValueError
        An unknown device type, a CPU view of GPU memory, a GPU view of another GPU's
        tensor, or a GPU view of a host NCCL tensor or of a plain tensor.
    TypeError
        ``t`` is not a tensor or ``device`` not a device.
    """
    _lib.require_init("get_tensor_view")
    if isinstance(t, WmTensor):
        return t.get_tensor_view(device)
    info = _plain.check_target(t, "get_tensor_view")
    dev = _plain.resolve_cuda(device, "get_tensor_view", info.comm if info is not None else None)
    if dev is None:
        if t.device.type != "cpu":
            raise _plain.no_cpu_view(t.device)
        return t
    return _plain.cuda_view(t, dev, "get_tensor_view")
