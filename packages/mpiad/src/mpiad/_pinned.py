"""Reused pinned host buffers for staging CUDA tensors through a non-CUDA-aware MPI.

``cudaHostAlloc`` costs tens of microseconds or more per call, as much as a small
Allreduce itself. Staging buffers are therefore taken from a small cache keyed by
power-of-two size classes: a call takes the smallest buffer of at least the bytes it
needs, views it with its dtype and shape, and gives it back when MPI and the copy
back are done. The cache keeps at most :data:`PER_CLASS` buffers per class and
:data:`MAX_CACHED_BYTES` in all; a buffer over :data:`MAX_CLASS_BYTES` is never
cached. It is emptied at interpreter exit and by :func:`clear`. All methods are thread-safe.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Sequence

import torch

from ._errors import MpiadValueError

Tensor = torch.Tensor

#: the smallest size class (bytes): smaller requests share it
MIN_CLASS_BYTES = 4096
#: requests above this many bytes get a buffer of their own, never cached
MAX_CLASS_BYTES = 1 << 28
#: buffers kept per size class
PER_CLASS = 4
#: bytes kept in all
MAX_CACHED_BYTES = 1 << 29


def size_class(nbytes: int) -> int:
    """The bytes of the buffer a request of ``nbytes`` gets: the next power of two.

    Parameters
    ----------
    nbytes : int
        Bytes needed (0 or more).

    Returns
    -------
    int
        ``max(MIN_CLASS_BYTES, 2**ceil(log2(nbytes)))``.

    Raises
    ------
    ValueError
        ``nbytes`` is negative or not an int.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise MpiadValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    return max(MIN_CLASS_BYTES, 1 << (nbytes - 1).bit_length()) if nbytes > 1 else MIN_CLASS_BYTES


#: the attribute of a view from take() that holds its buffer
_ROOT = "_mpiad_staging_buffer"


def _pinned_bytes(n: int) -> Tensor:
    return torch.empty(n, dtype=torch.uint8, pin_memory=True)


class PinnedPool:
    """A thread-safe cache of byte buffers by power-of-two size class.

    Parameters
    ----------
    alloc : callable, optional
        ``alloc(nbytes)`` gives a 1-D uint8 tensor of ``nbytes`` bytes; pinned host
        memory by default (the tests pass a plain allocator: no GPU needed).
    per_class, max_cached_bytes, max_class_bytes : int
        Limits of the cache (see the module docstring).
    """

    def __init__(
        self,
        alloc: Callable[[int], Tensor] = _pinned_bytes,
        per_class: int = PER_CLASS,
        max_cached_bytes: int = MAX_CACHED_BYTES,
        max_class_bytes: int = MAX_CLASS_BYTES,
    ) -> None:
        self._alloc = alloc
        self._per_class = per_class
        self._max_cached = max_cached_bytes
        self._max_class = max_class_bytes
        self._free: dict[int, list[Tensor]] = {}
        self._cached = 0
        self._lock = threading.Lock()
        self.hits = 0  #: requests served from the cache
        self.misses = 0  #: requests that allocated

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """A buffer viewed as an uninitialised contiguous tensor of ``shape`` and ``dtype``.

        Parameters
        ----------
        shape : sequence of int
            Shape of the view.
        dtype : torch.dtype
            Element type of the view.

        Returns
        -------
        torch.Tensor
            A view of a pooled buffer (its ``_base`` chain ends at that buffer); give
            it back with :meth:`give`.

        Raises
        ------
        ValueError
            A negative dimension.
        """
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise MpiadValueError(f"negative dimension in shape {dims!r}")
        numel = 1
        for d in dims:
            numel *= d
        itemsize = torch.empty(0, dtype=dtype).element_size()
        nbytes = numel * itemsize
        cls = size_class(nbytes)
        buf = None
        with self._lock:
            free = self._free.get(cls)
            if free:
                buf = free.pop()
                self._cached -= cls
                self.hits += 1
            else:
                self.misses += 1
        if buf is None:
            buf = self._alloc(cls)
        view = buf[:nbytes].view(dtype).view(dims)
        setattr(view, _ROOT, buf)  # what give() returns to the cache (a dtype view has no _base chain to it)
        return view

    def give(self, view: Tensor) -> None:
        """Return a buffer from :meth:`take` to the cache (or let it go if the cache is full).

        Parameters
        ----------
        view : torch.Tensor
            What :meth:`take` returned; it must not be used afterwards.

        Raises
        ------
        ValueError
            ``view`` did not come from :meth:`take`, or was given back already.
        """
        buf = getattr(view, _ROOT, None)
        if not isinstance(buf, torch.Tensor):
            raise MpiadValueError("not a buffer of the pinned staging pool")
        delattr(view, _ROOT)  # a second give() of the same view is refused
        cls = buf.numel()
        if cls > self._max_class:
            return
        with self._lock:
            free = self._free.setdefault(cls, [])
            if len(free) < self._per_class and self._cached + cls <= self._max_cached:
                free.append(buf)
                self._cached += cls

    def cached_bytes(self) -> int:
        """Bytes held by the cache (not counting buffers in use)."""
        with self._lock:
            return self._cached

    def clear(self) -> None:
        """Free every cached buffer (buffers in use are freed when their last view goes)."""
        with self._lock:
            self._free.clear()
            self._cached = 0


#: the pool of the staging code (_staging.py)
pool = PinnedPool()


def clear() -> None:
    """Free the cached pinned staging buffers (also done at interpreter exit)."""
    pool.clear()


atexit.register(clear)
