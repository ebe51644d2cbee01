"""Validation of the arguments of the row operations, shared by every tensor type.

Everything is checked before any row is read, written or sent: dtype, device, shape
and the range of every index (the native scan names the first bad index and its
position; device-resident indices are checked on their GPU).
"""

from __future__ import annotations

from typing import Any

import torch

from distkit_common.validate import as_tensor

from . import _gpu
from ._wholemem import check_indices

_INDEX_DTYPES = (torch.int64, torch.int32)


def index_array(x: Any) -> torch.Tensor:
    """``x`` as a 1-D int64 / int32 tensor (no range check, no copy).

    Raises
    ------
    TypeError
        Not a tensor / ndarray, or not int64 / int32.
    ValueError
        Not 1-D.
    """
    t = as_tensor(x, "indices")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"indices must be an integer array of dtype int64 or int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(t.shape)}")
    return t


def cpu_indices(x: Any, upper: int) -> torch.Tensor:
    """A contiguous 1-D int64/int32 CPU index tensor with every entry in ``[0, upper)``.

    Raises
    ------
    TypeError
        Not a tensor / ndarray, or not int64 / int32.
    ValueError
        Not 1-D or not on the CPU.
    IndexError
        An index outside ``[0, upper)`` (named with its position).
    """
    t = index_array(x)
    if t.device.type != "cpu":
        raise ValueError(f"indices must be on the CPU, got {t.device}")
    t = t.contiguous()
    if t.numel():
        check_indices(int(t.data_ptr()), t.dtype == torch.int64, int(t.numel()), int(upper))
    return t


def device_indices(x: Any, upper: int, device: torch.device) -> torch.Tensor:
    """Validated 1-D int64/int32 indices on ``device``: CPU indices are checked natively and
    copied; indices already on ``device`` are checked there (one small kernel and one
    synchronisation on a GPU; inside CUDA graph capture see the README's limitations).

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`cpu_indices`; ValueError also for indices on another device.
    """
    t = index_array(x)
    if t.device.type == "cpu":
        return cpu_indices(t, upper).to(device)
    if t.device != device:
        raise ValueError(f"indices must be on the CPU or on {device} (the tensor's device), got {t.device}")
    t = t.contiguous()
    if t.numel():
        if t.device.type == "cuda":
            _gpu.backend().check_indices(t, upper)
        else:  # e.g. 'meta' in tests: torch ops, the same message
            bad = (t < 0) | (t >= upper)
            if bool(bad.any()):
                pos = int(torch.nonzero(bad)[0, 0])
                raise IndexError(f"index {int(t[pos])} at position {pos} is out of range for {upper} rows")
    return t


def rows_in(x: Any, name: str, n: int, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Any:
    """``values`` (``name``) of one row per index: a tensor (or, on the CPU, an ndarray) of
    shape ``[n, *row_shape]``, ``dtype``, on ``device``.

    Raises
    ------
    TypeError
        Not a tensor, or the wrong dtype.
    ValueError
        Wrong device or shape.
    """
    if device.type == "cpu":
        v = as_tensor(x, name)
    elif isinstance(x, torch.Tensor):
        v = x
    else:
        raise TypeError(f"{name} must be a torch.Tensor on {device}, got {type(x).__name__}")
    if v.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (the tensor's), got {v.dtype}")
    if v.device != device:
        where = "the CPU" if device.type == "cpu" else f"{device} (the tensor's device)"
        raise ValueError(f"{name} must be on {where}, got {v.device}")
    want = (n, *row_shape)
    if tuple(v.shape) != want:
        raise ValueError(f"{name} must have shape {want} (one row per index), got {tuple(v.shape)}")
    return v


def out_rows(out: Any, n: int, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The output of a gather: ``out`` checked (contiguous ``[n, *row_shape]`` of ``dtype`` on
    ``device``), or a new tensor.

    Raises
    ------
    TypeError
        ``out`` not a tensor or of the wrong dtype.
    ValueError
        ``out`` of the wrong shape, device or not contiguous.
    """
    want = (n, *row_shape)
    if out is None:
        return torch.empty(want, dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    o: torch.Tensor = rows_in(out, "out", n, row_shape, dtype, device)
    if not o.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {want}, got strides {tuple(o.stride())}")
    return o
