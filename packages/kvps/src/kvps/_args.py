"""Validation of keys and value buffers at the public boundary (before anything is sent).

The checks are distkit-common's (:class:`distkit_common.validate.Checks`), raising
:class:`KeyRangeError` for keys outside the key range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from distkit_common.validate import Checks, describe


class KeyRangeError(IndexError, ValueError):
    """A key is negative or outside ``[0, num_keys)``.

    Both an :class:`IndexError` (distkit's convention) and a :class:`ValueError`
    (what AdaPM's bindings raise for keys outside the key range).
    """


checks = Checks(index_error=KeyRangeError)


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
    if not isinstance(x, (np.ndarray, torch.Tensor)):
        raise TypeError(f"{name} must be a 1-D int64 numpy array or torch tensor, got {describe(x)}")
    t = checks.index(x, name, upper=num_keys)
    return int(t.data_ptr()), int(t.shape[0]), t


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
    if isinstance(x, np.ndarray) and writable and not x.flags.writeable:
        raise ValueError(f"{name} is read-only but pull writes into it")
    t = checks.tensor(checks.array(x, name), name, dtype=dtype, device="cpu", contiguous=True)
    if writable and t.requires_grad and t.is_leaf:
        raise ValueError(f"{name} requires grad; pull into a tensor without requires_grad")
    if t.numel() != count:
        raise ValueError(f"{name} has {t.numel()} elements, but the keys' value lengths sum to {count}")
    return int(t.data_ptr()), t
