"""Tensor types and collective creation: HOST, DEVICE, CHUNKED, NCCL (= DISTRIBUTED)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _gpu, _lib
from ._comm import Communicator
from ._layout import Layout, Stride, local_range, rows_per_rank
from ._wholemem import Segment, Table


class WmTensorType(enum.Enum):
    """Where a wholemem tensor lives.

    HOST: one shared-memory segment per node, a normal ``torch.Tensor`` on every rank.
    DEVICE: one GPU allocation shared over CUDA IPC (needs a GPU).
    CHUNKED: one shared-memory chunk per rank, every rank maps every chunk.
    NCCL (alias DISTRIBUTED): each rank owns its rows privately; remote rows move by all-to-all.
    """

    HOST = 0
    DEVICE = 1
    CHUNKED = 2
    NCCL = 3
    DISTRIBUTED = 3  # alias of NCCL


@dataclass
class HostInfo:
    """What wholemem remembers about a HOST / DEVICE tensor (see :func:`host_info`)."""

    comm: Communicator
    layout: Layout  #: of the whole tensor
    segment: Any  #: keeps the mapping alive
    row_offset: int = 0  #: first row of this view in the whole tensor


# HOST / DEVICE tensors are plain torch tensors; their communicator and layout live in a
# registry keyed weakly by tensor identity (an attribute on the tensor would break
# torch.save / deepcopy, which would try to pickle the process group).
_HOST_INFO: WeakIdKeyDictionary = WeakIdKeyDictionary()


def register_host(t: torch.Tensor, info: HostInfo) -> None:
    """Remember ``info`` for ``t`` as long as ``t`` lives."""
    _HOST_INFO[t] = info


def host_info(t: torch.Tensor) -> HostInfo | None:
    """The :class:`HostInfo` of a tensor made by wholemem, or None for any other tensor."""
    return _HOST_INFO.get(t)


def _frombuffer(seg: Any, layout: Layout, rows: int) -> torch.Tensor:
    """A strided tensor of ``rows`` rows over a mapped segment (keeps the mapping alive)."""
    return _rows_view(torch.frombuffer(seg, dtype=torch.uint8), layout, rows)


def _rows_view(raw: torch.Tensor, layout: Layout, rows: int) -> torch.Tensor:
    """A strided tensor of ``rows`` rows over the uint8 tensor ``raw`` (same device)."""
    flat = raw[: layout.elems(rows) * layout.itemsize].view(layout.dtype)
    return flat.as_strided((rows, *layout.row_shape), layout.stride)


class _WmTensor:
    """Common part of :class:`ChunkedTensor` and :class:`NCCLTensor`: a (sub-)view of rows
    ``[row_offset, row_offset + shape[0])`` and, for 2-D tensors, columns
    ``[col_offset, col_offset + shape[1])`` of a row-partitioned base tensor."""

    _type: WmTensorType

    def __init__(self, comm: Communicator, layout: Layout) -> None:
        self.comm = comm
        self._base = layout
        self._row_offset = 0
        self._col_offset = 0
        self._shape = layout.shape
        self._rpr = rows_per_rank(layout.nrows, comm.size)
        self._table: Table | None = None
        #: GPU-resident tensors: their device and backend (None: host memory, CPU ops)
        self._dev: torch.device | None = None
        self._be: _gpu.Backend | None = None

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
        """Where the elements live: the CPU, or the GPU of a GPU-resident tensor."""
        return torch.device("cpu") if self._dev is None else self._dev

    @property
    def is_gpu(self) -> bool:
        """Whether ops on this tensor run on a GPU (``device='cuda'`` at creation, or a
        ``get_tensor_view(t, 'cuda')`` of a CHUNKED tensor)."""
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
        """Address of the native row table behind this tensor (for custom native ops).

        Raises
        ------
        RuntimeError
            If the communicator was destroyed or the library finalized.
        """
        self._check("get_ptr")
        assert self._table is not None
        return int(self._table.address)

    def _check(self, what: str) -> None:
        self.comm.check_alive(what)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shape={tuple(self._shape)}, stride={tuple(self._base.stride)}, "
            f"dtype={self.dtype}, rank={self.comm.rank}/{self.comm.size})"
        )

    # -- geometry used by the ops ----------------------------------------------------
    @property
    def _view_cols(self) -> int:
        return int(torch.Size(self._shape[1:]).numel())

    def _col_byte_offset(self) -> int:
        return self._col_offset * self._base.col_stride * self._base.itemsize

    def _sub(self, rows: tuple[int, int], cols: tuple[int, int] | None) -> Any:
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view._row_offset = self._row_offset + rows[0]
        shape = list(self._shape)
        shape[0] = rows[1] - rows[0]
        if cols is not None:
            view._col_offset = self._col_offset + cols[0]
            shape[1] = cols[1] - cols[0]
        view._shape = tuple(shape)
        view._table = view._make_table()
        return view

    def _make_table(self) -> Table:  # pragma: no cover - overridden
        raise NotImplementedError

    def _table_of(self, addresses: list[int], rows_per_chunk: int, nrows: int) -> Table:
        b = self._base
        on_device = self._be is not None and self._be.on_device
        index = -1 if self._dev is None or self._dev.index is None else int(self._dev.index)
        off = self._col_byte_offset()
        return Table(
            [a + off for a in addresses],
            rows_per_chunk,
            nrows,
            self._view_cols,
            b.row_stride,
            b.col_stride,
            b.code,
            on_device,
            index if on_device else -1,
        )

    def _local_part(self) -> tuple[torch.Tensor, int]:
        """This rank's rows of the base tensor as a tensor, and the first base row."""
        raise NotImplementedError  # pragma: no cover - overridden


class ChunkedTensor(_WmTensor):
    """A tensor stored as one chunk per rank, every chunk mapped by every rank.

    Rows ``[r*k, (r+1)*k)`` (``k = ceil(N/size)``) live in rank r's chunk; any rank reads
    and writes any row directly through the chunk table. Host chunks are shared-memory
    segments; GPU chunks (``device='cuda'``) are ``cudaMalloc`` allocations mapped by
    the peers over CUDA IPC, and the ops run CUDA kernels.
    """

    _type = WmTensorType.CHUNKED

    def __init__(
        self, comm: Communicator, layout: Layout, segments: list[Any], gpu: _gpu.GpuChunks | None = None
    ) -> None:
        super().__init__(comm, layout)
        self._segments = segments
        self._gpu = gpu
        if gpu is not None:
            self._dev, self._be = gpu.device, gpu.backend
        self._table = self._make_table()

    def _make_table(self) -> Table:
        gpu = self._gpu
        addresses = list(gpu.addresses) if gpu is not None else [int(s.address) for s in self._segments]
        return self._table_of(addresses, self._rpr, self._base.nrows)

    def _local_part(self) -> tuple[torch.Tensor, int]:
        lo, hi = local_range(self._base.nrows, self.comm.size, self.comm.rank)
        if self._gpu is not None and self._gpu.own is not None:
            return _rows_view(self._gpu.own_bytes(), self._base, hi - lo), lo
        if self._gpu is not None:  # a GPU view of host chunks
            m = self._gpu.mappings[self.comm.rank]
            raw = self._gpu.backend.as_tensor(m.device_ptr, m.nbytes, self._gpu.device, m)
            return _rows_view(raw, self._base, hi - lo), lo
        return _frombuffer(self._segments[self.comm.rank], self._base, hi - lo), lo


class NCCLTensor(_WmTensor):
    """A tensor whose rows are partitioned over the ranks in private memory.

    Gather and scatter are collective: indices are bucketed by owner and exchanged with
    all-to-all over the communicator's process group (gloo for host memory, NCCL for
    GPU-resident tensors; works across nodes).
    """

    _type = WmTensorType.NCCL

    def __init__(self, comm: Communicator, layout: Layout, device: torch.device | None = None) -> None:
        super().__init__(comm, layout)
        lo, hi = local_range(layout.nrows, comm.size, comm.rank)
        if device is not None:
            self._dev, self._be = device, _gpu.backend()
        storage = torch.zeros(max(layout.elems(self._rpr), 1), dtype=layout.dtype, device=device)
        self._local = storage.as_strided((hi - lo, *layout.row_shape), layout.stride)
        self._first = lo
        self._table = self._make_table()

    def _make_table(self) -> Table:
        n = self._local.shape[0]
        return self._table_of([int(self._local.data_ptr())], max(1, n), n)

    def _local_part(self) -> tuple[torch.Tensor, int]:
        return self._local, self._first


# -- creation ---------------------------------------------------------------------------


def _require_gpu(what: str) -> None:
    """Raise ``RuntimeError`` unless GPU paths can run here (CUDA build and a visible GPU)."""
    _gpu.backend().require(what)


def _device_of(tensor_type: WmTensorType, device: Any) -> torch.device | None:
    """Where a new tensor lives: None = host memory (CPU ops), else the resolved GPU."""
    if device is None:
        if tensor_type is not WmTensorType.DEVICE:
            return None
        device = "cuda"
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from e
    if dev.type == "cpu":
        if tensor_type is WmTensorType.DEVICE:
            raise ValueError("WmTensorType.DEVICE tensors live on a GPU; use HOST for a host-memory tensor")
        return None
    if dev.type != "cuda":
        raise ValueError(f"device must be a CPU or CUDA device, got {dev}")
    _require_gpu(f"WmTensorType.{tensor_type.name} on {dev}")
    return _gpu.backend().resolve(dev)


def _check_local(
    comm: Any, shape: Any, stride: Any, dtype: Any, tensor_type: Any, device: Any
) -> tuple[Layout, torch.device | None]:
    if not isinstance(tensor_type, WmTensorType):
        raise TypeError(f"tensor_type must be a wholemem.WmTensorType, got {tensor_type!r}")
    layout = Layout.make(shape, stride, dtype)
    if tensor_type in (WmTensorType.HOST, WmTensorType.CHUNKED, WmTensorType.DEVICE) and comm.num_nodes > 1:
        raise ValueError(
            f"WmTensorType.{tensor_type.name} shares memory within one node, but the communicator spans "
            f"{comm.num_nodes} nodes; use WmTensorType.NCCL (= DISTRIBUTED), which partitions the rows over "
            "the ranks of every node"
        )
    dev = _device_of(tensor_type, device)
    if dev is not None and tensor_type is WmTensorType.NCCL:
        problem = comm.device_group_problem(dev)
        if problem:
            raise ValueError(f"a GPU-resident WmTensorType.NCCL tensor needs NCCL collectives: {problem}")
    return layout, dev


def _raise_remote(errors: list[Any], rank: int) -> None:
    """Raise the first error reported by any rank (this rank's own exception type if it failed)."""
    for r, e in enumerate(errors):
        if e is not None:
            kind, msg = e
            if r == rank:
                raise {"TypeError": TypeError, "ValueError": ValueError, "OSError": OSError}.get(kind, RuntimeError)(
                    msg
                )
            raise RuntimeError(f"wholemem collective failed on rank {r}: {kind}: {msg}")


def _err(e: BaseException) -> tuple[str, str]:
    return (type(e).__name__ if isinstance(e, (TypeError, ValueError, OSError)) else "RuntimeError", str(e))


def create_wm_tensor(
    comm: Communicator,
    shape: Any,
    stride: Any = (),
    dtype: Any = torch.float32,
    tensor_type: WmTensorType = WmTensorType.CHUNKED,
    *,
    device: Any = None,
) -> Any:
    """Collective: create a tensor shared by (or partitioned over) the ranks of ``comm``.

    Same positional arguments and defaults as WholeGraph's
    ``create_wm_tensor(wm_comm, sizes, strides=[], tensor_dtype=torch.float32,
    wm_tensor_type=WmTensorType.CHUNKED)``.

    Parameters
    ----------
    comm : Communicator
        Every rank of it must call with the same arguments (checked).
    shape : sequence of int
        Size of each dimension; dim 0 (rows) is partitioned.
    stride : sequence of int, default ()
        Strides in elements, or empty for a contiguous layout.
    dtype : torch.dtype, default torch.float32
        float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8 or bool.
    tensor_type : WmTensorType, default WmTensorType.CHUNKED
        HOST / DEVICE return a ``torch.Tensor``; CHUNKED a :class:`ChunkedTensor`;
        NCCL (= DISTRIBUTED) an :class:`NCCLTensor`. Zero-initialised.
    device : str or torch.device, optional (keyword)
        Where the elements live. Default: host memory for HOST / CHUNKED / NCCL, the
        current GPU for DEVICE. ``'cuda'`` / ``'cuda:N'`` (the original's placement):
        CHUNKED = one ``cudaMalloc`` chunk per rank mapped by every rank over CUDA IPC,
        ops on CUDA kernels; NCCL = rank-private GPU rows, all-to-all over NCCL; HOST =
        the shared segment mapped for the GPU (as :func:`get_tensor_view`), returned as a
        CUDA tensor. Needs a GPU; checked on every rank before any memory is allocated.

    Returns
    -------
    torch.Tensor or ChunkedTensor or NCCLTensor

    Raises
    ------
    TypeError
        ``comm`` is not a communicator, bad shape/stride entries or dtype.
    ValueError
        Invalid shape/stride, HOST/CHUNKED/DEVICE over several nodes, a DEVICE tensor on
        the CPU, or the arguments differ between ranks (raised on every rank).
    RuntimeError
        Library finalized, communicator destroyed, a GPU placement without a usable GPU
        (CPU-only machine or a build without nvcc: raised on every rank, before any
        allocation), or a failure on another rank.
    OSError
        Shared memory could not be created or mapped.
    """
    _lib.require_init("create_wm_tensor")
    if not isinstance(comm, Communicator):
        raise TypeError(f"comm must be a wholemem.Communicator, got {type(comm).__name__}")
    comm.check_alive("create_wm_tensor")
    layout: Layout | None = None
    err: tuple[str, str] | None = None
    dev: torch.device | None = None
    try:
        layout, dev = _check_local(comm, shape, stride, dtype, tensor_type, device)
    except (TypeError, ValueError, RuntimeError) as e:
        err = _err(e)
    # every rank learns every rank's arguments (or error): a mismatch raises everywhere, nobody hangs;
    # the device type is compared, not its index (each rank uses its own GPU)
    placement = "host" if dev is None else "gpu"
    mine = (layout.describe(), tensor_type.name, placement) if layout is not None else None
    allargs = comm.allgather_object((mine, err))
    _raise_remote([e for _, e in allargs], comm.rank)
    first = allargs[0][0]
    bad = [r for r, (a, _) in enumerate(allargs) if a != first]
    if bad:
        raise ValueError(
            f"create_wm_tensor must be called with the same arguments on every rank: rank 0 passed {first}, "
            f"rank {bad[0]} passed {allargs[bad[0]][0]}"
        )
    assert layout is not None
    if tensor_type is WmTensorType.HOST:
        host = _create_host(comm, layout)
        if dev is None:
            return host
        from ._ops import get_tensor_view

        return get_tensor_view(host, device)
    if tensor_type is WmTensorType.CHUNKED:
        if dev is not None:
            return ChunkedTensor(comm, layout, [], _create_gpu_chunks(comm, layout, dev))
        return ChunkedTensor(comm, layout, _create_chunks(comm, layout))
    if tensor_type is WmTensorType.NCCL:
        if dev is not None:
            comm.ensure_device_group(dev)  # collective, every rank gets here
        return NCCLTensor(comm, layout, dev)
    assert dev is not None
    return _create_device(comm, layout, dev)


def _create_host(comm: Communicator, layout: Layout) -> torch.Tensor:
    nbytes = max(layout.elems(layout.nrows) * layout.itemsize, 1)
    seg = None
    msg: Any = None
    if comm.local_rank == 0:
        try:
            seg = Segment.create(nbytes)
            msg = (seg.name, None)
        except (OSError, RuntimeError, ValueError) as e:
            msg = (None, _err(e))
    try:
        names = comm.allgather_object(msg)
        leader = comm.node_ranks[0]
        name, lerr = names[leader]
        _raise_remote([lerr if r == leader else None for r in range(comm.size)], comm.rank)
        err = None
        if seg is None:
            try:
                seg = Segment.open(name, nbytes)
            except (OSError, RuntimeError, ValueError) as e:
                err = _err(e)
        errors = comm.allgather_object(err)  # after this every rank of the node has mapped it
    finally:
        if seg is not None and comm.local_rank == 0:
            seg.unlink()
    _raise_remote(errors, comm.rank)
    t = _frombuffer(seg, layout, layout.nrows)
    register_host(t, HostInfo(comm, layout, seg))
    return t


def _create_chunks(comm: Communicator, layout: Layout) -> list[Any]:
    nbytes = max(layout.elems(rows_per_rank(layout.nrows, comm.size)) * layout.itemsize, 1)
    own = None
    segs: list[Any] = []
    try:
        try:
            own = Segment.create(nbytes)
            mine: Any = (own.name, None)
        except (OSError, RuntimeError, ValueError) as e:
            mine = (None, _err(e))
        names = comm.allgather_object(mine)
        _raise_remote([e for _, e in names], comm.rank)
        err = None
        try:
            segs = [own if r == comm.rank else Segment.open(n, nbytes) for r, (n, _) in enumerate(names)]
        except (OSError, RuntimeError, ValueError) as e:
            err = _err(e)
        errors = comm.allgather_object(err)  # every rank has mapped every chunk
    finally:
        if own is not None:
            own.unlink()
    _raise_remote(errors, comm.rank)
    return segs


def _create_gpu_chunks(comm: Communicator, layout: Layout, dev: torch.device) -> _gpu.GpuChunks:
    """Collective: every rank allocates its chunk on its GPU and exports a CUDA IPC handle;
    every rank maps every peer's chunk; the device chunk table is built from the mappings."""
    be = _gpu.backend()
    nbytes = max(layout.elems(rows_per_rank(layout.nrows, comm.size)) * layout.itemsize, 1)
    own: _gpu.DeviceAlloc | None = None
    mine: Any
    try:
        own = _gpu.DeviceAlloc(be, nbytes, dev)
        mine = (be.ipc_export(own.ptr), None)
    except (OSError, RuntimeError, ValueError) as e:
        mine = (None, _err(e))
    gpu = _gpu.GpuChunks(be, dev, own)
    try:
        handles = comm.allgather_object(mine)
        _raise_remote([e for _, e in handles], comm.rank)
    except BaseException:
        if own is not None:
            own.released = True  # nobody mapped it: free it with this object
        raise
    err = None
    try:
        for r, (h, _) in enumerate(handles):
            if r == comm.rank:
                assert own is not None
                gpu.addresses.append(own.ptr)
            else:
                p = be.ipc_open(h, dev)
                gpu.imported.append(p)
                gpu.addresses.append(p)
    except (OSError, RuntimeError, ValueError) as e:
        err = _err(e)
    errors = comm.allgather_object(err)
    if any(e is not None for e in errors):
        gpu.close_imports()
        comm.barrier()  # every rank closed its mappings: the chunks can go
        if own is not None:
            own.released = True
        _raise_remote(errors, comm.rank)
    comm.register_gpu_chunks(gpu)  # freed by the collective comm.destroy()
    return gpu


def _create_device(comm: Communicator, layout: Layout, dev: torch.device) -> torch.Tensor:  # pragma: no cover
    # One allocation on the node leader's GPU, opened by the peers through CUDA IPC;
    # every rank sees a normal CUDA tensor (peer access over NVLink / PCIe). Needs a GPU.
    from ._cuda import create_device_tensor

    with torch.cuda.device(dev):
        return create_device_tensor(comm, layout)
