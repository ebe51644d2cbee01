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


def check_out(out: Any, t: Tensor) -> None:
    """Validate the ``out=`` tensor of an Allreduce of ``t``.

    Parameters
    ----------
    out : object
        What the caller passed as ``out``.
    t : torch.Tensor
        The (checked) input.

    Raises
    ------
    ValueError
        ``out`` is not a contiguous tensor of ``t``'s device, shape and dtype without grad,
        is a lazy conjugate / negative view, or partly overlaps ``t``.
    """
    if not (
        isinstance(out, torch.Tensor)
        and out.device == t.device
        and out.layout == torch.strided
        and not out.is_nested
        and out.is_contiguous()
        and out.dtype == t.dtype
        and out.shape == t.shape
        and not out.requires_grad
    ):
        raise MpiadValueError(
            "out must be a contiguous tensor on the input's device, of its shape and dtype, without grad"
        )
    if out.is_conj() or out.is_neg():
        raise MpiadValueError("out must hold its own values, not a lazy conjugate or negative view (resolve_conj())")
    if out is not t and out.nbytes:
        a, b, n = t.data_ptr(), out.data_ptr(), t.nbytes
        if a != b and a < b + n and b < a + n:
            raise MpiadValueError("out overlaps the input without being it (MPI forbids partly aliased buffers)")


def default_numelem(t: Tensor, axis: int, size: int, name: str) -> int:
    """The even share of ``t`` along ``axis`` over ``size`` ranks (Reduce_scatter's default ``numelem``).

    Parameters
    ----------
    t : torch.Tensor
        The input.
    axis : int
        The (checked) scatter axis.
    size : int
        The communicator size.
    name : str
        The operation, for the message.

    Returns
    -------
    int
        ``t.shape[axis] // size``.

    Raises
    ------
    ValueError
        The size along ``axis`` does not divide by ``size``.
    """
    if t.shape[axis] % size:
        raise MpiadValueError(
            f"{name}: size {t.shape[axis]} along axis {axis} does not divide by {size} ranks; pass numelem"
        )
    return t.shape[axis] // size


def script_numelem(tensor: Tensor, axis: int, numelem: int | None, size: int) -> int:
    """(compiled by TorchScript) Reduce_scatter's share: ``numelem``, by default the even split.

    Parameters
    ----------
    tensor : torch.Tensor
        The input.
    axis : int
        The scatter axis.
    numelem : int or None
        The share the caller gave, if any.
    size : int
        The communicator size.

    Returns
    -------
    int
        ``numelem``, or ``tensor.size(axis) // size``.

    Raises
    ------
    ValueError
        No ``numelem`` and the size along ``axis`` does not divide by ``size``.
    """
    if numelem is not None:
        return numelem
    n = tensor.size(axis)
    if n % size != 0:
        raise ValueError(f"Reduce_scatter: size {n} along axis {axis} does not divide by {size} ranks; pass numelem")
    return n // size


def check_reduce_scatter(
    tensor: Any, op: Any, scatteraxis: Any, numelem: Any, size: int
) -> tuple[Tensor, int, int, int]:
    """Validate the arguments of a (non-blocking) Reduce_scatter on ``size`` ranks.

    Parameters
    ----------
    tensor, op, scatteraxis, numelem : object
        What the caller passed (``numelem`` may be ``None``: the even split).
    size : int
        The communicator size.

    Returns
    -------
    tuple of (torch.Tensor, int, int, int)
        The tensor, op, axis (non-negative) and this rank's share.

    Raises
    ------
    TypeError, ValueError
        As :func:`check_tensor`, :func:`check_scatter_op`, ``check_axis``, :func:`check_numelem`
        and :func:`default_numelem`.
    """
    t = check_tensor(tensor)
    op = check_scatter_op(op, t)
    axis = check_axis(scatteraxis, "scatteraxis", t.dim())
    numelem = default_numelem(t, axis, size, "Reduce_scatter") if numelem is None else check_numelem(numelem)
    return t, op, axis, numelem
