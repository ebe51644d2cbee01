"""Non-blocking point-to-point messages with autograd: Isend / Irecv / Wait.

A :class:`WaitHandle` carries a differentiable ``dummy`` tensor plus a link
object shared by the operation's two autograd nodes (start and Wait). In the
backward pass the Wait node starts the reverse message (the gradient travels
from receiver to sender, with tag + 10) and the start node completes it, so the
order of the forward calls is mirrored without blocking in between.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import _mpiad, _raw
from ._constants import BACKWARD_TAG_OFFSET
from ._errors import MpiadTypeError

Tensor = torch.Tensor


class _Link:
    """State shared by the nodes of one non-blocking operation."""

    __slots__ = ("buf", "bwd_buf", "bwd_req", "comm", "kind", "peer", "req", "src", "tag", "tracked", "waited")

    def __init__(self, kind: str, comm: int, peer: int, tag: int, src: Tensor) -> None:
        self.kind = kind
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.src = src  # the tensor given to Isend / Irecv
        self.req: Any = None
        self.buf: Tensor | None = None  # what MPI reads from / writes into
        self.waited = False
        self.bwd_req: Any = None
        self.bwd_buf: Tensor | None = None
        self.tracked = False


def _dummy_like(t: Tensor) -> Tensor:
    dt = t.dtype if (t.is_floating_point() or t.is_complex()) else torch.float32
    return torch.zeros((), dtype=dt, device=t.device)


class WaitHandle:
    """Handle of a pending :meth:`Communicator.Isend` / :meth:`Communicator.Irecv`.

    Pass it to :meth:`Communicator.Wait`; use :attr:`dummy` to make other
    computations depend on it (:func:`mpiad.JoinDummies`).
    """

    __slots__ = ("_dummy", "_link")

    def __init__(self, dummy: Tensor, link: _Link) -> None:
        self._dummy = dummy
        self._link = link

    @property
    def dummy(self) -> Tensor:
        """A tensor standing for this handle in :func:`mpiad.JoinDummies`' dummy list."""
        return self._dummy

    def __repr__(self) -> str:
        link = self._link
        state = "done" if link.waited else "pending"
        return f"WaitHandle({link.kind} peer={link.peer} tag={link.tag} {state})"


class _Start(torch.autograd.Function):
    """Isend / Irecv node: input = the user's tensor, output = the handle's dummy."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, link: _Link) -> Tensor:
        ctx.link = link
        ctx.meta = (x.shape, x.dtype, x.device)
        link.tracked = True
        return _dummy_like(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None]:
        link: _Link = ctx.link
        shape, dtype, device = ctx.meta
        if link.bwd_req is None:
            # Wait was not part of the graph: exchange the gradient now
            _post_backward(link, None)
        link.bwd_req.wait()
        if link.kind == "send":
            assert link.bwd_buf is not None
            grad = _raw.from_mpi(link.bwd_buf, link.src).view(shape)
        else:
            # the received values do not depend on the receive buffer's old contents
            grad = torch.zeros(shape, dtype=dtype, device=device)
        link.bwd_req = None
        link.bwd_buf = None
        return grad, None


def _post_backward(link: _Link, g: Tensor | None) -> None:
    """Start the reverse message of ``link`` (gradient of the forward message)."""
    tag = link.tag + BACKWARD_TAG_OFFSET
    if link.kind == "send":
        buf = _raw.mpi_empty(link.src.shape, link.src)
        link.bwd_buf = buf
        link.bwd_req = _mpiad.irecv(link.comm, buf.data_ptr(), buf.numel(), _raw.dtype_code(buf), link.peer, tag, buf)
    else:
        if g is None:
            g = torch.zeros(link.src.shape, dtype=link.src.dtype, device=link.src.device)
        gx = _raw.to_mpi(g.to(link.src.dtype))
        link.bwd_buf = gx
        link.bwd_req = _mpiad.isend(link.comm, gx.data_ptr(), gx.numel(), _raw.dtype_code(gx), link.peer, tag, gx)


class _Wait(torch.autograd.Function):
    """Wait node: input = the handle's dummy, output = sent tensor / received tensor."""

    @staticmethod
    def forward(ctx: Any, dummy: Tensor, link: _Link, result: Tensor) -> Tensor:
        ctx.link = link
        ctx.dmeta = (dummy.shape, dummy.dtype, dummy.device)
        return result.detach()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
        link: _Link = ctx.link
        _post_backward(link, g)
        shape, dtype, device = ctx.dmeta
        return torch.zeros(shape, dtype=dtype, device=device), None, None


def isend(comm: int, t: Tensor, dest: int, tag: int) -> WaitHandle:
    link = _Link("send", comm, dest, tag, t)
    x = _raw.to_mpi(t.detach())
    link.buf = x
    link.req = _mpiad.isend(comm, x.data_ptr(), x.numel(), _raw.dtype_code(x), dest, tag, x)
    if torch.is_grad_enabled() and t.requires_grad:
        return WaitHandle(_Start.apply(t, link), link)
    return WaitHandle(_dummy_like(t), link)


def irecv(comm: int, t: Tensor, source: int, tag: int) -> WaitHandle:
    link = _Link("recv", comm, source, tag, t)
    # receive straight into the given tensor when possible, as mpi4torch does
    buf = t.detach() if t.device.type == "cpu" and t.is_contiguous() else _raw.mpi_empty(t.shape, t)
    link.buf = buf
    link.req = _mpiad.irecv(comm, buf.data_ptr(), buf.numel(), _raw.dtype_code(buf), source, tag, buf)
    if torch.is_grad_enabled() and t.requires_grad:
        return WaitHandle(_Start.apply(t, link), link)
    return WaitHandle(_dummy_like(t), link)


def wait(handle: WaitHandle) -> Tensor:
    if not isinstance(handle, WaitHandle):
        raise MpiadTypeError(f"Wait expects a WaitHandle, got {type(handle).__name__}")
    link = handle._link
    if link.waited:
        raise RuntimeError(f"{handle!r} was already waited for; each handle can be waited for once")
    link.req.wait()
    link.waited = True
    assert link.buf is not None
    if link.kind == "send":
        result = link.src
    else:
        result = _raw.from_mpi(link.buf, link.src)
        if link.src.numel() and link.buf.data_ptr() == link.src.data_ptr():
            torch.autograd.graph.increment_version(link.src)  # received in place
    link.req = None
    if torch.is_grad_enabled() and handle._dummy.requires_grad:
        return _Wait.apply(handle._dummy, link, result)
    return result.detach() if result.requires_grad else result


def join_dummies_handle(handle: WaitHandle, dummies: list[Tensor]) -> WaitHandle:
    from ._comm import JoinDummies

    if not isinstance(handle, WaitHandle):
        raise MpiadTypeError(f"JoinDummiesHandle expects a WaitHandle, got {type(handle).__name__}")
    return WaitHandle(JoinDummies(handle._dummy, dummies), handle._link)
