"""Communicators: rendezvous through ``torch.distributed`` (TCPStore + a private gloo group)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distkit_common.collective import allgather_json
from distkit_common.validate import check_int, check_rank

from . import _devmem, _gpu, _lib
from ._wholemem import random_token

#: process-group backends a communicator can use for GPU-resident NCCL tensors
DEVICE_BACKENDS = ("nccl", "gloo")

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)


@dataclass(frozen=True)
class UniqueId:
    """Where to meet: the rendezvous store's address plus a 128-bit random token.

    Picklable; broadcast it to every rank by any channel (MPI, a file, ...).
    """

    host: str
    port: int
    token: str

    def __repr__(self) -> str:
        return f"UniqueId(host={self.host!r}, port={self.port}, token=<{len(self.token) * 4} bits>)"


def _advertised_host() -> str:
    for var in ("WHOLEMEM_HOST", "MASTER_ADDR"):
        if os.environ.get(var):
            return os.environ[var]
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        return "127.0.0.1"


def get_unique_id(timeout: datetime.timedelta = _DEFAULT_TIMEOUT) -> UniqueId:
    """Start a rendezvous store in this process and return its id (call on one rank).

    Parameters
    ----------
    timeout : datetime.timedelta
        How long store operations wait for peers.

    Returns
    -------
    UniqueId
        Pass it to :func:`create_communicator` on every rank.

    Raises
    ------
    RuntimeError
        If the library is not initialised.
    """
    _lib.require_init("get_unique_id")
    server = dist.TCPStore("0.0.0.0", 0, None, True, timeout=timeout, wait_for_workers=False)
    uid = UniqueId(_advertised_host(), int(server.port), random_token(16))
    _lib.servers[uid.token] = server
    return uid


def _node_key() -> str:
    # Testing hook: WHOLEMEM_NODE_ID makes ranks of one machine look like separate nodes
    # (shared-memory types must then refuse the communicator).
    override = os.environ.get("WHOLEMEM_NODE_ID")
    if override:
        return f"override/{override}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class Communicator:
    """A group of ranks that create and share wholemem tensors.

    Attributes
    ----------
    rank, size : int
        This process's rank and the number of ranks.
    local_rank, local_size : int
        Rank among, and number of, the ranks on this node (shared memory peers).
    node_ranks : list of int
        Global ranks on this node, ascending.
    num_nodes : int
        Number of distinct nodes in the group.
    """

    def __init__(
        self,
        pg: Any,
        *,
        store: Any = None,
        token: str | None = None,
        timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
        device_backend: str = "nccl",
        device_group: Any = None,
    ) -> None:
        self._pg = pg
        self._timeout = timeout
        self._token = token
        self._store = store
        self._destroyed = False
        self._device_backend = device_backend
        backend_name = "" if store is not None else str(dist.get_backend(pg)) if dist.is_initialized() else ""
        self._pg_has_cuda = "nccl" in backend_name  # e.g. init_process_group("cpu:gloo,cuda:nccl")
        #: group for GPU-resident NCCL tensors: given, made on first use, or the gloo group itself
        self._dev_pg: Any = device_group
        self._gpu_chunks: weakref.WeakSet[Any] = weakref.WeakSet()  # closed by destroy / finalize_lib
        self.rank: int = int(pg.rank())
        self.size: int = int(pg.size())
        keys: list[str] = allgather_json(_node_key(), self)
        self.node_ranks: list[int] = [r for r, k in enumerate(keys) if k == keys[self.rank]]
        self.local_rank: int = self.node_ranks.index(self.rank)
        self.local_size: int = len(self.node_ranks)
        self.num_nodes: int = len(set(keys))
        _lib.communicators.add(self)

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "live"
        return f"Communicator(rank={self.rank}, size={self.size}, local_size={self.local_size}, {state})"

    # -- lifecycle -----------------------------------------------------------------
    def check_alive(self, what: str = "operation") -> None:
        """Raise ``RuntimeError`` if this communicator (or the library) is gone.

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

    def register_gpu_chunks(self, chunks: Any) -> None:
        """Close ``chunks`` (a GPU CHUNKED / DEVICE allocation) at :meth:`destroy` if it is still alive."""
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
        self._pg.allreduce([t]).wait()
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
        if self._token is not None:
            _lib.servers.pop(self._token, None)  # every rank is connected: the store is no longer needed
        if errors:
            raise RuntimeError(f"wholemem Communicator.destroy: unmapping GPU chunks failed: {errors[0]}")

    # -- process group for GPU-resident tensors ------------------------------------
    def device_group_problem(self, device: torch.device) -> str | None:
        """Why collectives on ``device`` tensors are impossible, or None (checked before
        any collective, and the same on every rank)."""
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
        """Collective (first call): the group used for ``device`` tensors. NCCL (bound to
        this rank's GPU, ``device``) unless the communicator was made with
        ``device_backend='gloo'`` (several ranks sharing one GPU, which NCCL refuses)."""
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
        """Every rank's ``data``, in rank order (the raw bytes; nothing is deserialised here)."""
        self.check_alive("allgather")
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        n = torch.tensor([buf.numel()], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._pg.allgather([sizes], [n]).wait()
        width = max(max(int(s) for s in sizes), 1)
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: buf.numel()] = buf
        outs = [torch.empty(width, dtype=torch.uint8) for _ in range(self.size)]
        self._pg.allgather([outs], [padded]).wait()
        return [o[: int(s)].numpy().tobytes() for o, s in zip(outs, sizes)]

    def all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        """Exchange rows of ``send`` (grouped by destination) and return the received rows."""
        self.check_alive("all_to_all")
        recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
        self._group_for(send).alltoall_base(recv, send.contiguous(), recv_counts, send_counts).wait()
        return recv

    def exchange_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """counts[r] sent to rank r -> counts received from every rank."""
        self.check_alive("all_to_all")
        recv = torch.empty_like(send_counts)
        self._group_for(send_counts).alltoall_base(recv, send_counts.contiguous(), [], []).wait()
        return recv


def create_communicator(
    size: int,
    unique_id: UniqueId,
    rank: int,
    *,
    timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
    device_backend: str = "nccl",
) -> Communicator:
    """Collective: build a communicator of ``size`` ranks from a :class:`UniqueId`.

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
    Communicator

    Raises
    ------
    TypeError
        ``unique_id`` is not a :class:`UniqueId`, or size / rank are not ints.
    ValueError
        ``size < 1``, ``rank`` outside ``[0, size)``, or an unknown ``device_backend``.
    RuntimeError
        Library not initialised, or the rendezvous failed / timed out.
    """
    _lib.require_init("create_communicator")
    size = check_int(size, "size", lo=1)
    rank = check_rank(rank, "rank", size)
    if not isinstance(unique_id, UniqueId):
        raise TypeError(f"unique_id must be a wholemem.UniqueId (from get_unique_id()), got {type(unique_id).__name__}")
    if device_backend not in DEVICE_BACKENDS:
        raise ValueError(f"device_backend must be one of {DEVICE_BACKENDS}, got {device_backend!r}")
    server = _lib.servers.get(unique_id.token)
    if server is not None:
        store = server
    else:
        store = dist.TCPStore(unique_id.host, unique_id.port, None, False, timeout=timeout)
    prefixed = dist.PrefixStore(f"wholemem/{unique_id.token}", store)
    pg = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    return Communicator(pg, store=store, token=unique_id.token, timeout=timeout, device_backend=device_backend)


def communicator_from_process_group(pg: Any = None, *, device_group: Any = None) -> Communicator:
    """Collective: a communicator over an existing ``torch.distributed`` process group.

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
    Communicator

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
    return Communicator(pg, device_group=device_group)


def communicator_from_mpi4py(comm: Any) -> Communicator:
    """Collective: a communicator with the ranks of an mpi4py communicator.

    Rank 0 of ``comm`` creates the unique id and broadcasts it over MPI.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        An intra-communicator (e.g. ``MPI.COMM_WORLD``).

    Returns
    -------
    Communicator

    Raises
    ------
    TypeError
        ``comm`` is not an mpi4py communicator.
    """
    _lib.require_init("communicator_from_mpi4py")
    if not all(hasattr(comm, a) for a in ("Get_rank", "Get_size", "Bcast")):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    rank, size = comm.Get_rank(), comm.Get_size()
    uid = get_unique_id() if rank == 0 else None
    # the id travels as JSON in a byte buffer (nothing received is unpickled)
    data = json.dumps(dataclasses.asdict(uid) if uid is not None else None).encode()
    n = np.array([len(data)], dtype=np.int64)
    comm.Bcast(n, root=0)
    buf = np.frombuffer(data, dtype=np.uint8).copy() if rank == 0 else np.empty(int(n[0]), dtype=np.uint8)
    comm.Bcast(buf, root=0)
    fields = json.loads(buf.tobytes())
    return create_communicator(size, UniqueId(str(fields["host"]), int(fields["port"]), str(fields["token"])), rank)
