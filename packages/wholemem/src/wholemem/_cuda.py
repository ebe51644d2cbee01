"""DEVICE tensors: one GPU allocation per node shared over CUDA IPC (needs a GPU).

The node leader allocates the storage on its current device and exports it with the
CUDA IPC machinery torch.multiprocessing uses; the other ranks of the node open it and
see a normal CUDA tensor (peer access). Not exercised on CPU-only machines.
"""

from __future__ import annotations

from typing import Any

import torch

from ._comm import Communicator
from ._layout import Layout


def create_device_tensor(comm: Communicator, layout: Layout) -> torch.Tensor:  # pragma: no cover - needs a GPU
    """Collective: a CUDA tensor shared by the ranks of one node.

    Raises
    ------
    ValueError
        If the communicator spans several nodes.
    """
    if comm.num_nodes > 1:
        raise ValueError("WmTensorType.DEVICE shares one allocation within a node; use NCCL across nodes")
    nbytes = max(layout.elems(layout.nrows) * layout.itemsize, 1)
    storage = None
    meta: Any = None
    if comm.local_rank == 0:
        storage = torch.zeros(nbytes, dtype=torch.uint8, device=torch.cuda.current_device()).untyped_storage()
        meta = storage._share_cuda_()
    metas = comm.allgather_object(meta)
    if storage is None:
        storage = torch.UntypedStorage._new_shared_cuda(*metas[comm.node_ranks[0]])
    comm.barrier()
    raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    flat = raw[: layout.elems(layout.nrows) * layout.itemsize].view(layout.dtype)
    t = flat.as_strided(layout.shape, layout.stride)
    from ._tensor import HostInfo, register_host

    register_host(t, HostInfo(comm, layout, storage))
    return t
