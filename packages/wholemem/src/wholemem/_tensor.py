"""Tensor types and collective creation: HOST, DEVICE, CHUNKED, NCCL (= DISTRIBUTED)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _lib
from ._comm import Communicator
from ._layout import Layout, Stride, local_range, rows_per_rank
from ._wholemem import Segment, Table, cuda_compiled, cuda_device_count


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
    raw = torch.frombuffer(seg, dtype=torch.uint8)
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
        """Where the elements live (always the CPU here)."""
        return torch.device("cpu")

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

    def _local_part(self) -> tuple[torch.Tensor, int]:
        """This rank's rows of the base tensor as a tensor, and the first base row."""
        raise NotImplementedError  # pragma: no cover - overridden


class ChunkedTensor(_WmTensor):
    """A tensor stored as one shared-memory chunk per rank, every chunk mapped by every rank.

    Rows ``[r*k, (r+1)*k)`` (``k = ceil(N/size)``) live in rank r's chunk; any rank reads
    and writes any row directly through the chunk table.
    """

    _type = WmTensorType.CHUNKED

    def __init__(self, comm: Communicator, layout: Layout, segments: list[Any]) -> None:
        super().__init__(comm, layout)
        self._segments = segments
        self._table = self._make_table()

    def _make_table(self) -> Table:
        off = self._col_byte_offset()
        b = self._base
        return Table(
            [int(s.address) + off for s in self._segments],
            self._rpr,
            b.nrows,
            self._view_cols,
            b.row_stride,
            b.col_stride,
            b.code,
            False,
        )

    def _local_part(self) -> tuple[torch.Tensor, int]:
        lo, hi = local_range(self._base.nrows, self.comm.size, self.comm.rank)
        return _frombuffer(self._segments[self.comm.rank], self._base, hi - lo), lo


class NCCLTensor(_WmTensor):
    """A tensor whose rows are partitioned over the ranks in private memory.

    Gather and scatter are collective: indices are bucketed by owner and exchanged with
    all-to-all over the communicator's process group (works across nodes).
    """

    _type = WmTensorType.NCCL

    def __init__(self, comm: Communicator, layout: Layout) -> None:
        super().__init__(comm, layout)
        lo, hi = local_range(layout.nrows, comm.size, comm.rank)
        storage = torch.zeros(max(layout.elems(self._rpr), 1), dtype=layout.dtype)
        self._local = storage.as_strided((hi - lo, *layout.row_shape), layout.stride)
        self._first = lo
        self._table = self._make_table()

    def _make_table(self) -> Table:
        b = self._base
        return Table(
            [int(self._local.data_ptr()) + self._col_byte_offset()],
            max(1, self._local.shape[0]),
            self._local.shape[0],
            self._view_cols,
            b.row_stride,
            b.col_stride,
            b.code,
            False,
        )

    def _local_part(self) -> tuple[torch.Tensor, int]:
        return self._local, self._first


# -- creation ---------------------------------------------------------------------------


def _require_gpu(what: str) -> None:
    if not cuda_compiled():
        raise RuntimeError(f"{what} needs CUDA, and this build of wholemem was compiled without nvcc")
    if not torch.cuda.is_available() or cuda_device_count() == 0:
        raise RuntimeError(
            f"{what} needs a CUDA GPU, and none is visible (torch.cuda.is_available() is False); "
            "use WmTensorType.HOST, CHUNKED or NCCL on CPU-only machines"
        )


def _check_local(comm: Any, shape: Any, stride: Any, dtype: Any, tensor_type: Any) -> Layout:
    if not isinstance(tensor_type, WmTensorType):
        raise TypeError(f"tensor_type must be a wholemem.WmTensorType, got {tensor_type!r}")
    layout = Layout.make(shape, stride, dtype)
    if tensor_type in (WmTensorType.HOST, WmTensorType.CHUNKED) and comm.num_nodes > 1:
        raise ValueError(
            f"WmTensorType.{tensor_type.name} shares memory within one node, but the communicator spans "
            f"{comm.num_nodes} nodes; use WmTensorType.NCCL (DISTRIBUTED)"
        )
    if tensor_type is WmTensorType.DEVICE:
        _require_gpu("WmTensorType.DEVICE")
    return layout


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

    Returns
    -------
    torch.Tensor or ChunkedTensor or NCCLTensor

    Raises
    ------
    TypeError
        ``comm`` is not a communicator, bad shape/stride entries or dtype.
    ValueError
        Invalid shape/stride, HOST/CHUNKED over several nodes, or the arguments differ
        between ranks (raised on every rank).
    RuntimeError
        Library finalized, communicator destroyed, DEVICE without a GPU, or a failure on
        another rank.
    OSError
        Shared memory could not be created or mapped.
    """
    _lib.require_init("create_wm_tensor")
    if not isinstance(comm, Communicator):
        raise TypeError(f"comm must be a wholemem.Communicator, got {type(comm).__name__}")
    comm.check_alive("create_wm_tensor")
    layout: Layout | None = None
    err: tuple[str, str] | None = None
    try:
        layout = _check_local(comm, shape, stride, dtype, tensor_type)
    except (TypeError, ValueError, RuntimeError) as e:
        err = _err(e)
    # every rank learns every rank's arguments (or error): a mismatch raises everywhere, nobody hangs
    mine = (layout.describe(), tensor_type.name) if layout is not None else None
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
        return _create_host(comm, layout)
    if tensor_type is WmTensorType.CHUNKED:
        return ChunkedTensor(comm, layout, _create_chunks(comm, layout))
    if tensor_type is WmTensorType.NCCL:
        return NCCLTensor(comm, layout)
    return _create_device(comm, layout)


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


def _create_device(comm: Communicator, layout: Layout) -> torch.Tensor:  # pragma: no cover - needs a GPU
    # One allocation on the node leader's GPU, opened by the peers through CUDA IPC;
    # every rank sees a normal CUDA tensor (peer access over NVLink / PCIe).
    from ._cuda import create_device_tensor

    return create_device_tensor(comm, layout)
