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


def uniform_lengths(length: int, num_keys: int) -> np.ndarray:
    """One length for every key, as a read-only array view that takes no memory per key.

    Parameters
    ----------
    length : int
        The value length of every key.
    num_keys : int
        Number of keys.

    Returns
    -------
    numpy.ndarray
        A broadcast int64 view of shape ``(num_keys,)`` (stride 0).
    """
    return np.broadcast_to(np.int64(length), (num_keys,))


def as_lengths(value_lengths: Any, num_keys: int) -> np.ndarray:
    """Check a server's ``value_lengths`` and return one int64 length per key.

    Parameters
    ----------
    value_lengths : int or 1-D integer array/tensor
        One length for all keys, or one per key (float arrays only with whole numbers, as AdaPM takes them).
    num_keys : int
        Number of keys.

    Returns
    -------
    numpy.ndarray
        Contiguous int64 lengths, or a stride-0 view (:func:`uniform_lengths`) where all are equal.

    Raises
    ------
    TypeError
        Not an int or an integer (or whole-number float) array.
    ValueError
        A length below 1, a fraction, or not one length per key.
    """
    if isinstance(value_lengths, (bool, np.bool_)):
        raise TypeError(f"value_lengths must be an int or a 1-D integer array, got {value_lengths!r}")
    if isinstance(value_lengths, (int, np.integer)):
        v = int(value_lengths)
        if v < 1:
            raise ValueError(f"value_lengths must be >= 1, got {v}")
        return uniform_lengths(v, num_keys)
    if isinstance(value_lengths, torch.Tensor):
        value_lengths = value_lengths.detach().cpu().numpy()
    if not isinstance(value_lengths, np.ndarray):
        raise TypeError(f"value_lengths must be an int or a 1-D integer array, got {type(value_lengths).__name__}")
    if value_lengths.dtype.kind == "f":
        # AdaPM converts any tensor to int64 (its example passes torch.ones(n) * vpk);
        # kvps accepts float lengths only when they are whole numbers.
        frac = np.nonzero(~np.isfinite(value_lengths) | (value_lengths != np.round(value_lengths)))[0]
        if frac.size:
            pos = int(frac[0])
            raise ValueError(f"value_lengths[{pos}] = {value_lengths[pos]} is not a whole number")
    elif value_lengths.dtype.kind not in "iu":
        raise TypeError(f"value_lengths must have an integer dtype, got {value_lengths.dtype}")
    if value_lengths.ndim != 1 or value_lengths.shape[0] != num_keys:
        raise ValueError(f"value_lengths must have shape ({num_keys},) (one length per key), got {value_lengths.shape}")
    arr = np.ascontiguousarray(value_lengths, dtype=np.int64)
    lo, hi = (int(arr.min()), int(arr.max())) if num_keys else (1, 1)
    if lo < 1:
        pos = int(np.nonzero(arr < 1)[0][0])
        raise ValueError(f"value_lengths[{pos}] = {int(arr[pos])} must be >= 1")
    return uniform_lengths(lo, num_keys) if lo == hi else arr
