"""Collective creation of every tensor type (``create_wm_tensor``)."""

from __future__ import annotations

from typing import Any

import torch

from distkit_common.collective import agree, allgather_json

from . import _binding, _devmem, _gpu, _lib, _plain, _registry
from ._comm import WholeMemoryCommunicator
from ._layout import Layout, rows_per_rank
from ._tensor import ChunkedTensor, NCCLTensor, WmTensorType
from ._wholemem import Segment

_STEP = "create_wm_tensor"
#: what a failure on one rank while allocating or mapping memory can be
_ALLOC_ERRORS = (OSError, RuntimeError, ValueError)


def _device_of(tensor_type: WmTensorType, device: Any, comm: WholeMemoryCommunicator) -> torch.device | None:
    """Where a new tensor lives: None = host memory (CPU ops), else this rank's GPU."""
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
    _gpu.backend().require(f"WmTensorType.{tensor_type.name} on {dev}")
    return _binding.resolve(dev, comm)


def _check_local(
    comm: WholeMemoryCommunicator, shape: Any, stride: Any, dtype: Any, tensor_type: Any, device: Any
) -> tuple[Layout, torch.device | None]:
    if not isinstance(tensor_type, WmTensorType):
        raise TypeError(f"tensor_type must be a wholemem.WmTensorType, got {tensor_type!r}")
    layout = Layout.make(shape, stride, dtype)
    if tensor_type in (WmTensorType.HOST, WmTensorType.CHUNKED, WmTensorType.DEVICE) and comm.num_nodes > 1:
        raise ValueError(
            f"WmTensorType.{tensor_type.name} shares memory within one node, but the communicator spans "
            f"{comm.num_nodes} nodes: {comm.describe_nodes()}. Make it on the communicator of this node's ranks, "
            "wholemem.get_local_node_communicator(comm) (one tensor per node), or use WmTensorType.NCCL "
            "(= DISTRIBUTED), which partitions the rows over the ranks of every node"
        )
    dev = _device_of(tensor_type, device, comm)
    if dev is not None and tensor_type is WmTensorType.NCCL:
        problem = comm.device_group_problem(dev)
        if problem:
            raise ValueError(f"a GPU-resident WmTensorType.NCCL tensor needs NCCL collectives: {problem}")
    return layout, dev


def create_wm_tensor(
    comm: WholeMemoryCommunicator,
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
    comm : WholeMemoryCommunicator
        Every rank of it must call with the same arguments (checked).
    shape : sequence of int
        Size of each dimension; dim 0 (rows) is partitioned.
    stride : sequence of int, default ()
        Strides in elements, or empty for a contiguous layout.
    dtype : torch.dtype, default torch.float32
        One of float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8 or bool.
    tensor_type : WmTensorType, default WmTensorType.CHUNKED
        HOST / DEVICE return a ``torch.Tensor``; CHUNKED a :class:`ChunkedTensor`;
        NCCL (= DISTRIBUTED) an :class:`NCCLTensor`. Zero-initialised.
    device : str or torch.device, optional
        Keyword only. Where the elements live. Default: host memory for HOST / CHUNKED / NCCL, this
        rank's GPU for DEVICE. ``'cuda'`` (this rank's GPU: its local rank's, unless the
        user set one; see the README) or ``'cuda:N'``: CHUNKED = one device chunk per rank
        mapped by every rank over CUDA IPC, ops on CUDA kernels; NCCL = rank-private GPU
        rows, all-to-all over NCCL; HOST = the shared segment mapped for the GPU (as
        :func:`get_tensor_view`), returned as a CUDA tensor. Checked on every rank before
        any memory is allocated.

    Returns
    -------
    torch.Tensor or ChunkedTensor or NCCLTensor
        The new tensor (zero-initialised).

    Raises
    ------
    TypeError
        ``comm`` is not a communicator, bad shape/stride entries or dtype.
    ValueError
        Invalid shape/stride, HOST/CHUNKED/DEVICE over several nodes, a DEVICE tensor on
        the CPU, or the arguments differ between ranks (raised on every rank).
    RuntimeError
        Library finalized, communicator destroyed, a GPU placement without a usable GPU
        (raised on every rank, before any allocation), or a failure on another rank.
    OSError
        Shared memory could not be created or mapped.

    Examples
    --------
    >>> t = wg.create_wm_tensor(comm, [1000, 64], [], torch.float32,   # doctest: +SKIP
    ...                         wg.WmTensorType.CHUNKED)
    >>> wg.scatter(t, torch.tensor([3]), torch.ones(1, 64)); comm.barrier()
    >>> wg.gather(t, torch.tensor([3, 4])).sum().item()
    64.0
    """
    _lib.require_init(_STEP)
    if not isinstance(comm, WholeMemoryCommunicator):
        raise TypeError(f"comm must be a wholemem.WholeMemoryCommunicator, got {type(comm).__name__}")
    comm.check_alive(_STEP)
    layout: Layout | None = None
    dev: torch.device | None = None
    err: BaseException | None = None
    try:
        layout, dev = _check_local(comm, shape, stride, dtype, tensor_type, device)
    except (TypeError, ValueError, RuntimeError) as e:
        err = e
    agree(comm, _STEP, err)  # a bad argument on one rank raises on every rank: nobody hangs
    assert layout is not None
    # the device type is compared, not its index (each rank uses its own GPU)
    mine = [layout.describe(), tensor_type.name, "host" if dev is None else "gpu"]
    everyone = allgather_json(mine, comm)
    bad = [r for r, a in enumerate(everyone) if a != everyone[0]]
    if bad:
        raise ValueError(
            f"create_wm_tensor must be called with the same arguments on every rank: rank 0 passed "
            f"{everyone[0]}, rank {bad[0]} passed {everyone[bad[0]]}"
        )
    if tensor_type is WmTensorType.HOST:
        host = _create_host(comm, layout)
        return host if dev is None else _plain.cuda_view(host, dev, _STEP)
    if tensor_type is WmTensorType.CHUNKED:
        if dev is not None:
            nbytes = max(layout.elems(rows_per_rank(layout.nrows, comm.size)) * layout.itemsize, 1)
            chunks = _devmem.share(comm, nbytes, dev, list(range(comm.size)), _STEP)
            comm.register_gpu_chunks(chunks)
            return ChunkedTensor(comm, layout, [], gpu=chunks)
        return ChunkedTensor(comm, layout, _create_chunks(comm, layout))
    if tensor_type is WmTensorType.NCCL:
        if dev is not None:
            comm.ensure_device_group(dev)  # collective, every rank gets here
        return NCCLTensor(comm, layout, dev)
    assert dev is not None
    return _create_device(comm, layout, dev)


def _create_host(comm: WholeMemoryCommunicator, layout: Layout) -> torch.Tensor:
    """One owner-only segment made by the node leader, mapped by every rank, unlinked as
    soon as every rank has mapped it."""
    nbytes = max(layout.elems(layout.nrows) * layout.itemsize, 1)
    seg = None
    err: BaseException | None = None
    if comm.local_rank == 0:
        try:
            seg = Segment.create(nbytes)
        except _ALLOC_ERRORS as e:
            err = e
    try:
        agree(comm, _STEP, err)
        names = allgather_json(seg.name if seg is not None else None, comm)
        if seg is None:
            try:
                seg = Segment.open(names[comm.node_ranks[0]], nbytes)
            except _ALLOC_ERRORS as e:
                err = e
        agree(comm, _STEP, err)  # after this every rank of the node has mapped it
    finally:
        if seg is not None and comm.local_rank == 0:
            seg.unlink()
    assert seg is not None
    t = layout.rows_view(torch.frombuffer(seg, dtype=torch.uint8), layout.nrows)
    return _registry.register(t, _registry.HostInfo(comm, layout, seg, WmTensorType.HOST))


def _create_chunks(comm: WholeMemoryCommunicator, layout: Layout) -> list[Any]:
    """One owner-only segment per rank, every rank maps every one; all unlinked after mapping."""
    nbytes = max(layout.elems(rows_per_rank(layout.nrows, comm.size)) * layout.itemsize, 1)
    own = None
    segs: list[Any] = []
    err: BaseException | None = None
    try:
        try:
            own = Segment.create(nbytes)
        except _ALLOC_ERRORS as e:
            err = e
        agree(comm, _STEP, err)
        names = allgather_json(own.name if own is not None else None, comm)
        try:
            segs = [own if r == comm.rank else Segment.open(n, nbytes) for r, n in enumerate(names)]
        except _ALLOC_ERRORS as e:
            err = e
        agree(comm, _STEP, err)  # every rank has mapped every chunk
    finally:
        if own is not None:
            own.unlink()
    return segs


def _create_device(comm: WholeMemoryCommunicator, layout: Layout, dev: torch.device) -> torch.Tensor:
    """One allocation on the node leader's GPU, mapped by the peers over CUDA IPC; every
    rank gets a normal CUDA tensor on its own GPU (peers read over NVLink / PCIe)."""
    nbytes = max(layout.elems(layout.nrows) * layout.itemsize, 1)
    chunks = _devmem.share(comm, nbytes, dev, [comm.node_ranks[0]], _STEP)
    comm.register_gpu_chunks(chunks)
    t = layout.rows_view(chunks.chunk_bytes(0, nbytes), layout.nrows)
    return _registry.register(t, _registry.HostInfo(comm, layout, chunks, WmTensorType.DEVICE))
