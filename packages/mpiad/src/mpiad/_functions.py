"""Eager autograd: one ``torch.autograd.Function`` per operation.

The backward passes call the raw (non-autograd) communication of
:mod:`mpiad._collectives` (or, under ``create_graph=True``, these Functions
again); the pairs: Gather <-> Scatter, Allgather <-> Reduce_scatter, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import _collectives as _coll
from . import _grad, _mpiad
from ._checks import CODE
from ._constants import BACKWARD_TAG_OFFSET, MPI_AVG, MPI_SUM
from ._debug import state as _debug

Tensor = torch.Tensor


def _diff(t: Tensor) -> bool:
    """Whether a backward formula must record a graph for ``t`` (``create_graph=True``)."""
    return t.requires_grad and torch.is_grad_enabled()


class EagerBackend:
    """Communication for backward formulas, on one communicator.

    Under ``create_graph=True`` (grad mode on inside backward) the communication
    goes through the autograd Functions again, so the backward itself is
    differentiable (double backward, Hessian-vector products), as in mpi4torch,
    whose backward nodes called its differentiable ops.
    """

    def __init__(self, comm: int, rank: int, size: int = 0) -> None:
        self.comm = comm
        self.rank = rank
        self.size = size

    def allreduce(self, t: Tensor, op: int) -> Tensor:
        if _diff(t):
            return Allreduce.apply(t, self.comm, self.rank, self.size, op)
        return _coll.allreduce(self.comm, t, op)

    def bcast(self, t: Tensor, root: int) -> Tensor:
        if _diff(t):
            return Bcast.apply(t.clone(), self.comm, self.rank, root)
        return _coll.bcast(self.comm, t, root)

    def reduce(self, t: Tensor, op: int, root: int) -> Tensor:
        if _diff(t):
            return Reduce.apply(t.clone(), self.comm, self.rank, self.size, op, root)
        return _coll.reduce(self.comm, t, op, root, self.rank)


class Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, size: int, op: int) -> Tensor:
        y = _coll.allreduce(comm, x, op)  # (large outputs come from the buffer pool)
        ctx.args = (comm, rank, size, op)
        if _grad.needs_saved(op):
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, size, op = ctx.args
        x, y = ctx.saved_tensors if _grad.needs_saved(op) else (None, None)
        gx = _grad.allreduce_backward(EagerBackend(comm, rank, size), g, x, y, op, rank, size)
        return gx, None, None, None, None


_empty_like = torch.empty_like
_allreduce_fast = _mpiad.allreduce_fast
_Tensor = torch.Tensor


class AllreduceSmall(torch.autograd.Function):
    """The latency path of :class:`Allreduce` (what ``Communicator.Allreduce`` uses
    for contiguous CPU tensors below 1 MiB outside debug mode).

    Forward and (first-order SUM) backward each cost one allocation and one
    native ``MPI_Allreduce``; ``ctx`` keeps one tuple (plus ``x`` and the result
    for ops other than SUM). ``code`` is the dtype code, validated by the caller.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: Any, op: int, code: int) -> Tensor:
        y = _empty_like(x)
        _allreduce_fast(comm.handle, x.data_ptr(), y.data_ptr(), x.nbytes, code, op)
        ctx.a = (comm, op, code)
        if _grad.needs_saved(op):
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, op, code = ctx.a
        if (
            op in (MPI_SUM, MPI_AVG)
            and type(g) is _Tensor
            and not g.requires_grad
            and g.is_cpu
            and g.is_contiguous()
            and not g.is_conj()  # (autograd may hand a lazily conjugated gradient)
            and not g.is_neg()
            and not _debug.on
            and CODE.get(g.dtype) == code
        ):
            gs = _empty_like(g)
            _allreduce_fast(comm.handle, g.data_ptr(), gs.data_ptr(), g.nbytes, code, op)
            return gs, None, None, None
        x, y = ctx.saved_tensors if _grad.needs_saved(op) else (None, None)
        be = EagerBackend(comm.handle, comm.rank, comm.size)
        return _grad.allreduce_backward(be, g, x, y, op, comm.rank, comm.size), None, None, None


#: ``AllreduceSmall.apply`` without ``Function.apply``'s Python wrapper (~1.5 us here);
#: valid only when no functorch transform is active, and after ``unwrap_if_dead`` on
#: the tensor argument: exactly what that wrapper does in this case.
#: These are torch internals: when a torch release renames any of them, the
#: public ``AllreduceSmall.apply`` is used instead (``functorch_active`` then
#: always answers True), which is slower by that wrapper and otherwise the same.
try:
    apply_small: Callable[..., Tensor] = torch._C._FunctionBase.__dict__["apply"].__get__(None, AllreduceSmall)
    functorch_active: Callable[[], bool] = torch._C._are_functorch_transforms_active
    unwrap_if_dead: Callable[[Tensor], Tensor] = torch._C._functorch.unwrap_if_dead
except (AttributeError, KeyError, TypeError):  # pragma: no cover - depends on the torch release
    apply_small = AllreduceSmall.apply

    def unwrap_if_dead(t: Tensor) -> Tensor:
        return t

    def functorch_active() -> bool:
        return True


class NoInplaceReuse(torch.autograd.Function):
    """Takes over the history of a tensor passed to an in-place op; using it raises."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, opname: str) -> Tensor:
        ctx.mark_dirty(x)
        ctx.opname = opname
        return x

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[None, None]:
        raise RuntimeError(
            "Reuse of variables passed to in-place MPI kernels not supported! Try using the return value "
            f"(mpiad: a tensor passed to the in-place {ctx.opname} was used again afterwards; its contents were "
            f"overwritten: use the return value of {ctx.opname} instead)."
        )


class Bcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, root: int) -> Tensor:
        buf = x.detach()
        _coll.bcast_into(comm, buf, root)
        torch.autograd.graph.increment_version(x)
        ctx.args = (comm, rank, root)
        return buf

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, root = ctx.args
        return EagerBackend(comm, rank).reduce(g, MPI_SUM, root), None, None, None


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, size: int, op: int, root: int) -> Tensor:
        keep = _grad.needs_saved(op)
        xin = x.detach().clone() if keep else None
        buf = x.detach()
        _coll.reduce_into(comm, buf, op, root, rank)
        torch.autograd.graph.increment_version(x)
        ctx.args = (comm, rank, size, op, root)
        if keep:
            ctx.save_for_backward(xin, buf.clone())
        return buf

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, size, op, root = ctx.args
        x, y = ctx.saved_tensors if _grad.needs_saved(op) else (None, None)
        gx = _grad.reduce_backward(EagerBackend(comm, rank, size), g, x, y, op, root, rank, size)
        return gx, None, None, None, None, None


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, size: int, axis: int, root: int) -> Tensor:
        ctx.args = (comm, rank, axis, root, x.shape[axis])
        return _coll.gather(comm, x, axis, root, rank)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, axis, root, n = ctx.args
        if _diff(g):
            return Scatter.apply(g, comm, rank, axis, n, root), None, None, None, None, None
        return _coll.scatter(comm, g, axis, n, root, rank), None, None, None, None, None


class Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, axis: int) -> Tensor:
        ctx.args = (comm, axis, x.shape[axis])
        return _coll.allgather(comm, x, axis)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, axis, n = ctx.args
        # every rank's upstream gradient of my slice, summed
        if _diff(g):
            return ReduceScatter.apply(g, comm, MPI_SUM, axis, n), None, None
        return _coll.reduce_scatter(comm, g, MPI_SUM, axis, n), None, None


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, axis: int, numelem: int, root: int) -> Tensor:
        ctx.like = (x.shape, x.dtype, x.device)
        y = _coll.scatter(comm, x, axis, numelem, root, rank)
        ctx.args = (comm, rank, axis % y.dim(), root)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, axis, root = ctx.args
        diff = _diff(g)
        gx = Gather.apply(g, comm, rank, 0, axis, root) if diff else _coll.gather(comm, g, axis, root, rank)
        if rank != root:
            shape, dtype, device = ctx.like
            zeros = torch.zeros(shape, dtype=dtype, device=device)
            # keep the (empty) gathered tensor in the graph, so that a double backward
            # runs its Scatter on every rank (as mpi4torch's JoinDummies did)
            gx = JoinDummies.apply(zeros, gx) if gx.requires_grad else zeros
        return gx, None, None, None, None, None


class Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> Tensor:
        ctx.args = (comm, gaxis, saxis, x.shape[gaxis])
        return _coll.alltoall(comm, x, gaxis, saxis, numelem)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, gaxis, saxis, n = ctx.args
        if _diff(g):
            return Alltoall.apply(g, comm, saxis, gaxis, n), None, None, None, None
        return _coll.alltoall(comm, g, saxis, gaxis, n), None, None, None, None


class ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, op: int, axis: int, numelem: int) -> Tensor:
        ctx.args = (comm, op, axis)
        return _coll.reduce_scatter(comm, x, op, axis, numelem)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, op, axis = ctx.args
        scale = _grad.reduce_scatter_adjoint_scale(op, _mpiad.comm_size(comm))
        gx = Allgather.apply(g, comm, axis) if _diff(g) else _coll.allgather(comm, g, axis)
        return (gx if scale == 1.0 else gx * scale), None, None, None, None


class Sendrecv(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, like: Tensor, comm: int, dest: int, sendtag: int, source: int, recvtag: int
    ) -> Tensor:
        ctx.args = (comm, dest, sendtag, source, recvtag)
        ctx.xmeta = (x.shape, x.dtype, x.device)
        ctx.likemeta = (like.shape, like.dtype, like.device)
        return _coll.sendrecv(comm, x, dest, sendtag, like, source, recvtag)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, dest, sendtag, source, recvtag = ctx.args
        shape, dtype, device = ctx.xmeta
        like = torch.empty(shape, dtype=dtype, device=device)
        off = BACKWARD_TAG_OFFSET
        if _diff(g):
            gx = Sendrecv.apply(g.to(dtype), like, comm, source, recvtag + off, dest, sendtag + off)
        else:
            gx = _coll.sendrecv(comm, g.to(dtype), source, recvtag + off, like, dest, sendtag + off)
        lshape, ldtype, ldevice = ctx.likemeta
        return gx, torch.zeros(lshape, dtype=ldtype, device=ldevice), None, None, None, None, None


class JoinDummies(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, *dummies: Tensor) -> Tensor:
        ctx.metas = [(d.shape, d.dtype, d.device) for d in dummies]
        return x.detach()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        return (g, *(torch.zeros(s, dtype=dt, device=dev) for s, dt, dev in ctx.metas))
