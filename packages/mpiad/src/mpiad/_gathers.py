"""Gather, Allgather, Scatter, Alltoall and Reduce_scatter: each one's backward rule, eager
autograd Function and torch.compile / TorchScript custom op, in that order.

The rules are written once, against a :class:`Backend` that does their communication: the
eager :class:`EagerBackend` (raw communication of ``_collectives``, or these Functions again
under ``create_graph=True``) or the compiled :class:`_Ops` (the custom ops). The pairs:
Gather <-> Scatter, Allgather <-> Reduce_scatter(SUM), Alltoall <-> Alltoall with the axes
swapped. The non-blocking twins (``_nonblocking``) start the same adjoints.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from . import _collectives as _coll
from . import _mpiad
from ._checks import check_axis, check_int, check_numelem, check_rank, check_scatter_op, check_tensor
from ._constants import MPI_AVG, MPI_SUM, OP_NAMES
from ._functions import EagerComm, JoinDummies, needs_grad
from ._library import check_shape, join, keep_collective_order, ordered, rank_size

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- plumbing
class Backend(Protocol):
    """The communication the gathers' backward rules perform, on one communicator."""

    def gather(self, t: Tensor, axis: int, root: int) -> Tensor: ...
    def allgather(self, t: Tensor, axis: int) -> Tensor: ...
    def scatter(self, t: Tensor, axis: int, numelem: int, root: int) -> Tensor: ...
    def alltoall(self, t: Tensor, gaxis: int, saxis: int, numelem: int) -> Tensor: ...
    def reduce_scatter(self, t: Tensor, op: int, axis: int, numelem: int) -> Tensor: ...
    def join(self, x: Tensor, dummy: Tensor) -> Tensor:
        """``x``, with an autograd dependency on ``dummy`` (JoinDummies)."""
        ...


class EagerBackend(EagerComm):
    """The eager communication of the gathers' backward rules (see :class:`~mpiad._functions.EagerComm`)."""

    def gather(self, t: Tensor, axis: int, root: int) -> Tensor:
        if needs_grad(t):
            return Gather.apply(t, self.comm, self.rank, self.size, axis, root)
        return _coll.gather(self.comm, t, axis, root, self.rank)

    def allgather(self, t: Tensor, axis: int) -> Tensor:
        if needs_grad(t):
            return Allgather.apply(t, self.comm, axis)
        return _coll.allgather(self.comm, t, axis)

    def scatter(self, t: Tensor, axis: int, numelem: int, root: int) -> Tensor:
        if needs_grad(t):
            return Scatter.apply(t, self.comm, self.rank, axis, numelem, root)
        return _coll.scatter(self.comm, t, axis, numelem, root, self.rank)

    def alltoall(self, t: Tensor, gaxis: int, saxis: int, numelem: int) -> Tensor:
        if needs_grad(t):
            return Alltoall.apply(t, self.comm, gaxis, saxis, numelem)
        return _coll.alltoall(self.comm, t, gaxis, saxis, numelem)

    def reduce_scatter(self, t: Tensor, op: int, axis: int, numelem: int) -> Tensor:
        if needs_grad(t):
            return ReduceScatter.apply(t, self.comm, op, axis, numelem)
        return _coll.reduce_scatter(self.comm, t, op, axis, numelem)

    def join(self, x: Tensor, dummy: Tensor) -> Tensor:
        return JoinDummies.apply(x, dummy) if dummy.requires_grad else x


class _Ops:
    """The custom ops as the communication of the backward rules (:class:`Backend`)."""

    def __init__(self, comm: int) -> None:
        self.comm = comm

    def gather(self, t: Tensor, axis: int, root: int) -> Tensor:
        return torch.ops.mpiad.gather(t, self.comm, axis, root)

    def allgather(self, t: Tensor, axis: int) -> Tensor:
        return torch.ops.mpiad.allgather(t, self.comm, axis)

    def scatter(self, t: Tensor, axis: int, numelem: int, root: int) -> Tensor:
        return torch.ops.mpiad.scatter(t, self.comm, axis, numelem, root)

    def alltoall(self, t: Tensor, gaxis: int, saxis: int, numelem: int) -> Tensor:
        return torch.ops.mpiad.alltoall(t, self.comm, gaxis, saxis, numelem)

    def reduce_scatter(self, t: Tensor, op: int, axis: int, numelem: int) -> Tensor:
        return torch.ops.mpiad.reduce_scatter(t, self.comm, op, axis, numelem)

    def join(self, x: Tensor, dummy: Tensor) -> Tensor:
        return join(x, [dummy])


# ------------------------------------------------------------------------------- Gather
def gather_backward(be: Backend, g: Tensor, axis: int, root: int, n: int) -> Tensor:
    """Gather on ``root``: root's gradient scattered back, ``n`` slices along ``axis`` to each rank."""
    return be.scatter(g.contiguous(), axis, n, root)


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, size: int, axis: int, root: int) -> Tensor:
        ctx.args = (comm, rank, size, axis, root, x.shape[axis])
        return _coll.gather(comm, x, axis, root, rank)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, size, axis, root, n = ctx.args
        gx = gather_backward(EagerBackend(comm, rank, size), g, axis, root, n)
        return gx, None, None, None, None, None


def _gather_shape(x: Tensor, comm: int, axis: int, root: int | None) -> list[int]:
    rank, size = rank_size(comm)
    shape = list(x.shape)
    shape[axis] = 0 if (root is not None and rank != root) else shape[axis] * size
    return shape


@torch.library.custom_op("mpiad::gather", mutates_args=())
def gather(x: Tensor, comm: int, axis: int, root: int) -> Tensor:
    rank, size = rank_size(comm)
    axis = check_axis(axis, "gatheraxis", check_tensor(x).dim())
    root = check_rank(root, "root", size)
    return check_shape(_coll.gather(comm, x, axis, root, rank), _gather_shape(x, comm, axis, root), "Gather")


@gather.register_fake
def _(x: Tensor, comm: int, axis: int, root: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_gather_shape(x, comm, axis, root))


def _gather_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, axis, root = inputs
    ctx.args = (comm, axis, root, x.shape[axis])


def _gather_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:
    comm, axis, root, n = ctx.args
    return gather_backward(_Ops(comm), g, axis, root, n), None, None, None


gather.register_autograd(_gather_bwd, setup_context=_gather_setup)


# ---------------------------------------------------------------------------- Allgather
def allgather_backward(be: Backend, g: Tensor, axis: int, n: int) -> Tensor:
    """Allgather: every rank's upstream gradient of my ``n`` slices, summed (Reduce_scatter SUM)."""
    return be.reduce_scatter(g.contiguous(), MPI_SUM, axis, n)


class Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, axis: int) -> Tensor:
        ctx.args = (comm, axis, x.shape[axis])
        return _coll.allgather(comm, x, axis)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, axis, n = ctx.args
        return allgather_backward(EagerBackend(comm), g, axis, n), None, None


@torch.library.custom_op("mpiad::allgather", mutates_args=())
def allgather(x: Tensor, comm: int, axis: int) -> Tensor:
    axis = check_axis(axis, "gatheraxis", check_tensor(x).dim())
    return check_shape(_coll.allgather(comm, x, axis), _gather_shape(x, comm, axis, None), "Allgather")


@allgather.register_fake
def _(x: Tensor, comm: int, axis: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_gather_shape(x, comm, axis, None))


def _allgather_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, axis = inputs
    ctx.args = (comm, axis, x.shape[axis])


def _allgather_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
    comm, axis, n = ctx.args
    return allgather_backward(_Ops(comm), g, axis, n), None, None


allgather.register_autograd(_allgather_bwd, setup_context=_allgather_setup)


# ------------------------------------------------------------------------------ Scatter
def scatter_backward(be: Backend, g: Tensor, axis: int, root: int, rank: int, xshape: list[int]) -> Tensor:
    """Scatter from ``root``: the gradients gathered on root; zeros of the input's shape elsewhere.

    The (empty) gathered tensor of a non-root stays in the graph, so that a double
    backward runs its Scatter on every rank (as mpi4torch's JoinDummies did).
    """
    gx = be.gather(g.contiguous(), axis, root)
    if rank != root:
        gx = be.join(torch.zeros(xshape, dtype=g.dtype, device=g.device), gx)
    return gx


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, axis: int, numelem: int, root: int) -> Tensor:
        ctx.xshape = list(x.shape)
        y = _coll.scatter(comm, x, axis, numelem, root, rank)
        ctx.args = (comm, rank, axis % y.dim(), root)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, axis, root = ctx.args
        gx = scatter_backward(EagerBackend(comm, rank), g, axis, root, rank, ctx.xshape)
        return gx, None, None, None, None, None


def _scatter_shape(x: Tensor, axis: int, numelem: int) -> list[int]:
    shape = list(x.shape)
    shape[axis] = numelem
    return shape


@torch.library.custom_op("mpiad::scatter", mutates_args=())
def scatter(x: Tensor, comm: int, axis: int, numelem: int, root: int) -> Tensor:
    rank, size = rank_size(comm)
    check_tensor(x)
    axis = check_int(axis, "scatteraxis")  # (range-checked against root's tensor, on every rank)
    numelem, root = check_numelem(numelem), check_rank(root, "root", size)
    out = _coll.scatter(comm, x, axis, numelem, root, rank)
    return check_shape(out, _scatter_shape(x, axis, numelem), "Scatter")


@scatter.register_fake
def _(x: Tensor, comm: int, axis: int, numelem: int, root: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_scatter_shape(x, axis, numelem))


def _scatter_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, axis, _, root = inputs
    ctx.args = (comm, axis, root, list(x.shape))


def _scatter_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None, None]:
    comm, axis, root, xshape = ctx.args
    rank, _ = rank_size(comm)
    return scatter_backward(_Ops(comm), g, axis, root, rank, xshape), None, None, None, None


scatter.register_autograd(_scatter_bwd, setup_context=_scatter_setup)


# ----------------------------------------------------------------------------- Alltoall
def alltoall_backward(be: Backend, g: Tensor, gaxis: int, saxis: int, n: int) -> Tensor:
    """Alltoall: the same exchange backwards (axes swapped, ``n`` = my input's size along ``gaxis``)."""
    return be.alltoall(g.contiguous(), saxis, gaxis, n)


class Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> Tensor:
        ctx.args = (comm, gaxis, saxis, x.shape[gaxis])
        return _coll.alltoall(comm, x, gaxis, saxis, numelem)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, gaxis, saxis, n = ctx.args
        return alltoall_backward(EagerBackend(comm), g, gaxis, saxis, n), None, None, None, None


def _alltoall_shape(x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> list[int]:
    _, size = rank_size(comm)
    shape = list(x.shape)
    if gaxis != saxis:
        shape[gaxis] *= size
    shape[saxis] = numelem
    return shape


@torch.library.custom_op("mpiad::alltoall", mutates_args=())
def alltoall(x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> Tensor:
    ndim = check_tensor(x).dim()
    gaxis, saxis = check_axis(gaxis, "gatheraxis", ndim), check_axis(saxis, "scatteraxis", ndim)
    numelem = check_numelem(numelem)
    out = _coll.alltoall(comm, x, gaxis, saxis, numelem)
    return check_shape(out, _alltoall_shape(x, comm, gaxis, saxis, numelem), "Alltoall")


@alltoall.register_fake
def _(x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_alltoall_shape(x, comm, gaxis, saxis, numelem))


def _alltoall_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, gaxis, saxis, _ = inputs
    ctx.args = (comm, gaxis, saxis, x.shape[gaxis])


def _alltoall_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None, None]:
    comm, gaxis, saxis, n = ctx.args
    return alltoall_backward(_Ops(comm), g, gaxis, saxis, n), None, None, None, None


alltoall.register_autograd(_alltoall_bwd, setup_context=_alltoall_setup)


# ----------------------------------------------------------------------- Reduce_scatter
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


def reduce_scatter_backward(be: Backend, g: Tensor, op: int, axis: int, size: int) -> Tensor:
    """Reduce_scatter (SUM or AVG): the shares' gradients gathered, scaled by 1/size for AVG.

    Raises
    ------
    RuntimeError
        ``op`` is not differentiable here (before any communication).
    """
    scale = reduce_scatter_adjoint_scale(op, size)
    gx = be.allgather(g.contiguous(), axis)
    return gx if scale == 1.0 else gx * scale


class ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, op: int, axis: int, numelem: int) -> Tensor:
        ctx.args = (comm, op, axis)
        return _coll.reduce_scatter(comm, x, op, axis, numelem)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, op, axis = ctx.args
        gx = reduce_scatter_backward(EagerBackend(comm), g, op, axis, _mpiad.comm_size(comm))
        return gx, None, None, None, None


@torch.library.custom_op("mpiad::reduce_scatter", mutates_args=())
def reduce_scatter(x: Tensor, comm: int, op: int, axis: int, numelem: int) -> Tensor:
    op = check_scatter_op(op, check_tensor(x))
    axis = check_axis(axis, "scatteraxis", x.dim())
    return _coll.reduce_scatter(comm, x, op, axis, check_numelem(numelem))


@reduce_scatter.register_fake
def _(x: Tensor, comm: int, op: int, axis: int, numelem: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_scatter_shape(x, axis, numelem))


def _rsc_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, comm, op, axis, _ = inputs
    ctx.args = (comm, op, axis)


def _rsc_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None, None]:
    comm, op, axis = ctx.args
    return reduce_scatter_backward(_Ops(comm), g, op, axis, rank_size(comm)[1]), None, None, None, None


reduce_scatter.register_autograd(_rsc_bwd, setup_context=_rsc_setup)


for _op in (gather, allgather, scatter, alltoall, reduce_scatter):
    ordered(_op)
