"""Argument checks shared by every distkit package's public boundary.

Each check raises a specific exception whose message names the argument and
the offending value; nothing is converted silently except where documented.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .dtypes import dtype_name


def _torch() -> Any:
    import torch

    return torch


def _describe(x: Any) -> str:
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return f"tensor(dtype={x.dtype}, shape={tuple(x.shape)}, device={x.device})"
    if isinstance(x, np.ndarray):
        return f"ndarray(dtype={x.dtype}, shape={x.shape})"
    return f"{type(x).__name__} {x!r}"[:120]


def check_tensor(
    t: Any,
    name: str,
    *,
    dtype: Any | Iterable[Any] | None = None,
    device: str | None = None,
    ndim: int | Iterable[int] | None = None,
    contiguous: bool = False,
) -> Any:
    """Check that ``t`` is a ``torch.Tensor`` with the given properties.

    Parameters
    ----------
    t : object
        The value to check.
    name : str
        Argument name used in error messages.
    dtype : torch.dtype or iterable of torch.dtype, optional
        Accepted dtype(s).
    device : str, optional
        Required device type (``"cpu"``, ``"cuda"``).
    ndim : int or iterable of int, optional
        Accepted number(s) of dimensions.
    contiguous : bool
        Require a contiguous tensor.

    Returns
    -------
    torch.Tensor
        ``t`` itself.

    Raises
    ------
    TypeError
        Not a tensor, or the wrong dtype.
    ValueError
        Wrong device, number of dimensions or layout.
    """
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_describe(t)}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            want = ", ".join(str(d) for d in allowed)
            raise TypeError(f"{name} must have dtype {want}, got {t.dtype}")
    if device is not None and t.device.type != device:
        raise ValueError(f"{name} must be on device {device!r}, got {t.device}")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in dims:
            raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dimension(s), got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()), got strides {t.stride()}")
    return t


def as_tensor(x: Any, name: str) -> Any:
    """A torch view of a tensor or numpy array (no copy); TypeError for anything else."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder not in ("=", "|", "<"):
            raise TypeError(f"{name} must be in native byte order, got {x.dtype}")
        return torch.from_numpy(x)
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {_describe(x)}")


def as_index_tensor(
    x: Any,
    name: str,
    *,
    upper: int | None = None,
    dtypes: tuple[str, ...] = ("int64",),
    allow_sequence: bool = False,
) -> Any:
    """Validate a 1-D integer index array and return it as a contiguous CPU tensor.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray (or a sequence when ``allow_sequence``)
        The indices.
    name : str
        Argument name for messages.
    upper : int, optional
        Exclusive upper bound; every index must lie in ``[0, upper)``.
    dtypes : tuple of str
        Accepted integer dtype names.
    allow_sequence : bool
        Also accept a Python sequence of ints (converted to int64).

    Raises
    ------
    TypeError
        Not an array, or not one of ``dtypes`` (a float array is refused).
    ValueError
        Not 1-D, or not on the CPU.
    IndexError
        An index is negative or ``>= upper`` (the message names it).
    """
    torch = _torch()
    if allow_sequence and isinstance(x, (list, tuple, range)):
        x = torch.as_tensor(list(x), dtype=torch.int64)
    t = as_tensor(x, name)
    dname = dtype_name(t.dtype) if t.dtype != torch.uint16 else "uint16"
    if dname not in dtypes:
        raise TypeError(f"{name} must be an integer array of dtype {' or '.join(dtypes)}, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    t = t.contiguous()
    if t.numel():
        # One pass over the data for both bounds; the slow search for the position
        # only runs on the error path.
        wide = t.dtype in (torch.uint16, torch.uint32, torch.uint64)  # no CPU min/max kernels
        c = t.to(torch.int64) if wide else t
        lo_t, hi_t = torch.aminmax(c)
        lo, hi = int(lo_t), int(hi_t)
        if lo < 0:
            pos = int((c < 0).nonzero()[0])
            raise IndexError(f"{name}[{pos}] = {int(c[pos])} is negative")
        if upper is not None and hi >= upper:
            pos = int((c >= upper).nonzero()[0])
            raise IndexError(f"{name}[{pos}] = {int(c[pos])} is out of range [0, {upper})")
    return t


def check_int(value: Any, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """Check an integer argument (bool refused) lies in ``[lo, hi)``.

    Raises
    ------
    TypeError
        Not an integer.
    ValueError
        Outside the range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    v = int(value)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v >= hi:
        raise ValueError(f"{name} must be < {hi}, got {v}")
    return v
