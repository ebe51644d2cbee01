"""Validation of the arguments of the row operations, shared by every tensor type.

The checks are distkit's (``distkit_common.validate.Checks``) with one part of
wholemem's own: the index range. wholemem's ops name a bad index as
``index V at position P is out of range for N rows`` (the message users and tests
rely on), and find it in one native pass that also yields the position (on the GPU,
one small kernel), where the shared check takes ``aminmax`` and then searches again.
Everything is checked before any row is read, written or sent.
"""

from __future__ import annotations

from typing import Any

import torch

from distkit_common.validate import Checks

from . import _gpu
from ._wholemem import check_indices

_INDEX_DTYPES = ("int64", "int32")


class _Checks(Checks):
    def index_range(self, t: Any, name: str, upper: int | None) -> None:
        """IndexError naming the first entry of ``t`` outside ``[0, upper)``.

        ``upper=None`` skips the scan: the caller's native op checks the range itself
        (before it touches memory) against the rows of the view it runs on.
        """
        if upper is None or not t.numel():
            return
        if t.device.type == "cpu":
            check_indices(int(t.data_ptr()), t.dtype == torch.int64, int(t.numel()), int(upper))
        elif t.device.type == "cuda":
            _gpu.backend().check_indices(t, upper)
        else:  # e.g. 'meta' in tests: torch ops, the same message
            bad = (t < 0) | (t >= upper)
            if bool(bad.any()):
                pos = int(torch.nonzero(bad)[0, 0])
                raise self.index_error(f"index {int(t[pos])} at position {pos} is out of range for {upper} rows")


CHECKS = _Checks()


def indices(x: Any, device: torch.device, upper: int | None) -> torch.Tensor:
    """1-D int64 / int32 indices (tensor or ndarray) on the CPU or on ``device``, range-checked
    against ``upper`` rows where they are (``None``: by the caller's native op), returned
    contiguous on ``device``.

    Raises
    ------
    TypeError
        Not a tensor / ndarray, or not int64 / int32.
    ValueError
        Not 1-D, or on another device.
    IndexError
        An index outside ``[0, upper)`` (named with its position).
    """
    t = CHECKS.array(x, "indices")
    if t.device.type != "cpu" and t.device != device:
        where = "the CPU" if device.type == "cpu" else f"the CPU or on {device} (the tensor's device)"
        raise ValueError(f"indices must be on {where}, got {t.device}")
    t = CHECKS.index(t, "indices", upper=upper, dtypes=_INDEX_DTYPES, device=None)
    return t.to(device)


def cpu_indices(x: Any, upper: int) -> torch.Tensor:
    """:func:`indices` for CPU tensors."""
    return indices(x, torch.device("cpu"), upper)


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
    v = CHECKS.array(x, name) if device.type == "cpu" else CHECKS.tensor(x, name)
    if v.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (the tensor's), got {v.dtype}")
    if v.device != device:
        where = "the CPU" if device.type == "cpu" else f"{device} (the tensor's device)"
        raise ValueError(f"{name} must be on {where}, got {v.device}")
    return CHECKS.tensor(v, name, shape=(n, *row_shape))


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
    if out is None:
        return torch.empty((n, *row_shape), dtype=dtype, device=device)
    o: torch.Tensor = rows_in(CHECKS.tensor(out, "out"), "out", n, row_shape, dtype, device)
    return CHECKS.tensor(o, "out", contiguous=True)
