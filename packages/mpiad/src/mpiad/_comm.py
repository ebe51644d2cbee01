"""The communicator: mpi4torch's API on top of the native core.

Each method validates its arguments locally (raising before any
communication), then takes one of three paths:

* under ``torch.compile``: the ``torch.ops.mpiad`` custom ops;
* an input requires grad: the collective's autograd Function;
* otherwise: straight to the raw communication of ``_collectives``;

and ``Allreduce`` first tries its latency path (checked in C). A collective's custom op,
Function and backward rule sit together: ``_reductions`` (Allreduce, Bcast_, Reduce_),
``_gathers`` (Gather, Allgather, Scatter, Alltoall, Reduce_scatter).

:class:`Communicator` is also a TorchScript class (compiled when a scripted
function or module first names it): the collectives and ``rank`` / ``size``
branch on ``torch.jit.is_scripting()``, which TorchScript resolves at compile
time, so scripted code calls the same custom ops as ``torch.compile`` and the
Python branch is neither compiled nor slowed. TorchScript parses (but does not
compile) the Python branches, so they avoid syntax it cannot parse (``try``,
``import``, generators). Methods TorchScript cannot express (point to point,
non-blocking, ``Barrier``) are dropped from the compiled class; the non-blocking and
point-to-point methods are defined next to their autograd (``_nonblocking``, ``_p2p``)
and attached to the class here.
"""

from __future__ import annotations

from typing import Any

import torch
from mpi4py import MPI

from . import _collectives as _coll
from . import _gathers as G
from . import _handles, _mpiad, _nonblocking, _p2p
from . import _reductions as R
from ._checks import (
    check_axis,
    check_int,
    check_numelem,
    check_op,
    check_out,
    check_rank,
    check_reduce_scatter,
    check_tensor,
    script_numelem,
)
from ._constants import MPI_SUM
from ._debug import state as _debug
from ._errors import MpiadTypeError, MpiadValueError
from ._functions import NoInplaceReuse, needs_grad
from ._handles import WaitHandle
from ._registry import register

Tensor = torch.Tensor

_is_compiling = torch.compiler.is_compiling
_is_scripting = torch.jit.is_scripting  # (TorchScript: the constant True; Python: False)
#: marks a method TorchScript leaves out of the compiled class
_drop = torch.jit._drop
_allreduce_tensor = _mpiad.allreduce_tensor


class Communicator:
    """An MPI communicator whose operations are differentiable.

    Build one with :func:`mpiad.comm_from_mpi4py` or use :data:`mpiad.COMM_WORLD`.
    Methods with a trailing underscore write into their input tensor.

    A TorchScript class too: scripted functions may take one
    (``comm: mpiad.MPI_Communicator``) and call ``rank``, ``size`` and the
    blocking collectives; scripted modules may hold one as an attribute.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator to wrap (kept alive by this object).

    Raises
    ------
    TypeError
        ``comm`` is not an mpi4py communicator.
    ValueError
        ``comm`` is ``MPI.COMM_NULL``.
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
            register(self)

    @_drop
    def __repr__(self) -> str:
        return f"mpiad.Communicator(rank={self._rank}, size={self._size})"

    @property
    def rank(self) -> int:
        """Rank of this process in the communicator (0 .. size-1)."""
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

        Examples
        --------
        >>> import torch, mpiad
        >>> comm = mpiad.COMM_WORLD
        >>> x = torch.full((3,), float(comm.rank + 1), requires_grad=True)
        >>> y = comm.Allreduce(x, mpiad.MPI_SUM)  # 1 + 2 + ... + size in every element
        >>> y.sum().backward()  # x.grad: size in every element (the sum of every rank's ones)
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
                    return R.allreduce_small(tensor, self, op, result)
            t = check_tensor(tensor)
            op = check_op(op, t)
            if out is not None:
                if needs_grad(t) or not t.is_contiguous() or _is_compiling():
                    raise MpiadValueError("out= is only supported for contiguous tensors that do not require grad")
                check_out(out, t)
                _coll.allreduce_out(self._handle, t, op, out)
                torch.autograd.graph.increment_version(out)  # as torch's out= ops do
                return out
            if _is_compiling():
                return torch.ops.mpiad.allreduce(t, self._handle, op)
            if needs_grad(t):
                return R.Allreduce.apply(t, self._handle, self._rank, self._size, op)
            return _coll.allreduce(self._handle, t, op)

    def Bcast_(self, tensor: Tensor, root: int) -> Tensor:
        """Broadcast root's ``tensor`` into every rank's ``tensor`` (in place).

        Parameters
        ----------
        tensor : torch.Tensor
            On root the values to send; elsewhere the tensor to overwrite (same shape and
            dtype on every rank).
        root : int
            The rank whose values every rank receives.

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
            if needs_grad(t):
                out = R.Bcast.apply(t, self._handle, self._rank, root)
                if t.grad_fn is not None:
                    NoInplaceReuse.apply(t, "Bcast_")
                return out
            _coll.bcast_into(self._handle, t, root)
            return t

    def Reduce_(self, tensor: Tensor, op: int, root: int) -> Tensor:
        """Combine ``tensor`` elementwise over all ranks into root's ``tensor`` (in place).

        Parameters
        ----------
        tensor : torch.Tensor
            Same shape and dtype on every rank; overwritten with the result.
        op : int
            One of the ``MPI_*`` constants (differentiable: SUM, AVG, MAX, MIN, PROD, MINLOC,
            MAXLOC).
        root : int
            The rank that gets the combined values.

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
            if needs_grad(t):
                out = R.Reduce.apply(t, self._handle, self._rank, self._size, op, root)
                if t.grad_fn is not None:
                    NoInplaceReuse.apply(t, "Reduce_")
                return out
            _coll.reduce_into(self._handle, t, op, root, self._rank)
            return t

    def Reduce_scatter(
        self, tensor: Tensor, op: int = MPI_SUM, scatteraxis: int = 0, numelem: int | None = None
    ) -> Tensor:
        """Combine ``tensor`` elementwise over all ranks; rank r keeps ``numelem`` slices along ``scatteraxis``.

        Parameters
        ----------
        tensor : torch.Tensor
            Same shape and dtype on every rank.
        op : int, optional
            ``MPI_SUM`` (default) or another ``MPI_*`` constant except MINLOC / MAXLOC
            (differentiable: SUM and AVG).
        scatteraxis : int, optional
            The axis along which the result is split between the ranks (default 0).
        numelem : int, optional
            This rank's share; by default ``tensor.shape[scatteraxis] // size``
            (which must then divide evenly).

        Returns
        -------
        torch.Tensor
            This rank's ``numelem`` slices of the combined tensor along ``scatteraxis``.

        Raises
        ------
        TypeError, ValueError
            Bad tensor/op/axis, or shares that do not add up (on every rank).
        """
        if _is_scripting():
            k = script_numelem(tensor, scatteraxis, numelem, self._size)
            return torch.ops.mpiad.reduce_scatter(tensor, self._handle, op, scatteraxis, k)
        else:
            t, op, axis, numelem = check_reduce_scatter(tensor, op, scatteraxis, numelem, self._size)
            if _is_compiling():
                return torch.ops.mpiad.reduce_scatter(t, self._handle, op, axis, numelem)
            if needs_grad(t):
                return G.ReduceScatter.apply(t, self._handle, op, axis, numelem)
            return _coll.reduce_scatter(self._handle, t, op, axis, numelem)

    # ------------------------------------------------------- gather / scatter
    def Gather(self, tensor: Tensor, gatheraxis: int, root: int) -> Tensor:
        """Concatenate every rank's ``tensor`` along ``gatheraxis`` on ``root``.

        Sizes along ``gatheraxis`` may differ between ranks. Non-root ranks get a
        tensor of size 0 along ``gatheraxis``.

        Parameters
        ----------
        tensor : torch.Tensor
            This rank's part: the same dtype on every rank, the same shape but along ``gatheraxis``.
        gatheraxis : int
            The axis to concatenate along.
        root : int
            The rank that receives the concatenation.

        Returns
        -------
        torch.Tensor
            On root the concatenation in rank order; elsewhere an empty tensor (size 0 along
            ``gatheraxis``).

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
            if needs_grad(t):
                return G.Gather.apply(t, self._handle, self._rank, self._size, axis, root)
            return _coll.gather(self._handle, t, axis, root, self._rank)

    def Allgather(self, tensor: Tensor, gatheraxis: int) -> Tensor:
        """Concatenate every rank's ``tensor`` along ``gatheraxis`` on every rank.

        Parameters
        ----------
        tensor : torch.Tensor
            This rank's part: the same dtype on every rank, the same shape but along ``gatheraxis``.
        gatheraxis : int
            The axis to concatenate along.

        Returns
        -------
        torch.Tensor
            The concatenation of every rank's ``tensor`` in rank order.

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
            if needs_grad(t):
                return G.Allgather.apply(t, self._handle, axis)
            return _coll.allgather(self._handle, t, axis)

    def Scatter(self, tensor: Tensor, scatteraxis: int, numelem: int, root: int) -> Tensor:
        """Split root's ``tensor`` along ``scatteraxis``; each rank receives its ``numelem`` slices.

        On non-root ranks ``tensor`` only supplies dtype and device. The ranks'
        ``numelem`` must add up to root's size along ``scatteraxis``.

        Parameters
        ----------
        tensor : torch.Tensor
            On root the tensor to split; elsewhere only its dtype and device count.
        scatteraxis : int
            The axis to split along.
        numelem : int
            How many slices this rank receives.
        root : int
            The rank whose tensor is split.

        Returns
        -------
        torch.Tensor
            This rank's ``numelem`` slices of root's tensor.

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
            if needs_grad(t):
                return G.Scatter.apply(t, self._handle, self._rank, axis, numelem, root)
            return _coll.scatter(self._handle, t, axis, numelem, root, self._rank)

    def Alltoall(self, tensor: Tensor, gatheraxis: int, scatteraxis: int, numelem: int) -> Tensor:
        """Exchange blocks between all ranks in one ``MPI_Alltoallv``.

        Scatter along ``scatteraxis`` (rank r receives ``numelem`` of r's slices) and
        gather the received blocks along ``gatheraxis``. With ``gatheraxis == scatteraxis`` the global concatenation along that axis
        is re-partitioned so that rank r holds ``numelem`` slices.

        Parameters
        ----------
        tensor : torch.Tensor
            This rank's data; same dtype on every rank.
        gatheraxis : int
            The axis along which the received blocks are concatenated (in rank order).
        scatteraxis : int
            The axis along which ``tensor`` is split into the blocks sent to each rank.
        numelem : int
            How many slices along ``scatteraxis`` each rank sends to this one.

        Returns
        -------
        torch.Tensor
            The received blocks, concatenated along ``gatheraxis``.

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
            if needs_grad(t):
                return G.Alltoall.apply(t, self._handle, gaxis, saxis, numelem)
            return _coll.alltoall(self._handle, t, gaxis, saxis, numelem)

    # ------------------------------------------- non-blocking (in _nonblocking.py)
    # Not in the TorchScript class, as the point-to-point ops below: their WaitHandle
    # carries Python autograd state. Each validates like its blocking twin, starts the
    # operation and returns a WaitHandle; ``Wait(handle)`` returns what the blocking
    # call returns.
    Iallreduce = _nonblocking.Iallreduce
    Ibcast_ = _nonblocking.Ibcast_
    Ireduce_ = _nonblocking.Ireduce_
    Igather = _nonblocking.Igather
    Iallgather = _nonblocking.Iallgather
    Iscatter = _nonblocking.Iscatter
    Ialltoall = _nonblocking.Ialltoall
    Ireduce_scatter = _nonblocking.Ireduce_scatter

    # ----------------------------------------------- point to point (in _p2p.py)
    Isend = _p2p.Isend
    Irecv = _p2p.Irecv
    Send = _p2p.Send
    Recv = _p2p.Recv
    Sendrecv = _p2p.Sendrecv

    @_drop
    def Wait(self, waithandle: WaitHandle) -> Tensor:
        """Complete a non-blocking operation.

        Parameters
        ----------
        waithandle : WaitHandle
            What a non-blocking method (``Isend``, ``Irecv``, ``Iallreduce``, ...) returned.

        Returns
        -------
        torch.Tensor
            What the blocking operation returns: for Isend the sent tensor, for Irecv
            the received one, for a collective its result.

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
    def Barrier(self) -> None:
        """Block until every rank of the communicator has called Barrier."""
        _mpiad.barrier(self._handle)


#: mpi4torch's name of the class.
MPI_Communicator = Communicator


def comm_from_mpi4py(comm: Any) -> Communicator:
    """Wrap an mpi4py communicator (``MPI.COMM_WORLD``, ``Split`` results, ...).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator to wrap.

    Returns
    -------
    Communicator
        Its differentiable twin (one per call; the mpi4py object is kept alive).

    Raises
    ------
    TypeError
        Not an mpi4py communicator.
    ValueError
        ``MPI.COMM_NULL``.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> import mpiad
    >>> half = mpiad.comm_from_mpi4py(MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank % 2))
    """
    return Communicator(comm)


#: The world communicator (``MPI_COMM_WORLD``).
COMM_WORLD: Communicator = Communicator(MPI.COMM_WORLD)
