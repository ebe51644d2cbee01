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
from . import _grad
from ._constants import MPI_SUM
from ._functions import EagerBackend
from ._handles import Link, WaitHandle, make_handle, saved_tensor
from ._join import JoinDummies

Tensor = torch.Tensor


class Communicator(Protocol):
    """What the adjoints need of the communicator (:class:`mpiad.Communicator` is one): its
    handle, rank and size, and its differentiable non-blocking methods (so that a backward under
    ``create_graph=True`` is differentiable again)."""

    @property
    def handle(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
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
    keep = _grad.needs_saved(op)
    # the input itself (not detached), as the blocking op's saved tensor: under
    # create_graph the PROD formula differentiates through it; SUM/AVG keep nothing
    saved = saved_tensor(t, "the input of Iallreduce") if keep else None
    handle: WaitHandle

    def start(g: Tensor | None) -> Any:
        return c.Iallreduce(_zeros(g, x.shape, x), _grad.adjoint_op(op))

    def finish(h: WaitHandle) -> Tensor:
        gs = c.Wait(h)
        y = _unpack(_link(handle).saved)
        be = EagerBackend(c.handle, c.rank, c.size)
        return _grad.allreduce_backward_finish(be, gs, _unpack(saved), y, op, c.rank, c.size)

    handle = make_handle(t, "Iallreduce", pending, start, finish, keep_result=keep)
    return handle


def _inplace_target(t: Tensor) -> Tensor:
    """What an in-place op writes into: ``t`` itself unless autograd records the op."""
    return t.detach() if (t.requires_grad and torch.is_grad_enabled()) else t


def ibcast(c: Communicator, t: Tensor, root: int) -> WaitHandle:
    buf = _inplace_target(t)
    pending = _coll.bcast_into(c.handle, buf, root, nb=True)

    def start(g: Tensor | None) -> Any:
        return c.Ireduce_(_zeros(g, buf.shape, buf).clone(), MPI_SUM, root)

    def finish(h: WaitHandle) -> Tensor:
        return c.Wait(h)

    return make_handle(t, "Ibcast_", pending, start, finish)


def ireduce(c: Communicator, t: Tensor, op: int, root: int) -> WaitHandle:
    keep = _grad.needs_saved(op)
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
        return _grad.reduce_backward_finish(be, gr, xin, y, op, root, c.rank, c.size)

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
        scale = _grad.reduce_scatter_adjoint_scale(op, c.size)
        return gx if scale == 1.0 else gx * scale

    handle = make_handle(t, "Ireduce_scatter", pending, start, finish)
    return handle
