"""Parallel layers (TorchShard's ``ts.nn``) and Megatron-style extras."""

from __future__ import annotations

from . import functional, init
from ._embedding import ParallelEmbedding, convert_parallel_embedding
from ._linear import ColumnParallelLinear, ParallelLinear, RowParallelLinear, convert_parallel_linear
from ._loss import ParallelCrossEntropyLoss, RegisterParallelDim
from ._sequence import SequenceParallelDropout, SequenceParallelLayerNorm
from .init import shard_init_helper_  # the API docs also name it ts.nn.shard_init_helper_

__all__ = [
    "ColumnParallelLinear",
    "ParallelCrossEntropyLoss",
    "ParallelEmbedding",
    "ParallelLinear",
    "RegisterParallelDim",
    "RowParallelLinear",
    "SequenceParallelDropout",
    "SequenceParallelLayerNorm",
    "convert_parallel_embedding",
    "convert_parallel_linear",
    "functional",
    "init",
    "shard_init_helper_",
]
