"""The communicator: mpi4torch's API on top of the native core.

Each method validates its arguments locally (raising before any
communication), then takes one of three paths:

* under ``torch.compile``: the ``torch.ops.mpiad`` custom ops (see ``_library``);
* an input requires grad: the autograd Functions of ``_functions`` / ``_p2p``;
* otherwise: straight to the native call (the latency fast path).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _functions as F
from . import _mpiad, _p2p, _raw
from ._constants import MPI_MAXLOC, MPI_MINLOC, MPI_SUM, OP_NAMES
from ._errors import MpiadTypeError, MpiadValueError
from ._p2p import WaitHandle

Tensor = torch.Tensor

_is_compiling = torch.compiler.is_compiling
_allreduce = _mpiad.allreduce
_CODE = _raw._CODE

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_empty_like = torch.empty_like
_grad_enabled = torch.is_grad_enabled
_AllreduceSmall = F.AllreduceSmall
_apply_small = F.apply_small
_functorch_active = F.functorch_active
_unwrap_if_dead = F.unwrap_if_dead
_allreduce_fast = _mpiad.allreduce_fast
#: below this many bytes a new Allreduce output is a plain torch.empty_like (above: the pool)
_SMALL = min(_raw.POOL_MIN_BYTES, _raw.LARGE_BYTES)


def _valid_pairs() -> dict[tuple[int, torch.dtype], int]:
    """Every (op, dtype) pair a reduction accepts (MINLOC/MAXLOC excluded: they need
    a shape check), mapped to the dtype code: one dict lookup validates a call."""
    out = {}
    for dtype, code in _CODE.items():
        for op in OP_NAMES:
            if op in (MPI_MINLOC, MPI_MAXLOC):
                continue
            try:
                _raw._check_op_dtype(op, dtype)
            except MpiadTypeError:
                continue
            out[(op, dtype)] = code
    return out


# (op, dtype) -> dtype code; built once, never mutated (torch.compile may guard on it)
_FAST: dict[tuple[int, torch.dtype], int] = _valid_pairs()


def _check_op(op: Any, t: Tensor) -> int:
    if type(op) is int and (op, t.dtype) in _FAST:
        return op
    return _raw.check_op(op, t)


def _needs_grad(t: Tensor) -> bool:
    return t.requires_grad and torch.is_grad_enabled()


def _check_out(out: Any, t: Tensor) -> None:
    if not (
        isinstance(out, torch.Tensor)
        and out.is_cpu
        and out.is_contiguous()
        and out.dtype == t.dtype
        and out.shape == t.shape
        and not out.requires_grad
    ):
        raise MpiadValueError("out must be a contiguous CPU tensor of the input's shape and dtype, without grad")


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
    """

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

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
    def mpi4py(self) -> Any:
        """The underlying ``mpi4py.MPI.Comm``."""
        return self._comm

    # ------------------------------------------------------------ reductions
    def Allreduce(self, tensor: Tensor, op: int = MPI_SUM, *, out: Tensor | None = None) -> Tensor:
        """Combine ``tensor`` elementwise over all ranks; every rank gets the result.

        Parameters
        ----------
        tensor : torch.Tensor
            Same shape and dtype on every rank.
        op : int
            One of the ``MPI_*`` constants. Differentiable: SUM, MAX, MIN, PROD,
            MINLOC, MAXLOC (pairs in the last dimension).
        out : torch.Tensor, optional
            (mpiad extension, no autograd) a contiguous CPU tensor of the same
            shape and dtype to write the result into, instead of a new tensor;
            may be ``tensor`` itself (MPI_IN_PLACE).

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
        if type(op) is int and (type(tensor) is _Tensor or type(tensor) is _Parameter):
            # the latency paths: a validated (op, dtype) pair and a contiguous CPU tensor
            code = _FAST.get((op, tensor.dtype))
            if code is not None and tensor.is_cpu and tensor.is_contiguous() and not _raw._debug:
                nbytes = tensor.nbytes
                if tensor.requires_grad and _grad_enabled():
                    if out is None and nbytes < _SMALL and not _is_compiling():
                        if _functorch_active():
                            return _AllreduceSmall.apply(tensor, self, op, code)
                        return _apply_small(_unwrap_if_dead(tensor), self, op, code)
                elif not _is_compiling():
                    # no autograd: one allocation and the native call, no staging or copies
                    if out is None:
                        out = _empty_like(tensor) if nbytes < _SMALL else _raw.new_output(tensor)
                    elif out is not tensor:
                        _check_out(out, tensor)
                    if nbytes < _raw.LARGE_BYTES:
                        _allreduce_fast(self._handle, tensor.data_ptr(), out.data_ptr(), nbytes, code, op)
                    else:
                        algo = _raw.large_algo(self._handle)
                        _allreduce(self._handle, tensor.data_ptr(), out.data_ptr(), tensor.numel(), code, op, algo)
                    return out
        t = _raw.check_tensor(tensor)
        op = _check_op(op, t)
        if out is not None:
            if _needs_grad(t) or not t.is_cpu or not t.is_contiguous() or _is_compiling():
                raise MpiadValueError("out= is only supported for contiguous CPU tensors that do not require grad")
            _check_out(out, t)
            _raw.debug_check(self._handle, _raw.OP_ALLREDUCE, t, op)
            n = t.numel()
            algo = _raw.large_algo(self._handle) if n * t.element_size() >= _raw.LARGE_BYTES else 0
            _allreduce(self._handle, t.data_ptr(), out.data_ptr(), n, _CODE[t.dtype], op, algo)
            return out
        if _is_compiling():
            return torch.ops.mpiad.allreduce(t, self._handle, op)
        if _needs_grad(t):
            return F.Allreduce.apply(t, self._handle, self._rank, self._size, op)
        return _raw.allreduce(self._handle, t, op)

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
        t = _raw.check_tensor(tensor)
        root = _raw.check_rank(root, "root", self._size)
        if _is_compiling():
            return torch.ops.mpiad.bcast(t, self._handle, root)
        if _needs_grad(t):
            out = F.Bcast.apply(t, self._handle, self._rank, root)
            if t.grad_fn is not None:
                F.NoInplaceReuse.apply(t, "Bcast_")
            return out
        _raw.bcast_into(self._handle, t, root)
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
        t = _raw.check_tensor(tensor)
        op = _check_op(op, t)
        root = _raw.check_rank(root, "root", self._size)
        if _is_compiling():
            return torch.ops.mpiad.reduce(t, self._handle, op, root)
        if _needs_grad(t):
            out = F.Reduce.apply(t, self._handle, self._rank, self._size, op, root)
            if t.grad_fn is not None:
                F.NoInplaceReuse.apply(t, "Reduce_")
            return out
        _raw.reduce_into(self._handle, t, op, root, self._rank)
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
        t = _raw.check_tensor(tensor)
        op = _check_op(op, t)
        if op in (MPI_MINLOC, MPI_MAXLOC):
            raise MpiadTypeError("Reduce_scatter does not support MPI_MINLOC / MPI_MAXLOC")
        axis = _raw.check_axis(scatteraxis, "scatteraxis", t.dim())
        if numelem is None:
            if t.shape[axis] % self._size:
                raise MpiadValueError(
                    f"Reduce_scatter: size {t.shape[axis]} along axis {axis} does not divide by {self._size} ranks; "
                    f"pass numelem"
                )
            numelem = t.shape[axis] // self._size
        numelem = _raw.check_int(numelem, "numelem")
        if numelem < 0:
            raise MpiadValueError(f"numelem must be >= 0, got {numelem}")
        if _is_compiling():
            return torch.ops.mpiad.reduce_scatter(t, self._handle, op, axis, numelem)
        if _needs_grad(t):
            return F.ReduceScatter.apply(t, self._handle, op, axis, numelem)
        return _raw.reduce_scatter(self._handle, t, op, axis, numelem)

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
        t = _raw.check_tensor(tensor)
        axis = _raw.check_axis(gatheraxis, "gatheraxis", t.dim())
        root = _raw.check_rank(root, "root", self._size)
        if _is_compiling():
            return torch.ops.mpiad.gather(t, self._handle, axis, root)
        if _needs_grad(t):
            return F.Gather.apply(t, self._handle, self._rank, self._size, axis, root)
        return _raw.gather(self._handle, t, axis, root, self._rank, self._size)

    def Allgather(self, tensor: Tensor, gatheraxis: int) -> Tensor:
        """Concatenate every rank's ``tensor`` along ``gatheraxis`` on every rank.

        Raises
        ------
        TypeError, ValueError
            Bad tensor or axis (locally); mismatching shapes/dtypes (on every rank).
        """
        t = _raw.check_tensor(tensor)
        axis = _raw.check_axis(gatheraxis, "gatheraxis", t.dim())
        if _is_compiling():
            return torch.ops.mpiad.allgather(t, self._handle, axis)
        if _needs_grad(t):
            return F.Allgather.apply(t, self._handle, axis)
        return _raw.allgather(self._handle, t, axis)

    def Scatter(self, tensor: Tensor, scatteraxis: int, numelem: int, root: int) -> Tensor:
        """Split root's ``tensor`` along ``scatteraxis``; each rank receives its ``numelem`` slices.

        On non-root ranks ``tensor`` only supplies dtype and device. The ranks'
        ``numelem`` must add up to root's size along ``scatteraxis``.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, axis, root or numelem; ``numelem`` not adding up (on every rank).
        """
        t = _raw.check_tensor(tensor)
        # range-checked after the size exchange, against root's tensor, on every rank
        axis = _raw.check_int(scatteraxis, "scatteraxis")
        numelem = _raw.check_int(numelem, "numelem")
        if numelem < 0:
            raise MpiadValueError(f"numelem must be >= 0, got {numelem}")
        root = _raw.check_rank(root, "root", self._size)
        if _is_compiling():
            return torch.ops.mpiad.scatter(t, self._handle, axis, numelem, root)
        if _needs_grad(t):
            return F.Scatter.apply(t, self._handle, self._rank, axis, numelem, root)
        return _raw.scatter(self._handle, t, axis, numelem, root, self._rank)

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
        t = _raw.check_tensor(tensor)
        gaxis = _raw.check_axis(gatheraxis, "gatheraxis", t.dim())
        saxis = _raw.check_axis(scatteraxis, "scatteraxis", t.dim())
        numelem = _raw.check_int(numelem, "numelem")
        if numelem < 0:
            raise MpiadValueError(f"numelem must be >= 0, got {numelem}")
        if _is_compiling():
            return torch.ops.mpiad.alltoall(t, self._handle, gaxis, saxis, numelem)
        if _needs_grad(t):
            return F.Alltoall.apply(t, self._handle, gaxis, saxis, numelem)
        return _raw.alltoall(self._handle, t, gaxis, saxis, numelem)

    # ------------------------------------------------------- point to point
    def Isend(self, tensor: Tensor, dest: int, tag: int) -> WaitHandle:
        """Start sending ``tensor`` to ``dest``; complete with :meth:`Wait`.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, ``dest`` out of range, bad tag.
        """
        t = _raw.check_tensor(tensor)
        dest = _raw.check_rank(dest, "dest", self._size)
        tag = _raw.check_tag(tag, "tag", self._tag_ub)
        return _p2p.isend(self._handle, t, dest, tag)

    def Irecv(self, tensor: Tensor, source: int, tag: int) -> WaitHandle:
        """Start receiving into a tensor shaped like ``tensor`` from ``source``; :meth:`Wait` returns it.

        Raises
        ------
        TypeError, ValueError
            Bad tensor, ``source`` out of range, bad tag.
        """
        t = _raw.check_tensor(tensor)
        source = _raw.check_rank(source, "source", self._size)
        tag = _raw.check_tag(tag, "tag", self._tag_ub)
        return _p2p.irecv(self._handle, t, source, tag)

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
        return _p2p.wait(waithandle)

    def Send(self, tensor: Tensor, dest: int, tag: int) -> Tensor:
        """Blocking send (``Wait(Isend(...))``); returns ``tensor``.

        Raises
        ------
        TypeError, ValueError
            As :meth:`Isend`.
        """
        return self.Wait(self.Isend(tensor, dest, tag))

    def Recv(self, tensor: Tensor, source: int, tag: int) -> Tensor:
        """Blocking receive (``Wait(Irecv(...))``); returns the received tensor.

        Raises
        ------
        TypeError, ValueError
            As :meth:`Irecv`.
        """
        return self.Wait(self.Irecv(tensor, source, tag))

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
        t = _raw.check_tensor(tensor)
        like = t if recvtensor is None else _raw.check_tensor(recvtensor, "recvtensor")
        dest = _raw.check_rank(dest, "dest", self._size)
        source = dest if source is None else _raw.check_rank(source, "source", self._size)
        sendtag = _raw.check_tag(sendtag, "sendtag", self._tag_ub)
        recvtag = sendtag if recvtag is None else _raw.check_tag(recvtag, "recvtag", self._tag_ub)
        if _needs_grad(t) or _needs_grad(like):
            return F.Sendrecv.apply(t, like, self._handle, dest, sendtag, source, recvtag)
        return _raw.sendrecv(self._handle, t, dest, sendtag, like, source, recvtag)

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


def JoinDummies(loopthrough: Tensor, dummies: list[Tensor]) -> Tensor:
    """Return ``loopthrough`` unchanged, but make autograd see a dependency on ``dummies``.

    The dummies receive zero gradients (after ``loopthrough``'s gradient is known),
    which orders communication in the backward pass.

    Raises
    ------
    TypeError
        ``loopthrough`` or an entry of ``dummies`` is not a tensor.
    """
    if not isinstance(loopthrough, torch.Tensor):
        raise MpiadTypeError(f"JoinDummies: loopthrough must be a torch.Tensor, got {type(loopthrough).__name__}")
    ds = list(dummies) if isinstance(dummies, (list, tuple)) else None
    if ds is None:
        raise MpiadTypeError(f"JoinDummies: dummies must be a list of tensors, got {type(dummies).__name__}")
    for i, d in enumerate(ds):
        if not isinstance(d, torch.Tensor):
            raise MpiadTypeError(
                f"JoinDummies: dummies[{i}] must be a torch.Tensor, got {type(d).__name__} (pass handle.dummy for handles)"
            )
    if _is_compiling():
        return torch.ops.mpiad.join_dummies(loopthrough, ds)
    if torch.is_grad_enabled() and any(d.requires_grad for d in ds):
        return F.JoinDummies.apply(loopthrough, *ds)
    return loopthrough


def JoinDummiesHandle(handle: WaitHandle, dummies: list[Tensor]) -> WaitHandle:
    """:func:`JoinDummies` for a :class:`WaitHandle` as first argument.

    Raises
    ------
    TypeError
        Not a handle, or bad dummies.
    """
    return _p2p.join_dummies_handle(handle, dummies)
