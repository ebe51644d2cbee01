"""Validation of keys and value buffers at the public boundary (before anything is sent)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_NP_OF_TORCH = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
}


class KeyRangeError(IndexError, ValueError):
    """A key is negative or outside ``[0, num_keys)``.

    Both an :class:`IndexError` (distkit's convention) and a :class:`ValueError`
    (what AdaPM's bindings raise for keys outside the key range).
    """


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor(dtype={x.dtype}, shape={tuple(x.shape)}, device={x.device})"
    if isinstance(x, np.ndarray):
        return f"ndarray(dtype={x.dtype}, shape={x.shape})"
    return f"{type(x).__name__} {x!r}"[:120]


def as_keys(x: Any, num_keys: int, name: str = "keys") -> tuple[int, int, Any]:
    """Check a key array and return ``(pointer, count, keepalive)``.

    Raises
    ------
    TypeError
        Not a torch tensor or numpy array, or not int64 (float keys are refused).
    ValueError
        Not 1-D, or not on the CPU.
    KeyRangeError
        (an ``IndexError`` and ``ValueError``) A key is negative or
        ``>= num_keys`` (the message names it).
    """
    if isinstance(x, np.ndarray):
        if x.dtype != np.int64:
            raise TypeError(f"{name} must be an int64 array, got {_describe(x)}")
        if x.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {x.shape}")
        arr = np.ascontiguousarray(x)
        n = arr.shape[0]
        if n:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0:
                pos = int(np.nonzero(arr < 0)[0][0])
                raise KeyRangeError(f"{name}[{pos}] = {int(arr[pos])} is negative")
            if hi >= num_keys:
                pos = int(np.nonzero(arr >= num_keys)[0][0])
                raise KeyRangeError(f"{name}[{pos}] = {int(arr[pos])} is out of range [0, {num_keys})")
        return int(arr.ctypes.data), n, arr
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.int64:
            raise TypeError(f"{name} must be an int64 tensor, got {_describe(x)}")
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got {x.device}")
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
        t = x.contiguous()
        n = t.shape[0]
        if n:
            lo, hi = int(t.min()), int(t.max())
            if lo < 0:
                pos = int((t < 0).nonzero()[0])
                raise KeyRangeError(f"{name}[{pos}] = {int(t[pos])} is negative")
            if hi >= num_keys:
                pos = int((t >= num_keys).nonzero()[0])
                raise KeyRangeError(f"{name}[{pos}] = {int(t[pos])} is out of range [0, {num_keys})")
        return int(t.data_ptr()), n, t
    raise TypeError(f"{name} must be a 1-D int64 numpy array or torch tensor, got {_describe(x)}")


def as_values(x: Any, dtype: torch.dtype, count: int, writable: bool, name: str = "vals") -> tuple[int, Any]:
    """Check a flat value buffer (read or written in place) and return ``(pointer, keepalive)``.

    Raises
    ------
    TypeError
        Not a tensor/array, or not the server's value dtype.
    ValueError
        Not contiguous, not on the CPU, read-only when written, or not exactly
        ``count`` elements long. Like AdaPM's bindings, any shape is accepted
        (e.g. ``(len(keys), dim)``): the buffer is used flat, in memory order.
    """
    if isinstance(x, np.ndarray):
        want = _NP_OF_TORCH.get(dtype)
        if want is None or x.dtype != want:
            raise TypeError(f"{name} must have dtype {dtype} (the server's value dtype), got {_describe(x)}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name} must be contiguous, got strides {x.strides}")
        if writable and not x.flags.writeable:
            raise ValueError(f"{name} is read-only but pull writes into it")
        if x.size != count:
            raise ValueError(f"{name} has {x.size} elements, but the keys' value lengths sum to {count}")
        return int(x.ctypes.data), x
    if isinstance(x, torch.Tensor):
        if x.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype} (the server's value dtype), got {x.dtype}")
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got {x.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {x.stride()}")
        if writable and x.requires_grad and x.is_leaf:
            raise ValueError(f"{name} requires grad; pull into a tensor without requires_grad")
        if x.numel() != count:
            raise ValueError(f"{name} has {x.numel()} elements, but the keys' value lengths sum to {count}")
        return int(x.data_ptr()), x
    raise TypeError(f"{name} must be a 1-D numpy array or torch tensor, got {_describe(x)}")
