"""The communicator: mpi4torch's API on top of the native core.

Each method validates its arguments locally (raising before any
communication), then takes one of three paths:

* under ``torch.compile``: the ``torch.ops.mpiad`` custom ops (see ``_library``);
* an input requires grad: the autograd Functions of ``_functions`` / ``_p2p``;
* otherwise: straight to the native call (the latency fast path).

:class:`Communicator` is also a TorchScript class (compiled when a scripted
function or module first names it): the collectives and ``rank`` / ``size``
branch on ``torch.jit.is_scripting()``, which TorchScript resolves at compile
time, so scripted code calls the same custom ops as ``torch.compile`` and the
Python branch is neither compiled nor slowed. TorchScript parses (but does not
compile) the Python branches, so they avoid syntax it cannot parse (``try``,
``import``, generators). Methods TorchScript cannot express (point to point,
non-blocking, ``Barrier``) are dropped from the compiled class.
"""

from __future__ import annotations

from typing import Any

import torch
from mpi4py import MPI

from . import _collectives as _coll
from . import _functions as F
from . import _handles, _mpiad, _nonblocking, _p2p
from ._checks import (
    CODE,
    check_axis,
    check_int,
    check_numelem,
    check_op,
    check_rank,
    check_scatter_op,
    check_tag,
    check_tensor,
)
from ._constants import MPI_SUM
from ._debug import state as _debug
from ._errors import MpiadTypeError, MpiadValueError
from ._handles import WaitHandle
from ._pool import POOL_MIN_BYTES, new_output

Tensor = torch.Tensor

_is_compiling = torch.compiler.is_compiling
_is_scripting = torch.jit.is_scripting  # (TorchScript: the constant True; Python: False)
#: marks a method TorchScript leaves out of the compiled class
_drop = torch.jit._drop
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_AllreduceSmall = F.AllreduceSmall
_apply_small = F.apply_small
_functorch_active = F.functorch_active
_unwrap_if_dead = F.unwrap_if_dead
_allreduce_tensor = _mpiad.allreduce_tensor
#: whether the C latency path is on (False only where a torch release defines a
#: tensor attribute it reads in Python; every call then takes the Python path)
TENSOR_FAST_PATH: bool = _mpiad.init_tensor_fast(
    _Tensor,
    _Parameter,
    torch.is_grad_enabled,
    torch._C._increment_version,
    torch.empty_like,
    new_output,
    CODE,
    POOL_MIN_BYTES,
)


def _needs_grad(t: Tensor) -> bool:
    return t.requires_grad and torch.is_grad_enabled()


def _check_out(out: Any, t: Tensor) -> None:
    if not (
        isinstance(out, torch.Tensor)
        and out.device == t.device
        and out.layout == torch.strided
        and not out.is_nested
        and out.is_contiguous()
        and out.dtype == t.dtype
        and out.shape == t.shape
        and not out.requires_grad
    ):
        raise MpiadValueError(
            "out must be a contiguous tensor on the input's device, of its shape and dtype, without grad"
        )
    if out.is_conj() or out.is_neg():
        raise MpiadValueError("out must hold its own values, not a lazy conjugate or negative view (resolve_conj())")
    if out is not t and out.nbytes:
        a, b, n = t.data_ptr(), out.data_ptr(), t.nbytes
        if a != b and a < b + n and b < a + n:
            raise MpiadValueError("out overlaps the input without being it (MPI forbids partly aliased buffers)")


def _compiled_handle(t: Tensor, result: Tensor) -> WaitHandle:
    """Under torch.compile a non-blocking op is traced as its blocking custom op (the
    same values and gradients, from the op's autograd formula; the compiled graph
    does not overlap it). The handle's dummy is the result itself: Wait returns it,
    and JoinDummies on it orders as on the real handle."""
    return WaitHandle(result, None)


def _allreduce_small(tensor: Tensor, comm: Communicator, op: int, code: int) -> Tensor:
    """The autograd latency path of Allreduce (one AllreduceSmall node; ``code``: the dtype code)."""
    if _functorch_active():
        return _AllreduceSmall.apply(tensor, comm, op, code)
    try:
        tensor.data_ptr()
    except RuntimeError:  # no storage: a functorch wrapper left from a transform
        tensor = _unwrap_if_dead(tensor)  # (what Function.apply would do)
    return _apply_small(tensor, comm, op, code)


def _script_numelem(tensor: Tensor, axis: int, numelem: int | None, size: int) -> int:
    """(compiled by TorchScript) Reduce_scatter's share: ``numelem``, by default the even split."""
    if numelem is not None:
        return numelem
    n = tensor.size(axis)
    if n % size != 0:
        raise ValueError(f"Reduce_scatter: size {n} along axis {axis} does not divide by {size} ranks; pass numelem")
    return n // size


def _default_numelem(t: Tensor, axis: int, size: int, name: str) -> int:
    if t.shape[axis] % size:
        raise MpiadValueError(
            f"{name}: size {t.shape[axis]} along axis {axis} does not divide by {size} ranks; pass numelem"
        )
    return t.shape[axis] // size


_REGISTRY: dict[int, Communicator] = {}


def lookup(handle: int) -> Communicator:
    """The :class:`Communicator` of an integer handle (used by the compiled ops)."""
    try:
        return _REGISTRY[handle]
    except KeyError:
        raise MpiadValueError(f"no mpiad communicator with handle {handle:#x}") from None


class Communicator:
    """An MPI communicator whose operations are differentiable.

    Build one with :func:`mpiad.comm_from_mpi4py` or use :data:`mpiad.COMM_WORLD`.
    Methods with a trailing underscore write into their input tensor.

    A TorchScript class too: scripted functions may take one
    (``comm: mpiad.MPI_Communicator``) and call ``rank``, ``size`` and the
    blocking collectives; scripted modules may hold one as an attribute.
    """

    #: (not compiled: TorchScript has no type for an mpi4py object)
    __jit_unused_properties__ = ["mpi4py"]

    def __init__(self, comm: Any) -> None:
        if _is_scripting():
            # the attributes a scripted method reads (TorchScript copies them from the
            # Python object it is given); communicators are made in Python only
            self._handle = 0
            self._rank = 0
            self._size = 1
            self._tag_ub = 32767
            raise RuntimeError("mpiad: make communicators in Python (mpiad.comm_from_mpi4py), not in TorchScript")
        else:
            if not isinstance(comm, MPI.Comm):
                raise MpiadTypeError(f"expected an mpi4py communicator (mpi4py.MPI.Comm), got {type(comm).__name__}")
            if comm == MPI.COMM_NULL:
                raise MpiadValueError("cannot wrap MPI.COMM_NULL (this rank is not part of the communicator)")
            self._comm = comm  # keeps the mpi4py object (and the MPI handle) alive
            self._handle = int(comm.handle)
            self._rank = int(_mpiad.comm_rank(self._handle))
            self._size = int(_mpiad.comm_size(self._handle))
            ub = comm.Get_attr(MPI.TAG_UB)  # the largest tag this MPI accepts (>= 32767 by the standard)
            self._tag_ub = int(ub) if ub else 32767
            _REGISTRY[self._handle] = self

    @_drop
    def __repr__(self) -> str:
        return f"mpiad.Communicator(rank={self._rank}, size={self._size})"

    @property
    def rank(self) -> int:
        """This process's rank in the communicator (0 .. size-1)."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of processes in the communicator."""
        return self._size

    @property
    def handle(self) -> int:
        """The MPI communicator handle (mpi4py's ``Comm.handle``) the native calls take."""
        return self._handle

    @property
    def mpi4py(self) -> Any:
        """The underlying ``mpi4py.MPI.Comm``."""
        return self._comm

    # ------------------------------------------------------------ reductions
    def Allreduce(self, tensor: Tensor, op: int = MPI_SUM, out: Tensor | None = None) -> Tensor:
        """Combine ``tensor`` elementwise over all ranks; every rank gets the result.

        Parameters
        ----------
        tensor : torch.Tensor
            Same shape and dtype on every rank.
        op : int
            One of the ``MPI_*`` constants. Differentiable: SUM, MAX, MIN, PROD,
            MINLOC, MAXLOC (pairs in the last dimension).
        out : torch.Tensor, optional
            (mpiad extension, no autograd, not under TorchScript) a contiguous
            tensor on the input's device (CPU or CUDA), of the same shape and dtype,
            to write the result into, instead of a new tensor (a CUDA result staged
            through host memory is copied straight into it); may be ``tensor`` itself (MPI_IN_PLACE), but not partly
            overlap it. Its autograd version counter is bumped, as by torch's
            ``out=`` ops.

        Returns
        -------
        torch.Tensor
            A new tensor with the combined values (``out`` when given).

        Raises
        ------
        TypeError
            Not a tensor, or ``op`` undefined for its dtype.
        ValueError
            Unknown ``op``; ``out`` not matching, or used with autograd.
        """
        if _is_scripting():
            if out is not None:
                raise ValueError("mpiad: Allreduce(out=...) is not supported under TorchScript")
            return torch.ops.mpiad.allreduce(tensor, self._handle, op)
        else:
            if not _debug.on and not _is_compiling():
                # the latency paths, checked in C (csrc/tensor_fast.hpp): the result
                # without autograd; the dtype code for a call the autograd latency path
                # takes (one AllreduceSmall node); None for anything else
                result = _allreduce_tensor(self._handle, tensor, op, out)
                if result is not None:
                    if type(result) is not int:
                        return result
                    return _allreduce_small(tensor, self, op, result)
            t = check_tensor(tensor)
            op = check_op(op, t)
            if out is not None:
                if _needs_grad(t) or not t.is_contiguous() or _is_compiling():
                    raise MpiadValueError("out= is only supported for contiguous tensors that do not require grad")
                _check_out(out, t)
                _coll.allreduce_out(self._handle, t, op, out)
                torch.autograd.graph.increment_version(out)  # as torch's out= ops do
                return out
            if _is_compiling():
                return torch.ops.mpiad.allreduce(t, self._handle, op)
            if _needs_grad(t):
                return F.Allreduce.apply(t, self._handle, self._rank, self._size, op)
            return _coll.allreduce(self._handle, t, op)

    def Bcast_(self, tensor: Tensor, root: int) -> Tensor:
        """Broadcast root's ``tensor`` into every rank's ``tensor`` (in place).

        Returns
        -------
        torch.Tensor
            The broadcast values (sharing memory with ``tensor``). Use this return
            value: reusing ``tensor`` in a differentiated computation raises.

        Raises
        ------
        TypeError
            Not a tensor / unsupported dtype.
        ValueError
            ``root`` out of range.
        """
        if _is_scripting():
            return torch.ops.mpiad.bcast(tensor, self._handle, root)
        else:
            t = check_tensor(tensor)
            root = check_rank(root, "root", self._size)
            if _is_compiling():
                return torch.ops.mpiad.bcast(t, self._handle, root)
            if _needs_grad(t):
                out = F.Bcast.apply(t, self._handle, self._rank, root)
                if t.grad_fn is not None:
                    F.NoInplaceReuse.apply(t, "Bcast_")
                return out
            _coll.bcast_into(self._handle, t, root)
            return t

    def Reduce_(self, tensor: Tensor, op: int, root: int) -> Tensor:
        """Combine ``tensor`` elementwise over all ranks into root's ``tensor`` (in place).

        Returns
        -------
        torch.Tensor
            On root the combined values, elsewhere zeros (sharing memory with
            ``tensor``). Reusing ``tensor`` afterwards in autograd raises.

        Raises
        ------
        TypeError
            Not a tensor, or ``op`` undefined for its dtype.
        ValueError
            ``root`` out of range, unknown ``op``.
        """
        if _is_scripting():
            return torch.ops.mpiad.reduce(tensor, self._handle, op, root)
        else:
            t = check_tensor(tensor)
            op = check_op(op, t)
            root = check_rank(root, "root", self._size)
            if _is_compiling():
                return torch.ops.mpiad.reduce(t, self._handle, op, root)
            if _needs_grad(t):
                out = F.Reduce.apply(t, self._handle, self._rank, self._size, op, root)
                if t.grad_fn is not None:
                    F.NoInplaceReuse.apply(t, "Reduce_")
                return out
            _coll.reduce_into(self._handle, t, op, root, self._rank)
            return t

    def Reduce_scatter(
        self, tensor: Tensor, op: int = MPI_SUM, scatteraxis: int = 0, numelem: int | None = None
    ) -> Tensor:
        """Combine ``tensor`` elementwise over all ranks; rank r keeps ``numelem`` slices along ``scatteraxis``.

        Parameters
        ----------
        numelem : int, optional
            This rank's share; by default ``tensor.shape[scatteraxis] // size``
            (which must then divide evenly).

        Raises
        ------
        TypeError, ValueError
            Bad tensor/op/axis, or shares that do not add up (on every rank).
        """
        if _is_scripting():
            k = _script_numelem(tensor, scatteraxis, numelem, self._size)
            return torch.ops.mpiad.reduce_scatter(tensor, self._handle, op, scatteraxis, k)
        else:
            t, op, axis, numelem = self._reduce_scatter_args(tensor, op, scatteraxis, numelem)
            if _is_compiling():
                return torch.ops.mpiad.reduce_scatter(t, self._handle, op, axis, numelem)
            if _needs_grad(t):
                return F.ReduceScatter.apply(t, self._handle, op, axis, numelem)
            return _coll.reduce_scatter(self._handle, t, op, axis, numelem)

    @_drop
    def _reduce_scatter_args(
        self, tensor: Any, op: Any, scatteraxis: Any, numelem: Any
    ) -> tuple[Tensor, int, int, int]:
        t = check_tensor(tensor)
        op = check_scatter_op(op, t)
        axis = check_axis(scatteraxis, "scatteraxis", t.dim())
        numelem = _default_numelem(t, axis, self._size, "Reduce_scatter") if numelem is None else check_numelem(numelem)
        return t, op, axis, numelem

    # ------------------------------------------------------- gather / scatter
    def Gather(self, tensor: Tensor, gatheraxis: int, root: int) -> Tensor:
        """Concatenate every rank's ``tensor`` along ``gatheraxis`` on ``root``.

        Sizes along ``gatheraxis`` may differ between ranks. Non-root ranks get a
        tensor of size 0 along ``gatheraxis``.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, axis or root (locally); mismatching shapes/dtypes (on every rank).
        """
        if _is_scripting():
            return torch.ops.mpiad.gather(tensor, self._handle, gatheraxis, root)
        else:
            t = check_tensor(tensor)
            axis = check_axis(gatheraxis, "gatheraxis", t.dim())
            root = check_rank(root, "root", self._size)
            if _is_compiling():
                return torch.ops.mpiad.gather(t, self._handle, axis, root)
            if _needs_grad(t):
                return F.Gather.apply(t, self._handle, self._rank, self._size, axis, root)
            return _coll.gather(self._handle, t, axis, root, self._rank)

    def Allgather(self, tensor: Tensor, gatheraxis: int) -> Tensor:
        """Concatenate every rank's ``tensor`` along ``gatheraxis`` on every rank.

        Raises
        ------
        TypeError, ValueError
            Bad tensor or axis (locally); mismatching shapes/dtypes (on every rank).
        """
        if _is_scripting():
            return torch.ops.mpiad.allgather(tensor, self._handle, gatheraxis)
        else:
            t = check_tensor(tensor)
            axis = check_axis(gatheraxis, "gatheraxis", t.dim())
            if _is_compiling():
                return torch.ops.mpiad.allgather(t, self._handle, axis)
            if _needs_grad(t):
                return F.Allgather.apply(t, self._handle, axis)
            return _coll.allgather(self._handle, t, axis)

    def Scatter(self, tensor: Tensor, scatteraxis: int, numelem: int, root: int) -> Tensor:
        """Split root's ``tensor`` along ``scatteraxis``; each rank receives its ``numelem`` slices.

        On non-root ranks ``tensor`` only supplies dtype and device. The ranks'
        ``numelem`` must add up to root's size along ``scatteraxis``.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, axis, root or numelem; ``numelem`` not adding up (on every rank).
        """
        if _is_scripting():
            return torch.ops.mpiad.scatter(tensor, self._handle, scatteraxis, numelem, root)
        else:
            t = check_tensor(tensor)
            # range-checked after the size exchange, against root's tensor, on every rank
            axis = check_int(scatteraxis, "scatteraxis")
            numelem = check_numelem(numelem)
            root = check_rank(root, "root", self._size)
            if _is_compiling():
                return torch.ops.mpiad.scatter(t, self._handle, axis, numelem, root)
            if _needs_grad(t):
                return F.Scatter.apply(t, self._handle, self._rank, axis, numelem, root)
            return _coll.scatter(self._handle, t, axis, numelem, root, self._rank)

    def Alltoall(self, tensor: Tensor, gatheraxis: int, scatteraxis: int, numelem: int) -> Tensor:
        """Scatter along ``scatteraxis`` (rank r receives ``numelem`` of r's slices) and
        gather the received blocks along ``gatheraxis`` - one ``MPI_Alltoallv``.

        With ``gatheraxis == scatteraxis`` the global concatenation along that axis
        is re-partitioned so that rank r holds ``numelem`` slices.

        Raises
        ------
        TypeError, ValueError
            Bad tensor/axes/numelem (locally); sizes that do not add up (on every rank).
        """
        if _is_scripting():
            return torch.ops.mpiad.alltoall(tensor, self._handle, gatheraxis, scatteraxis, numelem)
        else:
            t = check_tensor(tensor)
            gaxis = check_axis(gatheraxis, "gatheraxis", t.dim())
            saxis = check_axis(scatteraxis, "scatteraxis", t.dim())
            numelem = check_numelem(numelem)
            if _is_compiling():
                return torch.ops.mpiad.alltoall(t, self._handle, gaxis, saxis, numelem)
            if _needs_grad(t):
                return F.Alltoall.apply(t, self._handle, gaxis, saxis, numelem)
            return _coll.alltoall(self._handle, t, gaxis, saxis, numelem)

    # ------------------------------------------------------ non-blocking
    # (Not in the TorchScript class, as the point-to-point ops below: their WaitHandle
    # carries Python autograd state.) Each I-method validates like its blocking twin,
    # starts the operation and returns a WaitHandle; ``Wait(handle)`` returns what the
    # blocking call returns. The engine's worker thread runs the communication while
    # the caller computes; the backward starts the adjoint when the gradient of the
    # result arrives (the Wait node) and completes it at the start node.

    @_drop
    def Iallreduce(self, tensor: Tensor, op: int = MPI_SUM) -> WaitHandle:
        """Start :meth:`Allreduce`; :meth:`Wait` returns the combined tensor.

        Do not write ``tensor`` before the Wait (MPI may still read it).

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
            return _compiled_handle(t, torch.ops.mpiad.allreduce(t, self._handle, op))
        return _nonblocking.iallreduce(self, t, op)

    @_drop
    def Ibcast_(self, tensor: Tensor, root: int) -> WaitHandle:
        """Start :meth:`Bcast_` (in place); :meth:`Wait` returns the broadcast tensor.

        ``tensor`` holds root's values only after the Wait; use the returned tensor.

        Raises
        ------
        TypeError
            Not a tensor / unsupported dtype.
        ValueError
            ``root`` out of range.
        """
        t = check_tensor(tensor)
        root = check_rank(root, "root", self._size)
        if _is_compiling():
            return _compiled_handle(t, torch.ops.mpiad.bcast(t, self._handle, root))
        handle = _nonblocking.ibcast(self, t, root)
        if _needs_grad(t) and t.grad_fn is not None:
            F.NoInplaceReuse.apply(t, "Ibcast_")
        return handle

    @_drop
    def Ireduce_(self, tensor: Tensor, op: int, root: int) -> WaitHandle:
        """Start :meth:`Reduce_` (in place); :meth:`Wait` returns root's result (zeros elsewhere).

        Raises
        ------
        TypeError
            Not a tensor, or ``op`` undefined for its dtype.
        ValueError
            ``root`` out of range, unknown ``op``.
        """
        t = check_tensor(tensor)
        op = check_op(op, t)
        root = check_rank(root, "root", self._size)
        if _is_compiling():
            return _compiled_handle(t, torch.ops.mpiad.reduce(t, self._handle, op, root))
        handle = _nonblocking.ireduce(self, t, op, root)
        if _needs_grad(t) and t.grad_fn is not None:
            F.NoInplaceReuse.apply(t, "Ireduce_")
        return handle

    @_drop
    def Igather(self, tensor: Tensor, gatheraxis: int, root: int) -> WaitHandle:
        """Start :meth:`Gather`. The sizes along ``gatheraxis`` are exchanged first (a short
        blocking step); the data moves in the background.

        Raises
        ------
        TypeError, ValueError
            As :meth:`Gather`.
        """
        t = check_tensor(tensor)
        axis = check_axis(gatheraxis, "gatheraxis", t.dim())
        root = check_rank(root, "root", self._size)
        if _is_compiling():
            return _compiled_handle(t, torch.ops.mpiad.gather(t, self._handle, axis, root))
        return _nonblocking.igather(self, t, axis, root)

    @_drop
    def Iallgather(self, tensor: Tensor, gatheraxis: int) -> WaitHandle:
        """Start :meth:`Allgather` (sizes exchanged first, data in the background).

        Raises
        ------
        TypeError, ValueError
            As :meth:`Allgather`.
        """
        t = check_tensor(tensor)
        axis = check_axis(gatheraxis, "gatheraxis", t.dim())
        if _is_compiling():
            return _compiled_handle(t, torch.ops.mpiad.allgather(t, self._handle, axis))
        return _nonblocking.iallgather(self, t, axis)

    @_drop
    def Iscatter(self, tensor: Tensor, scatteraxis: int, numelem: int, root: int) -> WaitHandle:
        """Start :meth:`Scatter` (sizes exchanged first, data in the background).

        Raises
        ------
        TypeError, ValueError
            As :meth:`Scatter`.
        """
        t = check_tensor(tensor)
        axis = check_int(scatteraxis, "scatteraxis")
        numelem = check_numelem(numelem)
        root = check_rank(root, "root", self._size)
        if _is_compiling():
            return _compiled_handle(t, torch.ops.mpiad.scatter(t, self._handle, axis, numelem, root))
        return _nonblocking.iscatter(self, t, axis, numelem, root)

    @_drop
    def Ialltoall(self, tensor: Tensor, gatheraxis: int, scatteraxis: int, numelem: int) -> WaitHandle:
        """Start :meth:`Alltoall` (sizes exchanged first, data in the background).

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
            return _compiled_handle(t, torch.ops.mpiad.alltoall(t, self._handle, gaxis, saxis, numelem))
        return _nonblocking.ialltoall(self, t, gaxis, saxis, numelem)

    @_drop
    def Ireduce_scatter(
        self, tensor: Tensor, op: int = MPI_SUM, scatteraxis: int = 0, numelem: int | None = None
    ) -> WaitHandle:
        """Start :meth:`Reduce_scatter` (shares exchanged first, data in the background).

        Raises
        ------
        TypeError, ValueError
            As :meth:`Reduce_scatter`.
        """
        t, op, axis, numelem = self._reduce_scatter_args(tensor, op, scatteraxis, numelem)
        if _is_compiling():
            return _compiled_handle(t, torch.ops.mpiad.reduce_scatter(t, self._handle, op, axis, numelem))
        return _nonblocking.ireduce_scatter(self, t, op, axis, numelem)

    # ------------------------------------------------------- point to point
    @_drop
    def Isend(self, tensor: Tensor, dest: int, tag: int) -> WaitHandle:
        """Start sending ``tensor`` to ``dest``; complete with :meth:`Wait`.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, ``dest`` out of range, bad tag.
        """
        t = check_tensor(tensor)
        dest = check_rank(dest, "dest", self._size)
        tag = check_tag(tag, "tag", self._tag_ub)
        return _p2p.isend(self._handle, t, dest, tag)

    @_drop
    def Irecv(self, tensor: Tensor, source: int, tag: int) -> WaitHandle:
        """Start receiving into a tensor shaped like ``tensor`` from ``source``; :meth:`Wait` returns it.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, ``source`` out of range, bad tag.
        """
        t = check_tensor(tensor)
        source = check_rank(source, "source", self._size)
        tag = check_tag(tag, "tag", self._tag_ub)
        return _p2p.irecv(self._handle, t, source, tag)

    @_drop
    def Wait(self, waithandle: WaitHandle) -> Tensor:
        """Complete a non-blocking operation.

        Returns
        -------
        torch.Tensor
            For Isend the sent tensor, for Irecv the received one.

        Raises
        ------
        TypeError
            Not a :class:`WaitHandle`.
        RuntimeError
            The handle was already waited for.
        """
        if _is_compiling() and isinstance(waithandle, WaitHandle) and waithandle.link is None:
            return waithandle.dummy
        return _handles.wait(waithandle)

    @_drop
    def Send(self, tensor: Tensor, dest: int, tag: int) -> Tensor:
        """Blocking send (``Wait(Isend(...))``); returns ``tensor``.

        Raises
        ------
        TypeError, ValueError
            As :meth:`Isend`.
        """
        return self.Wait(self.Isend(tensor, dest, tag))

    @_drop
    def Recv(self, tensor: Tensor, source: int, tag: int) -> Tensor:
        """Blocking receive (``Wait(Irecv(...))``); returns the received tensor.

        Raises
        ------
        TypeError, ValueError
            As :meth:`Irecv`.
        """
        return self.Wait(self.Irecv(tensor, source, tag))

    @_drop
    def Sendrecv(
        self,
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
        dest = check_rank(dest, "dest", self._size)
        source = dest if source is None else check_rank(source, "source", self._size)
        sendtag = check_tag(sendtag, "sendtag", self._tag_ub)
        recvtag = sendtag if recvtag is None else check_tag(recvtag, "recvtag", self._tag_ub)
        if _needs_grad(t) or _needs_grad(like):
            return F.Sendrecv.apply(t, like, self._handle, dest, sendtag, source, recvtag)
        return _coll.sendrecv(self._handle, t, dest, sendtag, like, source, recvtag)

    @_drop
    def Barrier(self) -> None:
        """Block until every rank of the communicator has called Barrier."""
        _mpiad.barrier(self._handle)


#: mpi4torch's name of the class.
MPI_Communicator = Communicator


def comm_from_mpi4py(comm: Any) -> Communicator:
    """Wrap an mpi4py communicator (``MPI.COMM_WORLD``, ``Split`` results, ...).

    Raises
    ------
    TypeError
        Not an mpi4py communicator.
    ValueError
        ``MPI.COMM_NULL``.
    """
    return Communicator(comm)


#: The world communicator (``MPI_COMM_WORLD``).
COMM_WORLD: Communicator = Communicator(MPI.COMM_WORLD)
