"""The tensor types that are wholemem objects: :class:`ChunkedTensor` and :class:`NCCLTensor`.

Each behaves like pylibwholegraph's ``WholeMemoryTensor``: ``gather``, ``scatter``,
``get_sub_tensor``, ``get_local_tensor`` and ``get_tensor_view`` are methods, each
calling one native row table built once when the tensor was made. A sub-tensor shares
that table and only narrows its window (rows ``[row0, row0 + nrows)``, columns
``[col0, col0 + ncols)``), so making a view costs nothing. HOST and DEVICE tensors are
plain ``torch.Tensor`` objects (``_plain``); creation is in ``_create``.
"""

from __future__ import annotations

import copy
import enum
from typing import Any

import torch

from . import _checks, _gpu, _hostmap, _lib, _plain
from ._devmem import NodeChunks
from ._layout import Layout, Stride, local_range, rows_per_rank
from ._route import from_bytes, return_rows, route, send_rows
from ._wholemem import Table


class WmTensorType(enum.Enum):
    """Where a wholemem tensor lives.

    HOST: one shared-memory segment per node, a normal ``torch.Tensor`` on every rank.
    DEVICE: one GPU allocation shared over CUDA IPC, a normal CUDA tensor on every rank.
    CHUNKED: one chunk per rank, every rank maps every chunk.
    NCCL (alias DISTRIBUTED): each rank owns its rows privately; remote rows move by all-to-all.
    """

    HOST = 0
    DEVICE = 1
    CHUNKED = 2
    NCCL = 3
    DISTRIBUTED = 3  # alias of NCCL


def check_ranges(shape: tuple[int, ...], starts: Any, ends: Any) -> list[tuple[int, int]]:
    """``(start, end)`` per dimension of ``shape`` from the successor's ``starts`` / ``ends``
    (missing entries: the whole dimension; end -1: to the end).

    Raises
    ------
    TypeError
        starts / ends not lists of ints.
    ValueError
        More entries than dimensions, or a range outside the tensor.
    """
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


def _table(
    addresses: list[int], rows_per_chunk: int, nrows: int, layout: Layout, device: torch.device | None, be: Any
) -> Table:
    """The native row table of a whole tensor: host addresses (CPU ops), or device-visible
    addresses with CUDA kernels on ``device`` when the backend computes on a GPU."""
    on_device = be is not None and be.on_device and device is not None
    index = int(device.index) if on_device and device is not None and device.index is not None else -1
    return Table(
        addresses,
        rows_per_chunk,
        nrows,
        layout.ncols,
        layout.row_stride,
        layout.col_stride,
        layout.code,
        on_device,
        index,
    )


class WmTensor:
    """Common part of :class:`ChunkedTensor` and :class:`NCCLTensor`: a (sub-)view of rows
    ``[row0, row0 + shape[0])`` and, for 2-D tensors, columns ``[col0, col0 + shape[1])``
    of a row-partitioned base tensor."""

    _type: WmTensorType

    def __init__(
        self, comm: Any, layout: Layout, table: Table, device: torch.device | None, be: _gpu.Backend | None
    ) -> None:
        self.comm = comm
        self._base = layout
        self._table = table
        #: GPU-resident tensors (and GPU views): their device and backend; None: host memory, CPU ops
        self._dev = device
        self._be = be
        self._row0, self._col0 = 0, 0
        self._shape = layout.shape
        self._rpr = rows_per_rank(layout.nrows, comm.size)

    # -- tensor-like metadata --------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """Shape of this (view of the) tensor."""
        return torch.Size(self._shape)

    @property
    def stride(self) -> Stride:
        """Strides in elements (callable too: ``t.stride()`` / ``t.stride(0)``)."""
        return Stride(self._base.stride)

    @property
    def dtype(self) -> torch.dtype:
        """Element type."""
        return self._base.dtype

    @property
    def device(self) -> torch.device:
        """Where the elements are read and written: the CPU, or this rank's GPU."""
        return torch.device("cpu") if self._dev is None else self._dev

    @property
    def is_gpu(self) -> bool:
        """Whether ops on this tensor run on a GPU (``device='cuda'`` at creation, or a
        ``get_tensor_view(t, 'cuda')`` of a host CHUNKED tensor)."""
        return self._dev is not None

    @property
    def tensor_type(self) -> WmTensorType:
        """The :class:`WmTensorType` of this tensor."""
        return self._type

    def dim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    def size(self, dim: int | None = None) -> Any:
        """``torch.Size`` of the tensor, or one dimension."""
        return self.shape if dim is None else self._shape[dim]

    def numel(self) -> int:
        """Number of elements."""
        return int(torch.Size(self._shape).numel())

    def get_ptr(self) -> int:
        """Address of the native row table of the whole tensor (shared by its views).

        Raises
        ------
        RuntimeError
            If the communicator was destroyed or the library finalized.
        """
        self.check_alive("get_ptr")
        return int(self._table.address)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shape={tuple(self._shape)}, stride={tuple(self._base.stride)}, "
            f"dtype={self.dtype}, device={self.device}, rank={self.comm.rank}/{self.comm.size})"
        )

    # -- operations (the public functions of the same names call these) --------------
    def gather(self, indices: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``indices`` of this tensor: ``out[i] = self[indices[i]]`` (see :func:`wholemem.gather`).

        Raises
        ------
        IndexError, TypeError, ValueError, RuntimeError
            As :func:`wholemem.gather`.
        """
        raise NotImplementedError  # pragma: no cover - overridden

    def scatter(self, indices: Any, values: Any) -> None:
        """Write ``values[i]`` into row ``indices[i]`` (see :func:`wholemem.scatter`).

        Raises
        ------
        IndexError, TypeError, ValueError, RuntimeError
            As :func:`wholemem.scatter`.
        """
        raise NotImplementedError  # pragma: no cover - overridden

    def get_local_tensor(self) -> tuple[torch.Tensor, int]:
        """This rank's rows of this (view of the) tensor and the index of the first one
        (see :func:`wholemem.get_local_tensor`).

        Raises
        ------
        RuntimeError
            Library finalized or communicator destroyed.
        """
        self.check_alive("get_local_tensor")
        part, first = self._local_part()
        a = max(first, self._row0)
        b = max(a, min(first + part.shape[0], self._row0 + self._shape[0]))
        local = part[a - first : b - first]
        if self.dim() >= 2 and (self._col0 != 0 or self._shape[1] != self._base.shape[1]):
            local = local[:, self._col0 : self._col0 + self._shape[1]]
        return local, min(a - self._row0, self._shape[0])

    def get_sub_tensor(self, starts: Any, ends: Any) -> Any:
        """A view of rows (and, for 2-D tensors, columns) ``[starts[d], ends[d])``; -1 = to
        the end (see :func:`wholemem.get_sub_tensor`). Allocates nothing.

        Raises
        ------
        TypeError
            starts / ends not lists of ints.
        ValueError
            A range outside the tensor, or a column range on a tensor with more than 2 dims.
        """
        self.check_alive("get_sub_tensor")
        rng = check_ranges(self._shape, starts, ends)
        if any(r != (0, size) for r, size in zip(rng[2:], self._shape[2:])):
            raise ValueError("get_sub_tensor: only rows and (for 2-D tensors) columns can be restricted")
        if self.dim() > 2 and rng[1] != (0, self._shape[1]):
            raise ValueError("get_sub_tensor: column ranges need a 2-D tensor")
        view = copy.copy(self)  # shares the table, storage and communicator
        view._row0 = self._row0 + rng[0][0]
        shape = list(self._shape)
        shape[0] = rng[0][1] - rng[0][0]
        if self.dim() == 2:
            view._col0 = self._col0 + rng[1][0]
            shape[1] = rng[1][1] - rng[1][0]
        view._shape = tuple(shape)
        return view

    def get_tensor_view(self, device: Any) -> Any:
        """This tensor as seen from ``device`` (see :func:`wholemem.get_tensor_view`).

        Raises
        ------
        TypeError, ValueError, RuntimeError
            As :func:`wholemem.get_tensor_view`.
        """
        self.check_alive("get_tensor_view")
        dev = _plain.resolve_cuda(device, "get_tensor_view", self.comm)
        if dev is None:
            if self.is_gpu:
                raise _plain.no_cpu_view(self.device)
            return self
        if self.is_gpu:
            if self.device != dev:
                raise ValueError(f"get_tensor_view: the tensor lives on {self.device}, not {dev}")
            return self
        return self._cuda_view(dev)

    # -- shared machinery -------------------------------------------------------------
    def check_alive(self, what: str = "operation") -> None:
        """Raise ``RuntimeError`` if the library was finalized or the communicator destroyed.

        Raises
        ------
        RuntimeError
            After :func:`wholemem.finalize_lib` or ``comm.destroy()``.
        """
        _lib.require_init(what)
        self.comm.check_alive(what)

    @property
    def _row_shape(self) -> tuple[int, ...]:
        return tuple(self._shape[1:])

    @property
    def _ncols(self) -> int:
        return int(torch.Size(self._shape[1:]).numel())

    def _indices(self, indices: Any) -> torch.Tensor:
        """Index dtype / shape / device checked, on this tensor's device; the range is checked
        by the native op (the first bad index named) before anything is read or written."""
        return _checks.indices(indices, self.device, None)

    def _run(self, op: str, idx: torch.Tensor, data: torch.Tensor, row0: int, nrows: int) -> None:
        """One native row op on the window rows ``[row0, row0 + nrows)`` x this view's columns."""
        if not idx.numel():
            return
        stream = 0
        if self._table.on_device:
            assert self._be is not None and self._dev is not None
            stream = self._be.stream(self._dev)
        fn = self._table.gather if op == "gather" else self._table.scatter
        fn(
            int(idx.data_ptr()),
            idx.dtype == torch.int64,
            int(idx.numel()),
            int(data.data_ptr()),
            stream,
            row0=row0,
            nrows=nrows,
            col0=self._col0,
            ncols=self._ncols,
        )

    def _local_part(self) -> tuple[torch.Tensor, int]:
        """This rank's rows of the base tensor as a tensor, and the first base row."""
        raise NotImplementedError  # pragma: no cover - overridden

    def _cuda_view(self, device: torch.device) -> Any:
        raise NotImplementedError  # pragma: no cover - overridden


class ChunkedTensor(WmTensor):
    """A tensor stored as one chunk per rank, every chunk mapped by every rank.

    Rows ``[r*k, (r+1)*k)`` (``k = ceil(N/size)``) live in rank r's chunk; any rank reads
    and writes any row directly through the chunk table. Host chunks are shared-memory
    segments; GPU chunks (``device='cuda'``) are device allocations mapped by the peers
    over CUDA IPC, and the ops run CUDA kernels on this rank's GPU.

    Made by :func:`wholemem.create_wm_tensor` (``WmTensorType.CHUNKED``); not constructed directly.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The ranks that share it.
    layout : Layout
        Shape, stride and dtype.
    segments : list
        Every rank's host chunk (shared-memory segments), in rank order.
    gpu : NodeChunks, optional
        The GPU chunks, when the tensor lives in device memory.
    mappings : list of HostMapping, optional
        The host chunks mapped for a GPU (a CUDA view of a host tensor).
    """

    _type = WmTensorType.CHUNKED

    def __init__(
        self,
        comm: Any,
        layout: Layout,
        segments: list[Any],
        gpu: NodeChunks | None = None,
        mappings: list[_hostmap.HostMapping] | None = None,
    ) -> None:
        on_gpu = gpu is not None or mappings is not None
        be = _gpu.backend() if on_gpu else None
        device = None
        if gpu is not None:
            device, be = gpu.device, gpu.backend
            addresses = list(gpu.addresses)
        elif mappings is not None:
            device = mappings[0].device
            addresses = [m.device_ptr for m in mappings]
        else:
            addresses = [int(s.address) for s in segments]
        table = _table(addresses, rows_per_rank(layout.nrows, comm.size), layout.nrows, layout, device, be)
        super().__init__(comm, layout, table, device, be)
        self._segments = segments
        self._gpu = gpu  # kept alive by the tensor and its views
        self._mappings = mappings

    def gather(self, indices: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """Read rows ``indices``: ``out[i] = self[indices[i]]`` (see :func:`wholemem.gather`).

        Parameters
        ----------
        indices : torch.Tensor or numpy.ndarray
            1-D int64 or int32 row indices in ``[0, shape[0])``.
        out : torch.Tensor, optional
            Contiguous ``[len(indices), *shape[1:]]`` tensor of this dtype, on this device.

        Returns
        -------
        torch.Tensor
            The rows (``out`` when given).

        Raises
        ------
        IndexError, TypeError, ValueError, RuntimeError
            As :func:`wholemem.gather`.
        """
        self.check_alive("gather")
        idx = self._indices(indices)
        o = _checks.out_rows(out, idx.numel(), self._row_shape, self.dtype, self.device)
        self._run("gather", idx, o, self._row0, self._shape[0])
        return o

    def scatter(self, indices: Any, values: Any) -> None:
        """Write ``values[i]`` into row ``indices[i]`` (see :func:`wholemem.scatter`).

        Parameters
        ----------
        indices : torch.Tensor or numpy.ndarray
            1-D int64 or int32 row indices in ``[0, shape[0])``.
        values : torch.Tensor or numpy.ndarray
            ``[len(indices), *shape[1:]]`` of this dtype, on this device.

        Raises
        ------
        IndexError, TypeError, ValueError, RuntimeError
            As :func:`wholemem.scatter`.
        """
        self.check_alive("scatter")
        idx = self._indices(indices)
        vals = _checks.rows_in(values, "values", idx.numel(), self._row_shape, self.dtype, self.device).contiguous()
        self._run("scatter", idx, vals, self._row0, self._shape[0])

    def _local_part(self) -> tuple[torch.Tensor, int]:
        lo, hi = local_range(self._base.nrows, self.comm.size, self.comm.rank)
        nbytes = max(self._base.elems(self._rpr) * self._base.itemsize, 1)
        if self._gpu is not None:
            raw = self._gpu.chunk_bytes(self.comm.rank, nbytes)
        elif self._mappings is not None:
            m = self._mappings[self.comm.rank]
            assert self._be is not None and self._dev is not None
            raw = self._be.as_tensor(m.device_ptr, m.nbytes, self._dev, m)
        else:
            raw = torch.frombuffer(self._segments[self.comm.rank], dtype=torch.uint8)
        return self._base.rows_view(raw, hi - lo), lo

    def _cuda_view(self, device: torch.device) -> ChunkedTensor:
        """The host chunks mapped for ``device``: same rows, ops on CUDA kernels."""
        maps = [_hostmap.host_mapping(int(s.address), int(s.size), device, s) for s in self._segments]
        view = ChunkedTensor(self.comm, self._base, self._segments, mappings=maps)
        view._row0, view._col0, view._shape = self._row0, self._col0, self._shape
        return view


class NCCLTensor(WmTensor):
    """A tensor whose rows are partitioned over the ranks in private memory.

    Gather and scatter are collective: indices are bucketed by owner and exchanged with
    all-to-all over the communicator's process group (gloo for host memory, the device
    group for GPU-resident tensors; works across nodes).

    Made by :func:`wholemem.create_wm_tensor` (``WmTensorType.NCCL``); not constructed directly.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The ranks over which the rows are partitioned.
    layout : Layout
        Shape, stride and dtype.
    device : torch.device, optional
        The GPU holding this rank's rows; host memory when None.
    """

    _type = WmTensorType.NCCL

    def __init__(self, comm: Any, layout: Layout, device: torch.device | None = None) -> None:
        lo, hi = local_range(layout.nrows, comm.size, comm.rank)
        rpr = rows_per_rank(layout.nrows, comm.size)
        be = _gpu.backend() if device is not None else None
        storage = torch.zeros(max(layout.elems(rpr), 1), dtype=layout.dtype, device=device)
        local = storage.as_strided((hi - lo, *layout.row_shape), layout.stride)
        n = hi - lo
        table = _table([int(local.data_ptr())], max(1, n), n, layout, device, be)
        super().__init__(comm, layout, table, device, be)
        self._local = local
        self._first = lo

    def _checked_indices(self, indices: Any) -> torch.Tensor:
        """Indices range-checked before they are sent anywhere."""
        return _checks.indices(indices, self.device, self._shape[0])

    def gather(self, indices: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """Read rows ``indices`` (collective: every rank calls it with its own indices).

        Parameters
        ----------
        indices : torch.Tensor or numpy.ndarray
            1-D int64 or int32 row indices in ``[0, shape[0])``.
        out : torch.Tensor, optional
            Contiguous ``[len(indices), *shape[1:]]`` tensor of this dtype, on this device.

        Returns
        -------
        torch.Tensor
            The rows (``out`` when given).

        Raises
        ------
        IndexError, TypeError, ValueError, RuntimeError
            As :func:`wholemem.gather`.
        """
        self.check_alive("gather")
        if self.comm.size == 1:  # every row is local: one native op on the window
            idx = self._indices(indices)
            o = _checks.out_rows(out, idx.numel(), self._row_shape, self.dtype, self.device)
            self._run("gather", idx, o, self._row0, self._shape[0])
            return o
        idx = self._checked_indices(indices)
        o = _checks.out_rows(out, idx.numel(), self._row_shape, self.dtype, self.device)
        r, wanted = route(self.comm, idx.to(torch.int64) + self._row0, self._rpr)
        rows = torch.empty((wanted.numel(), *self._row_shape), dtype=self.dtype, device=self.device)
        self._run("gather", wanted - self._first, rows, 0, self._local.shape[0])
        back = return_rows(self.comm, r, rows)
        if o.numel():
            if self.is_gpu:
                o.index_copy_(0, r.order, from_bytes(back, self.dtype, idx.numel(), self._row_shape))
            else:
                # o[order[i]] = back[i], done as a row gather o[j] = back[inv[j]] (prefetching, threaded)
                inv = torch.empty_like(r.order)
                inv[r.order] = torch.arange(r.order.numel())
                table = _plain.plain_table(back)
                assert table is not None
                table.gather(int(inv.data_ptr()), True, int(inv.numel()), int(o.data_ptr()))
        return o

    def scatter(self, indices: Any, values: Any) -> None:
        """Write ``values[i]`` into row ``indices[i]`` (collective: every rank calls it).

        Parameters
        ----------
        indices : torch.Tensor or numpy.ndarray
            1-D int64 or int32 row indices in ``[0, shape[0])``.
        values : torch.Tensor or numpy.ndarray
            ``[len(indices), *shape[1:]]`` of this dtype, on this device.

        Raises
        ------
        IndexError, TypeError, ValueError, RuntimeError
            As :func:`wholemem.scatter`.
        """
        self.check_alive("scatter")
        if self.comm.size == 1:
            idx = self._indices(indices)
            vals = _checks.rows_in(values, "values", idx.numel(), self._row_shape, self.dtype, self.device)
            self._run("scatter", idx, vals.contiguous(), self._row0, self._shape[0])
            return
        idx = self._checked_indices(indices)
        vals = _checks.rows_in(values, "values", idx.numel(), self._row_shape, self.dtype, self.device)
        r, wanted = route(self.comm, idx.to(torch.int64) + self._row0, self._rpr)
        received = send_rows(self.comm, r, vals)
        rows = from_bytes(received, self.dtype, wanted.numel(), self._row_shape)
        self._run("scatter", wanted - self._first, rows, 0, self._local.shape[0])

    def _local_part(self) -> tuple[torch.Tensor, int]:
        return self._local, self._first

    def _cuda_view(self, device: torch.device) -> Any:
        raise ValueError(
            "get_tensor_view: a host NCCL tensor's rows are private to each rank; create it with "
            "device='cuda' for GPU-resident rows"
        )
