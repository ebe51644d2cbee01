"""Row operations on every tensor type: gather, scatter, local parts, views."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from distkit_common.validate import as_index_tensor, as_tensor

from . import _lib
from ._layout import local_range, plain_table_args
from ._tensor import ChunkedTensor, HostInfo, NCCLTensor, _WmTensor, host_info, register_host
from ._wholemem import Table, check_indices

WmAny = Any  # torch.Tensor | ChunkedTensor | NCCLTensor


def _info(t: torch.Tensor) -> HostInfo | None:
    return host_info(t)


def _check_target(t: Any, what: str) -> None:
    _lib.require_init(what)
    if isinstance(t, _WmTensor):
        t._check(what)
    elif isinstance(t, torch.Tensor):
        info = _info(t)
        if info is not None:
            info.comm.check_alive(what)
    else:
        raise TypeError(f"{what}: expected a torch.Tensor, ChunkedTensor or NCCLTensor, got {type(t).__name__}")


def _indices(indices: Any, upper: int) -> torch.Tensor:
    """A contiguous 1-D int64/int32 CPU index tensor with every entry in ``[0, upper)``."""
    t = as_tensor(indices, "indices")
    if t.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be an integer array of dtype int64 or int32, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"indices must be on the CPU, got {t.device}")
    if t.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(t.shape)}")
    t = t.contiguous()
    if t.numel():
        check_indices(int(t.data_ptr()), t.dtype == torch.int64, int(t.numel()), int(upper))
    return t


def _row_shape(t: Any) -> tuple[int, ...]:
    return tuple(t.shape[1:])


def _values(values: Any, n: int, t: Any) -> torch.Tensor:
    v = as_tensor(values, "values")
    if v.dtype != t.dtype:
        raise TypeError(f"values must have dtype {t.dtype} (the tensor's), got {v.dtype}")
    if v.device.type != "cpu":
        raise ValueError(f"values must be on the CPU, got {v.device}")
    want = (n, *_row_shape(t))
    if tuple(v.shape) != want:
        raise ValueError(f"values must have shape {want} (one row per index), got {tuple(v.shape)}")
    return v.contiguous()


def _out(out: Any, n: int, t: Any) -> torch.Tensor:
    want = (n, *_row_shape(t))
    if out is None:
        return torch.empty(want, dtype=t.dtype)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != t.dtype:
        raise TypeError(f"out must have dtype {t.dtype}, got {out.dtype}")
    if out.device.type != "cpu":
        raise ValueError(f"out must be on the CPU, got {out.device}")
    if tuple(out.shape) != want or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {want}, got {tuple(out.shape)}")
    return out


def _plain_table(t: torch.Tensor) -> Table | None:
    args = plain_table_args(t)
    if args is None or t.device.type != "cpu":
        return None
    from distkit_common.dtypes import code_of

    nrows, ncols, rs, cs = args
    return Table([int(t.data_ptr())], max(nrows, 1), nrows, ncols, rs, cs, code_of(t.dtype), False)


def _native_gather(table: Table, idx: torch.Tensor, out: torch.Tensor) -> None:
    if idx.numel():
        table.gather(int(idx.data_ptr()), idx.dtype == torch.int64, int(idx.numel()), int(out.data_ptr()))


def _native_scatter(table: Table, idx: torch.Tensor, vals: torch.Tensor) -> None:
    if idx.numel():
        table.scatter(int(idx.data_ptr()), idx.dtype == torch.int64, int(idx.numel()), int(vals.data_ptr()))


def gather(t: WmAny, indices: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``indices`` of ``t``: ``out[i] = t[indices[i]]``.

    Collective for NCCL tensors (every rank calls it, with its own indices).

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
        Any wholemem tensor (or any CPU tensor).
    indices : torch.Tensor or numpy.ndarray
        1-D int64 or int32 row indices in ``[0, t.shape[0])``, on the CPU.
    out : torch.Tensor, optional
        Contiguous ``[len(indices), *t.shape[1:]]`` tensor of ``t``'s dtype.

    Returns
    -------
    torch.Tensor

    Raises
    ------
    IndexError
        An index is negative or ``>= t.shape[0]`` (named in the message).
    TypeError
        Indices not int32/int64, or ``out`` of the wrong dtype.
    ValueError
        Indices not 1-D or not on the CPU; ``out`` of the wrong shape/device.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    _check_target(t, "gather")
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        idx = as_index_tensor(
            indices.cpu() if isinstance(indices, torch.Tensor) else indices,
            "indices",
            upper=t.shape[0],
            dtypes=("int64", "int32"),
        )
        res = t.index_select(0, idx.to(t.device))
        if out is not None:
            out.copy_(res)
            return out
        return res
    idx = _indices(indices, int(t.shape[0]))
    o = _out(out, idx.numel(), t)
    if isinstance(t, NCCLTensor):
        _nccl_gather(t, idx, o)
    elif isinstance(t, ChunkedTensor):
        assert t._table is not None
        _native_gather(t._table, idx + t._row_offset if t._row_offset else idx, o)
    else:
        table = _plain_table(t)
        if table is None:
            torch.index_select(t, 0, idx, out=o)
        else:
            _native_gather(table, idx, o)
    return o


def scatter(t: WmAny, indices: Any, values: Any) -> None:
    """Write ``values[i]`` into row ``indices[i]`` of ``t`` (last duplicate wins).

    Collective for NCCL tensors. For HOST / CHUNKED tensors the write is visible to
    every rank immediately; call ``comm.barrier()`` before others read it.

    Parameters
    ----------
    t : torch.Tensor, ChunkedTensor or NCCLTensor
    indices : torch.Tensor or numpy.ndarray
        1-D int64 or int32 row indices in ``[0, t.shape[0])``, on the CPU.
    values : torch.Tensor or numpy.ndarray
        ``[len(indices), *t.shape[1:]]`` of ``t``'s dtype, on the CPU.

    Raises
    ------
    IndexError
        An index is negative or ``>= t.shape[0]``.
    TypeError
        Indices not int32/int64, or values of another dtype.
    ValueError
        Wrong shape or device of indices / values.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    _check_target(t, "scatter")
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        idx = as_index_tensor(
            indices.cpu() if isinstance(indices, torch.Tensor) else indices,
            "indices",
            upper=t.shape[0],
            dtypes=("int64", "int32"),
        )
        v = as_tensor(values, "values")
        if v.dtype != t.dtype:
            raise TypeError(f"values must have dtype {t.dtype} (the tensor's), got {v.dtype}")
        t.index_copy_(0, idx.to(t.device), v.to(t.device))
        return
    idx = _indices(indices, int(t.shape[0]))
    vals = _values(values, idx.numel(), t)
    if isinstance(t, NCCLTensor):
        _nccl_scatter(t, idx, vals)
    elif isinstance(t, ChunkedTensor):
        assert t._table is not None
        _native_scatter(t._table, idx + t._row_offset if t._row_offset else idx, vals)
    else:
        table = _plain_table(t)
        if table is None:
            t.index_copy_(0, idx.to(torch.int64), vals)
        else:
            _native_scatter(table, idx, vals)


# -- NCCL (distributed) type: bucket by owner, all-to-all, local native op -------------


def _route(t: NCCLTensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Send every global row index to its owner; returns (sort order, received local rows, send, recv counts)."""
    comm = t.comm
    gidx = idx.to(torch.int64) + t._row_offset
    owner = torch.div(gidx, t._rpr, rounding_mode="floor")
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=comm.size)
    recv_counts = comm.exchange_counts(send_counts)
    sc, rc = send_counts.tolist(), recv_counts.tolist()
    ridx = comm.all_to_all(gidx[order], sc, rc) - t._first
    return order, ridx, sc, rc


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(x.shape[0], math.prod(x.shape[1:]))
    if x.shape[1] == 0 or x.shape[0] == 0:
        return torch.empty((x.shape[0], x.shape[1] * x.element_size()), dtype=torch.uint8)
    return x.contiguous().view(torch.uint8)


def _nccl_gather(t: NCCLTensor, idx: torch.Tensor, out: torch.Tensor) -> None:
    if t.comm.size == 1:
        assert t._table is not None
        _native_gather(t._table, idx.to(torch.int64) + t._row_offset, out)
        return
    order, ridx, sc, rc = _route(t, idx)
    rows = torch.empty((ridx.numel(), *_row_shape(t)), dtype=t.dtype)
    assert t._table is not None
    _native_gather(t._table, ridx, rows)
    back = t.comm.all_to_all(_as_bytes(rows), rc, sc)
    if out.numel():
        # out[order[i]] = back[i], done as a row gather out[j] = back[inv[j]] (prefetching, threaded)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel())
        table = _plain_table(back)
        assert table is not None
        _native_gather(table, inv, _as_bytes(out))


def _nccl_scatter(t: NCCLTensor, idx: torch.Tensor, vals: torch.Tensor) -> None:
    assert t._table is not None
    if t.comm.size == 1:
        _native_scatter(t._table, idx.to(torch.int64) + t._row_offset, vals)
        return
    order, ridx, sc, rc = _route(t, idx)
    sent = _as_bytes(vals)[order] if vals.numel() else _as_bytes(vals)
    recv = t.comm.all_to_all(sent, sc, rc)
    if recv.numel():
        rows = recv.view(t.dtype).reshape(ridx.numel(), *_row_shape(t))
    else:
        rows = torch.empty((ridx.numel(), *_row_shape(t)), dtype=t.dtype)
    _native_scatter(t._table, ridx, rows.contiguous())


# -- local parts, views, plan -----------------------------------------------------------


def get_partition_plan(t: Any, total_entry_count: int | None = None) -> tuple[int, int, int, int]:
    """The row partition plan, as WholeGraph's ``get_partition_plan``.

    Rows (dim 0) are split evenly: with ``k = ceil(N / size)``, rank r owns rows
    ``[r*k, min(N, (r+1)*k))``.

    Parameters
    ----------
    t : wholemem tensor or Communicator
        A tensor made by :func:`create_wm_tensor` (N = ``t.shape[0]``), or a communicator
        together with ``total_entry_count``.
    total_entry_count : int, optional
        N; required with a communicator, and must equal ``t.shape[0]`` with a tensor.

    Returns
    -------
    (local_start, local_entry_count, entry_per_rank, total_entry_count) : tuple of int
        This rank's first row, its number of rows, ``k`` and N. Ranks past the end get
        ``local_start = N`` and 0 rows (the original could return a negative count).

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
    from ._comm import Communicator

    if total_entry_count is not None and (
        isinstance(total_entry_count, bool) or not isinstance(total_entry_count, int)
    ):
        raise TypeError(f"get_partition_plan: total_entry_count must be an int, got {total_entry_count!r}")
    if isinstance(t, Communicator):
        _lib.require_init("get_partition_plan")
        t.check_alive("get_partition_plan")
        if total_entry_count is None:
            raise ValueError("get_partition_plan: total_entry_count is required when a communicator is given")
        comm, n = t, int(total_entry_count)
    else:
        _check_target(t, "get_partition_plan")
        if isinstance(t, _WmTensor):
            comm = t.comm
        else:
            info = _info(t)
            if info is None:
                raise TypeError("get_partition_plan: t is a plain torch.Tensor, not one made by create_wm_tensor")
            comm = info.comm
        n = int(t.shape[0])
        if total_entry_count is not None and total_entry_count != n:
            raise ValueError(f"get_partition_plan: total_entry_count={total_entry_count} but t.shape[0]={n}")
    if n < 0:
        raise ValueError(f"get_partition_plan: total_entry_count must be >= 0, got {n}")
    k = (n + comm.size - 1) // comm.size
    start = min(comm.rank * k, n)
    end = min(k * (comm.rank + 1), n)
    return start, max(0, end - start), k, n


def get_local_tensor(t: WmAny) -> tuple[torch.Tensor, int]:
    """This rank's rows of ``t`` (under the partition plan) and the index of the first one.

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
    _check_target(t, "get_local_tensor")
    if isinstance(t, torch.Tensor):
        info = _info(t)
        if info is None:
            raise TypeError("get_local_tensor: t is a plain torch.Tensor, not one made by create_wm_tensor")
        lo, hi = local_range(info.layout.nrows, info.comm.size, info.comm.rank)
        a = max(lo, info.row_offset)
        b = max(a, min(hi, info.row_offset + int(t.shape[0])))
        return t[a - info.row_offset : b - info.row_offset], min(a - info.row_offset, int(t.shape[0]))
    part, first = t._local_part()
    a = max(first, t._row_offset)
    b = min(first + part.shape[0], t._row_offset + t._shape[0])
    b = max(a, b)
    local = part[a - first : b - first]
    if t.dim() >= 2 and (t._col_offset != 0 or t._shape[1] != t._base.shape[1]):
        local = local[:, t._col_offset : t._col_offset + t._shape[1]]
    return local, min(a - t._row_offset, t._shape[0])


def _ranges(t: Any, starts: Any, ends: Any) -> list[tuple[int, int]]:
    shape = tuple(t.shape)
    if not isinstance(starts, (list, tuple)) or not isinstance(ends, (list, tuple)):
        raise TypeError("starts and ends must be lists of ints")
    if len(starts) > len(shape) or len(ends) > len(shape):
        raise ValueError(f"starts/ends have more entries than {len(shape)} dimensions")
    out = []
    for d, size in enumerate(shape):
        s = int(starts[d]) if d < len(starts) else 0
        e = int(ends[d]) if d < len(ends) else -1
        e = size if e == -1 else e
        if not 0 <= s <= e <= size:
            raise ValueError(f"dimension {d}: range [{s}, {e}) is not within [0, {size}]")
        out.append((s, e))
    return out


def get_sub_tensor(t: WmAny, starts: Any, ends: Any) -> WmAny:
    """A view of rows (and, for 2-D tensors, columns) ``[starts[d], ends[d])``; -1 = to the end.

    The view shares memory with ``t``; gather / scatter / get_local_tensor work on it
    with view-relative indices.

    Raises
    ------
    TypeError
        starts / ends not lists of ints.
    ValueError
        A range outside the tensor, or a column range on a tensor with more than 2 dims.
    """
    _check_target(t, "get_sub_tensor")
    rng = _ranges(t, starts, ends)
    if isinstance(t, torch.Tensor):
        view = t[tuple(slice(s, e) for s, e in rng)]
        info = _info(t)
        if info is not None:
            sub_info = dataclasses.replace(info, row_offset=info.row_offset + rng[0][0])
            register_host(view, sub_info)
        return view
    if any(r != (0, size) for r, size in zip(rng[2:], t._shape[2:])):
        raise ValueError("get_sub_tensor: only rows and (for 2-D tensors) columns can be restricted")
    if t.dim() > 2 and rng[1] != (0, t._shape[1]):
        raise ValueError("get_sub_tensor: column ranges need a 2-D tensor")
    return t._sub(rng[0], rng[1] if t.dim() >= 2 else None)


def get_tensor_view(t: WmAny, device: Any) -> WmAny:
    """The tensor as seen from ``device``.

    For CPU devices the tensor itself (HOST tensors are normal CPU tensors; CHUNKED and
    NCCL objects are device independent); a GPU view needs a visible GPU.

    Raises
    ------
    RuntimeError
        A CUDA device was asked for and none is visible, or the library is finalized.
    ValueError
        An unknown device type.
    """
    _check_target(t, "get_tensor_view")
    dev = torch.device(device)
    if dev.type == "cpu":
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            raise ValueError("get_tensor_view: a DEVICE tensor has no CPU view (copy it with .cpu())")
        return t
    if dev.type == "cuda":
        from ._tensor import _require_gpu

        _require_gpu("get_tensor_view(t, 'cuda')")
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":  # pragma: no cover - needs a GPU
            return t
        raise RuntimeError(  # pragma: no cover - needs a GPU
            "get_tensor_view: GPU views of host-resident wholemem tensors are not implemented; "
            "gather rows and move them with .to(device)"
        )
    raise ValueError(f"get_tensor_view: unsupported device {dev}")
