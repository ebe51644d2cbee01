"""One rank's failure becomes every rank's: small collective agreements.

A collective step (allocating a shared tensor, writing a checkpoint, loading a
server's state) can fail on one rank only: a full disk, a bad argument on one
rank, an allocation. If that rank raised alone, the others would wait in the
next collective forever. The pattern (DCP's ``_DistWrapper`` /
``CheckpointException``) is: every rank runs its part, then all ranks exchange
"ok" or "failed: <type>: <message>", and every rank raises if any failed.

Here that exchange is :func:`agree` (or the :func:`all_ranks` block around a
step). The failing rank re-raises its own exception; every other rank raises a
:class:`CollectiveError` naming the step, the rank and its error, which is also
an instance of the failing rank's builtin exception type (a ``ValueError`` on
rank 1 is a ``ValueError`` everywhere), so ``except ValueError`` behaves the same
on every rank.

Everything exchanged is JSON over byte buffers: nothing received from a peer is
unpickled.

Groups: ``None`` (torch's default process group if initialised, else this
process alone), an ``mpi4py`` communicator, a ``torch.distributed``
``ProcessGroup``, or any object with ``rank``, ``size`` and
``allgather_bytes(data: bytes) -> list[bytes]`` (see :class:`Group`).
"""

from __future__ import annotations

import builtins
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Group(Protocol):
    """What the agreements need from a group of processes.

    Any object with ``rank`` and ``size`` (ints) and a collective
    ``allgather_bytes(data: bytes) -> list[bytes]`` is one; :func:`as_group`
    makes one from an mpi4py communicator or a torch ProcessGroup.

    Parameters
    ----------
    *args, **kwargs
        A Protocol is never instantiated; classes that satisfy it take their own arguments.
    """

    @property
    def rank(self) -> int:
        """Return this process's rank in the group, in ``[0, size)``.

        Returns
        -------
        int
            The rank.
        """
        ...

    @property
    def size(self) -> int:
        """Return the number of processes in the group.

        Returns
        -------
        int
            The size.
        """
        ...

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Gather every rank's ``data``, in rank order (a collective call).

        Parameters
        ----------
        data : bytes
            This rank's contribution (any length; ranks may differ).

        Returns
        -------
        list of bytes
            ``size`` entries, entry ``r`` being rank ``r``'s ``data``.
        """
        ...


class _Single:
    """This process alone."""

    rank = 0
    size = 1

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [bytes(data)]


class MPIGroup:
    """An mpi4py communicator as a :class:`Group`, through buffer-based Allgather(v) (mpi4py's lowercase methods pickle).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator.
    wait : callable, optional
        When given, the gathers are nonblocking (``Iallgather(v)``) and
        ``wait(request)`` completes each one. A package whose own progress thread
        drives MPI traffic on the same ranks (kvps) passes a polling wait: a blocking
        collective can stall behind that thread's messages across hosts.
    """

    def __init__(self, comm: Any, wait: Callable[[Any], None] | None = None) -> None:
        self.comm = comm
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())
        self.wait = wait

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Gather every rank's ``data``, in rank order (a collective call).

        Parameters
        ----------
        data : bytes
            This rank's contribution (any length; ranks may differ).

        Returns
        -------
        list of bytes
            ``size`` entries, entry ``r`` being rank ``r``'s ``data``.
        """
        import numpy as np
        from mpi4py import MPI

        n = np.array([len(data)], dtype=np.int64)
        counts = np.empty(self.size, dtype=np.int64)
        self._allgather([n, MPI.INT64_T], [counts, MPI.INT64_T], vector=False)
        displs = np.zeros(self.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=displs[1:])
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        send = np.frombuffer(data, dtype=np.uint8) if data else np.empty(0, dtype=np.uint8)
        self._allgather([send, MPI.BYTE], [recv, (counts.tolist(), displs.tolist()), MPI.BYTE], vector=True)
        return [recv[d : d + c].tobytes() for d, c in zip(displs.tolist(), counts.tolist())]

    def _allgather(self, send: Any, recv: Any, *, vector: bool) -> None:
        if self.wait is None:
            (self.comm.Allgatherv if vector else self.comm.Allgather)(send, recv)
        else:
            self.wait((self.comm.Iallgatherv if vector else self.comm.Iallgather)(send, recv))


class _TorchGroup:
    """A torch.distributed process group (the default one for ``group=None``)."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        # NCCL moves only CUDA tensors; every other backend takes host tensors
        self.device = "cpu"
        if dist.get_backend(group) == "nccl":
            import torch

            self.device = f"cuda:{torch.cuda.current_device()}"

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        import torch
        import torch.distributed as dist

        n = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(n) for _ in range(self.size)]
        dist.all_gather(sizes, n, group=self.group)
        counts = [int(s) for s in sizes]
        width = max(max(counts), 1)
        buf = torch.zeros(width, dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        buf = buf.to(self.device)
        outs = [torch.empty_like(buf) for _ in range(self.size)]
        dist.all_gather(outs, buf, group=self.group)
        return [o[:c].cpu().numpy().tobytes() for o, c in zip(outs, counts)]


def as_group(comm: Any = None) -> Group:
    """Return the :class:`Group` for ``comm``.

    Parameters
    ----------
    comm : None, mpi4py communicator, torch ProcessGroup or Group
        ``None`` means torch's default process group when one is initialised,
        else this process alone.

    Returns
    -------
    Group
        ``comm`` itself when it already is one, else a wrapper.

    Raises
    ------
    TypeError
        For any other object.
    """
    if comm is None:
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch without distributed
            return _Single()
        if dist.is_available() and dist.is_initialized():
            return _TorchGroup(None)
        return _Single()
    if isinstance(comm, (_Single, MPIGroup, _TorchGroup)):
        return comm
    if type(comm).__module__.startswith("mpi4py"):
        return MPIGroup(comm)
    try:
        import torch.distributed as dist

        if dist.is_available() and isinstance(comm, dist.ProcessGroup):
            return _TorchGroup(comm)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(comm, Group):
        return comm
    raise TypeError(
        "comm must be None, an mpi4py communicator, a torch ProcessGroup or an object with rank, size and "
        f"allgather_bytes(); got {type(comm).__name__}"
    )


def allgather_json(obj: Any, comm: Any = None) -> list[Any]:
    """Gather every rank's JSON-serialisable ``obj``, in rank order (a collective call).

    Parameters
    ----------
    obj : object
        Dicts, lists, str, numbers, bool, None; tuples arrive as lists.
    comm : optional
        The group, as for :func:`as_group`.

    Returns
    -------
    list
        Rank ``r``'s ``obj`` at position ``r``, decoded from JSON (nothing is unpickled).

    Raises
    ------
    TypeError
        If ``obj`` is not JSON-serialisable (raised before any communication) or
        ``comm`` is no group.
    """
    group = as_group(comm)
    data = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()
    return [json.loads(b) for b in group.allgather_bytes(data)]


def bcast_json(obj: Any, comm: Any = None, root: int = 0) -> Any:
    """Send rank ``root``'s JSON-serialisable ``obj`` to every rank (a collective call).

    Parameters
    ----------
    obj : object
        On ``root``: the value (as for :func:`allgather_json`). Others pass anything; it is not sent.
    comm : optional
        The group, as for :func:`as_group`.
    root : int
        The rank whose ``obj`` is sent.

    Returns
    -------
    object
        Rank ``root``'s ``obj``, decoded from JSON, on every rank.

    Raises
    ------
    ValueError
        If ``root`` is not a rank of the group.
    TypeError
        If root's ``obj`` is not JSON-serialisable or ``comm`` is no group.
    """
    group = as_group(comm)
    if not 0 <= root < group.size:
        raise ValueError(f"root = {root} is out of range for a group of size {group.size}")
    data = json.dumps(obj, separators=(",", ":")).encode() if group.rank == root else b""
    return json.loads(group.allgather_bytes(data)[root])


@dataclass(frozen=True)
class RankFailure:
    """What one rank reported about its failure.

    Parameters
    ----------
    type : str
        Its exception's type name.
    builtin : str
        The nearest builtin exception type's name (``"ValueError"``, ``"OSError"``, ...).
    message : str
        The exception's message.
    """

    type: str
    builtin: str
    message: str

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


class CollectiveError(RuntimeError):
    """A collective step failed on another rank.

    Parameters
    ----------
    step : str
        What the ranks were doing (``"save"``, ``"create_wm_tensor"``, ...).
    failures : dict of int to RankFailure
        Every failing rank's report.

    Attributes
    ----------
    step : str
        What the ranks were doing.
    failures : dict of int to RankFailure
        Every failing rank's report.
    """

    def __init__(self, step: str, failures: dict[int, RankFailure]) -> None:
        self.step = step
        self.failures = dict(failures)
        first = min(self.failures)
        msg = f"{step} failed on rank {first}: {self.failures[first]}"
        others = sorted(self.failures)[1:]
        if others:
            msg += f" (and on rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})"
        super().__init__(msg)

    def __str__(self) -> str:  # not KeyError's repr-style message when mixed with KeyError
        return str(self.args[0])

    def __reduce__(self) -> Any:
        return (type(self), (self.step, self.failures))


_REMOTE_TYPES: dict[str, type[CollectiveError]] = {}


def _nearest_builtin(exc: BaseException) -> str:
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins" and issubclass(cls, Exception):
            return cls.__name__
    return "RuntimeError"


def _remote_type(builtin: str) -> type[CollectiveError]:
    """CollectiveError mixed with the builtin exception type a failing rank raised."""
    cls = _REMOTE_TYPES.get(builtin)
    if cls is None:
        base = getattr(builtins, builtin, None)
        if not (isinstance(base, type) and issubclass(base, Exception)) or base is RuntimeError:
            cls = CollectiveError
        else:
            try:
                cls = type(f"Collective{builtin}", (CollectiveError, base), {"__module__": __name__})
            except TypeError:  # a builtin whose layout cannot be combined
                cls = CollectiveError
        _REMOTE_TYPES[builtin] = cls
    return cls


def agree(comm: Any, step: str, error: BaseException | None = None) -> None:
    """Collective: raise on every rank if ``error`` is set on any rank.

    Every rank of ``comm`` must call it once for the step, passing the exception
    its own part raised (or ``None``).

    Parameters
    ----------
    comm : None, mpi4py communicator, torch ProcessGroup or Group
        The ranks that agree (see :func:`as_group`).
    step : str
        Names the step in messages.
    error : BaseException, optional
        This rank's failure.

    Raises
    ------
    BaseException
        ``error`` itself on a rank that failed (with a note naming the other
        failing ranks, if any).
    CollectiveError
        On every other rank, when any rank failed; also an instance of the first
        failing rank's builtin exception type.
    """
    mine = None
    if error is not None:
        mine = {"type": type(error).__name__, "builtin": _nearest_builtin(error), "message": str(error)}
    reports = allgather_json(mine, comm)
    failures = {r: RankFailure(**rep) for r, rep in enumerate(reports) if rep is not None}
    if not failures:
        return
    if error is not None:
        me = as_group(comm).rank
        others = [r for r in sorted(failures) if r != me]
        if others:
            error.add_note(f"{step} also failed on rank(s) {', '.join(map(str, others))}")
        raise error
    first = failures[min(failures)]
    raise _remote_type(first.builtin)(step, failures)


@contextlib.contextmanager
def all_ranks(comm: Any, step: str) -> Iterator[None]:
    """Run a block on every rank; if it raises on any rank, raise on all of them.

    Parameters
    ----------
    comm : None, mpi4py communicator, torch ProcessGroup or Group
        The ranks that run the block (as for :func:`as_group`).
    step : str
        What the block does, for messages (``"save"``).

    Yields
    ------
    None
        Once, for the ``with`` block.

    Raises
    ------
    Exception
        This rank's own exception, or a :class:`CollectiveError` (see :func:`agree`).

    Examples
    --------
    >>> with all_ranks(comm, "save"):          # doctest: +SKIP
    ...     write_my_shard(path)
    """
    try:
        yield
    except Exception as e:
        agree(comm, step, e)
        raise  # pragma: no cover - agree re-raises e
    agree(comm, step, None)


__all__ = [
    "CollectiveError",
    "Group",
    "MPIGroup",
    "RankFailure",
    "agree",
    "all_ranks",
    "allgather_json",
    "as_group",
    "bcast_json",
]
