"""Non-blocking point-to-point messages with autograd: Isend / Irecv (Wait in ``_handles``).

The gradient travels against the message, with tag + 10: the Wait node of an
Isend starts receiving the gradient from the peer, its start node completes it;
the Wait node of an Irecv starts sending the received tensor's gradient back.
The gradient that arrives from the peer is a constant in a double backward.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _mpiad
from ._checks import CODE
from ._constants import BACKWARD_TAG_OFFSET
from ._handles import WaitHandle, make_handle
from ._staging import cuda_aware, from_mpi, mpi_empty, sync_device, to_mpi, write_back

Tensor = torch.Tensor


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
