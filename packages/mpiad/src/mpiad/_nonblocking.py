"""Non-blocking collectives with autograd: Iallreduce, Ibcast_, Ireduce_, Igather,
Iallgather, Iscatter, Ialltoall, Ireduce_scatter.

Each starts the collective (``_collectives`` with ``nb=True``: the engine's
worker thread runs it) and returns a :class:`WaitHandle`. The adjoint of each
is the non-blocking adjoint collective, started by the Wait node when the
gradient of the result arrives and completed by the start node (``_handles``):
Iallreduce <-> Iallreduce(SUM/AVG), Ibcast_ <-> Ireduce_(SUM), Igather <->
Iscatter, Iallgather <-> Ireduce_scatter(SUM), Ialltoall <-> Ialltoall with the
axes swapped. The adjoints are started through the communicator's own
differentiable methods, so under ``create_graph=True`` the backward is
differentiable again (double backward), as for the blocking ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from . import _collectives as _coll
from ._checks import check_axis, check_int, check_numelem, check_op, check_rank, check_reduce_scatter, check_tensor
from ._constants import MPI_SUM
from ._functions import NoInplaceReuse, needs_grad
from ._gathers import reduce_scatter_adjoint_scale
from ._handles import Link, WaitHandle, compiled_handle, make_handle, saved_tensor
from ._join import JoinDummies
from ._reductions import (
    EagerBackend,
    adjoint_op,
    allreduce_backward_finish,
    needs_saved,
    reduce_backward_finish,
)
from ._registry import Registered

Tensor = torch.Tensor

_is_compiling = torch.compiler.is_compiling
#: marks a method TorchScript leaves out of the compiled class
_drop = torch.jit._drop


class Communicator(Registered, Protocol):
    """What the adjoints need of the communicator (:class:`mpiad.Communicator` is one).

    Its handle, rank and size, and its differentiable non-blocking methods (so that a
    backward under ``create_graph=True`` is differentiable again).
    """

    def Iallreduce(self, tensor: Tensor, op: int = ...) -> WaitHandle: ...
    def Ibcast_(self, tensor: Tensor, root: int) -> WaitHandle: ...
    def Ireduce_(self, tensor: Tensor, op: int, root: int) -> WaitHandle: ...
    def Igather(self, tensor: Tensor, gatheraxis: int, root: int) -> WaitHandle: ...
    def Iallgather(self, tensor: Tensor, gatheraxis: int) -> WaitHandle: ...
    def Iscatter(self, tensor: Tensor, scatteraxis: int, numelem: int, root: int) -> WaitHandle: ...
    def Ialltoall(self, tensor: Tensor, gatheraxis: int, scatteraxis: int, numelem: int) -> WaitHandle: ...
    def Ireduce_scatter(
        self, tensor: Tensor, op: int = ..., scatteraxis: int = ..., numelem: int | None = ...
    ) -> WaitHandle: ...
    def Wait(self, waithandle: WaitHandle) -> Tensor: ...


def _link(h: WaitHandle) -> Link:
    assert h.link is not None  # eager handles always have one
    return h.link


def _unpack(saved: Callable[[], Tensor] | None) -> Tensor | None:
    """A saved tensor (``saved_tensor``'s getter, checked), or None where nothing was saved."""
    return saved() if saved is not None else None


def _zeros(g: Tensor | None, shape: Any, like: Tensor) -> Tensor:
    return g if g is not None else torch.zeros(shape, dtype=like.dtype, device=like.device)


def iallreduce(c: Communicator, t: Tensor, op: int) -> WaitHandle:
    x = t.detach()
    pending = _coll.allreduce(c.handle, x, op, nb=True)
    keep = needs_saved(op)
    # the input itself (not detached), as the blocking op's saved tensor: under
    # create_graph the PROD formula differentiates through it; SUM/AVG keep nothing
    saved = saved_tensor(t, "the input of Iallreduce") if keep else None
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Iallreduce(_zeros(g, x.shape, x), adjoint_op(op))

    def finish(h: WaitHandle) -> Tensor:
        gs = c.Wait(h)
        y = _unpack(_link(handle).saved)
        be = EagerBackend(c.handle, c.rank, c.size)
        return allreduce_backward_finish(be, gs, _unpack(saved), y, op, c.rank, c.size)

    handle = make_handle(t, "Iallreduce", pending, start, finish, keep_result=keep)
    return handle


def _inplace_target(t: Tensor) -> Tensor:
    """What an in-place op writes into: ``t`` itself unless autograd records the op."""
    return t.detach() if needs_grad(t) else t


def ibcast(c: Communicator, t: Tensor, root: int) -> WaitHandle:
    buf = _inplace_target(t)
    pending = _coll.bcast_into(c.handle, buf, root, nb=True)

    def start(g: Tensor | None) -> Any:
        return c.Ireduce_(_zeros(g, buf.shape, buf).clone(), MPI_SUM, root)

    def finish(h: WaitHandle) -> Tensor:
        return c.Wait(h)

    return make_handle(t, "Ibcast_", pending, start, finish)


def ireduce(c: Communicator, t: Tensor, op: int, root: int) -> WaitHandle:
    keep = needs_saved(op)
    xin = t.detach().clone() if keep else None
    buf = _inplace_target(t)
    pending = _coll.reduce_into(c.handle, buf, op, root, c.rank, nb=True)
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Ibcast_(_zeros(g, buf.shape, buf).contiguous().clone(), root)

    def finish(h: WaitHandle) -> Tensor:
        gr = c.Wait(h)
        y = _unpack(_link(handle).saved)
        be = EagerBackend(c.handle, c.rank, c.size)
        return reduce_backward_finish(be, gr, xin, y, op, root, c.rank, c.size)

    handle = make_handle(t, "Ireduce_", pending, start, finish, keep_result=keep)
    return handle


def igather(c: Communicator, t: Tensor, axis: int, root: int) -> WaitHandle:
    x = t.detach()
    pending = _coll.gather(c.handle, x, axis, root, c.rank, nb=True)
    n = x.shape[axis]
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Iscatter(g if g is not None else _link(handle).zeros_like_result(), axis, n, root)

    handle = make_handle(t, "Igather", pending, start, c.Wait)
    return handle


def iallgather(c: Communicator, t: Tensor, axis: int) -> WaitHandle:
    x = t.detach()
    pending = _coll.allgather(c.handle, x, axis, nb=True)
    n = x.shape[axis]
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Ireduce_scatter(g if g is not None else _link(handle).zeros_like_result(), MPI_SUM, axis, n)

    handle = make_handle(t, "Iallgather", pending, start, c.Wait)
    return handle


def iscatter(c: Communicator, t: Tensor, axis: int, numelem: int, root: int) -> WaitHandle:
    x = t.detach()
    pending = _coll.scatter(c.handle, x, axis, numelem, root, c.rank, nb=True)
    xshape, xdtype, xdevice = x.shape, x.dtype, x.device  # (the backward keeps no input)
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        g = g if g is not None else _link(handle).zeros_like_result()
        return c.Igather(g, axis % g.dim(), root)

    def finish(h: WaitHandle) -> Tensor:
        gx = c.Wait(h)
        if c.rank != root:
            # non-roots get zeros; the empty gathered part stays in the graph so that a
            # double backward runs its Scatter on every rank
            return JoinDummies(torch.zeros(xshape, dtype=xdtype, device=xdevice), [gx])
        return gx

    handle = make_handle(t, "Iscatter", pending, start, finish)
    return handle


def ialltoall(c: Communicator, t: Tensor, gaxis: int, saxis: int, numelem: int) -> WaitHandle:
    x = t.detach()
    pending = _coll.alltoall(c.handle, x, gaxis, saxis, numelem, nb=True)
    n = x.shape[gaxis]
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Ialltoall(g if g is not None else _link(handle).zeros_like_result(), saxis, gaxis, n)

    handle = make_handle(t, "Ialltoall", pending, start, c.Wait)
    return handle


def ireduce_scatter(c: Communicator, t: Tensor, op: int, axis: int, numelem: int) -> WaitHandle:
    x = t.detach()
    pending = _coll.reduce_scatter(c.handle, x, op, axis, numelem, nb=True)
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Iallgather(g if g is not None else _link(handle).zeros_like_result(), axis)

    def finish(h: WaitHandle) -> Tensor:
        gx = c.Wait(h)
        scale = reduce_scatter_adjoint_scale(op, c.size)
        return gx if scale == 1.0 else gx * scale

    handle = make_handle(t, "Ireduce_scatter", pending, start, finish)
    return handle


# ------------------------------------------------------------------------------------------
# The communicator's methods (attached to ``Communicator`` in ``_comm``): each validates like
# its blocking twin (raising before any communication), traces as the blocking custom op
# under torch.compile, and otherwise starts the operation above.


@_drop
def Iallreduce(self: Communicator, tensor: Tensor, op: int = MPI_SUM) -> WaitHandle:
    """Start :meth:`Allreduce`; :meth:`Wait` returns the combined tensor.

    Do not write ``tensor`` before the Wait (MPI may still read it).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Allreduce`.
    op : int, optional
        As for :meth:`Allreduce` (default ``MPI_SUM``).

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns the combined tensor.

    Raises
    ------
    TypeError
        Not a tensor, or ``op`` undefined for its dtype.
    ValueError
        Unknown ``op``.
    """
    t = check_tensor(tensor)
    op = check_op(op, t)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.allreduce(t, self.handle, op))
    return iallreduce(self, t, op)


@_drop
def Ibcast_(self: Communicator, tensor: Tensor, root: int) -> WaitHandle:
    """Start :meth:`Bcast_` (in place); :meth:`Wait` returns the broadcast tensor.

    ``tensor`` holds root's values only after the Wait; use the returned tensor.

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Bcast_`.
    root : int
        As for :meth:`Bcast_`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns the broadcast values.

    Raises
    ------
    TypeError
        Not a tensor / unsupported dtype.
    ValueError
        ``root`` out of range.
    """
    t = check_tensor(tensor)
    root = check_rank(root, "root", self.size)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.bcast(t, self.handle, root))
    handle = ibcast(self, t, root)
    if needs_grad(t) and t.grad_fn is not None:
        NoInplaceReuse.apply(t, "Ibcast_")
    return handle


@_drop
def Ireduce_(self: Communicator, tensor: Tensor, op: int, root: int) -> WaitHandle:
    """Start :meth:`Reduce_` (in place); :meth:`Wait` returns root's result (zeros elsewhere).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Reduce_`.
    op, root : int
        As for :meth:`Reduce_`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns root's result (zeros elsewhere).

    Raises
    ------
    TypeError
        Not a tensor, or ``op`` undefined for its dtype.
    ValueError
        ``root`` out of range, unknown ``op``.
    """
    t = check_tensor(tensor)
    op = check_op(op, t)
    root = check_rank(root, "root", self.size)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.reduce(t, self.handle, op, root))
    handle = ireduce(self, t, op, root)
    if needs_grad(t) and t.grad_fn is not None:
        NoInplaceReuse.apply(t, "Ireduce_")
    return handle


@_drop
def Igather(self: Communicator, tensor: Tensor, gatheraxis: int, root: int) -> WaitHandle:
    """Start :meth:`Gather`; the data moves in the background.

    The sizes along ``gatheraxis`` are exchanged first (a short blocking step).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Gather`.
    gatheraxis, root : int
        As for :meth:`Gather`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns what ``Gather`` returns.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Gather`.
    """
    t = check_tensor(tensor)
    axis = check_axis(gatheraxis, "gatheraxis", t.dim())
    root = check_rank(root, "root", self.size)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.gather(t, self.handle, axis, root))
    return igather(self, t, axis, root)


@_drop
def Iallgather(self: Communicator, tensor: Tensor, gatheraxis: int) -> WaitHandle:
    """Start :meth:`Allgather` (sizes exchanged first, data in the background).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Allgather`.
    gatheraxis : int
        As for :meth:`Allgather`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns what ``Allgather`` returns.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Allgather`.
    """
    t = check_tensor(tensor)
    axis = check_axis(gatheraxis, "gatheraxis", t.dim())
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.allgather(t, self.handle, axis))
    return iallgather(self, t, axis)


@_drop
def Iscatter(self: Communicator, tensor: Tensor, scatteraxis: int, numelem: int, root: int) -> WaitHandle:
    """Start :meth:`Scatter` (sizes exchanged first, data in the background).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Scatter`.
    scatteraxis, numelem, root : int
        As for :meth:`Scatter`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns what ``Scatter`` returns.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Scatter`.
    """
    t = check_tensor(tensor)
    axis = check_int(scatteraxis, "scatteraxis")
    numelem = check_numelem(numelem)
    root = check_rank(root, "root", self.size)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.scatter(t, self.handle, axis, numelem, root))
    return iscatter(self, t, axis, numelem, root)


@_drop
def Ialltoall(self: Communicator, tensor: Tensor, gatheraxis: int, scatteraxis: int, numelem: int) -> WaitHandle:
    """Start :meth:`Alltoall` (sizes exchanged first, data in the background).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Alltoall`.
    gatheraxis, scatteraxis, numelem : int
        As for :meth:`Alltoall`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns what ``Alltoall`` returns.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Alltoall`.
    """
    t = check_tensor(tensor)
    gaxis = check_axis(gatheraxis, "gatheraxis", t.dim())
    saxis = check_axis(scatteraxis, "scatteraxis", t.dim())
    numelem = check_numelem(numelem)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.alltoall(t, self.handle, gaxis, saxis, numelem))
    return ialltoall(self, t, gaxis, saxis, numelem)


@_drop
def Ireduce_scatter(
    self: Communicator, tensor: Tensor, op: int = MPI_SUM, scatteraxis: int = 0, numelem: int | None = None
) -> WaitHandle:
    """Start :meth:`Reduce_scatter` (shares exchanged first, data in the background).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Reduce_scatter`.
    op, scatteraxis : int, optional
        As for :meth:`Reduce_scatter`.
    numelem : int, optional
        As for :meth:`Reduce_scatter`.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns what ``Reduce_scatter`` returns.

    Raises
    ------
    TypeError, ValueError
        As :meth:`Reduce_scatter`.
    """
    t, op, axis, numelem = check_reduce_scatter(tensor, op, scatteraxis, numelem, self.size)
    if _is_compiling():
        return compiled_handle(torch.ops.mpiad.reduce_scatter(t, self.handle, op, axis, numelem))
    return ireduce_scatter(self, t, op, axis, numelem)
