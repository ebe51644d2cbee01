"""Backward formulas, shared by the eager autograd Functions and the torch.compile ops.

Each formula takes a ``Backend`` that performs the communication: the eager
path passes :mod:`mpiad._raw`-based functions, the compiled path the
``torch.ops.mpiad`` custom ops (so the backward graph traces too).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ._constants import (
    DIFFERENTIABLE_OPS,
    MPI_AVG,
    MPI_MAX,
    MPI_MAXLOC,
    MPI_MIN,
    MPI_MINLOC,
    MPI_PROD,
    MPI_SUM,
    OP_NAMES,
)

Tensor = torch.Tensor


class Backend(Protocol):
    def allreduce(self, t: Tensor, op: int) -> Tensor: ...
    def bcast(self, t: Tensor, root: int) -> Tensor: ...
    def reduce(self, t: Tensor, op: int, root: int) -> Tensor: ...


def _owner_mask(be: Backend, x: Tensor, y: Tensor, rank: int, size: int, pairs: bool) -> Tensor:
    """1 where this rank holds the extremum ``y`` (lowest rank on ties), else 0."""
    hit = (x[..., 0] == y[..., 0]) & (x[..., 1] == y[..., 1]) if pairs else x == y
    cand = torch.where(
        hit, torch.full_like(hit, rank, dtype=torch.int32), torch.full_like(hit, size, dtype=torch.int32)
    )
    owner = be.allreduce(cand, MPI_MIN)
    return owner == rank


def _prod_others(be: Backend, x: Tensor) -> Tensor:
    """prod over the other ranks' x, elementwise, robust to zeros."""
    zero = x == 0
    nzero = be.allreduce(zero.to(torch.int32), MPI_SUM)
    safe = torch.where(zero, torch.ones_like(x), x)
    p = be.allreduce(safe, MPI_PROD)
    others_if_none = p / safe
    return torch.where(
        nzero == 0,
        others_if_none,
        torch.where((nzero == 1) & zero, p, torch.zeros_like(p)),
    )


def _check_diff(op: int, name: str) -> None:
    if op not in DIFFERENTIABLE_OPS:
        raise RuntimeError(f"{name} with {OP_NAMES.get(op, op)} has no derivative (it is not differentiable)")


def allreduce_backward(
    be: Backend, g: Tensor, x: Tensor | None, y: Tensor | None, op: int, rank: int, size: int
) -> Tensor:
    """d/dx_r of y = op_r x_r, given every rank's upstream gradient ``g``."""
    _check_diff(op, "Allreduce")
    return allreduce_backward_finish(be, be.allreduce(g, adjoint_op(op)), x, y, op, rank, size)


def adjoint_op(op: int) -> int:
    """The reduction of the upstream gradients in the backward of an ``op`` reduction."""
    return MPI_AVG if op == MPI_AVG else MPI_SUM


def allreduce_backward_finish(
    be: Backend, gs: Tensor, x: Tensor | None, y: Tensor | None, op: int, rank: int, size: int
) -> Tensor:
    """The rest of :func:`allreduce_backward`, given ``gs`` = Allreduce(g, adjoint_op(op))."""
    _check_diff(op, "Allreduce")
    if op in (MPI_SUM, MPI_AVG):
        return gs
    assert x is not None and y is not None
    if op in (MPI_MAX, MPI_MIN):
        return gs * _owner_mask(be, x, y, rank, size, False).to(gs.dtype)
    if op in (MPI_MAXLOC, MPI_MINLOC):
        m = _owner_mask(be, x, y, rank, size, True).to(gs.dtype)
        out = torch.zeros_like(gs)
        out[..., 0] = gs[..., 0] * m
        return out
    d = _prod_others(be, x)
    return gs * (d.conj() if d.is_complex() else d)


def reduce_backward(
    be: Backend, g: Tensor, x: Tensor | None, y: Tensor | None, op: int, root: int, rank: int, size: int
) -> Tensor:
    """Backward of Reduce_ to ``root``: only root's upstream gradient counts."""
    _check_diff(op, "Reduce_")
    return reduce_backward_finish(be, be.bcast(g.contiguous(), root), x, y, op, root, rank, size)


def reduce_backward_finish(
    be: Backend, gr: Tensor, x: Tensor | None, y: Tensor | None, op: int, root: int, rank: int, size: int
) -> Tensor:
    """The rest of :func:`reduce_backward`, given ``gr`` = root's upstream gradient (Bcast)."""
    _check_diff(op, "Reduce_")
    if op == MPI_SUM:
        return gr
    if op == MPI_AVG:
        return gr / size
    assert x is not None and y is not None
    if op == MPI_PROD:
        d = _prod_others(be, x)
        return gr * (d.conj() if d.is_complex() else d)
    yr = be.bcast(y.contiguous(), root)
    pairs = op in (MPI_MAXLOC, MPI_MINLOC)
    m = _owner_mask(be, x, yr, rank, size, pairs).to(gr.dtype)
    if not pairs:
        return gr * m
    out = torch.zeros_like(gr)
    out[..., 0] = gr[..., 0] * m
    return out


def needs_saved(op: int) -> bool:
    """Whether the backward of an ``op`` reduction needs the input and the result."""
    return op not in (MPI_SUM, MPI_AVG)


def reduce_scatter_adjoint_scale(op: int, size: int) -> float:
    """Factor of the Allgather in Reduce_scatter's backward (SUM: 1, AVG: 1/size).

    Raises
    ------
    RuntimeError
        Other ops (not differentiable).
    """
    if op == MPI_SUM:
        return 1.0
    if op == MPI_AVG:
        return 1.0 / size
    raise RuntimeError(
        f"Reduce_scatter with {OP_NAMES.get(op, op)} has no derivative: differentiable for MPI_SUM only (and MPI_AVG)"
    )
