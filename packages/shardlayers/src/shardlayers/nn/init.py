"""Initialisation of sharded parameters equal to slices of the full-size initialisation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._split import partition_range
from .._tag import _FULL_SIZE, get_parallel_dim, storage_axis

__all__ = ["shard_init_helper_"]


def full_shape(tensor: torch.Tensor, group_size: int) -> tuple[list[int], int | None]:
    """The unsplit shape of a tagged parameter and its split storage axis."""
    axis = storage_axis(tensor)
    shape = list(tensor.shape)
    if axis is not None:
        shape[axis] = int(getattr(tensor, _FULL_SIZE, shape[axis] * group_size))
    return shape, axis


def shard_init_helper_(init_method: Callable[..., Any], tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Initialise a (possibly sharded) parameter as the slice of ``init_method`` applied to the full tensor.

    The full tensor is built on the CPU (never on the accelerator) with the default generator, so
    with the same seed every rank draws the same full tensor and keeps its own slice: the sharded
    model equals the slices of the single-process model. Untagged tensors get ``init_method``
    directly.

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
        If ``tensor`` is tagged and the process groups are not initialised.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not callable(init_method):
        raise TypeError(f"init_method must be callable, got {init_method!r}")
    with torch.no_grad():
        if get_parallel_dim(tensor) is None:
            if tensor.device.type == "meta":
                return tensor
            full = torch.empty(tensor.shape, dtype=tensor.dtype)
            init_method(full, **kwargs)
            tensor.copy_(full)
            return tensor
        from ..distributed import get_group_size, get_rank

        p, r = get_group_size(), get_rank()
        shape, axis = full_shape(tensor, p)
        full = torch.empty(shape, dtype=tensor.dtype)
        init_method(full, **kwargs)
        assert axis is not None
        start, n = partition_range(shape[axis], p, r)
        if tensor.device.type != "meta":
            tensor.copy_(full.narrow(axis, start, n))
    return tensor
