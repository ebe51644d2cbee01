"""Point-to-point messages with autograd: Isend / Irecv (Wait in ``_handles``), Send / Recv,
and the blocking Sendrecv.

The gradient travels against the message, with tag + 10: the Wait node of an
Isend starts receiving the gradient from the peer, its start node completes it;
the Wait node of an Irecv starts sending the received tensor's gradient back.
The gradient that arrives from the peer is a constant in a double backward.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from . import _collectives as _coll
from . import _mpiad
from ._checks import CODE, check_rank, check_tag, check_tensor
from ._constants import BACKWARD_TAG_OFFSET
from ._functions import needs_grad
from ._handles import WaitHandle, make_handle
from ._registry import Registered
from ._staging import cuda_aware, from_mpi, mpi_empty, sync_device, to_mpi, write_back

Tensor = torch.Tensor

#: marks a method TorchScript leaves out of the compiled class
_drop = torch.jit._drop


class Communicator(Registered, Protocol):
    """What the point-to-point methods read of the communicator (:class:`mpiad.Communicator` is one)."""

    _tag_ub: int

    def Isend(self, tensor: Tensor, dest: int, tag: int) -> WaitHandle: ...
    def Irecv(self, tensor: Tensor, source: int, tag: int) -> WaitHandle: ...
    def Wait(self, waithandle: WaitHandle) -> Tensor: ...


class _Message:
    """A started message; ``wait()`` gives the sent tensor / the filled receive tensor."""

    __slots__ = ("buf", "recv", "req", "src")

    def __init__(self, req: Any, buf: Tensor, src: Tensor, recv: bool) -> None:
        self.req, self.buf, self.src, self.recv = req, buf, src, recv

    def wait(self) -> Tensor:
        self.req.wait()
        if not self.recv:
            return self.src
        # the received values go into the tensor passed to Irecv, as in mpi4torch: in
        # place when MPI could write there, else copied from the (staging) buffer
        if self.buf is not self.src:
            write_back(self.src, self.buf)  # (copy_ moves a staged buffer to the device)
        if self.src.numel():
            torch.autograd.graph.increment_version(self.src)
        return self.src.detach()


def isend(comm: int, t: Tensor, dest: int, tag: int) -> WaitHandle:
    x = to_mpi(t.detach())
    req = _mpiad.isend(comm, x.data_ptr(), x.numel(), CODE[x.dtype], dest, tag, x)
    shape, btag = t.shape, tag + BACKWARD_TAG_OFFSET

    def start_adjoint(g: Tensor | None) -> Any:
        # the gradient of the sent tensor comes back from the receiver
        buf = mpi_empty(shape, t)
        return _mpiad.irecv(comm, buf.data_ptr(), buf.numel(), CODE[buf.dtype], dest, btag, buf), buf

    def finish_adjoint(state: Any) -> Tensor:
        req, buf = state
        req.wait()
        return from_mpi(buf, t).view(shape)

    return make_handle(t, "Isend", _Message(req, x, t, False), start_adjoint, finish_adjoint)


def irecv(comm: int, t: Tensor, source: int, tag: int) -> WaitHandle:
    src = t.detach()
    # receive straight into the given tensor when MPI can write there (a CUDA tensor
    # only with a CUDA-aware MPI, after the kernels still using it are done)
    direct = src.is_contiguous() and (src.is_cpu or cuda_aware())
    if direct:
        sync_device(src)
    buf = src if direct else mpi_empty(t.shape, t)
    req = _mpiad.irecv(comm, buf.data_ptr(), buf.numel(), CODE[buf.dtype], source, tag, buf)
    shape, dtype, device, btag = t.shape, t.dtype, t.device, tag + BACKWARD_TAG_OFFSET

    def start_adjoint(g: Tensor | None) -> Any:
        # the received tensor's gradient goes back to the sender
        if g is None:
            g = torch.zeros(shape, dtype=dtype, device=device)
        gx = to_mpi(g.detach().to(dtype))
        return _mpiad.isend(comm, gx.data_ptr(), gx.numel(), CODE[gx.dtype], source, btag, gx)

    def finish_adjoint(req: Any) -> Tensor:
        req.wait()
        # the received values do not depend on the receive buffer's old contents
        return torch.zeros(shape, dtype=dtype, device=device)

    return make_handle(t, "Irecv", _Message(req, buf, src, True), start_adjoint, finish_adjoint)


class _SendrecvFunction(torch.autograd.Function):
    """The blocking exchange; its backward sends the gradient back against the message."""

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
        if needs_grad(g):
            gx = _SendrecvFunction.apply(g.to(dtype), like, comm, source, recvtag + off, dest, sendtag + off)
        else:
            gx = _coll.sendrecv(comm, g.to(dtype), source, recvtag + off, like, dest, sendtag + off)
        lshape, ldtype, ldevice = ctx.likemeta
        return gx, torch.zeros(lshape, dtype=ldtype, device=ldevice), None, None, None, None, None


# ------------------------------------------------------------------------------------------
# The communicator's methods (attached to ``Communicator`` in ``_comm``).


@_drop
def Isend(self: Communicator, tensor: Tensor, dest: int, tag: int) -> WaitHandle:
    """Start sending ``tensor`` to ``dest``; complete with :meth:`Wait`.

    Parameters
    ----------
    tensor : torch.Tensor
        The values to send (MPI may read it until the Wait).
    dest : int
        The receiving rank.
    tag : int
        The message tag (0 .. MPI_TAG_UB - 10; the gradient travels back with tag + 10).

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns ``tensor``; its gradient comes back from ``dest``.

    Raises
    ------
    TypeError, ValueError
        Bad tensor, ``dest`` out of range, bad tag.
    """
    t = check_tensor(tensor)
    dest = check_rank(dest, "dest", self.size)
    tag = check_tag(tag, "tag", self._tag_ub)
    return isend(self.handle, t, dest, tag)


@_drop
def Irecv(self: Communicator, tensor: Tensor, source: int, tag: int) -> WaitHandle:
    """Start receiving into a tensor shaped like ``tensor`` from ``source``; :meth:`Wait` returns it.

    Parameters
    ----------
    tensor : torch.Tensor
        Gives the shape and dtype; the received values are written into it.
    source : int
        The sending rank.
    tag : int
        The message tag, as for ``Isend``.

    Returns
    -------
    WaitHandle
        Pass it to ``Wait``, which returns the received tensor.

    Raises
    ------
    TypeError, ValueError
        Bad tensor, ``source`` out of range, bad tag.
    """
    t = check_tensor(tensor)
    source = check_rank(source, "source", self.size)
    tag = check_tag(tag, "tag", self._tag_ub)
    return irecv(self.handle, t, source, tag)


@_drop
def Send(self: Communicator, tensor: Tensor, dest: int, tag: int) -> Tensor:
    """Send ``tensor`` to ``dest``, blocking (``Wait(Isend(...))``).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Isend`.
    dest, tag : int
        As for :meth:`Isend`.

    Returns
    -------
    torch.Tensor
        ``tensor`` (differentiable: its gradient comes back from ``dest``).

    Raises
    ------
    TypeError, ValueError
        As :meth:`Isend`.
    """
    return self.Wait(self.Isend(tensor, dest, tag))


@_drop
def Recv(self: Communicator, tensor: Tensor, source: int, tag: int) -> Tensor:
    """Receive from ``source``, blocking (``Wait(Irecv(...))``).

    Parameters
    ----------
    tensor : torch.Tensor
        As for :meth:`Irecv`.
    source, tag : int
        As for :meth:`Irecv`.

    Returns
    -------
    torch.Tensor
        The received tensor (its gradient is sent back to ``source``).

    Raises
    ------
    TypeError, ValueError
        As :meth:`Irecv`.
    """
    return self.Wait(self.Irecv(tensor, source, tag))


@_drop
def Sendrecv(
    self: Communicator,
    tensor: Tensor,
    dest: int,
    sendtag: int = 0,
    recvtensor: Tensor | None = None,
    source: int | None = None,
    recvtag: int | None = None,
) -> Tensor:
    """Send ``tensor`` to ``dest`` and receive from ``source`` in one deadlock-free call.

    Parameters
    ----------
    tensor : torch.Tensor
        The values to send.
    dest : int
        The receiving rank.
    sendtag : int, optional
        The tag of the sent message (default 0).
    recvtensor : torch.Tensor, optional
        Gives the received tensor's shape and dtype (default: like ``tensor``).
    source : int, optional
        Default ``dest``.
    recvtag : int, optional
        Default ``sendtag``.

    Returns
    -------
    torch.Tensor
        The received tensor; its gradient is sent back to ``source``.

    Raises
    ------
    TypeError, ValueError
        Bad tensors, ranks or tags.
    """
    t = check_tensor(tensor)
    like = t if recvtensor is None else check_tensor(recvtensor, "recvtensor")
    dest = check_rank(dest, "dest", self.size)
    source = dest if source is None else check_rank(source, "source", self.size)
    sendtag = check_tag(sendtag, "sendtag", self._tag_ub)
    recvtag = sendtag if recvtag is None else check_tag(recvtag, "recvtag", self._tag_ub)
    if needs_grad(t) or needs_grad(like):
        return _SendrecvFunction.apply(t, like, self.handle, dest, sendtag, source, recvtag)
    return _coll.sendrecv(self.handle, t, dest, sendtag, like, source, recvtag)
