"""``torch.library`` custom ops: what the communicator calls under ``torch.compile``.

Each op is functional (a new output, the input untouched; ``Bcast_`` /
``Reduce_`` are therefore functionalised inside compiled code), has a fake
kernel for tracing and an autograd formula built from the other ops, so a
compiled backward graph contains the matching communication.

The real kernels validate their arguments as the communicator's methods do
(TorchScript calls them directly, without the method's Python checks); a bad
argument raises before any communication.

Fake kernels cannot see the other ranks, so compiled code assumes equal sizes
along gather axes and non-root ``Scatter`` inputs shaped like root's tensor;
the real kernel raises ``ValueError`` when that does not hold.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._library.effects import EffectType

from . import _collectives as _coll
from . import _grad
from ._checks import check_axis, check_int, check_numelem, check_op, check_rank, check_scatter_op, check_tensor
from ._constants import MPI_SUM
from ._errors import MpiadValueError

Tensor = torch.Tensor


def _rs(comm: int) -> tuple[int, int]:
    from ._comm import lookup

    c = lookup(comm)
    return c.rank, c.size


def _check_shape(out: Tensor, want: list[int], what: str) -> Tensor:
    if list(out.shape) != want:
        raise MpiadValueError(
            f"mpiad (torch.compile): {what} produced shape {list(out.shape)}, but the compiled graph assumed "
            f"{want}; compiled code needs equal sizes along gather axes on every rank (and non-root Scatter inputs "
            f"shaped like root's tensor)"
        )
    return out


class _Ops:
    """The custom ops as a backend for the shared backward formulas."""

    def __init__(self, comm: int) -> None:
        self.comm = comm

    def allreduce(self, t: Tensor, op: int) -> Tensor:
        return torch.ops.mpiad.allreduce(t, self.comm, op)

    def bcast(self, t: Tensor, root: int) -> Tensor:
        return torch.ops.mpiad.bcast(t, self.comm, root)

    def reduce(self, t: Tensor, op: int, root: int) -> Tensor:
        return torch.ops.mpiad.reduce(t, self.comm, op, root)


# ------------------------------------------------------------------ allreduce
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
    rank, size = _rs(comm)
    return _grad.allreduce_backward(_Ops(comm), g, x, y, op, rank, size), None, None


allreduce.register_autograd(_allreduce_bwd, setup_context=_allreduce_setup)


# ---------------------------------------------------------------------- bcast
@torch.library.custom_op("mpiad::bcast", mutates_args=())
def bcast(x: Tensor, comm: int, root: int) -> Tensor:
    return _coll.bcast(comm, check_tensor(x), check_rank(root, "root", _rs(comm)[1]))


@bcast.register_fake
def _(x: Tensor, comm: int, root: int) -> Tensor:
    keep_collective_order()
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _bcast_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.args = inputs[1:]


def _bcast_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
    comm, root = ctx.args
    return torch.ops.mpiad.reduce(g.contiguous(), comm, MPI_SUM, root), None, None


bcast.register_autograd(_bcast_bwd, setup_context=_bcast_setup)


# --------------------------------------------------------------------- reduce
@torch.library.custom_op("mpiad::reduce", mutates_args=())
def reduce(x: Tensor, comm: int, op: int, root: int) -> Tensor:
    rank, size = _rs(comm)
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
    rank, size = _rs(comm)
    return _grad.reduce_backward(_Ops(comm), g, x, y, op, root, rank, size), None, None, None


reduce.register_autograd(_reduce_bwd, setup_context=_reduce_setup)


# --------------------------------------------------------------------- gather
def _gather_shape(x: Tensor, comm: int, axis: int, root: int | None) -> list[int]:
    rank, size = _rs(comm)
    shape = list(x.shape)
    shape[axis] = 0 if (root is not None and rank != root) else shape[axis] * size
    return shape


@torch.library.custom_op("mpiad::gather", mutates_args=())
def gather(x: Tensor, comm: int, axis: int, root: int) -> Tensor:
    rank, size = _rs(comm)
    axis = check_axis(axis, "gatheraxis", check_tensor(x).dim())
    root = check_rank(root, "root", size)
    return _check_shape(_coll.gather(comm, x, axis, root, rank), _gather_shape(x, comm, axis, root), "Gather")


@gather.register_fake
def _(x: Tensor, comm: int, axis: int, root: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_gather_shape(x, comm, axis, root))


def _gather_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, axis, root = inputs
    ctx.args = (comm, axis, root, x.shape[axis])


def _gather_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:
    comm, axis, root, n = ctx.args
    return torch.ops.mpiad.scatter(g.contiguous(), comm, axis, n, root), None, None, None


gather.register_autograd(_gather_bwd, setup_context=_gather_setup)


@torch.library.custom_op("mpiad::allgather", mutates_args=())
def allgather(x: Tensor, comm: int, axis: int) -> Tensor:
    axis = check_axis(axis, "gatheraxis", check_tensor(x).dim())
    return _check_shape(_coll.allgather(comm, x, axis), _gather_shape(x, comm, axis, None), "Allgather")


@allgather.register_fake
def _(x: Tensor, comm: int, axis: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_gather_shape(x, comm, axis, None))


def _allgather_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, axis = inputs
    ctx.args = (comm, axis, x.shape[axis])


def _allgather_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
    comm, axis, n = ctx.args
    return torch.ops.mpiad.reduce_scatter(g.contiguous(), comm, MPI_SUM, axis, n), None, None


allgather.register_autograd(_allgather_bwd, setup_context=_allgather_setup)


# -------------------------------------------------------------------- scatter
def _scatter_shape(x: Tensor, axis: int, numelem: int) -> list[int]:
    shape = list(x.shape)
    shape[axis] = numelem
    return shape


@torch.library.custom_op("mpiad::scatter", mutates_args=())
def scatter(x: Tensor, comm: int, axis: int, numelem: int, root: int) -> Tensor:
    rank, size = _rs(comm)
    check_tensor(x)
    axis = check_int(axis, "scatteraxis")  # (range-checked against root's tensor, on every rank)
    numelem, root = check_numelem(numelem), check_rank(root, "root", size)
    out = _coll.scatter(comm, x, axis, numelem, root, rank)
    return _check_shape(out, _scatter_shape(x, axis, numelem), "Scatter")


@scatter.register_fake
def _(x: Tensor, comm: int, axis: int, numelem: int, root: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_scatter_shape(x, axis, numelem))


def _scatter_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, axis, _, root = inputs
    ctx.args = (comm, axis, root, list(x.shape))


def _scatter_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None, None]:
    comm, axis, root, xshape = ctx.args
    gx = torch.ops.mpiad.gather(g.contiguous(), comm, axis, root)
    rank, _ = _rs(comm)
    if rank != root:
        gx = _join(g.new_zeros(xshape), [gx])
    return gx, None, None, None, None


scatter.register_autograd(_scatter_bwd, setup_context=_scatter_setup)


# ------------------------------------------------------------------- alltoall
def _alltoall_shape(x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> list[int]:
    _, size = _rs(comm)
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
    return _check_shape(out, _alltoall_shape(x, comm, gaxis, saxis, numelem), "Alltoall")


@alltoall.register_fake
def _(x: Tensor, comm: int, gaxis: int, saxis: int, numelem: int) -> Tensor:
    keep_collective_order()
    return x.new_empty(_alltoall_shape(x, comm, gaxis, saxis, numelem))


def _alltoall_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, comm, gaxis, saxis, _ = inputs
    ctx.args = (comm, gaxis, saxis, x.shape[gaxis])


def _alltoall_bwd(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None, None]:
    comm, gaxis, saxis, n = ctx.args
    return torch.ops.mpiad.alltoall(g.contiguous(), comm, saxis, gaxis, n), None, None, None, None


alltoall.register_autograd(_alltoall_bwd, setup_context=_alltoall_setup)


# ------------------------------------------------------------- reduce_scatter
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
    scale = _grad.reduce_scatter_adjoint_scale(op, _rs(comm)[1])
    gx = torch.ops.mpiad.allgather(g.contiguous(), comm, axis)
    return (gx if scale == 1.0 else gx * scale), None, None, None, None


reduce_scatter.register_autograd(_rsc_bwd, setup_context=_rsc_setup)


# --------------------------------------------------------------- join_dummies
@torch.library.custom_op("mpiad::join_dummies", mutates_args=())
def join_dummies(x: Tensor, dummies: list[Tensor]) -> Tensor:
    return x.clone()


@join_dummies.register_fake
def _(x: Tensor, dummies: list[Tensor]) -> Tensor:
    return torch.empty_like(x)


def _join_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.n = len(inputs[1])
    ctx.dummies = [(d.shape, d.dtype, d.device) for d in inputs[1]]


def _join_bwd(ctx: Any, g: Tensor) -> tuple[Tensor, list[Tensor]]:
    return g, [_join(torch.zeros(s, dtype=dt, device=dev), [g]) for s, dt, dev in ctx.dummies]


join_dummies.register_autograd(_join_bwd, setup_context=_join_setup)


def _join(x: Tensor, dummies: list[Tensor]) -> Tensor:
    return torch.ops.mpiad.join_dummies(x, dummies)


# Collectives must run in the same order on every rank. The ops are functional, so a
# compiler may reorder independent ones. ORDERED effects make AOTAutograd thread a
# token through them (program order in the FX graphs, forward and backward) ...
for _op in (allreduce, bcast, reduce, gather, allgather, scatter, alltoall, reduce_scatter):
    _op.register_effect(EffectType.ORDERED)


def keep_collective_order() -> None:
    """... but inductor's peak-memory reordering (torch 2.13) ignores that token chain
    and reorders the collectives by estimated memory, which differs between ranks
    whose shapes differ (a Gather root, uneven sizes): rank 0 entered an Allgather
    while rank 1 waited in an Allreduce (a deadlock, reproduced by
    tests/scripts/compiled.py). So tracing any mpiad collective switches that pass
    off, process-wide (it only trades peak memory, never values)."""
    import torch._inductor.config as cfg

    if getattr(cfg, "reorder_for_peak_memory", False):
        cfg.reorder_for_peak_memory = False
