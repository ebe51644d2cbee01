"""CUDA staging: what MPI may read and write, for CPU and CUDA tensors.

Device pointers go to MPI only when the library is CUDA-aware
(``MPIX_Query_cuda_support``); otherwise CUDA tensors travel through pinned host
buffers, copied synchronously so the kernels producing them are complete. The
host buffers come from a cache of pinned buffers by size class (_pinned.py) and go
back to it with :func:`release` once MPI and the copy back are done.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from . import _mpiad
from ._pinned import pool

Tensor = torch.Tensor


class _State:
    __slots__ = ("aware",)

    def __init__(self) -> None:
        self.aware: bool | None = None


_state = _State()


def cuda_aware() -> bool:
    """Tell whether device pointers are handed to MPI directly (CUDA-aware MPI).

    Returns
    -------
    bool
        ``True`` when this MPI is CUDA-aware and ``MPIAD_CUDA_AWARE`` is not ``0`` (and
        :func:`deactivate_cuda_aware_mpi_support` was not called).
    """
    if _state.aware is None:
        _state.aware = bool(_mpiad.cuda_aware()) and os.environ.get("MPIAD_CUDA_AWARE", "1") != "0"
    return _state.aware


def deactivate_cuda_aware_mpi_support() -> None:
    """Stage CUDA tensors through host memory from now on (as mpi4torch's function of this name)."""
    _state.aware = False


def sync_device(t: Tensor) -> None:
    """Wait for the kernels queued on ``t``'s current stream (MPI works outside torch's streams)."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()


def to_mpi(t: Tensor) -> Tensor:
    """A contiguous tensor whose memory MPI may read: ``t`` itself when possible.

    CUDA tensors go to pinned host memory unless the MPI is CUDA-aware; the
    current stream is synchronised first so the data is complete. A lazy
    conjugate or negative view is resolved first: MPI reads raw memory.
    """
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.is_cuda:
        if not cuda_aware():
            host = pool.take(t.shape, t.dtype)
            host.copy_(t)  # synchronous: waits for the kernels that produce t
            return host
        x = t if t.is_contiguous() else t.contiguous()
        # MPI reads device memory outside torch's streams: everything queued on the
        # current stream (including the copy above) must be complete
        sync_device(x)
        return x
    return t if t.is_contiguous() else t.contiguous()


def from_mpi(buf: Tensor, like: Tensor) -> Tensor:
    """Move an MPI result back to ``like``'s device (no-op on the CPU)."""
    if buf.device == like.device:
        return buf
    return buf.to(like.device, non_blocking=False)


def mpi_empty(shape: Sequence[int], like: Tensor) -> Tensor:
    """An uninitialised receive buffer for ``like``'s dtype where MPI can write."""
    if like.is_cuda:
        if not cuda_aware():
            return pool.take(tuple(shape), like.dtype)
        buf = torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        # the caching allocator may hand out memory that kernels still queued on the
        # current stream use; MPI writes outside the stream, so let them finish
        sync_device(buf)
        return buf
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)


def write_back(dst: Tensor, src: Tensor) -> None:
    """Copy an MPI result ``src`` into the user's tensor ``dst`` unless they are one."""
    if src is not dst:
        with torch.no_grad():
            dst.copy_(src)


def staged(like: Tensor) -> bool:
    """Whether :func:`to_mpi` / :func:`mpi_empty` give pooled host buffers for ``like``."""
    return like.is_cuda and not cuda_aware()


def release(like: Tensor, *bufs: Tensor) -> None:
    """Give the staging buffers of a call on ``like`` back to the pool (when they are pooled).

    Call only when MPI and every copy out of them are complete; they must not be used after.
    """
    if staged(like):
        for b in bufs:
            pool.give(b)
