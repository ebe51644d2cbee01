"""Argument checks at the public boundary (raised before any communication)."""

from __future__ import annotations

from typing import Any

import torch

from distkit_common.dtypes import CODES
from distkit_common.validate import Checks

from . import _mpiad
from ._constants import MPI_MAXLOC, MPI_MINLOC, OP_NAMES
from ._errors import MpiadTypeError, MpiadValueError

Tensor = torch.Tensor

#: distkit's shared checks, raising mpiad's exception classes (also RuntimeErrors, as mpi4torch's)
CHECKS = Checks(type_error=MpiadTypeError, value_error=MpiadValueError, index_error=MpiadValueError)

#: torch dtype -> distkit dtype code (the codes of the extension)
CODE: dict[torch.dtype, int] = {getattr(torch, name): code for name, code in CODES.items()}
_DTYPE: dict[int, torch.dtype] = {code: dt for dt, code in CODE.items()}

#: (op, dtype) -> dtype code for every pair a reduction accepts, from the extension's
#: own table (MINLOC/MAXLOC excluded: they also need a shape check). One dict lookup
#: validates a call; built once, never mutated (torch.compile may guard on it).
VALID: dict[tuple[int, torch.dtype], int] = {
    (op, _DTYPE[code]): code
    for op, code in _mpiad.valid_op_dtypes()
    if op not in (MPI_MINLOC, MPI_MAXLOC) and code in _DTYPE
}
_VALID_ALL = frozenset((op, _DTYPE[code]) for op, code in _mpiad.valid_op_dtypes() if code in _DTYPE)


def dtype_code(t: Tensor, name: str = "tensor") -> int:
    """distkit dtype code of ``t`` (TypeError for unsupported dtypes)."""
    code = CODE.get(t.dtype)
    if code is None:
        supported = ", ".join(str(d).removeprefix("torch.") for d in CODE)
        raise MpiadTypeError(f"{name} has unsupported dtype {t.dtype}; supported: {supported}")
    return code


def check_tensor(t: Any, name: str = "tensor") -> Tensor:
    """TypeError unless ``t`` is a strided CPU/CUDA tensor of a supported dtype."""
    CHECKS.tensor(t, name)
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else t.layout
        raise MpiadTypeError(f"{name} must be a dense (strided) tensor, got a {kind} tensor")
    if not (t.is_cpu or t.is_cuda):  # (meta tensors have no memory for MPI)
        raise MpiadValueError(f"{name} must live on the CPU or a CUDA device, got {t.device}")
    dtype_code(t, name)
    if t.numel() and not torch.compiler.is_compiling():  # (traced tensors have no memory yet)
        try:
            ptr = t.data_ptr()
        except RuntimeError:  # a functorch wrapper: its inner tensor is checked when unwrapped
            ptr = None
        if ptr == 0:
            raise MpiadValueError(
                f"{name} has {t.numel()} elements but no memory (its storage was resized to 0, "
                "as FSDP does with freed parameters)"
            )
    return t


check_int = CHECKS.int
check_rank = CHECKS.rank
check_axis = CHECKS.axis


def check_numelem(v: Any) -> int:
    return CHECKS.int(v, "numelem", lo=0)


def check_tag(v: Any, name: str, tag_ub: int = 32767) -> int:
    """``v`` as a tag: 0 .. ``tag_ub`` - 10 (the backward message uses tag + 10)."""
    v = check_int(v, name)
    if not 0 <= v <= tag_ub - 10:
        raise MpiadValueError(
            f"{name} = {v} is out of range (0..{tag_ub - 10}: MPI_TAG_UB = {tag_ub}, tag+10 carries the gradient)"
        )
    return v


def check_op(op: Any, t: Tensor) -> int:
    """``op`` validated for ``t`` (op constant, dtype, MINLOC/MAXLOC pair shape)."""
    if type(op) is int and (op, t.dtype) in VALID:
        return op
    op = check_int(op, "op")
    if op not in OP_NAMES:
        raise MpiadValueError(f"op = {op} is not one of the MPI_* constants")
    if (op, t.dtype) not in _VALID_ALL:
        raise MpiadTypeError(f"{OP_NAMES[op]} is not supported for dtype {str(t.dtype).removeprefix('torch.')}")
    if op in (MPI_MINLOC, MPI_MAXLOC) and (t.dim() == 0 or t.shape[-1] != 2):
        raise MpiadValueError(
            f"{OP_NAMES[op]} needs (value, index) pairs in the last dimension (size 2), got shape {tuple(t.shape)}"
        )
    return op


def check_scatter_op(op: Any, t: Tensor) -> int:
    """``op`` validated for a Reduce_scatter of ``t`` (MINLOC / MAXLOC rejected)."""
    op = check_op(op, t)
    if op in (MPI_MINLOC, MPI_MAXLOC):
        raise MpiadTypeError("Reduce_scatter does not support MPI_MINLOC / MPI_MAXLOC")
    return op
