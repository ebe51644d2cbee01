"""Allreduce, Bcast_ and Reduce_: each one's backward rule, eager autograd Function and
torch.compile / TorchScript custom op, in that order, plus Allreduce's latency path.

The rules are written once, against a :class:`Backend` that does their communication: the
eager :class:`EagerBackend` (raw communication of ``_collectives``, or these Functions again
under ``create_graph=True``, so double backward works as in mpi4torch) or the compiled
:class:`_Ops` (the custom ops, so a compiled backward graph traces too). The pairs:
Allreduce <-> Allreduce (SUM, or AVG for AVG; MAX/MIN/MINLOC/MAXLOC/PROD add a mask or a
product), Bcast_ <-> Reduce_(SUM). The non-blocking twins (``_nonblocking``) start the same
adjoints and finish them with :func:`allreduce_backward_finish` / :func:`reduce_backward_finish`.

Allreduce's latency path: without autograd the whole call is checked and run in C
(``csrc/tensor_fast.hpp``, ``_mpiad.allreduce_tensor``); with autograd it is one
:class:`AllreduceSmall` node whose forward and (first-order SUM/AVG) backward are each one
allocation and one native ``MPI_Allreduce``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from . import _collectives as _coll
from . import _mpiad
from ._checks import CODE, check_op, check_rank, check_tensor
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
from ._debug import state as _debug
from ._functions import EagerComm, needs_grad
from ._library import keep_collective_order, ordered, rank_size
from ._pool import POOL_MIN_BYTES, new_output

Tensor = torch.Tensor


# ----------------------------------------------------------------------------- plumbing
class Backend(Protocol):
    """The communication the reductions' backward rules perform, on one communicator."""

    def allreduce(self, t: Tensor, op: int) -> Tensor: ...
    def bcast(self, t: Tensor, root: int) -> Tensor: ...
    def reduce(self, t: Tensor, op: int, root: int) -> Tensor: ...


class EagerBackend(EagerComm):
    """The eager communication of the reductions' backward rules (see :class:`~mpiad._functions.EagerComm`)."""

    def allreduce(self, t: Tensor, op: int) -> Tensor:
        if needs_grad(t):
            return Allreduce.apply(t, self.comm, self.rank, self.size, op)
        return _coll.allreduce(self.comm, t, op)

    def bcast(self, t: Tensor, root: int) -> Tensor:
        if needs_grad(t):
            return Bcast.apply(t.clone(), self.comm, self.rank, root)
        return _coll.bcast(self.comm, t, root)

    def reduce(self, t: Tensor, op: int, root: int) -> Tensor:
        if needs_grad(t):
            return Reduce.apply(t.clone(), self.comm, self.rank, self.size, op, root)
        return _coll.reduce(self.comm, t, op, root, self.rank)


class _Ops:
    """The custom ops as the communication of the backward rules (:class:`Backend`)."""

    def __init__(self, comm: int) -> None:
        self.comm = comm

    def allreduce(self, t: Tensor, op: int) -> Tensor:
        return torch.ops.mpiad.allreduce(t, self.comm, op)

    def bcast(self, t: Tensor, root: int) -> Tensor:
        return torch.ops.mpiad.bcast(t, self.comm, root)

    def reduce(self, t: Tensor, op: int, root: int) -> Tensor:
        return torch.ops.mpiad.reduce(t, self.comm, op, root)


def _check_diff(op: int, name: str) -> None:
    if op not in DIFFERENTIABLE_OPS:
        raise RuntimeError(f"{name} with {OP_NAMES.get(op, op)} has no derivative (it is not differentiable)")


def needs_saved(op: int) -> bool:
    """Whether the backward of an ``op`` reduction needs the input and the result."""
    return op not in (MPI_SUM, MPI_AVG)


def adjoint_op(op: int) -> int:
    """The reduction of the upstream gradients in the backward of an ``op`` reduction."""
    return MPI_AVG if op == MPI_AVG else MPI_SUM


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


# ---------------------------------------------------------------------------- Allreduce
def allreduce_backward(
    be: Backend, g: Tensor, x: Tensor | None, y: Tensor | None, op: int, rank: int, size: int
) -> Tensor:
    """d/dx_r of y = op_r x_r, given every rank's upstream gradient ``g``."""
    _check_diff(op, "Allreduce")
    return allreduce_backward_finish(be, be.allreduce(g, adjoint_op(op)), x, y, op, rank, size)


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


class Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, size: int, op: int) -> Tensor:
        y = _coll.allreduce(comm, x, op)  # (large outputs come from the buffer pool)
        ctx.args = (comm, rank, size, op)
        if needs_saved(op):
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        comm, rank, size, op = ctx.args
        x, y = ctx.saved_tensors if needs_saved(op) else (None, None)
        gx = allreduce_backward(EagerBackend(comm, rank, size), g, x, y, op, rank, size)
        return gx, None, None, None, None


@torch.library.custom_op("mpiad::allreduce", mutates_args=())
def allreduce(x: Tensor, comm: int, op: int) -> Tensor:
    return _coll.allreduce(comm, x, check_op(op, check_tensor(x)))


@allreduce.register_fake
def _(x: Tensor, comm: int, op: int) -> Tensor:
    keep_collective_order()
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _allreduce_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, op = inputs
    ctx.args = (comm, op)
    ctx.save_for_backward(x, output)


def _allreduce_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
    comm, op = ctx.args
    x, y = ctx.saved_tensors
    rank, size = rank_size(comm)
    return allreduce_backward(_Ops(comm), g, x, y, op, rank, size), None, None


allreduce.register_autograd(_allreduce_bwd, setup_context=_allreduce_setup)


# ---------------------------------------------------------- Allreduce: the latency path
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
        if needs_saved(op):
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
        x, y = ctx.saved_tensors if needs_saved(op) else (None, None)
        be = EagerBackend(comm.handle, comm.rank, comm.size)
        return allreduce_backward(be, g, x, y, op, comm.rank, comm.size), None, None, None


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


#: whether the C latency path is on (False only where a torch release defines a
#: tensor attribute it reads in Python; every call then takes the Python path)
TENSOR_FAST_PATH: bool = _mpiad.init_tensor_fast(
    _Tensor,
    torch.nn.Parameter,
    torch.is_grad_enabled,
    torch._C._increment_version,
    torch.empty_like,
    new_output,
    CODE,
    POOL_MIN_BYTES,
)


def allreduce_small(tensor: Tensor, comm: Any, op: int, code: int) -> Tensor:
    """The autograd latency path of Allreduce (one :class:`AllreduceSmall` node).

    Parameters
    ----------
    tensor : torch.Tensor
        The input, already accepted by the C check (contiguous, CPU, below the pool size).
    comm : mpiad.Communicator
        Its communicator.
    op : int
        The ``MPI_*`` reduction.
    code : int
        The dtype code the C check answered.

    Returns
    -------
    torch.Tensor
        The combined values, with an ``AllreduceSmall`` node as ``grad_fn``.
    """
    if functorch_active():
        return AllreduceSmall.apply(tensor, comm, op, code)
    try:
        tensor.data_ptr()
    except RuntimeError:  # no storage: a functorch wrapper left from a transform
        tensor = unwrap_if_dead(tensor)  # (what Function.apply would do)
    return apply_small(tensor, comm, op, code)


# ------------------------------------------------------------------------------- Bcast_
def bcast_backward(be: Backend, g: Tensor, root: int) -> Tensor:
    """Bcast_ from ``root``: every rank's upstream gradient, summed on root (zeros elsewhere)."""
    return be.reduce(g.contiguous(), MPI_SUM, root)


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
        return bcast_backward(EagerBackend(comm, rank), g, root), None, None, None


@torch.library.custom_op("mpiad::bcast", mutates_args=())
def bcast(x: Tensor, comm: int, root: int) -> Tensor:
    return _coll.bcast(comm, check_tensor(x), check_rank(root, "root", rank_size(comm)[1]))


@bcast.register_fake
def _(x: Tensor, comm: int, root: int) -> Tensor:
    keep_collective_order()
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _bcast_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.args = inputs[1:]


def _bcast_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
    comm, root = ctx.args
    return bcast_backward(_Ops(comm), g, root), None, None


bcast.register_autograd(_bcast_bwd, setup_context=_bcast_setup)


# ------------------------------------------------------------------------------ Reduce_
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


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: int, rank: int, size: int, op: int, root: int) -> Tensor:
        keep = needs_saved(op)
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
        x, y = ctx.saved_tensors if needs_saved(op) else (None, None)
        gx = reduce_backward(EagerBackend(comm, rank, size), g, x, y, op, root, rank, size)
        return gx, None, None, None, None, None


@torch.library.custom_op("mpiad::reduce", mutates_args=())
def reduce(x: Tensor, comm: int, op: int, root: int) -> Tensor:
    rank, size = rank_size(comm)
    op = check_op(op, check_tensor(x))
    return _coll.reduce(comm, x, op, check_rank(root, "root", size), rank)


@reduce.register_fake
def _(x: Tensor, comm: int, op: int, root: int) -> Tensor:
    keep_collective_order()
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _reduce_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, op, root = inputs
    ctx.args = (comm, op, root)
    ctx.save_for_backward(x, output)


def _reduce_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:
    comm, op, root = ctx.args
    x, y = ctx.saved_tensors
    rank, size = rank_size(comm)
    return reduce_backward(_Ops(comm), g, x, y, op, root, rank, size), None, None, None


reduce.register_autograd(_reduce_bwd, setup_context=_reduce_setup)


for _op in (allreduce, bcast, reduce):
    ordered(_op)
