"""Initialisation of sharded parameters equal to slices of the full-size initialisation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .._tag import _PARALLEL_DIM, shard_extent, storage_axis

__all__ = ["shard_init_helper_"]


def shard_init_helper_(init_method: Callable[..., Any], tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Initialise a (possibly sharded) parameter as the slice of ``init_method`` applied to the full tensor.

    As in TorchShard, a parameter of a parallel layer (a tensor carrying the ``ts._PARALLEL_DIM``
    attribute, whatever its value) gets the full-size tensor initialised by ``init_method``,
    **broadcast from global rank 0** so every rank holds slices of one and the same full tensor
    (and replicated parameters are identical everywhere) even when the ranks' seeds differ, then
    keeps its own slice. Unlike TorchShard the full tensor lives on the CPU (never on the
    accelerator; NCCL broadcasts go through a device copy) and the split axis follows the order
    type (TorchShard got embedding tables wrong). A tensor without the attribute simply gets
    ``init_method(tensor, **kwargs)``.

    Every rank must call it for a tagged tensor (the broadcast is a collective over the default
    group); with a single process or without ``torch.distributed`` there is no broadcast.

    Parameters
    ----------
    init_method : callable
        E.g. ``torch.nn.init.kaiming_uniform_``; called as ``init_method(full, **kwargs)``.
    tensor : torch.Tensor
        The local shard (tagged with :func:`register_parallel_attribute`).
    **kwargs
        Passed to ``init_method``.

    Returns
    -------
    torch.Tensor
        ``tensor``.

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor or ``init_method`` is not callable.
    RuntimeError
        If ``tensor`` is split and the process groups are not initialised.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not callable(init_method):
        raise TypeError(f"init_method must be callable, got {init_method!r}")
    if not hasattr(tensor, _PARALLEL_DIM):
        with torch.no_grad():
            init_method(tensor, **kwargs)
        return tensor
    return init_shard_(init_method, tensor, broadcast=True, **kwargs)


def _broadcast_from_rank0(full: torch.Tensor) -> None:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    if dist.get_backend() == "nccl":  # NCCL only moves device memory
        buf = full.to(torch.device("cuda", torch.cuda.current_device()))
        dist.broadcast(buf, 0)
        full.copy_(buf.cpu())
    else:
        dist.broadcast(full, 0)


def init_shard_(
    init_method: Callable[..., Any], tensor: torch.Tensor, *, broadcast: bool = False, **kwargs: Any
) -> torch.Tensor:
    """Initialise ``tensor`` as this rank's slice of a full CPU tensor initialised by ``init_method``
    (the layers' ``reset_parameters``: same RNG draws as the ``torch.nn`` layer, no communication
    unless ``broadcast``). Padding rows (a padded vocabulary) are zero. A ``meta`` tensor is left
    alone: nothing is drawn (parallelize_module builds layers on ``meta`` and assigns the shards)."""
    if tensor.device.type == "meta":
        return tensor
    with torch.no_grad():
        if storage_axis(tensor) is None:  # replicated (untagged, or e.g. a row-parallel bias)
            full = torch.empty(tensor.shape, dtype=tensor.dtype)
            init_method(full, **kwargs)
            if broadcast:
                _broadcast_from_rank0(full)
            tensor.copy_(full)
            return tensor
        from ..distributed import get_group_size, get_rank

        p, r = get_group_size(), get_rank()
        axis, full_n, start, n = shard_extent(tensor, p, r)
        assert axis is not None
        shape = list(tensor.shape)
        shape[axis] = full_n
        full = torch.empty(shape, dtype=tensor.dtype)
        init_method(full, **kwargs)
        if broadcast:
            _broadcast_from_rank0(full)
        tensor.narrow(axis, 0, n).copy_(full.narrow(axis, start, n))
        if tensor.shape[axis] > n:
            tensor.narrow(axis, n, tensor.shape[axis] - n).zero_()
    return tensor
