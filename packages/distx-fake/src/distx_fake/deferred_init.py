"""Deferred module initialization (torchdistX ``deferred_init`` API) with exact replay."""

from __future__ import annotations

from ._deferred import (
    deferred_init,
    is_deferred,
    materialize_module,
    materialize_tensor,
)
from ._graph import CapturedTensorModifiedError
from ._shard import ShardMaterializeError, materialize_shard

__all__ = [
    "CapturedTensorModifiedError",
    "ShardMaterializeError",
    "deferred_init",
    "is_deferred",
    "materialize_module",
    "materialize_shard",
    "materialize_tensor",
]
