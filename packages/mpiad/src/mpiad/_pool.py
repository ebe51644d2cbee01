"""Output buffer pool of large Allreduce results.

Large outputs come from a small pool of host buffers that are handed out again
only when nothing references their memory any more (no tensor, view, numpy
array, DLPack capsule, autograd-saved tensor or pending non-blocking call):
fresh multi-MiB allocations cost page faults that can exceed the communication.
"""

from __future__ import annotations

import os

import torch

Tensor = torch.Tensor

#: outputs from this size on come from the pool
POOL_MIN_BYTES = 1 << 20
_pool_limit = int(os.environ.get("MPIAD_POOL_BYTES", str(256 << 20)))
_pool: dict[int, list[Tensor]] = {}
_pool_bytes = 0
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def empty_cache() -> None:
    """Release the pooled output buffers of large Allreduce results."""
    global _pool_bytes
    _pool.clear()
    _pool_bytes = 0


def _alias(st: torch.UntypedStorage, like: Tensor) -> Tensor:
    strides, acc = [], 1
    for d in reversed(like.shape):
        strides.append(acc)
        acc *= d
    return torch.empty(0, dtype=like.dtype, device="cpu").set_(st, 0, like.shape, strides[::-1])


def new_output(like: Tensor) -> Tensor:
    """An uninitialised contiguous CPU tensor shaped like ``like`` (pooled when large)."""
    nbytes = like.numel() * like.element_size()
    if nbytes < POOL_MIN_BYTES or _use_count is None or _pool_limit <= 0:
        return torch.empty(like.shape, dtype=like.dtype, device="cpu")
    global _pool_bytes
    bufs = _pool.setdefault(nbytes, [])
    for b in bufs:
        st = b.untyped_storage()
        if _use_count(st._cdata) == 2:  # the pool's own tensor + `st`: nobody else
            return _alias(st, like)
    b = torch.empty(nbytes, dtype=torch.uint8, device="cpu")  # (not a torch.device context's)
    if len(bufs) < 2 and _pool_bytes + nbytes <= _pool_limit:
        bufs.append(b)
        _pool_bytes += nbytes
    return _alias(b.untyped_storage(), like)
