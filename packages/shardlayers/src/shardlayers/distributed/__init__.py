"""Tensor-parallel / data-parallel groups and the autograd communication ops."""

from __future__ import annotations

from ._ops import copy, gather, reduce, scatter
from ._state import (
    destroy_process_group,
    get_data_parallel_group,
    get_data_parallel_rank,
    get_data_parallel_size,
    get_group,
    get_group_size,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
)

__all__ = [
    "copy",
    "destroy_process_group",
    "gather",
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_size",
    "get_group",
    "get_group_size",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_initialized",
    "reduce",
    "scatter",
]
