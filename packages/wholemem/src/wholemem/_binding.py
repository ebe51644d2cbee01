"""Which GPU a rank computes on: its local rank's GPU, unless the user chose one.

On a node with several GPUs, every rank must use its own: NCCL refuses two ranks on
one device ("Duplicate GPU detected"), and a rank that runs on GPU 0 by default
competes with rank 0 for it. The first GPU request of a process (``device='cuda'``, a
DEVICE tensor, ``get_tensor_view(t, 'cuda')``) binds the process to GPU
``local_rank % device_count`` with ``torch.cuda.set_device``, where the local rank
comes from the launcher (``distkit_common.launch``: mpiexec, torchrun, srun) or, when
the process was started otherwise (e.g. spawned), from the communicator's node-local
rank. A process in which torch's current device is already another GPU than 0 was
bound by its user (``torch.cuda.set_device``), and that choice is kept; an explicit
``device='cuda:N'`` always wins.
"""

from __future__ import annotations

from typing import Any

import torch

from distkit_common.launch import launch_info

from . import _gpu


def pick_device(count: int, local_rank: int, current: int, cuda_initialized: bool) -> int:
    """The GPU index a rank binds to (pure: the policy of the module docstring).

    Parameters
    ----------
    count : int
        Visible GPUs (> 0).
    local_rank : int
        The rank's index among the ranks of its node.
    current : int
        torch's current device.
    cuda_initialized : bool
        Whether torch initialised CUDA in this process (before that, ``current`` is
        only torch's default, 0).

    Raises
    ------
    RuntimeError
        No GPU is visible.
    """
    if count <= 0:
        raise RuntimeError("no CUDA GPU is visible")
    if cuda_initialized and current != 0:
        return current
    return local_rank % count


def local_rank(comm: Any) -> int:
    """This rank's index on its node: the launcher's local rank when a known launcher
    started the process, else the communicator's node-local rank."""
    info = launch_info()
    if info.launcher != "none":
        return int(info.local_rank)
    return int(comm.local_rank) if comm is not None else 0


def resolve(device: torch.device, comm: Any = None) -> torch.device:
    """The concrete GPU a request for ``device`` (``cuda`` or ``cuda:N``) means on this rank;
    binds the process to its local GPU on the first request without an index.

    Raises
    ------
    ValueError
        ``cuda:N`` with N outside the visible devices.
    RuntimeError
        No GPU is usable (call ``backend().require`` first for the clear message).
    """
    be = _gpu.backend()
    count = be.device_count()
    if device.index is not None:
        if not 0 <= device.index < count:
            raise ValueError(f"device {device} does not exist: {count} CUDA devices are visible")
        dev = be.device(int(device.index))
    else:
        current, initialized = be.current_device()
        index = pick_device(count, local_rank(comm), current, initialized)
        if not initialized or index != current:
            be.set_device(index)
        dev = be.device(index)
    _gpu.note_used(dev, be)
    return dev
