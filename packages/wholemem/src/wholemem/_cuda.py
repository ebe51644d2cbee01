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
    """Collective: a CUDA tensor shared by the ranks of one node (call under the rank's device).

    The node leader allocates with torch's CUDA allocator and exports the storage once
    *per peer* with ``torch.multiprocessing.reductions.reduce_tensor``: every export
    takes its own reference in torch's CUDA IPC reference counter, which the peer
    releases when its tensor dies, so the leader's block is kept (torch's "limbo") until
    the last peer is done; the export also carries an event the peer waits on, ordering
    the zero fill before any use.

    Raises
    ------
    ValueError
        If the communicator spans several nodes.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    if comm.num_nodes > 1:
        raise ValueError("WmTensorType.DEVICE shares one allocation within a node; use NCCL across nodes")
    nbytes = max(layout.elems(layout.nrows) * layout.itemsize, 1)
    raw: torch.Tensor | None = None
    exports: Any = None
    if comm.local_rank == 0:
        raw = torch.zeros(nbytes, dtype=torch.uint8, device=torch.cuda.current_device())
        exports = {peer: reduce_tensor(raw) for peer in comm.node_ranks if peer != comm.rank}
    everything = comm.allgather_object(exports)
    if raw is None:
        rebuild, args = everything[comm.node_ranks[0]][comm.rank]
        raw = rebuild(*args)
    assert raw is not None
    comm.barrier()  # every peer has opened the leader's allocation
    flat = raw[: layout.elems(layout.nrows) * layout.itemsize].view(layout.dtype)
    t = flat.as_strided(layout.shape, layout.stride)
    from ._tensor import HostInfo, register_host

    register_host(t, HostInfo(comm, layout, raw))
    return t
