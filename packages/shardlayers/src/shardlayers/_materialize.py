"""Shards of existing parameters: sliced from real tensors, or materialized shard-only from a
``distx_fake.deferred_init`` module without ever allocating the full tensor.

The shard-only replay is distx-fake's (``distx_fake.deferred_init.materialize_shard``). distx-fake
is an optional extra of shardlayers (``shardlayers[distx]``): a deferred tensor can only exist once
distx-fake is imported, so nothing here imports it before then.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

__all__ = ["ShardMaterializeError", "full_of", "is_deferred_tensor", "shard_of"]

_DISTX = "distx_fake.deferred_init"


class ShardMaterializeError(RuntimeError):
    """A deferred parameter whose recorded ops cannot be replayed on a shard.

    Raised by :func:`~shardlayers.parallelize_module` for a ``distx_fake.deferred_init`` model; its
    ``__cause__`` is distx-fake's ``distx_fake.deferred_init.ShardMaterializeError``, whose
    message names the op.
    """


def _distx() -> Any:
    """distx-fake's ``deferred_init`` module if distx-fake was imported, else None."""
    return sys.modules.get(_DISTX)


def is_deferred_tensor(t: Any) -> bool:
    """True for a parameter of a ``distx_fake.deferred_init`` module that awaits materialization."""
    distx = _distx()
    return distx is not None and isinstance(t, torch.Tensor) and bool(distx.is_deferred(t))


def full_of(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (replicated parameters): materialized if deferred, else ``t`` detached."""
    if is_deferred_tensor(t):
        return _distx().materialize_tensor(t).detach()
    return t.detach()


def shard_of(t: torch.Tensor, axis: int, start: int, length: int, rows: int | None = None) -> torch.Tensor:
    """A contiguous copy of ``t.narrow(axis, start, length)``, zero-padded to ``rows`` along ``axis``.

    A deferred ``t`` is materialized on that window only.

    Raises
    ------
    ShardMaterializeError
        If ``t`` is deferred and one of its recorded ops cannot be replayed on a window.
    """
    if is_deferred_tensor(t):
        distx = _distx()
        try:
            piece = distx.materialize_shard(t, axis, start, length)
        except distx.ShardMaterializeError as e:
            raise ShardMaterializeError(str(e)) from e
    else:
        piece = t.detach().narrow(axis, start, length).clone(memory_format=torch.contiguous_format)
    if rows is not None and rows > length:
        pad = list(piece.shape)
        pad[axis] = rows - length
        piece = torch.cat([piece, piece.new_zeros(pad)], dim=axis)
    return piece
