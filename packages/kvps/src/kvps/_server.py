"""``Server``: a rank's shard of the parameter server (collective set-up, information, checkpoints, shutdown).

The worker API is :class:`kvps.Worker` (``_worker.py``); ``setup`` is in
``_setup.py``, the sampler in ``_sampling.py`` and the checkpoint formats in
``_persist.py``.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

import torch
from mpi4py import MPI

from distkit_common.validate import check_int

from . import _kvps
from ._args import as_lengths
from ._persist import load_checkpoint, save_checkpoint
from ._sampling import SamplingConfig, sampling_config
from ._setup import TECHNIQUES, configured, link_rate
from ._shard import LocalShard
from .optim import Optimizer

#: torch dtype -> the engine's value dtype code
_DTYPES = {getattr(torch, name): code for name, code in _kvps.VALUE_DTYPES.items()}

_live: weakref.WeakSet[Server] = weakref.WeakSet()


class Server:
    """The rank's shard of the parameter server (one per process; collective).

    Parameters
    ----------
    value_lengths : int or 1-D int array or tensor
        The value length of every key (an int: the same for all keys).
    dtype : torch.dtype
        Value dtype: float32 (default), float64, float16 or bfloat16.
    intent_lookahead : int
        An intent for clock ``c`` takes effect once the worker's clock reaches
        ``c - intent_lookahead`` (so the key is local when used). With ranks on
        other nodes and a lookahead of 8 or more, intents take effect in rounds
        every ``intent_lookahead // 4`` clocks (the first round at or after
        ``c - intent_lookahead``), so that a round's intents travel in one
        message per home; ``wait_sync`` applies every due intent at once.
    replica_sync_every : int
        ``advance_clock`` refreshes replicas every this many clocks (bounded
        staleness; ``wait_sync`` always refreshes them).
    prefault : bool
        Commit the value arenas at creation (``2 * sum(value_lengths) *
        itemsize`` bytes of RAM per rank) instead of page by page when keys
        first arrive (relocations/replicas of fresh keys then cost no page
        faults). Default False: memory is committed on first use.
    shared_memory : bool, optional
        Ranks on the same node read and update each other's shards in place
        through owner-only shared memory (no message, the call returns -1)
        whenever the peer owns the key. Default: on, unless the environment
        variable ``KVPS_SHARED_MEMORY`` is ``0``/``false``/``off``. Switch it
        off to measure what ranks on different nodes would see. Memory is
        shared only when ``/dev/shm`` can hold every co-located shard.
    comm : mpi4py.MPI.Comm, optional
        The communicator to span (duplicated); ``MPI.COMM_WORLD`` by default.
    optimizer : kvps.optim.Optimizer, optional
        Apply this optimizer where the rows live: every ``push`` then carries
        gradients, and the key's owner runs one optimizer step with them (see
        :mod:`kvps.optim`). Its state is stored behind each row, moves with the
        key and is checkpointed with the server. Needs a float32 or float64
        server. Default: ``push`` adds the values (AdaPM).

    Raises
    ------
    RuntimeError
        ``kvps.setup`` was not called, or MPI does not provide ``MPI_THREAD_MULTIPLE``.
    TypeError, ValueError
        Bad ``value_lengths``, ``dtype`` or ``optimizer`` (an optimizer on a 16-bit server).

    Examples
    --------
    Under ``mpiexec -n 2 python script.py``:

    >>> import kvps, torch  # doctest: +SKIP
    >>> kvps.setup(num_keys=100, num_threads=1)  # doctest: +SKIP
    >>> server = kvps.Server(4)  # every key holds 4 float32 values  # doctest: +SKIP
    >>> w = kvps.Worker(0, server)  # doctest: +SKIP
    >>> w.push(torch.arange(10), torch.ones(40))  # doctest: +SKIP
    >>> server.barrier(); server.shutdown()  # doctest: +SKIP
    """

    def __init__(
        self,
        value_lengths: Any,
        *,
        dtype: torch.dtype = torch.float32,
        intent_lookahead: int = 2,
        replica_sync_every: int = 1,
        prefault: bool = False,
        shared_memory: bool | None = None,
        comm: Any = None,
        optimizer: Optimizer | None = None,
    ) -> None:
        self._cfg = configured()
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        self.dtype: torch.dtype = dtype
        self.lookahead = check_int(intent_lookahead, "intent_lookahead", lo=0)
        self.replica_sync_every = check_int(replica_sync_every, "replica_sync_every", lo=1)
        self.lengths = as_lengths(value_lengths, self._cfg.num_keys)
        if shared_memory is None:
            shared_memory = os.environ.get("KVPS_SHARED_MEMORY", "1").strip().lower() not in ("0", "false", "off", "no")
        elif not isinstance(shared_memory, bool):
            raise TypeError(f"shared_memory must be a bool or None, got {type(shared_memory).__name__}")
        if optimizer is not None:
            if not isinstance(optimizer, Optimizer) or type(optimizer) is Optimizer:
                raise TypeError(f"optimizer must be one of kvps.optim's optimizers, got {type(optimizer).__name__}")
            if dtype not in (torch.float32, torch.float64):
                raise TypeError(f"server-side optimizers need a float32 or float64 server, got {dtype}")
        self.optimizer: Optimizer | None = optimizer
        rule = optimizer._engine_args() if optimizer is not None else (_kvps.RULES["add"], 0.0, 0.0, 0.0, 0.0)
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError(
                "kvps needs MPI_THREAD_MULTIPLE; mpi4py initialised MPI with a lower thread level "
                "(do not set mpi4py.rc.thread_level below 'multiple')"
            )
        rate = link_rate()
        base = MPI.COMM_WORLD if comm is None else comm
        self._comm = base.Dup()
        self._coll = base.Dup()
        self._engine: Any = _kvps.Engine(
            self._comm.handle,
            self._coll.handle,
            self._cfg.num_keys,
            0 if self.lengths.strides[0] == 0 else int(self.lengths.ctypes.data),
            int(self.lengths[0]) if self.lengths.strides[0] == 0 else 0,
            _DTYPES[dtype],
            self._cfg.num_threads,
            TECHNIQUES[self._cfg.technique],
            self.lookahead,
            self.replica_sync_every,
            bool(prefault),
            shared_memory,
            *rule,
            rate,
        )
        rule_desc = optimizer.to_dict() if optimizer is not None else {"name": "add"}
        self._shard = LocalShard(self._engine, self._coll, self.lengths, dtype, rule_desc)
        self._closed = False
        self._sampling: SamplingConfig | None = None
        _live.add(self)

    @property
    def num_keys(self) -> int:
        """Number of keys (from ``setup``).

        Returns
        -------
        int
            Keys are ``0 .. num_keys - 1``.
        """
        return self._cfg.num_keys

    @property
    def num_threads(self) -> int:
        """Worker threads per rank (from ``setup``).

        Returns
        -------
        int
            The customer ids of a rank's workers are ``0 .. num_threads - 1``.
        """
        return self._cfg.num_threads

    @property
    def technique(self) -> str:
        """The ``use_techniques`` setting (from ``setup``).

        Returns
        -------
        str
            One of :data:`kvps.TECHNIQUES`.
        """
        return self._cfg.technique

    @property
    def shares_memory(self) -> bool:
        """Whether this rank reads and updates node-local peers' shards in place.

        Returns
        -------
        bool
            True where memory is shared with at least one node-local peer.
        """
        return bool(self._engine.shares_memory)

    def stats(self) -> dict[str, int | float]:
        """Count how this rank's workers' keys were served so far, and what became of their intents.

        Returns
        -------
        dict
            ``local``: keys served from this rank's shard or replicas;
            ``shared``: in place in a node-local peer's shard; ``remote``:
            through messages. ``intent_moved``: intended keys this rank asked
            to move (or replicate) here; ``intent_classic``: intended keys the
            cost model left at their owners, because moving them would cost
            more than their expected uses save (one-off keys), or because
            intent does not pay on this workload (see the README).
            ``intent_all_keys``: 1 while every intended key goes through
            intent, 0 while only a probe sample does (intent costs more than
            it saves); ``intent_switches``: how often that changed;
            ``intent_probe_gain`` / ``intent_probe_cost``: the probe sample's
            recent gains and costs, in remote accesses of one key.
            ``link_rate``: the rate of the link between hosts in bytes/s,
            measured when the server started (or ``KVPS_LINK_RATE``; 0 where
            intent is not weighed against it: one host, or a technique other
            than ``"all"``); ``link_weight``: how much the bytes intent saves
            and sends count against its engine work, from 0 (the engine's CPU
            binds) to 1 (the link does). ``forwarded``: requests for keys
            this rank received but did not hold, passed on towards the
            owner (the sender's routing hint was stale after a move);
            ``given_back``: keys this rank, their home, took back from the
            rank intent had moved them to when intent paused (keys moved for
            a single use; see the user guide); ``announced``: keys this rank
            holds away from their homes and kept when intent paused, whose
            new place it told every rank then.
        """
        s = self._engine.stats()
        loc, shared, remote, moved, classic, all_keys, switches, gain, cost = s[:9]
        return {
            "local": int(loc),
            "shared": int(shared),
            "remote": int(remote),
            "intent_moved": int(moved),
            "intent_classic": int(classic),
            "intent_all_keys": int(all_keys),
            "intent_switches": int(switches),
            "intent_probe_gain": int(gain),
            "intent_probe_cost": int(cost),
            "link_rate": int(s[9]),
            "link_weight": s[10] / 1000,
            "forwarded": int(s[11]),
            "given_back": int(s[12]),
            "announced": int(s[13]),
        }

    def my_rank(self) -> int:
        """Return this process's rank.

        Returns
        -------
        int
            The rank in the server's communicator.
        """
        return int(self._engine.rank)

    def num_ranks(self) -> int:
        """Return the number of ranks holding shards.

        Returns
        -------
        int
            The size of the server's communicator.
        """
        return int(self._engine.size)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the kvps Server was shut down")

    def barrier(self) -> None:
        """Block until every rank reached this barrier (releases the GIL).

        Raises
        ------
        RuntimeError
            After ``shutdown``.
        """
        self._check_open()
        self._engine.barrier()

    def enable_sampling_support(
        self,
        scheme: str = "naive",
        with_replacement: bool = True,
        distribution: str = "uniform",
        min: int | None = None,  # AdaPM's argument names (shadow the builtins here)
        max: int | None = None,
        seed: int | None = None,
        *,
        min_key: int | None = None,
        max_key: int | None = None,
    ) -> None:
        """Enable ``prepare_sample`` / ``pull_sample`` on this rank's workers.

        The arguments follow AdaPM's ``enable_sampling_support(scheme,
        with_replacement, distribution, min, max)``; ``min_key`` / ``max_key``
        are keyword aliases of ``min`` / ``max``.

        Parameters
        ----------
        scheme : {"naive", "preloc", "pool", "local"}
            "naive" pulls the sampled keys where they are; "preloc" signals
            intent for them over the sample's clock window, so they are
            relocated/replicated here before use; "pool" is treated like
            "preloc" (kvps keeps no separate pool); "local" draws only keys
            this rank holds at ``prepare_sample`` time (falling back to its home
            keys), so their pulls are answered locally.
        with_replacement : bool
            Draw keys with replacement (else the keys of one sample are distinct).
        distribution : {"uniform", "log-uniform"}
            Sampling distribution over ``[min, max)``; "log-uniform" draws
            ``floor(exp(u * log(max - min + 1))) + min - 1`` for uniform ``u``
            in ``[0, 1)`` as AdaPM does (small keys are frequent).
        min, max : int
            The key range ``[min, max)`` to sample from (defaults ``0`` and ``num_keys``).
        seed : int, optional
            Seed of the sampler (a rank-dependent default otherwise).

        min_key, max_key : int, optional
            Keyword aliases of ``min`` and ``max``.

        Raises
        ------
        TypeError
            A bound given under both names, or a bound or ``seed`` that is not an int.
        ValueError
            Unknown scheme/distribution or an empty/out-of-range key range.
        RuntimeError
            After ``shutdown``.
        """
        self._check_open()
        self._sampling = sampling_config(
            self.num_keys, self.my_rank(), scheme, with_replacement, distribution, (min, min_key), (max, max_key), seed
        )

    def save(self, path: Any, format: str = "kvps") -> None:
        """Write the whole server state to directory ``path`` (collective, atomic).

        Call it when no worker is pushing. The checkpoint loads into any number
        of ranks.

        Parameters
        ----------
        path : str or os.PathLike
            The checkpoint directory (replaced atomically if it exists).
        format : {"kvps", "distx"}
            "kvps" (default): every rank writes its shard (raw bytes + JSON
            metadata; temporary directory, fsync, rename). "distx": distx-fake's
            checkpoint format (``distx_fake.checkpoint.save_state_dict``: crc32c
            per piece, atomic commit) with entries ``format``, ``num_keys``,
            ``dtype``, ``lengths`` and ``values`` (every key's value in key
            order); rank 0 gathers the values and writes it. Needs the optional
            extra ``kvps[distx]``.

        Raises
        ------
        ValueError
            Unknown ``format``.
        ImportError
            ``format="distx"`` without distx-fake installed.
        OSError
            The directory cannot be written.
        RuntimeError
            After ``shutdown``.
        """
        self._check_open()
        save_checkpoint(self._shard, path, format)

    def load(self, path: Any, format: str = "kvps") -> None:
        """Replace the server state by the checkpoint in ``path`` (collective).

        The checkpoint may come from a different number of ranks. Ownership is
        reset to the home ranks; replicas and intents are dropped.

        Parameters
        ----------
        path : str or os.PathLike
            The checkpoint directory.
        format : {"kvps", "distx"}
            The format it was saved in (see :meth:`save`).

        Raises
        ------
        ValueError
            Unknown ``format``, or the checkpoint does not match
            ``num_keys``/``value_lengths``/``dtype``.
        ImportError
            ``format="distx"`` without distx-fake installed.
        OSError
            The checkpoint cannot be read.
        RuntimeError
            After ``shutdown``.
        """
        self._check_open()
        load_checkpoint(self._shard, path, format)

    def shutdown(self) -> None:
        """Flush replica deltas, stop the progress engine and free the communicators (collective).

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        if self._closed:
            return
        eng = self._engine
        eng.wait_sync()
        eng.barrier()
        eng.begin_shutdown()
        eng.wait_sync()
        eng.barrier()
        self._stop()

    def _stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._engine.stop()
        for c in (self._comm, self._coll):
            try:
                c.Free()
            except MPI.Exception:  # pragma: no cover - MPI already finalised
                pass


@atexit.register
def _stop_all() -> None:  # pragma: no cover - exercised at interpreter exit
    # a rank leaving without shutdown() tells its peers ("going away"): their
    # pending and further operations raise RuntimeError naming this rank
    # instead of hanging (runs before mpi4py finalises MPI: atexit is LIFO)
    for s in list(_live):
        if not s._closed:
            s._closed = True
            s._engine.abandon()
