"""Communication without autograd: buffer preparation, the native calls, the results.

Every function takes a communicator handle (mpi4py's ``Comm.handle``) and
arguments already validated locally (``_checks``), and returns new tensors.
With ``nb=True`` it starts the non-blocking variant instead and returns a
:class:`Pending` whose ``wait()`` gives the same result: one code path for both,
so the blocking and non-blocking ops cannot drift apart. Where sizes must be
exchanged (Gather, Scatter, Alltoall, ...) that exchange is blocking and comes
first; the exchanged header also lets every rank check the others' arguments,
so inconsistent calls raise the same error on every rank before data moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _mpiad
from ._checks import CODE
from ._errors import MpiadTypeError, MpiadValueError
from ._pool import new_output
from ._signatures import (
    NONBLOCKING,
    OP_ALLGATHER,
    OP_ALLREDUCE,
    OP_ALLTOALL,
    OP_BCAST,
    OP_GATHER,
    OP_REDUCE,
    OP_REDUCE_SCATTER,
    OP_SCATTER,
    check_signatures,
    debug_check,
    exchange,
    signature,
)
from ._staging import from_mpi, mpi_empty, release, staged, sync_device, to_mpi, write_back

Tensor = torch.Tensor


class Pending:
    """A started non-blocking collective; :meth:`wait` completes it and returns the result."""

    __slots__ = ("_finish", "req")

    def __init__(self, req: Any, finish: Callable[[], Tensor]) -> None:
        self.req = req
        self._finish = finish

    def wait(self) -> Tensor:
        self.req.wait()
        return self._finish()


def _run(
    nb: bool,
    blocking: Callable[..., Any],
    nonblocking: Callable[..., Any],
    args: tuple[Any, ...],
    keep: tuple[Tensor, ...],
    finish: Callable[[], Tensor],
) -> Any:
    if nb:
        return Pending(nonblocking(*args, keep), finish)
    blocking(*args)
    return finish()


def _id(opid: int, nb: bool) -> int:
    return opid + NONBLOCKING if nb else opid


def allreduce(comm: int, t: Tensor, op: int, nb: bool = False) -> Any:
    """Elementwise reduction over all ranks; a new tensor on every rank."""
    debug_check(comm, _id(OP_ALLREDUCE, nb), t, op)
    x = to_mpi(t)
    # a CUDA input staged through host memory gets a pinned output too (its copy back is faster)
    out = mpi_empty(x.shape, t) if t.is_cuda else new_output(x)
    args = (comm, x.data_ptr(), out.data_ptr(), x.nbytes, CODE[x.dtype], op)

    def finish() -> Tensor:
        result = from_mpi(out, t)  # a synchronous copy: the staging buffers are free after it
        release(t, x, out)
        return result

    return _run(nb, _mpiad.allreduce_fast, _mpiad.iallreduce, args, (x, out), finish)


def allreduce_out(comm: int, t: Tensor, op: int, out: Tensor) -> Tensor:
    """Blocking Allreduce of ``t`` into ``out`` (checked by the caller: same device, shape, dtype).

    A CUDA tensor staged through host memory is reduced in place in one pooled pinned
    buffer and copied straight into ``out``: no device tensor is allocated.
    """
    debug_check(comm, OP_ALLREDUCE, t, op)
    x = to_mpi(t)  # (values of a lazy conjugate/negative view; a pooled host copy when staged)
    if staged(t):
        _mpiad.allreduce_fast(comm, x.data_ptr(), x.data_ptr(), x.nbytes, CODE[x.dtype], op)  # in place
        with torch.no_grad():
            out.copy_(x)  # synchronous from pinned memory
        release(t, x)
    else:
        if out.is_cuda:
            sync_device(out)  # kernels still reading out finish before MPI writes it
        _mpiad.allreduce_fast(comm, x.data_ptr(), out.data_ptr(), x.nbytes, CODE[x.dtype], op)
    return out


def bcast_into(comm: int, t: Tensor, root: int, nb: bool = False) -> Any:
    """Broadcast root's ``t`` into every rank's ``t`` (in place); returns ``t``."""
    debug_check(comm, _id(OP_BCAST, nb), t, root)
    x = to_mpi(t)

    def finish() -> Tensor:
        write_back(t, x)  # a synchronous copy: x is free after it
        release(t, x)
        return t

    args = (comm, x.data_ptr(), x.numel(), CODE[x.dtype], root)
    return _run(nb, _mpiad.bcast, _mpiad.ibcast, args, (x,), finish)


def bcast(comm: int, t: Tensor, root: int, nb: bool = False) -> Any:
    """Functional broadcast: a new tensor holding root's values."""
    return bcast_into(comm, t.detach().clone(memory_format=torch.contiguous_format), root, nb)


def reduce_into(comm: int, t: Tensor, op: int, root: int, rank: int, nb: bool = False) -> Any:
    """Reduce every rank's ``t`` into root's ``t`` (in place); non-roots get zeros; returns ``t``."""
    debug_check(comm, _id(OP_REDUCE, nb), t, op, root)
    x = to_mpi(t)

    def finish() -> Tensor:
        with torch.no_grad():
            if rank != root:
                t.zero_()
            else:
                write_back(t, x)
        release(t, x)
        return t

    args = (comm, x.data_ptr(), x.data_ptr(), x.numel(), CODE[x.dtype], op, root)
    return _run(nb, _mpiad.reduce, _mpiad.ireduce, args, (x,), finish)


def reduce(comm: int, t: Tensor, op: int, root: int, rank: int, nb: bool = False) -> Any:
    """Functional reduce to root (zeros elsewhere)."""
    return reduce_into(comm, t.detach().clone(memory_format=torch.contiguous_format), op, root, rank, nb)


def _front(t: Tensor, axis: int) -> Tensor:
    """``t`` with ``axis`` moved to the front, contiguous (no copy when already so)."""
    return to_mpi(t.movedim(axis, 0) if axis else t)


def _back(buf: Tensor, axis: int, like: Tensor) -> Tensor:
    out = buf.movedim(0, axis).contiguous() if axis else buf
    return from_mpi(out, like)


def _displs(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def _inner(shape: Sequence[int], axis: int) -> int:
    n = 1
    for i, s in enumerate(shape):
        if i != axis:
            n *= s
    return n


def gather(comm: int, t: Tensor, axis: int, root: int, rank: int, nb: bool = False) -> Any:
    """Concatenate every rank's ``t`` along ``axis`` on ``root``.

    Non-root ranks get a tensor of size 0 along ``axis`` (as mpi4torch).
    """
    sigs = exchange(comm, signature(_id(OP_GATHER, nb), t, axis, root))
    check_signatures(sigs, free_axis=axis)
    sizes = [s[3 + axis] for s in sigs]
    x = _front(t, axis)
    inner = _inner(t.shape, axis)
    out = mpi_empty((sum(sizes) if rank == root else 0, *x.shape[1:]), t)
    counts = [s * inner for s in sizes]
    args = (comm, x.data_ptr(), x.numel(), out.data_ptr(), counts, _displs(counts), CODE[x.dtype], root)
    return _run(nb, _mpiad.gatherv, _mpiad.igatherv, args, (x, out), lambda: _back(out, axis, t))


def allgather(comm: int, t: Tensor, axis: int, nb: bool = False) -> Any:
    """Concatenate every rank's ``t`` along ``axis`` on every rank."""
    sigs = exchange(comm, signature(_id(OP_ALLGATHER, nb), t, axis))
    check_signatures(sigs, free_axis=axis)
    sizes = [s[3 + axis] for s in sigs]
    x = _front(t, axis)
    inner = _inner(t.shape, axis)
    out = mpi_empty((sum(sizes), *x.shape[1:]), t)
    counts = [s * inner for s in sizes]
    args = (comm, x.data_ptr(), x.numel(), out.data_ptr(), counts, _displs(counts), CODE[x.dtype])
    return _run(nb, _mpiad.allgatherv, _mpiad.iallgatherv, args, (x, out), lambda: _back(out, axis, t))


def scatter(comm: int, t: Tensor, axis: int, numelem: int, root: int, rank: int, nb: bool = False) -> Any:
    """Split root's ``t`` along ``axis``; rank r receives ``numelem`` (its own) slices.

    On non-root ranks ``t`` only supplies the dtype (and device).
    """
    sigs = exchange(comm, [*signature(_id(OP_SCATTER, nb), t, axis, root, 0), numelem])
    check_signatures(sigs, shapes=False)  # op, dtype, axis, root agree
    rsig = sigs[root]
    ndim = rsig[2]
    if not -ndim <= axis < ndim:
        raise MpiadValueError(f"Scatter: scatteraxis = {axis} is out of range for root's {ndim}-d tensor")
    axis %= ndim
    shape = list(rsig[3 : 3 + ndim])
    numelems = [s[-1] for s in sigs]
    if any(n < 0 for n in numelems) or sum(numelems) != shape[axis]:
        raise MpiadValueError(
            f"Scatter: the ranks' numelem {numelems} sum to {sum(numelems)}, but root's tensor has "
            f"{shape[axis]} elements along scatteraxis {axis}"
        )
    inner = _inner(shape, axis)
    rest = shape[:axis] + shape[axis + 1 :]
    out = mpi_empty((numelem, *rest), t)
    counts = [n * inner for n in numelems]
    keep: tuple[Tensor, ...] = (out,)
    src = 0
    if rank == root:
        x = _front(t, axis)
        src, keep = x.data_ptr(), (x, out)
    else:
        sync_device(t)
    args = (comm, src, counts, _displs(counts), out.data_ptr(), out.numel(), CODE[t.dtype], root)
    return _run(nb, _mpiad.scatterv, _mpiad.iscatterv, args, keep, lambda: _back(out, axis, t))


def alltoall(comm: int, t: Tensor, gaxis: int, saxis: int, numelem: int, nb: bool = False) -> Any:
    """Redistribute: slices along ``saxis`` go to the ranks (``numelem`` each, per
    receiver), received blocks are concatenated along ``gaxis``. One MPI_Alltoallv."""
    sigs = exchange(comm, signature(_id(OP_ALLTOALL, nb), t, gaxis, saxis, numelem))
    check_signatures([[*s[:-1], 0] for s in sigs], free_axis=gaxis)
    size = len(sigs)
    numelems = [s[-1] for s in sigs]
    gsizes = [s[3 + gaxis] for s in sigs]
    ssizes = [s[3 + saxis] for s in sigs]
    inner = [_inner(s[3 : 3 + s[2]], saxis) for s in sigs]
    if any(n < 0 for n in numelems):
        raise MpiadValueError(f"Alltoall: numelem must be >= 0, got {numelems}")
    me = _mpiad.comm_rank(comm)
    x = _front(t, saxis)
    rest = list(x.shape[1:])
    code = CODE[x.dtype]
    if gaxis != saxis:
        bad = [r for r in range(size) if ssizes[r] != sum(numelems)]
        if bad:
            raise MpiadValueError(
                f"Alltoall: the ranks' numelem {numelems} sum to {sum(numelems)}, but rank {bad[0]}'s tensor has "
                f"{ssizes[bad[0]]} elements along scatteraxis {saxis}"
            )
        scounts = [n * inner[me] for n in numelems]
        rcounts = [numelem * inner[r] for r in range(size)]
        out = mpi_empty((sum(rcounts),), t)
        g_in_rest = gaxis if gaxis < saxis else gaxis - 1

        def finish() -> Tensor:
            blocks = []
            for r, piece in enumerate(out.split(rcounts)):
                shp = list(rest)
                shp[g_in_rest] = gsizes[r]
                blocks.append(piece.view(numelem, *shp).movedim(0, saxis))
            return from_mpi(torch.cat(blocks, dim=gaxis), t)

        args = (comm, x.data_ptr(), scounts, _displs(scounts), out.data_ptr(), rcounts, _displs(rcounts), code)
        return _run(nb, _mpiad.alltoallv, _mpiad.ialltoallv, args, (x, out), finish)
    # gather axis == scatter axis: re-partition the global concatenation
    if sum(gsizes) != sum(numelems):
        raise MpiadValueError(
            f"Alltoall: the ranks' numelem {numelems} sum to {sum(numelems)}, but their tensors hold "
            f"{sum(gsizes)} elements along axis {gaxis} in total"
        )
    cur, new = _displs(gsizes), _displs(numelems)
    row = inner[me]
    scounts, sdispl, rcounts, rdispl = [], [], [], []
    for r in range(size):
        lo, hi = max(cur[me], new[r]), min(cur[me] + gsizes[me], new[r] + numelems[r])
        scounts.append(max(0, hi - lo) * row)
        sdispl.append(max(0, lo - cur[me]) * row)
        lo, hi = max(cur[r], new[me]), min(cur[r] + gsizes[r], new[me] + numelem)
        rcounts.append(max(0, hi - lo) * row)
        rdispl.append(max(0, lo - new[me]) * row)
    out = mpi_empty((numelem, *rest), t)
    args = (comm, x.data_ptr(), scounts, sdispl, out.data_ptr(), rcounts, rdispl, code)
    return _run(nb, _mpiad.alltoallv, _mpiad.ialltoallv, args, (x, out), lambda: _back(out, saxis, t))


def reduce_scatter(comm: int, t: Tensor, op: int, axis: int, numelem: int, nb: bool = False) -> Any:
    """Reduce every rank's ``t`` elementwise; rank r keeps its ``numelem`` slices along ``axis``."""
    sigs = exchange(comm, [*signature(_id(OP_REDUCE_SCATTER, nb), t, op, axis, 0), numelem])
    check_signatures(sigs)
    numelems = [s[-1] for s in sigs]
    if any(n < 0 for n in numelems) or sum(numelems) != t.shape[axis]:
        raise MpiadValueError(
            f"Reduce_scatter: the ranks' numelem {numelems} sum to {sum(numelems)}, but the tensors have "
            f"{t.shape[axis]} elements along axis {axis}"
        )
    x = _front(t, axis)
    inner = _inner(t.shape, axis)
    out = mpi_empty((numelem, *x.shape[1:]), t)
    args = (comm, x.data_ptr(), out.data_ptr(), [n * inner for n in numelems], CODE[x.dtype], op)
    return _run(nb, _mpiad.reduce_scatter, _mpiad.ireduce_scatter, args, (x, out), lambda: _back(out, axis, t))


def sendrecv(comm: int, t: Tensor, dest: int, sendtag: int, like: Tensor, source: int, recvtag: int) -> Tensor:
    """Send ``t`` to ``dest`` and receive a tensor shaped like ``like`` from ``source``."""
    if like.dtype != t.dtype:
        raise MpiadTypeError(f"Sendrecv: send dtype {t.dtype} differs from receive dtype {like.dtype}")
    x = to_mpi(t)
    out = mpi_empty(like.shape, like)
    _mpiad.sendrecv(
        comm, x.data_ptr(), x.numel(), dest, sendtag, out.data_ptr(), out.numel(), source, recvtag, CODE[x.dtype]
    )
    return from_mpi(out, like)
