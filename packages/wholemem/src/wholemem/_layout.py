"""Shapes, strides and dtypes of wholemem tensors, and the row partition plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from distkit_common.dtypes import code_of

#: dtypes a wholemem tensor can hold.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
)


class Stride(tuple[int, ...]):
    """A tuple of strides that can also be called like ``Tensor.stride(dim=None)``."""

    def __call__(self, dim: int | None = None) -> Any:
        return tuple(self) if dim is None else self[dim]


def rows_per_rank(nrows: int, size: int) -> int:
    """The partition plan: rank r owns rows ``[r*k, min(N, (r+1)*k))`` with ``k = ceil(N/size)``."""
    return max(1, math.ceil(nrows / size))


def local_range(nrows: int, size: int, rank: int) -> tuple[int, int]:
    """First and one-past-last row owned by ``rank``."""
    k = rows_per_rank(nrows, size)
    return min(nrows, rank * k), min(nrows, (rank + 1) * k)


def _int_seq(x: Any, name: str) -> tuple[int, ...]:
    if isinstance(x, torch.Size):
        return tuple(int(v) for v in x)
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of ints, got {type(x).__name__} {x!r}")
    out = []
    for v in x:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must hold ints, got {v!r} in {x!r}")
        out.append(int(v))
    return tuple(out)


def elements_overlap(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether two elements of a tensor of ``shape`` and ``stride`` may share memory: dims sorted
    by stride, each stride must clear the span of those below it (True also for rare interleaved
    layouts that do not overlap)."""
    span = 0
    for st, sz in sorted(zip(stride, shape)):
        if sz > 1 and st <= span:
            return True
        span += (sz - 1) * st
    return False


@dataclass(frozen=True)
class Layout:
    """Shape, strides (in elements) and dtype of a row-partitioned tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @staticmethod
    def make(shape: Any, stride: Any, dtype: Any) -> Layout:
        """Validate and build a layout; an empty ``stride`` means contiguous.

        Raises
        ------
        TypeError
            Non-integer shape/stride entries, or an unsupported dtype.
        ValueError
            Negative sizes, a stride of the wrong length, non-positive strides,
            overlapping elements, or trailing dimensions that cannot be merged
            into one column dimension.
        """
        shp = _int_seq(shape, "shape")
        if len(shp) == 0:
            raise ValueError("shape must have at least one dimension (rows)")
        if any(s < 0 for s in shp):
            raise ValueError(f"shape must be non-negative, got {shp}")
        if not isinstance(dtype, torch.dtype) or dtype not in SUPPORTED_DTYPES:
            names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
            raise TypeError(f"dtype must be one of {names}; got {dtype!r}")
        strd = _int_seq(stride if stride is not None else [], "stride")
        if len(strd) == 0:
            acc, out = 1, []
            for s in reversed(shp):
                out.append(acc)
                acc *= max(s, 1)
            strd = tuple(reversed(out))
        if len(strd) != len(shp):
            raise ValueError(f"stride {strd} must have one entry per dimension of shape {shp}")
        if any(s < 1 for s in strd):
            raise ValueError(f"strides must be >= 1, got {strd}")
        if elements_overlap(shp, strd):
            raise ValueError(f"stride {strd} makes elements of shape {shp} overlap")
        # dims 1.. must merge into one strided column dimension
        for i in range(1, len(shp) - 1):
            if shp[i + 1] > 1 and shp[i] > 1 and strd[i] != strd[i + 1] * shp[i + 1]:
                raise ValueError(
                    f"stride {strd}: dimensions 1..{len(shp) - 1} of shape {shp} must be mergeable into one "
                    "(stride[i] == stride[i+1] * shape[i+1])"
                )
        return Layout(shp, strd, dtype)

    @property
    def nrows(self) -> int:
        return self.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def ncols(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def row_stride(self) -> int:
        return self.stride[0]

    @property
    def col_stride(self) -> int:
        # innermost dimension with more than one element decides the column step
        for sz, st in zip(reversed(self.shape[1:]), reversed(self.stride[1:])):
            if sz > 1:
                return st
        return 1

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def code(self) -> int:
        return code_of(self.dtype)

    def elems(self, rows: int) -> int:
        """Elements of storage needed for ``rows`` rows (0 when empty)."""
        if rows == 0 or self.ncols == 0:
            return 0
        return (rows - 1) * self.row_stride + sum((s - 1) * st for s, st in zip(self.shape[1:], self.stride[1:])) + 1

    def describe(self) -> list[Any]:
        """Shape, strides and dtype as JSON values (compared between ranks)."""
        return [list(self.shape), list(self.stride), str(self.dtype)]

    def rows_view(self, raw: torch.Tensor, rows: int) -> torch.Tensor:
        """A strided tensor of ``rows`` rows of this layout over the uint8 tensor ``raw``
        (same device; it keeps ``raw``'s memory alive)."""
        flat = raw[: self.elems(rows) * self.itemsize].view(self.dtype)
        return flat.as_strided((rows, *self.row_shape), self.stride)


def plain_table_args(t: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(nrows, ncols, row_stride, col_stride) of a strided CPU tensor, or None if its
    trailing dimensions cannot be merged into one strided column dimension."""
    if t.dim() == 0:
        return None
    shp, strd = tuple(t.shape), tuple(t.stride())
    for i in range(1, len(shp) - 1):
        if shp[i + 1] > 1 and shp[i] > 1 and strd[i] != strd[i + 1] * shp[i + 1]:
            return None
    col = 1
    for sz, st in zip(reversed(shp[1:]), reversed(strd[1:])):
        if sz > 1:
            col = st
            break
    return shp[0], math.prod(shp[1:]), strd[0], col
