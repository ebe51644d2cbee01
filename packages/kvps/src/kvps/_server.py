"""``setup``, ``Server`` and ``Worker``: the AdaPM-style API over the native engine."""

from __future__ import annotations

import atexit
import functools
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import torch
from mpi4py import MPI

from distkit_common.validate import check_int

from . import _kvps
from ._args import KeyRangeError, as_keys, as_values
from ._shard import LocalShard
from .optim import Optimizer

#: ``use_techniques`` name -> the engine's code
TECHNIQUES: dict[str, int] = dict(_kvps.TECHNIQUES)
_DTYPES = {getattr(torch, name): code for name, code in _kvps.VALUE_DTYPES.items()}
_PULL, _PUSH, _SET = _kvps.PULL, _kvps.PUSH, _kvps.SET


def link_rate() -> float:
    """The link rate between hosts that ``KVPS_LINK_RATE`` gives, in bytes/s.

    tc's syntax (``"1gbit"``, ``"100mbit"``, ``"125MBps"``); ``"off"`` (or
    ``"0"``) weighs no bytes, so the ledger judges intent by engine work alone;
    unset, -1: the server measures the link when it starts.

    Raises
    ------
    ValueError
        If ``KVPS_LINK_RATE`` is not a rate.
    """
    text = os.environ.get("KVPS_LINK_RATE", "").strip()
    if not text:
        return -1.0
    if text.lower() in ("0", "off"):
        return 0.0
    from distkit_common.rates import parse_rate

    try:
        return parse_rate(text) / 8
    except ValueError as e:
        raise ValueError(f"KVPS_LINK_RATE: {e}") from None


@dataclass
class _Config:
    num_keys: int
    num_threads: int
    technique: str


_config: _Config | None = None
_live: weakref.WeakSet[Server] = weakref.WeakSet()
_F = TypeVar("_F", bound=Callable[..., Any])


def _adapm_keywords(**deprecated: str) -> Callable[[_F], _F]:
    """Accept AdaPM's keyword ``async`` for ``asynchronous``, and ``deprecated`` old names (with a warning).

    ``async`` is a Python keyword, so AdaPM's flag can only be passed
    positionally or as ``**{"async": flag}``; both work. ``deprecated`` maps
    old kvps keyword names to the current ones.
    """
    renames = {"async": "asynchronous", **deprecated}

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if kwargs:
                for old, new in renames.items():
                    if old not in kwargs:
                        continue
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {old!r} and {new!r} (the same argument)")
                    if old in deprecated:
                        warnings.warn(
                            f"Worker.{fn.__name__}({old}=...) is deprecated, use {new}= (AdaPM's name)",
                            DeprecationWarning,
                            stacklevel=2,
                        )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(_F, inner)

    return wrap


def setup(num_keys: int, num_threads: int = 1, use_techniques: str = "all", num_channels: int = -1) -> None:
    """Configure the parameter server before creating the :class:`Server`.

    Parameters
    ----------
    num_keys : int
        Number of keys; keys are ``0 .. num_keys-1``.
    num_threads : int
        Number of worker threads (``Worker`` customer ids) per rank.
    use_techniques : {"all", "replication_only", "relocation_only", "none"}
        Which intent-driven techniques the server uses: relocation to a single
        intending rank and replication for several ("all"), only one of them,
        or none (a classic static parameter server; ``localize`` still works).
        ``""`` (AdaPM's default) means "all".
    num_channels : int
        Accepted for AdaPM compatibility: -1 (default) or >= 1. kvps runs one
        progress engine per rank, so the value does not change behaviour.

    Raises
    ------
    TypeError
        ``num_keys`` or ``num_threads`` is not an int.
    ValueError
        A value is out of range or ``use_techniques`` is unknown.
    """
    global _config
    n = check_int(num_keys, "num_keys", lo=1)
    t = check_int(num_threads, "num_threads", lo=1, hi=1025)
    if use_techniques == "":
        use_techniques = "all"
    if not isinstance(num_channels, (int, np.integer)) or isinstance(num_channels, bool):
        raise TypeError(f"num_channels must be an int, got {type(num_channels).__name__}")
    if num_channels != -1 and num_channels < 1:
        raise ValueError(f"num_channels must be -1 (default) or >= 1, got {num_channels}")
    if not isinstance(use_techniques, str) or use_techniques not in TECHNIQUES:
        raise ValueError(f"use_techniques must be one of {sorted(TECHNIQUES)}, got {use_techniques!r}")
    _config = _Config(n, t, use_techniques)


def _uniform(length: int, num_keys: int) -> np.ndarray:
    """One length for every key, as a read-only array view that takes no memory per key."""
    return np.broadcast_to(np.int64(length), (num_keys,))


def _lengths_array(value_lengths: Any, num_keys: int) -> np.ndarray:
    if isinstance(value_lengths, (bool, np.bool_)):
        raise TypeError(f"value_lengths must be an int or a 1-D integer array, got {value_lengths!r}")
    if isinstance(value_lengths, (int, np.integer)):
        v = int(value_lengths)
        if v < 1:
            raise ValueError(f"value_lengths must be >= 1, got {v}")
        return _uniform(v, num_keys)
    if isinstance(value_lengths, torch.Tensor):
        value_lengths = value_lengths.detach().cpu().numpy()
    if not isinstance(value_lengths, np.ndarray):
        raise TypeError(f"value_lengths must be an int or a 1-D integer array, got {type(value_lengths).__name__}")
    if value_lengths.dtype.kind == "f":
        # AdaPM converts any tensor to int64 (its example passes torch.ones(n) * vpk);
        # kvps accepts float lengths only when they are whole numbers.
        frac = np.nonzero(~np.isfinite(value_lengths) | (value_lengths != np.round(value_lengths)))[0]
        if frac.size:
            pos = int(frac[0])
            raise ValueError(f"value_lengths[{pos}] = {value_lengths[pos]} is not a whole number")
    elif value_lengths.dtype.kind not in "iu":
        raise TypeError(f"value_lengths must have an integer dtype, got {value_lengths.dtype}")
    if value_lengths.ndim != 1 or value_lengths.shape[0] != num_keys:
        raise ValueError(f"value_lengths must have shape ({num_keys},) (one length per key), got {value_lengths.shape}")
    arr = np.ascontiguousarray(value_lengths, dtype=np.int64)
    lo, hi = (int(arr.min()), int(arr.max())) if num_keys else (1, 1)
    if lo < 1:
        pos = int(np.nonzero(arr < 1)[0][0])
        raise ValueError(f"value_lengths[{pos}] = {int(arr[pos])} must be >= 1")
    return _uniform(lo, num_keys) if lo == hi else arr


class Server:
    """The rank's shard of the parameter server (one per process; collective).

    Parameters
    ----------
    value_lengths : int or 1-D integer array/tensor
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
        if _config is None:
            raise RuntimeError("call kvps.setup(num_keys, num_threads, use_techniques) before creating a Server")
        self._cfg = _config
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        self.dtype: torch.dtype = dtype
        self.lookahead = check_int(intent_lookahead, "intent_lookahead", lo=0)
        self.replica_sync_every = check_int(replica_sync_every, "replica_sync_every", lo=1)
        self.lengths = _lengths_array(value_lengths, self._cfg.num_keys)
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
        self._sampling: _SamplingConfig | None = None
        _live.add(self)

    # ---------------------------------------------------------------- info
    @property
    def num_keys(self) -> int:
        """Number of keys."""
        return self._cfg.num_keys

    @property
    def num_threads(self) -> int:
        """Worker threads per rank (from ``setup``)."""
        return self._cfg.num_threads

    @property
    def technique(self) -> str:
        """The ``use_techniques`` setting."""
        return self._cfg.technique

    @property
    def shares_memory(self) -> bool:
        """Whether this rank reads and updates node-local peers' shards in place."""
        return bool(self._engine.shares_memory)

    def stats(self) -> dict[str, int | float]:
        """How this rank's workers' keys were served so far, and what became of their intents.

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
            binds) to 1 (the link does).
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
        }

    def my_rank(self) -> int:
        """This process's rank."""
        return int(self._engine.rank)

    def num_ranks(self) -> int:
        """Number of ranks holding shards."""
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

        Raises
        ------
        ValueError
            Unknown scheme/distribution or an empty/out-of-range key range.
        """
        self._check_open()
        if scheme not in ("naive", "preloc", "pool", "local"):
            raise ValueError(f"scheme must be 'naive', 'preloc', 'pool' or 'local', got {scheme!r}")
        if distribution not in ("uniform", "log-uniform"):
            raise ValueError(f"distribution must be 'uniform' or 'log-uniform', got {distribution!r}")
        if min is not None and min_key is not None:
            raise TypeError("give min or min_key, not both")
        if max is not None and max_key is not None:
            raise TypeError("give max or max_key, not both")
        lo_name, lo_arg = ("min_key", min_key) if min_key is not None else ("min", min)
        hi_name, hi_arg = ("max_key", max_key) if max_key is not None else ("max", max)
        hi = self.num_keys if hi_arg is None else check_int(hi_arg, hi_name, lo=1, hi=self.num_keys + 1)
        lo = 0 if lo_arg is None else check_int(lo_arg, lo_name, lo=0, hi=hi)
        s = (12345 + 7919 * self.my_rank()) if seed is None else check_int(seed, "seed", lo=0)
        self._sampling = _SamplingConfig(scheme, bool(with_replacement), lo, hi, s, distribution)

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
        """
        from ._persist import save, save_distx

        self._check_open()
        if format == "kvps":
            save(self._shard, path)
        elif format == "distx":
            save_distx(self._shard, path)
        else:
            raise ValueError(f"format must be 'kvps' or 'distx', got {format!r}")

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
        """
        from ._persist import load, load_distx

        self._check_open()
        if format == "kvps":
            load(self._shard, path)
        elif format == "distx":
            load_distx(self._shard, path)
        else:
            raise ValueError(f"format must be 'kvps' or 'distx', got {format!r}")

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


@dataclass
class _SamplingConfig:
    scheme: str
    with_replacement: bool
    lo: int
    hi: int
    seed: int
    distribution: str = "uniform"


@atexit.register
def _stop_all() -> None:  # pragma: no cover - exercised at interpreter exit
    # a rank leaving without shutdown() tells its peers ("going away"): their
    # pending and further operations raise RuntimeError naming this rank
    # instead of hanging (runs before mpi4py finalises MPI: atexit is LIFO)
    for s in list(_live):
        if not s._closed:
            s._closed = True
            s._engine.abandon()


class Worker:
    """A worker (customer) thread's handle on the parameter server.

    Parameters
    ----------
    customer_id : int
        In ``[0, num_threads)``; each worker thread of a rank uses its own id.
    server : Server
        This rank's server.

    Raises
    ------
    TypeError
        ``server`` is not a Server or ``customer_id`` not an int.
    ValueError
        ``customer_id`` out of range.
    """

    def __init__(self, customer_id: int, server: Server) -> None:
        if not isinstance(server, Server):
            raise TypeError(f"server must be a kvps.Server, got {type(server).__name__}")
        self.customer_id = check_int(customer_id, "customer_id", lo=0, hi=server.num_threads)
        self.server = server
        self._e = server._engine
        self._keep: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._samples: dict[int, list[Any]] = {}
        self._next_sample = 0
        self._rng: np.random.Generator | None = None

    @property
    def num_keys(self) -> int:
        """Number of keys."""
        return self.server.num_keys

    def get_key_size(self, key_id: int = 0) -> int:
        """Value length of key ``key_id`` (AdaPM's argument name and default).

        Raises
        ------
        TypeError
            ``key_id`` is not an int.
        KeyRangeError
            (an ``IndexError`` and ``ValueError``) ``key_id`` out of range.
        """
        key = key_id
        k = int(key) if isinstance(key, (int, np.integer)) and not isinstance(key, bool) else None
        if k is None:
            raise TypeError(f"key must be an int, got {type(key).__name__}")
        if not 0 <= k < self.num_keys:
            raise KeyRangeError(f"key {k} is out of range [0, {self.num_keys})")
        return int(self.server.lengths[k])

    def _op(self, op: int, keys: Any, vals: Any, asynchronous: Any) -> int:
        self.server._check_open()
        if not isinstance(asynchronous, (bool, np.bool_)):
            raise TypeError(f"asynchronous must be a bool, got {type(asynchronous).__name__}")
        kp, n, kkeep = as_keys(keys, self.num_keys)
        count = int(self._e.value_count(kp, n))
        vp, vkeep = as_values(vals, self.server.dtype, count, writable=(op == _PULL))
        ts = int(self._e.op(op, self.customer_id, kp, n, vp))
        if ts < 0:
            return -1
        if asynchronous:
            with self._lock:
                self._keep[ts] = (kkeep, vkeep)
        else:
            self._e.wait(ts)
        return ts

    def _rows(self, op: int, keys: torch.Tensor, vals: torch.Tensor, asynchronous: bool) -> int:
        """``op`` on keys and values the caller made and checked itself (the torch modules).

        ``keys``: contiguous int64 in range; ``vals``: contiguous, of the
        server's dtype and the keys' value lengths. Pushes copy the values, so
        an asynchronous push needs nothing kept alive; pulls here are synchronous.
        """
        self.server._check_open()
        ts = int(self._e.op(op, self.customer_id, keys.data_ptr(), keys.numel(), vals.data_ptr()))
        if ts >= 0 and (op == _PULL or not asynchronous):
            self._e.wait(ts)
        return ts

    @_adapm_keywords()
    def pull(self, keys: Any, vals: Any, asynchronous: bool = False) -> int:
        """Read the values of ``keys`` into the flat buffer ``vals`` (in place).

        Parameters
        ----------
        keys : 1-D int64 numpy array or CPU tensor
            Keys (duplicates allowed).
        vals : 1-D contiguous numpy array or CPU tensor of the server dtype
            Receives the values, concatenated in key order; its length must be
            the sum of the keys' value lengths. With ``asynchronous=True`` it is
            filled once ``wait(ts)`` returns (keep it alive until then).
        asynchronous : bool
            Return at once instead of waiting. AdaPM's ``async`` flag: also
            accepted positionally (``pull(keys, vals, True)``) or as
            ``**{"async": True}`` (``async`` is a Python keyword); so are
            those of ``push``, ``set``, ``localize`` and ``pull_sample``.

        Returns
        -------
        int
            A timestamp for ``wait``; -1 when every key was answered locally.

        Raises
        ------
        TypeError
            Wrong key or value dtype (float keys are refused).
        ValueError
            Wrong dimensionality, device, contiguity or length.
        IndexError
            A key is negative or out of range.
        """
        return self._op(_PULL, keys, vals, asynchronous)

    @_adapm_keywords()
    def push(self, keys: Any, vals: Any, asynchronous: bool = False) -> int:
        """Add ``vals`` to the values of ``keys`` (or, on a server with an optimizer, apply them as gradients).

        Duplicate keys in one push accumulate (each occurrence is added; under
        an optimizer each occurrence is one step: push one summed gradient per
        key). The buffer may be reused as soon as ``push`` returns (it is copied).

        Returns
        -------
        int
            A timestamp for ``wait``; -1 when applied locally.

        Raises
        ------
        TypeError, ValueError, IndexError
            As for :meth:`pull`.
        """
        return self._op(_PUSH, keys, vals, asynchronous)

    @_adapm_keywords()
    def set(self, keys: Any, vals: Any, asynchronous: bool = False) -> int:
        """Overwrite the values of ``keys`` with ``vals`` (at the owner; replicas catch up at the next sync).

        Under a server-side optimizer only the parameters are written; the
        optimizer state of the keys is kept.

        Returns
        -------
        int
            A timestamp for ``wait``; -1 when applied locally.

        Raises
        ------
        TypeError, ValueError, IndexError
            As for :meth:`pull`.
        """
        return self._op(_SET, keys, vals, asynchronous)

    def wait(self, ts: int) -> None:
        """Block (without the GIL) until the operation with timestamp ``ts`` finished; -1 returns at once.

        Raises
        ------
        TypeError
            ``ts`` is not an int.
        RuntimeError
            The progress engine failed.
        """
        t = check_int(ts, "ts")
        if t >= 0:
            self._e.wait(t)
            with self._lock:
                self._keep.pop(t, None)

    def waitall(self) -> None:
        """Wait for every operation this worker issued.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self._e.waitall(self.customer_id)
        with self._lock:
            self._keep.clear()

    @_adapm_keywords()
    def localize(self, keys: Any, asynchronous: bool = False) -> int:
        """Relocate ``keys`` to this rank now (Lapse's primitive).

        Returns
        -------
        int
            A timestamp for ``wait``; -1 when all keys were local already.

        Raises
        ------
        TypeError, ValueError, IndexError
            Bad keys, or ``asynchronous`` not a bool.
        """
        self.server._check_open()
        if not isinstance(asynchronous, (bool, np.bool_)):
            raise TypeError(f"asynchronous must be a bool, got {type(asynchronous).__name__}")
        kp, n, _keep = as_keys(keys, self.num_keys)
        ts = int(self._e.localize(self.customer_id, kp, n))
        if ts >= 0 and not asynchronous:
            self._e.wait(ts)
        return ts

    def intent(self, keys: Any, start: int, end: int = 0) -> int:
        """Signal that this worker will access ``keys`` during clocks ``[start, end)``.

        ``end=0`` means ``start + 1``. The server relocates (one intending rank)
        or replicates (several) the keys before the window starts and drops
        replicas after it ends. Duplicate keys count once.

        Returns
        -------
        int
            Always -1 (as in AdaPM: intent is registered without a request to
            wait for; ``wait(-1)`` returns at once, ``wait_sync`` waits for the
            relocations/replications it triggers).

        Raises
        ------
        TypeError, IndexError
            Bad keys or clocks.
        ValueError
            ``end <= start`` (other than ``end=0``) or a negative clock.
        """
        self.server._check_open()
        s = check_int(start, "start", lo=0)
        e = check_int(end, "end", lo=0)
        if e == 0:
            e = s + 1
        if e <= s:
            raise ValueError(f"intent window [start, end) = [{s}, {e}) is empty")
        kp, n, _keep = as_keys(keys, self.num_keys)
        self._e.intent(self.customer_id, kp, n, s, e)
        return -1

    def advance_clock(self) -> int:
        """Advance this worker's clock by one (starts a sync round in the background); returns the new clock.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        return int(self._e.advance_clock(self.customer_id))

    def current_clock(self) -> int:
        """This worker's clock."""
        return int(self._e.current_clock(self.customer_id))

    def wait_sync(self) -> None:
        """Run a sync round now and wait until it and all relocations/replications under way finished.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        self._e.wait_sync()

    def wait_replica_sync(self) -> None:
        """Deprecated alias of :meth:`wait_sync` (AdaPM keeps it for old scripts).

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.wait_sync()

    def begin_setup(self) -> None:
        """Begin a setup phase (e.g. the initial ``set`` of all parameters).

        As in AdaPM: one sync round (``wait_sync``), then a barrier of every
        worker of every rank (every worker must call it).

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        self._e.wait_sync()
        self._e.worker_barrier()

    def end_setup(self) -> None:
        """End the setup phase.

        As in AdaPM (two sync rounds, then a barrier of every worker): waits for
        this worker's operations, ships and refreshes replica state twice, then
        blocks until every worker of every rank called ``end_setup``. Values set
        or pushed during the setup are then visible everywhere, replicas included.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        self.waitall()
        # AdaPM: WaitSync, WaitSync, Barrier. kvps puts barriers between the
        # rounds so that the guarantee holds: round 1 ships every rank's deltas
        # (after everybody's setup operations finished), round 2 refreshes
        # every replica from the owners.
        self._e.worker_barrier()
        self._e.wait_sync()
        self._e.worker_barrier()
        self._e.wait_sync()
        self._e.worker_barrier()

    def barrier(self) -> None:
        """Wait for this worker's operations, then block until every worker of every rank arrives.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        self.waitall()
        self._e.worker_barrier()

    def finalize(self) -> None:
        """Finish this worker: wait for its operations, flush replica deltas, barrier of all workers.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        self.waitall()
        self._e.wait_sync()
        self._e.worker_barrier()

    # ------------------------------------------------------------- sampling
    def prepare_sample(self, K: int, start: int, end: int = 0) -> int:
        """Draw ``K`` keys to be used during clocks ``[start, end)``; returns a sample id.

        Raises
        ------
        RuntimeError
            ``enable_sampling_support`` was not called.
        ValueError
            ``K`` < 1, or more distinct keys than the range holds.
        """
        cfg = self.server._sampling
        if cfg is None:
            raise RuntimeError("call server.enable_sampling_support(...) before prepare_sample")
        k = check_int(K, "K", lo=1)
        s = check_int(start, "start", lo=0)
        e = check_int(end, "end", lo=0)
        if e == 0:
            e = s + 1
        if e <= s:
            raise ValueError(f"sample window [start, end) = [{s}, {e}) is empty")
        if self._rng is None:
            self._rng = np.random.default_rng(cfg.seed + 104729 * self.customer_id)
        cand: np.ndarray | None = None  # None: the whole range [lo, hi)
        if cfg.scheme == "local":
            owned = np.asarray(self._e.owned_keys(), dtype=np.int64)
            cand = np.sort(owned[(owned >= cfg.lo) & (owned < cfg.hi)])
            if cand.size == 0:  # nothing held here: this rank's home keys
                size, rank = self.server.num_ranks(), self.server.my_rank()
                cand = np.arange(cfg.lo + (rank - cfg.lo) % size, cfg.hi, size, dtype=np.int64)
            if cand.size == 0:
                cand = None
        n = cfg.hi - cfg.lo if cand is None else int(cand.size)
        if not cfg.with_replacement and k > n:
            raise ValueError(f"cannot draw {k} distinct keys from {n} candidate keys in [{cfg.lo}, {cfg.hi})")
        if cfg.distribution == "log-uniform":
            j = np.arange(n, dtype=np.float64)
            p = (np.log(j + 2.0) - np.log(j + 1.0)) / np.log(n + 1.0)
            pos = self._rng.choice(n, size=k, replace=cfg.with_replacement, p=p / p.sum())
        elif cfg.with_replacement:
            pos = self._rng.integers(0, n, size=k)
        else:
            pos = self._rng.choice(n, size=k, replace=False)
        keys = (cfg.lo + pos.astype(np.int64)) if cand is None else cand[pos]
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if cfg.scheme in ("preloc", "pool"):
            self.intent(keys, s, e)
        sid = self._next_sample
        self._next_sample += 1
        self._samples[sid] = [keys, 0]
        return sid

    @_adapm_keywords(sample_id="id", keys_out="keys", vals_out="vals")
    def pull_sample(self, id: int, keys: Any, vals: Any, asynchronous: bool = False) -> int:
        """Take the next ``len(keys)`` keys of a prepared sample and pull their values.

        AdaPM's ``pull_sample(id, keys, vals, async=False)``: the same names
        and order (``async`` positionally or as ``**{"async": flag}``). The
        former kvps names (``sample_id``, ``keys_out``, ``vals_out``) still
        work as keywords, with a ``DeprecationWarning``.

        Parameters
        ----------
        id : int
            A sample id from :meth:`prepare_sample` of this worker.
        keys : 1-D int64 numpy array or CPU tensor
            Receives the next ``len(keys)`` keys of the sample (written in place).
        vals : 1-D contiguous numpy array or CPU tensor of the server dtype
            Receives their values, concatenated in key order (its length: the
            sum of those keys' value lengths); with ``asynchronous=True``
            filled once ``wait(ts)`` returns.
        asynchronous : bool
            Return at once instead of waiting.

        Returns
        -------
        int
            -1 when answered locally, else a timestamp (already waited for
            unless ``asynchronous``).

        Raises
        ------
        KeyError
            Unknown or exhausted sample id.
        TypeError
            ``id`` or ``asynchronous`` of the wrong type, ``keys`` not a 1-D
            int64 array, ``vals`` of the wrong dtype; a name given twice.
        ValueError
            ``keys`` longer than what remains of the sample, or ``vals`` of the wrong length.
        """
        if not isinstance(asynchronous, (bool, np.bool_)):
            raise TypeError(f"asynchronous must be a bool, got {type(asynchronous).__name__}")
        sid = check_int(id, "id", lo=0)
        if sid not in self._samples:
            raise KeyError(f"unknown or exhausted sample id {sid}")
        drawn, used = self._samples[sid]
        kout: Any = keys
        if not isinstance(kout, (np.ndarray, torch.Tensor)):
            raise TypeError(f"keys must be an int64 numpy array or tensor, got {type(kout).__name__}")
        if kout.dtype not in (np.int64, torch.int64) or kout.ndim != 1:
            raise TypeError(f"keys must be a 1-D int64 array, got dtype {kout.dtype}, ndim {kout.ndim}")
        m = int(kout.shape[0])
        if used + m > len(drawn):
            raise ValueError(f"sample {sid} has {len(drawn) - used} keys left, keys asks for {m}")
        chunk = drawn[used : used + m]
        count = int(self.server.lengths[chunk].sum())
        as_values(vals, self.server.dtype, count, writable=True, name="vals")
        if isinstance(kout, np.ndarray):
            kout[:] = chunk
        else:
            kout.copy_(torch.from_numpy(chunk))
        if used + m == len(drawn):
            del self._samples[sid]
        else:
            self._samples[sid][1] = used + m
        return self.pull(chunk, vals, asynchronous)
