"""``LocalShard``: this rank's part of a server's state, as checkpoints read and write it."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from distkit_common import collective


def wait_polling(req: Any) -> None:
    """Wait for a nonblocking MPI request by testing it, sleeping briefly in between.

    Blocking collectives on the server's communicator could hang while the
    rank's progress thread drives messages across hosts (seen with co-located
    ranks sharing memory and the rest over TCP: ``MPI_Allgather`` never
    returned); the engine's own barrier polls the same way and never did.
    """
    while not req.Test():
        time.sleep(50e-6)


def polling_group(comm: Any) -> collective.MPIGroup:
    """``distkit_common.collective``'s group over an mpi4py communicator, waiting by :func:`wait_polling`."""
    return collective.MPIGroup(comm, wait=wait_polling)


class LocalShard:
    """The keys a rank owns and their slots (parameters + optimizer state).

    Every method that says "collective" must be called by every rank of the
    server, with no worker pushing.

    Parameters
    ----------
    engine : kvps._kvps.Engine
        The rank's engine.
    comm : mpi4py.MPI.Comm
        A communicator over the server's ranks reserved for collectives.
    lengths : numpy.ndarray
        The row length (``value_lengths``) of every key.
    dtype : torch.dtype
        The value dtype.
    rule : dict
        The server's update rule (``{"name": ...}`` and its parameters).
    """

    def __init__(self, engine: Any, comm: Any, lengths: np.ndarray, dtype: torch.dtype, rule: dict[str, Any]) -> None:
        self._engine = engine
        self.comm = comm
        #: what distkit_common.collective's helpers get (see wait_polling)
        self.group = polling_group(comm)
        self.lengths = lengths
        self.dtype = dtype
        self.rule = dict(rule)
        self.rank = int(engine.rank)
        self.size = int(engine.size)
        self.num_keys = int(engine.num_keys)
        uniform = int(engine.uniform_slot_len)
        self.slot_lengths: np.ndarray = (
            np.broadcast_to(np.int64(uniform), (self.num_keys,))
            if uniform
            else np.asarray(engine.slot_lengths(), dtype=np.int64)
        )

    @property
    def itemsize(self) -> int:
        """Bytes per value element."""
        return int(torch.empty(0, dtype=self.dtype).element_size())

    def quiesce(self) -> None:
        """Collective: replica updates reach their owners, then a barrier."""
        self._engine.wait_sync()
        self._engine.barrier()

    def barrier(self) -> None:
        """Collective: a barrier over the server's ranks."""
        self._engine.barrier()

    def owned_keys(self) -> np.ndarray:
        """The keys this rank owns now (sorted int64)."""
        return np.asarray(self._engine.owned_keys(), dtype=np.int64)

    def read(self, keys: np.ndarray) -> torch.Tensor:
        """The slots of ``keys`` (owned here), concatenated in key order."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = torch.empty(int(self.slot_lengths[keys].sum()) if len(keys) else 0, dtype=self.dtype)
        if len(keys):
            self._engine.read_slots(int(keys.ctypes.data), len(keys), out.data_ptr())
        return out

    def write(self, keys: np.ndarray, raw: np.ndarray) -> None:
        """Overwrite the slots of ``keys`` (owned here) with ``raw`` (their bytes, concatenated)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        raw = np.ascontiguousarray(raw)
        want = int(self.slot_lengths[keys].sum()) * self.itemsize if len(keys) else 0
        if raw.nbytes != want:
            raise ValueError(f"{raw.nbytes} bytes for slots of {want} bytes")
        if len(keys):
            self._engine.write_slots(int(keys.ctypes.data), len(keys), int(raw.ctypes.data))

    def reset_ownership(self) -> None:
        """Collective: every key back on its home rank (``key % size``), no replicas, no intents."""
        self.quiesce()
        self._engine.reset_ownership()
        self._engine.barrier()
