"""Communicators: rendezvous through ``torch.distributed`` (TCPStore + a private gloo group)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distkit_common.collective import agree, allgather_json
from distkit_common.validate import check_int, check_rank

from . import _devmem, _gpu, _lib, _peers
from ._node import NodeInfo, advertised_host, local_node
from ._wholemem import random_token

#: process-group backends a communicator can use for GPU-resident NCCL tensors
DEVICE_BACKENDS = ("nccl", "gloo")

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)


@dataclass(frozen=True)
class UniqueId:
    """Where to meet: the rendezvous store's address plus a 128-bit random token.

    Picklable; broadcast it to every rank by any channel (MPI, a file, ...).

    Parameters
    ----------
    host : str
        Address of the rank that runs the store.
    port : int
        The store's port.
    token : str
        32 hex digits, the prefix of the communicator's keys.
    """

    host: str
    port: int
    token: str

    def __repr__(self) -> str:
        return f"UniqueId(host={self.host!r}, port={self.port}, token=<{len(self.token) * 4} bits>)"


def get_unique_id(timeout: datetime.timedelta = _DEFAULT_TIMEOUT) -> UniqueId:
    """Start a rendezvous store in this process and return its id (call on one rank).

    Parameters
    ----------
    timeout : datetime.timedelta
        How long store operations wait for peers.

    Returns
    -------
    UniqueId
        Pass it to :func:`create_communicator` on every rank. Its host is this
        machine's address that the other ranks can reach (``$WHOLEMEM_HOST`` overrides;
        see the README's "Running on a cluster").

    Raises
    ------
    TypeError
        ``timeout`` is not a ``datetime.timedelta``.
    ValueError
        ``timeout`` is not positive.
    RuntimeError
        If the library is not initialised.
    """
    _lib.require_init("get_unique_id")
    check_timeout(timeout)
    server = dist.TCPStore("0.0.0.0", 0, None, True, timeout=timeout, wait_for_workers=False)
    uid = UniqueId(advertised_host(), int(server.port), random_token(16))
    _lib.servers[uid.token] = server
    return uid


def check_timeout(timeout: Any) -> None:
    """Raise unless ``timeout`` is a positive ``datetime.timedelta``.

    Raises
    ------
    TypeError
        Not a timedelta.
    ValueError
        Zero or negative.
    """
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")


def _pg_timeout(pg: Any) -> datetime.timedelta:
    """The collective timeout of a process group (wholemem's default when torch does not say)."""
    try:
        t = pg._get_backend(torch.device("cpu")).options._timeout
        if isinstance(t, datetime.timedelta):
            return t
    except (AttributeError, RuntimeError):
        pass
    return _DEFAULT_TIMEOUT


class WholeMemoryCommunicator:
    """A group of ranks that create and share wholemem tensors (pylibwholegraph's name).

    Parameters
    ----------
    pg : ProcessGroup
        The gloo process group of its ranks.
    store : Store, optional
        The rendezvous store (None when it wraps an existing process group).
    token : str, optional
        The rendezvous id's random prefix.
    timeout : datetime.timedelta, optional
        Collective timeout; the group's own when None.
    device_backend : {"nccl", "gloo"}
        How GPU-resident tensors are exchanged (see :func:`create_communicator`).
    device_group : ProcessGroup, optional
        A given group for GPU-resident tensors.
    server_key : str, optional
        Key of the rendezvous server its store lives on.

    Attributes
    ----------
    rank, size : int
        This process's rank and the number of ranks.
    local_rank, local_size : int
        Rank among, and number of, the ranks on this node (shared memory peers).
    node_ranks : list of int
        Ranks of this communicator on this node, ascending.
    num_nodes : int
        Number of distinct nodes in the group.
    hosts : list of str
        The host name of every rank, in rank order.

    Two ranks are on one node when they have the same host name, boot id and
    ``/dev/shm`` (see :func:`get_local_node_communicator` for the ranks of this node).

    Made by :func:`create_communicator`, :func:`communicator_from_process_group`,
    :func:`communicator_from_mpi4py` or the group functions
    (:func:`get_global_communicator`, :func:`split_communicator`, ...); not constructed directly.
    """

    def __init__(
        self,
        pg: Any,
        *,
        store: Any = None,
        token: str | None = None,
        timeout: datetime.timedelta | None = None,
        device_backend: str = "nccl",
        device_group: Any = None,
        server_key: str | None = None,
    ) -> None:
        self._pg = pg
        self._timeout: datetime.timedelta = timeout if timeout is not None else _pg_timeout(pg)
        self._token = token
        self._store = store
        self._destroyed = False
        self._device_backend = device_backend
        backend_name = "" if store is not None else str(dist.get_backend(pg)) if dist.is_initialized() else ""
        self._pg_has_cuda = "nccl" in backend_name  # e.g. init_process_group("cpu:gloo,cuda:nccl")
        #: group for GPU-resident NCCL tensors: given, made on first use, or the gloo group itself
        self._dev_pg: Any = device_group
        self._gpu_chunks: weakref.WeakSet[Any] = weakref.WeakSet()  # closed by destroy / finalize_lib
        #: key of the rendezvous server (in ``_lib.servers``) this communicator's store lives on
        self._server_key: str | None = server_key if server_key is not None else token
        #: a store for split_communicator when the communicator wraps a process group (made on first use)
        self._split_store: Any = None
        #: the communicator of this node's ranks (made by get_local_node_communicator)
        self._node_comm: WholeMemoryCommunicator | None = None
        self.rank: int = int(pg.rank())
        self.size: int = int(pg.size())
        # the first collective: every rank learns where every other one runs
        self._nodes: list[NodeInfo] = [NodeInfo.from_json(x) for x in allgather_json(local_node().to_json(), self)]
        keys = [n.key for n in self._nodes]
        self.node_ranks: list[int] = [r for r, k in enumerate(keys) if k == keys[self.rank]]
        self.local_rank: int = self.node_ranks.index(self.rank)
        self.local_size: int = len(self.node_ranks)
        self.num_nodes: int = len(set(keys))
        self.hosts: list[str] = [n.label for n in self._nodes]
        _lib.communicators.add(self)

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "live"
        return (
            f"WholeMemoryCommunicator(rank={self.rank}, size={self.size}, local_size={self.local_size}, "
            f"num_nodes={self.num_nodes}, {state})"
        )

    def node_groups(self) -> list[list[int]]:
        """List the ranks of every node, nodes ordered by their lowest rank.

        Returns
        -------
        list of list of int
            The ranks of each node, ascending.
        """
        groups: dict[str, list[int]] = {}
        for r, n in enumerate(self._nodes):
            groups.setdefault(n.key, []).append(r)
        return list(groups.values())

    def describe_nodes(self) -> str:
        """Describe where the ranks run, for error messages.

        Returns
        -------
        str
            ``"dkh1 (ranks 0, 1), dkh2 (ranks 2, 3)"``.
        """
        return _peers.hosts_of(self._nodes)

    # -- communicators made from this one -----------------------------------------
    def split(self, color: int, key: int = 0) -> WholeMemoryCommunicator | None:
        """Return the communicator of the ranks that pass the same ``color`` (collective).

        pylibwholegraph's ``split_communicator``; see :func:`wholemem.split_communicator`.

        Every rank of this communicator must call it. Ranks are ordered by ``key``, ties
        by their rank here; a negative ``color`` takes part and gets ``None``.

        Parameters
        ----------
        color : int
            Group of this rank; negative: none.
        key : int
            Orders the ranks in the new communicator.

        Returns
        -------
        WholeMemoryCommunicator or None
            This rank's new communicator, or None for a negative ``color``.

        Raises
        ------
        TypeError
            ``color`` or ``key`` is not an int (on every rank).
        RuntimeError
            The communicator was destroyed, or a peer failed.
        """
        self.check_alive("split_communicator")
        err: BaseException | None = None
        for name, v in (("color", color), ("key", key)):
            if err is None and (isinstance(v, bool) or not isinstance(v, int)):
                err = TypeError(f"{name} must be an int, got {type(v).__name__}")
        agree(self, "split_communicator", err)  # a bad argument on one rank raises on every rank
        store, server_key = self._rendezvous_store()
        everyone = allgather_json([int(color), int(key), random_token(16)], self)
        if color < 0:
            return None
        members = sorted((r for r, e in enumerate(everyone) if e[0] == color), key=lambda r: (everyone[r][1], r))
        token = str(everyone[members[0]][2])  # the group's first rank names it: unique, and the same for all
        prefixed = dist.PrefixStore(f"wholemem/{token}", store)
        pg = dist.ProcessGroupGloo(prefixed, members.index(self.rank), len(members), self._timeout)
        return WholeMemoryCommunicator(
            pg,
            store=store,
            token=token,
            timeout=self._timeout,
            device_backend=self._children_device_backend(),
            server_key=server_key,
        )

    def node_communicator(self) -> WholeMemoryCommunicator:
        """Return the communicator of this communicator's ranks on this node (collective on first use).

        This communicator itself when it has one node; the same object afterwards.

        Returns
        -------
        WholeMemoryCommunicator
            The ranks of this node.

        Raises
        ------
        RuntimeError
            The communicator was destroyed, or a peer failed.
        """
        self.check_alive("get_local_node_communicator")
        if self.num_nodes == 1:
            return self
        if self._node_comm is None or self._node_comm._destroyed:
            color = next(i for i, ranks in enumerate(self.node_groups()) if self.rank in ranks)
            child = self.split(color, self.rank)
            assert child is not None
            self._node_comm = child
        return self._node_comm

    def _rendezvous_store(self) -> tuple[Any, str | None]:
        """Collective on first use: the store that groups split from this one meet in,
        and the key of its server. A communicator made from a unique id has one; one
        wrapping a process group gets a store started on its rank 0. The server stays
        up until ``finalize_lib`` (children may outlive this communicator)."""
        if self._store is not None:
            if self._server_key is not None:
                _lib.pinned_servers.add(self._server_key)
            return self._store, self._server_key
        if self._split_store is None:
            timeout = self._timeout
            uid = get_unique_id(timeout) if self.rank == 0 else None
            where = allgather_json(dataclasses.asdict(uid) if uid is not None else None, self)[0]
            assert isinstance(where, dict)
            token = str(where["token"])
            server = _lib.servers.get(token)
            if server is None:
                server = dist.TCPStore(str(where["host"]), int(where["port"]), None, False, timeout=timeout)
            store = server
            _lib.pinned_servers.add(token)
            self._split_store = (store, token)
        store, token = self._split_store
        return store, token

    def _children_device_backend(self) -> str:
        """How communicators split from this one move GPU tensors: over gloo when this one
        does (ranks sharing a GPU), else NCCL."""
        if self._device_backend == "gloo":
            return "gloo"
        if self._dev_pg is not None and "nccl" not in str(dist.get_backend(self._dev_pg)):
            return "gloo"
        return "nccl"

    def _wait(self, what: str, start: Any) -> None:
        """Run a process-group call (``start()`` returns its work) and wait for it; a
        failure becomes a ``RuntimeError`` that names the peer host it lost, if any."""
        try:
            start().wait()
        except RuntimeError as e:  # gloo / NCCL errors (DistBackendError, ...) are RuntimeErrors
            timeout = self._timeout.total_seconds()
            raise RuntimeError(_peers.describe_failure(what, self.rank, self._nodes, timeout, e)) from e

    # -- lifecycle -----------------------------------------------------------------
    @property
    def destroyed(self) -> bool:
        """Tell whether :meth:`destroy` or :func:`finalize_lib` ended this communicator.

        Returns
        -------
        bool
            True after :meth:`destroy` or :func:`finalize_lib`.
        """
        return self._destroyed

    def check_alive(self, what: str = "operation") -> None:
        """Raise ``RuntimeError`` if this communicator (or the library) is gone.

        Parameters
        ----------
        what : str
            The operation, named in the message.

        Raises
        ------
        RuntimeError
            After :meth:`destroy` or :func:`finalize_lib`.
        """
        if self._destroyed:
            if _lib.state["finalized"]:
                raise RuntimeError(f"wholemem {what}: the library was finalized (finalize_lib)")
            raise RuntimeError(f"wholemem {what}: the communicator was destroyed")

    def close_locally(self) -> None:
        """Mark this communicator destroyed without talking to the others (``finalize_lib``).

        Not collective: unmaps the peers' GPU chunks and drops this rank's holds; own
        chunks are freed once every rank dropped its hold, at process exit at the latest.
        """
        for g in list(self._gpu_chunks):
            try:
                g.close()
            except Exception:  # best effort while tearing down
                pass
        self._gpu_chunks = weakref.WeakSet()
        self._destroyed = True
        self._pg = None
        self._dev_pg = None
        self._store = None
        self._split_store = None
        self._node_comm = None

    def register_gpu_chunks(self, chunks: Any) -> None:
        """Close ``chunks`` (a GPU CHUNKED / DEVICE allocation) at :meth:`destroy` if it is still alive.

        Parameters
        ----------
        chunks : NodeChunks
            The allocation (held weakly).
        """
        self._gpu_chunks.add(chunks)

    def barrier(self) -> None:
        """Block until every rank of the group has called ``barrier``.

        This rank's GPU work (wholemem kernels and torch work on every device wholemem
        used in this process) completes first, so GPU writes are visible to the other
        ranks after the barrier, as host writes are.

        Raises
        ------
        RuntimeError
            If the communicator was destroyed.
        """
        self.check_alive("barrier")
        _gpu.synchronize_used()
        # an allreduce doubles as a barrier and works on every backend
        t = torch.zeros(1)
        self._wait("barrier", lambda: self._pg.allreduce([t]))
        _devmem.collect_limbo()  # chunks every rank has released can go now

    def destroy(self) -> None:
        """Collective: wait for every rank, then release the group (idempotent).

        GPU CHUNKED / DEVICE tensors of this communicator that are still alive become
        unusable: every rank unmaps the peers' chunks, then (after a barrier) frees its own
        chunk once no local view of it is alive.

        Raises
        ------
        RuntimeError
            A CUDA error while unmapping (after the group was released).
        """
        if self._destroyed:
            return
        errors = []
        for g in list(self._gpu_chunks):
            try:
                g.close()
            except Exception as e:  # still take part in the barrier
                errors.append(e)
        self.barrier()  # every peer has unmapped this rank's chunks: they are freed here
        if self._dev_pg is not None and self._dev_pg is not self._pg and hasattr(self._dev_pg, "shutdown"):
            self._dev_pg.shutdown()
        self.close_locally()
        _lib.communicators.discard(self)
        if self._server_key is not None and self._server_key not in _lib.pinned_servers:
            _lib.servers.pop(self._server_key, None)  # every rank is connected: the store is no longer needed
        if errors:
            raise RuntimeError(f"wholemem WholeMemoryCommunicator.destroy: unmapping GPU chunks failed: {errors[0]}")

    # -- process group for GPU-resident tensors ------------------------------------
    def device_group_problem(self, device: torch.device) -> str | None:
        """Tell why collectives on ``device`` tensors are impossible.

        Checked before any collective; the answer is the same on every rank.

        Parameters
        ----------
        device : torch.device
            A CUDA device.

        Returns
        -------
        str or None
            The reason, or None when they are possible.
        """
        if device.type != "cuda" or self._dev_pg is not None or self._pg_has_cuda:
            return None
        if self._device_backend == "gloo":
            return None
        if self._store is None:
            return (
                "this communicator wraps a process group without a CUDA backend; use a group made with "
                "backend='cpu:gloo,cuda:nccl', pass device_group=, or use create_communicator"
            )
        if not dist.is_nccl_available():
            return "this torch build has no NCCL"
        return None

    def ensure_device_group(self, device: torch.device) -> None:
        """Make the group used for ``device`` tensors (collective on the first call).

        NCCL (bound to this rank's GPU, ``device``) unless the communicator was made with
        ``device_backend='gloo'`` (several ranks sharing one GPU, which NCCL refuses).

        Parameters
        ----------
        device : torch.device
            This rank's GPU.

        Raises
        ------
        RuntimeError
            The communicator was destroyed, or the group cannot be made.
        """
        self.check_alive("create_wm_tensor")
        if device.type != "cuda" or self._dev_pg is not None:
            return
        if self._pg_has_cuda or self._device_backend == "gloo":
            self._dev_pg = self._pg  # gloo moves CUDA tensors through host memory
            return
        store = dist.PrefixStore(f"wholemem/{self._token}/nccl", self._store)  # pragma: no cover - needs GPUs
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = self._timeout
        pg = dist.ProcessGroupNCCL(store, self.rank, self.size, opts)
        # bind the group to this rank's GPU now (collective): NCCL otherwise guesses the
        # device from the rank number on the first collective
        connect = getattr(pg, "eager_connect_single_device", None)
        if connect is not None:
            connect(device)
        self._dev_pg = pg

    def _group_for(self, t: torch.Tensor) -> Any:
        if t.device.type == "cpu":
            return self._pg
        if self._dev_pg is None:
            raise RuntimeError(f"wholemem: no process group for {t.device} tensors on this communicator")
        return self._dev_pg

    # -- collectives used by the tensor types ---------------------------------------
    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Gather every rank's ``data``, in rank order (collective; nothing is deserialised here).

        Parameters
        ----------
        data : bytes
            This rank's contribution.

        Returns
        -------
        list of bytes
            Rank ``r``'s ``data`` at position ``r``.

        Raises
        ------
        RuntimeError
            The communicator was destroyed, or the collective failed.
        """
        self.check_alive("allgather")
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        n = torch.tensor([buf.numel()], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._wait("allgather", lambda: self._pg.allgather([sizes], [n]))
        width = max(max(int(s) for s in sizes), 1)
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: buf.numel()] = buf
        outs = [torch.empty(width, dtype=torch.uint8) for _ in range(self.size)]
        self._wait("allgather", lambda: self._pg.allgather([outs], [padded]))
        return [o[: int(s)].numpy().tobytes() for o, s in zip(outs, sizes)]

    def all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        """Exchange rows of ``send`` (grouped by destination) and return the received rows (collective).

        Parameters
        ----------
        send : torch.Tensor
            Rows for rank 0 first, then rank 1, ...
        send_counts : list of int
            Rows of ``send`` for each rank.
        recv_counts : list of int
            Rows to receive from each rank.

        Returns
        -------
        torch.Tensor
            ``sum(recv_counts)`` rows, rank 0's first.

        Raises
        ------
        RuntimeError
            The communicator was destroyed, or the collective failed.
        """
        self.check_alive("all_to_all")
        recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
        group, data = self._group_for(send), send.contiguous()
        self._wait("all_to_all", lambda: group.alltoall_base(recv, data, recv_counts, send_counts))
        return recv

    def exchange_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """Send ``send_counts[r]`` to rank ``r`` and return what every rank sent here (collective).

        Parameters
        ----------
        send_counts : torch.Tensor
            One count per rank.

        Returns
        -------
        torch.Tensor
            ``recv[r]``: the count rank ``r`` sent to this rank.

        Raises
        ------
        RuntimeError
            The communicator was destroyed, or the collective failed.
        """
        self.check_alive("all_to_all")
        recv = torch.empty_like(send_counts)
        group, data = self._group_for(send_counts), send_counts.contiguous()
        self._wait("all_to_all", lambda: group.alltoall_base(recv, data, [], []))
        return recv


def create_communicator(
    size: int,
    unique_id: UniqueId,
    rank: int,
    *,
    timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
    device_backend: str = "nccl",
) -> WholeMemoryCommunicator:
    """Build a communicator of ``size`` ranks from a :class:`UniqueId` (collective).

    pylibwholegraph's ``create_communicator(size, unique_id, rank)``.

    Connects to the id's TCPStore and builds a private gloo process group under the
    id's random prefix, so it never clashes with the default process group.

    Parameters
    ----------
    size : int
        Number of ranks.
    unique_id : UniqueId
        From :func:`get_unique_id` on one rank.
    rank : int
        This process's rank in ``[0, size)``.
    timeout : datetime.timedelta
        Collective timeout of the group.
    device_backend : {"nccl", "gloo"}
        The all-to-all of GPU-resident NCCL tensors and GPU Embeddings: ``"nccl"`` (a
        NCCL group made on first use, bound to this rank's GPU), or ``"gloo"`` (the
        communicator's own group, which moves CUDA tensors through host memory: slower,
        but it works when several ranks share one GPU, which NCCL refuses).

    Returns
    -------
    WholeMemoryCommunicator
        The new communicator.

    Raises
    ------
    TypeError
        ``unique_id`` is not a :class:`UniqueId`, size / rank are not ints, or ``timeout``
        is not a ``datetime.timedelta``.
    ValueError
        ``size < 1``, ``rank`` outside ``[0, size)``, an unknown ``device_backend``, or a
        timeout that is not positive.
    RuntimeError
        Library not initialised, or the rendezvous failed / timed out.

    Examples
    --------
    >>> import dataclasses, wholemem as wg                        # doctest: +SKIP
    >>> from distkit_common.collective import bcast_json
    >>> wg.init_lib()
    >>> uid = dataclasses.asdict(wg.get_unique_id()) if rank == 0 else None
    >>> uid = wg.UniqueId(**bcast_json(uid, mpi_comm))          # any way to send it
    >>> comm = wg.create_communicator(size, uid, rank)
    >>> comm.rank, comm.size
    (0, 4)
    """
    _lib.require_init("create_communicator")
    size = check_int(size, "size", lo=1)
    rank = check_rank(rank, "rank", size)
    if not isinstance(unique_id, UniqueId):
        raise TypeError(f"unique_id must be a wholemem.UniqueId (from get_unique_id()), got {type(unique_id).__name__}")
    if device_backend not in DEVICE_BACKENDS:
        raise ValueError(f"device_backend must be one of {DEVICE_BACKENDS}, got {device_backend!r}")
    check_timeout(timeout)
    server = _lib.servers.get(unique_id.token)
    if server is not None:
        store = server
    else:
        store = dist.TCPStore(unique_id.host, unique_id.port, None, False, timeout=timeout)
    prefixed = dist.PrefixStore(f"wholemem/{unique_id.token}", store)
    pg = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    return WholeMemoryCommunicator(
        pg, store=store, token=unique_id.token, timeout=timeout, device_backend=device_backend
    )


def communicator_from_process_group(pg: Any = None, *, device_group: Any = None) -> WholeMemoryCommunicator:
    """Build a communicator over an existing ``torch.distributed`` process group (collective).

    Parameters
    ----------
    pg : ProcessGroup, optional
        A group whose backend handles CPU tensors (gloo); default: the world group.
    device_group : ProcessGroup, optional
        The group for the all-to-all of GPU-resident NCCL tensors and GPU Embeddings
        (same ranks as ``pg``). Default: ``pg`` when its backend includes NCCL (e.g.
        ``"cpu:gloo,cuda:nccl"``); a gloo group also works (through host memory).

    Returns
    -------
    WholeMemoryCommunicator
        The new communicator.

    Raises
    ------
    RuntimeError
        ``torch.distributed`` is not initialised, or the library is not.
    ValueError
        The group has no CPU (gloo) backend.
    """
    _lib.require_init("communicator_from_process_group")
    if not dist.is_initialized():
        raise RuntimeError("communicator_from_process_group: torch.distributed is not initialized")
    if pg is None:
        pg = dist.group.WORLD
    if not isinstance(pg, dist.ProcessGroup):
        raise TypeError(f"pg must be a torch.distributed.ProcessGroup, got {type(pg).__name__}")
    backend = str(dist.get_backend(pg))
    if "gloo" not in backend and "mpi" not in backend:
        raise ValueError(f"communicator_from_process_group needs a group with a CPU backend (gloo), got {backend!r}")
    if device_group is not None:
        if not isinstance(device_group, dist.ProcessGroup):
            raise TypeError(f"device_group must be a torch.distributed.ProcessGroup, got {type(device_group).__name__}")
        if device_group.size() != pg.size() or device_group.rank() != pg.rank():
            raise ValueError("device_group must have the same ranks as pg")
    return WholeMemoryCommunicator(pg, device_group=device_group)


def communicator_from_mpi4py(comm: Any, *, timeout: datetime.timedelta = _DEFAULT_TIMEOUT) -> WholeMemoryCommunicator:
    """Build a communicator with the ranks of an mpi4py communicator (collective).

    Rank 0 of ``comm`` creates the unique id and broadcasts it over MPI.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        An intra-communicator (e.g. ``MPI.COMM_WORLD``).
    timeout : datetime.timedelta
        Collective timeout of the group (as :func:`create_communicator`).

    Returns
    -------
    WholeMemoryCommunicator
        The new communicator.

    Raises
    ------
    TypeError
        ``comm`` is not an mpi4py communicator, or ``timeout`` not a ``datetime.timedelta``.
    ValueError
        ``timeout`` is not positive.
    RuntimeError
        The library is not initialised, or the rendezvous failed / timed out.
    """
    _lib.require_init("communicator_from_mpi4py")
    check_timeout(timeout)
    if not all(hasattr(comm, a) for a in ("Get_rank", "Get_size", "Bcast")):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    rank, size = comm.Get_rank(), comm.Get_size()
    uid = get_unique_id(timeout) if rank == 0 else None
    # the id travels as JSON in a byte buffer (nothing received is unpickled)
    data = json.dumps(dataclasses.asdict(uid) if uid is not None else None).encode()
    n = np.array([len(data)], dtype=np.int64)
    comm.Bcast(n, root=0)
    buf = np.frombuffer(data, dtype=np.uint8).copy() if rank == 0 else np.empty(int(n[0]), dtype=np.uint8)
    comm.Bcast(buf, root=0)
    fields = json.loads(buf.tobytes())
    uid = UniqueId(str(fields["host"]), int(fields["port"]), str(fields["token"]))
    return create_communicator(size, uid, rank, timeout=timeout)
