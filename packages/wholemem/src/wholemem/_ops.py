"""Row operations on every tensor type: gather, scatter, local parts, views."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from distkit_common.validate import as_tensor

from . import _gpu, _lib
from ._layout import local_range, plain_table_args
from ._tensor import ChunkedTensor, HostInfo, NCCLTensor, _require_gpu, _WmTensor, host_info, register_host
from ._wholemem import Segment, Table, check_indices

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
        1-D int64 or int32 row indices in ``[0, t.shape[0])``, on the CPU (or, for a
        GPU-resident tensor, on its GPU).
    out : torch.Tensor, optional
        Contiguous ``[len(indices), *t.shape[1:]]`` tensor of ``t``'s dtype, on ``t.device``.

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
    if isinstance(t, _WmTensor) and t.is_gpu:
        return _gpu_gather(t, indices, out)
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        # a DEVICE tensor or a CUDA view of a HOST tensor: torch's kernels
        didx = _device_indices(t, indices)
        o = torch.empty((didx.numel(), *_row_shape(t)), dtype=t.dtype, device=t.device) if out is None else out
        o = _gpu_rows_arg(t, o, didx.numel(), "out")
        torch.index_select(t, 0, didx, out=o)
        return o
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
        Wrong shape or device of indices / values.
    RuntimeError
        Library finalized or communicator destroyed.
    """
    _check_target(t, "scatter")
    if isinstance(t, _WmTensor) and t.is_gpu:
        _gpu_scatter(t, indices, values)
        return
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        didx = _device_indices(t, indices)
        t.index_copy_(0, didx.to(torch.int64), _gpu_rows_arg(t, values, didx.numel(), "values"))
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
        return torch.empty((x.shape[0], x.shape[1] * x.element_size()), dtype=torch.uint8, device=x.device)
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


# -- GPU-resident CHUNKED / NCCL tensors: CUDA kernels on torch's current stream -----------


def _device_indices(t: Any, indices: Any) -> torch.Tensor:
    """Validated 1-D int32/int64 indices on ``t.device`` (CPU indices are checked natively
    and copied; device indices are checked with one reduction and one host sync)."""
    x = as_tensor(indices, "indices")
    if x.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be an integer array of dtype int64 or int32, got {x.dtype}")
    if x.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(x.shape)}")
    n = int(t.shape[0])
    if x.device.type == "cpu":
        return _indices(x, n).to(t.device)
    if x.device != t.device:
        raise ValueError(f"indices must be on the CPU or on {t.device} (the tensor's device), got {x.device}")
    x = x.contiguous()
    if x.numel():
        bad = (x < 0) | (x >= n)
        if bool(bad.any()):
            pos = int(torch.nonzero(bad)[0, 0])
            raise IndexError(f"index {int(x[pos])} at position {pos} is out of range for {n} rows")
    return x


def _gpu_rows_arg(t: Any, x: Any, n: int, name: str) -> torch.Tensor:
    want = (n, *_row_shape(t))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor on {t.device}, got {type(x).__name__}")
    if x.dtype != t.dtype:
        raise TypeError(f"{name} must have dtype {t.dtype} (the tensor's), got {x.dtype}")
    if x.device != t.device:
        raise ValueError(f"{name} must be on {t.device} (the tensor's device), got {x.device}")
    if tuple(x.shape) != want:
        raise ValueError(f"{name} must have shape {want} (one row per index), got {tuple(x.shape)}")
    return x


def _run(t: _WmTensor, table: Table, op: str, idx: torch.Tensor, data: torch.Tensor) -> None:
    if not idx.numel():
        return
    assert t._be is not None and t._dev is not None
    stream = t._be.stream(t._dev) if t._be.on_device else 0
    fn = table.gather if op == "gather" else table.scatter
    fn(int(idx.data_ptr()), idx.dtype == torch.int64, int(idx.numel()), int(data.data_ptr()), stream)


def _from_bytes(b: torch.Tensor, t: _WmTensor, n: int) -> torch.Tensor:
    if b.numel() == 0:
        return torch.empty((n, *_row_shape(t)), dtype=t.dtype, device=b.device)
    return b.contiguous().view(t.dtype).reshape(n, *_row_shape(t))


def _gpu_route(t: NCCLTensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    comm = t.comm
    gidx = idx.to(torch.int64) + t._row_offset
    owner = torch.div(gidx, t._rpr, rounding_mode="floor")
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=comm.size)
    recv_counts = comm.exchange_counts(send_counts)
    sc, rc = send_counts.tolist(), recv_counts.tolist()
    ridx = comm.all_to_all(gidx[order], sc, rc) - t._first
    return order, ridx, sc, rc


def _gpu_gather(t: _WmTensor, indices: Any, out: torch.Tensor | None) -> torch.Tensor:
    idx = _device_indices(t, indices)
    n = idx.numel()
    o = torch.empty((n, *_row_shape(t)), dtype=t.dtype, device=t.device) if out is None else out
    o = _gpu_rows_arg(t, o, n, "out")
    if not o.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {tuple(o.shape)}")
    assert t._table is not None
    if isinstance(t, ChunkedTensor):
        _run(t, t._table, "gather", idx.to(torch.int64) + t._row_offset if t._row_offset else idx, o)
    elif isinstance(t, NCCLTensor):
        if t.comm.size == 1:
            _run(t, t._table, "gather", idx.to(torch.int64) + t._row_offset, o)
            return o
        order, ridx, sc, rc = _gpu_route(t, idx)
        rows = torch.empty((ridx.numel(), *_row_shape(t)), dtype=t.dtype, device=t.device)
        _run(t, t._table, "gather", ridx, rows)
        back = t.comm.all_to_all(_as_bytes(rows), rc, sc)
        if o.numel():
            o.index_copy_(0, order, _from_bytes(back, t, n))
    return o


def _gpu_scatter(t: _WmTensor, indices: Any, values: Any) -> None:
    idx = _device_indices(t, indices)
    vals = _gpu_rows_arg(t, values, idx.numel(), "values").contiguous()
    assert t._table is not None
    if isinstance(t, ChunkedTensor):
        _run(t, t._table, "scatter", idx.to(torch.int64) + t._row_offset if t._row_offset else idx, vals)
    elif isinstance(t, NCCLTensor):
        if t.comm.size == 1:
            _run(t, t._table, "scatter", idx.to(torch.int64) + t._row_offset, vals)
            return
        order, ridx, sc, rc = _gpu_route(t, idx)
        sent = _as_bytes(vals)[order] if vals.numel() else _as_bytes(vals)
        recv = t.comm.all_to_all(sent, sc, rc)
        _run(t, t._table, "scatter", ridx, _from_bytes(recv, t, ridx.numel()))


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
    """The tensor as seen from ``device`` (WholeGraph's ``get_tensor_view``).

    - ``'cpu'``: host-memory tensors themselves (HOST tensors are normal CPU tensors;
      host CHUNKED / NCCL objects); GPU-resident tensors have no CPU view.
    - ``'cuda'`` / ``'cuda:N'``: a HOST tensor (or any view of one) becomes a CUDA tensor
      over the same shared pages: the segment is page-locked and mapped for the GPUs
      with ``cudaHostRegister`` (once per process, undone when the last such view dies);
      kernels read and write host memory over PCIe/NVLink, and writes are shared with
      every rank exactly like the CPU tensor's. A host CHUNKED tensor becomes a
      :class:`ChunkedTensor` whose ops run the CUDA kernels over its mapped chunks.
      GPU-resident tensors are returned as they are on their own device.

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
    _check_target(t, "get_tensor_view")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"get_tensor_view: device must be 'cpu', 'cuda[:N]' or a torch.device, got {device!r}") from e
    if dev.type == "cpu":
        if (isinstance(t, torch.Tensor) and t.device.type != "cpu") or (isinstance(t, _WmTensor) and t.is_gpu):
            raise ValueError(
                f"get_tensor_view: this tensor lives on {t.device} and has no CPU view (copy rows with .cpu())"
            )
        return t
    if dev.type != "cuda":
        raise ValueError(f"get_tensor_view: unsupported device {dev}")
    _require_gpu(f"get_tensor_view(t, {str(device)!r})")
    be = _gpu.backend()
    dev = be.resolve(dev)
    if isinstance(t, _WmTensor) and t.is_gpu:
        if t.device != dev:
            raise ValueError(f"get_tensor_view: the tensor lives on {t.device}, not {dev}")
        return t
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        if t.device != dev:
            raise ValueError(f"get_tensor_view: the tensor lives on {t.device}, not {dev}")
        return t
    if isinstance(t, ChunkedTensor):
        return _chunked_cuda_view(t, dev)
    if isinstance(t, NCCLTensor):
        raise ValueError(
            "get_tensor_view: a host NCCL tensor's rows are private to each rank; create it with "
            "device='cuda' for GPU-resident rows"
        )
    info = _info(t)
    if info is None or not isinstance(info.segment, Segment):
        raise ValueError("get_tensor_view: a GPU view needs a HOST tensor made by create_wm_tensor (use .to(device))")
    return _host_cuda_view(t, info, dev)


def _host_cuda_view(t: torch.Tensor, info: HostInfo, dev: torch.device) -> torch.Tensor:
    """A CUDA tensor over the pages of ``t``'s shared segment (same offset and strides)."""
    seg = info.segment
    be = _gpu.backend()
    m = _gpu.host_mapping(int(seg.address), int(seg.size), dev, seg)
    raw = be.as_tensor(m.device_ptr, int(seg.size), dev, m)
    item = t.element_size()
    offset = int(t.data_ptr()) - int(seg.address)
    assert 0 <= offset <= int(seg.size) and offset % item == 0
    flat = raw[: int(seg.size) // item * item].view(t.dtype)
    view = flat.as_strided(tuple(t.shape), tuple(t.stride()), offset // item)
    register_host(view, dataclasses.replace(info))
    return view


def _chunked_cuda_view(t: ChunkedTensor, dev: torch.device) -> ChunkedTensor:
    """The host chunks mapped for ``dev``: same rows, ops on CUDA kernels."""
    be = _gpu.backend()
    gpu = _gpu.GpuChunks(be, dev, None)
    gpu.closed = True  # nothing imported over IPC
    for seg in t._segments:
        m = _gpu.host_mapping(int(seg.address), int(seg.size), dev, seg)
        gpu.mappings.append(m)
        gpu.addresses.append(m.device_ptr)
    view = object.__new__(ChunkedTensor)
    view.__dict__.update(t.__dict__)
    view._gpu, view._dev, view._be = gpu, dev, be
    view._table = view._make_table()
    return view
