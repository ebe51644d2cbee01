"""``Worker``: a worker thread's handle on the parameter server (AdaPM's worker API).

Keys this rank holds (or a node-local peer holds in shared memory) are served
by the calling thread itself; the rest go through the rank's progress engine.
Sampling (``prepare_sample`` / ``pull_sample``) draws keys with ``_sampling.py``.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import torch

from distkit_common.validate import check_int

from . import _kvps
from ._args import KeyRangeError, as_keys, as_values
from ._sampling import Samples
from ._server import Server

_PULL, _PUSH, _SET = _kvps.PULL, _kvps.PUSH, _kvps.SET

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

    Examples
    --------
    >>> w = kvps.Worker(0, server)  # doctest: +SKIP
    >>> keys = torch.tensor([1, 7, 42])  # doctest: +SKIP
    >>> vals = torch.empty(3 * server.lengths[0])  # doctest: +SKIP
    >>> w.pull(keys, vals)  # -1: answered locally, else a finished timestamp  # doctest: +SKIP
    >>> w.intent(keys, w.current_clock() + 2)  # relocate or replicate them before clock + 2  # doctest: +SKIP
    """

    def __init__(self, customer_id: int, server: Server) -> None:
        if not isinstance(server, Server):
            raise TypeError(f"server must be a kvps.Server, got {type(server).__name__}")
        self.customer_id = check_int(customer_id, "customer_id", lo=0, hi=server.num_threads)
        self.server = server
        self._e = server._engine
        self._keep: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._samples = Samples(self.customer_id)

    @property
    def num_keys(self) -> int:
        """Number of keys of the worker's server.

        Returns
        -------
        int
            ``server.num_keys``.
        """
        return self.server.num_keys

    def get_key_size(self, key_id: int = 0) -> int:
        """Return the value length of key ``key_id`` (AdaPM's argument name and default).

        Parameters
        ----------
        key_id : int
            The key.

        Returns
        -------
        int
            The number of values ``pull`` returns for the key.

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

        Parameters
        ----------
        keys : 1-D int64 numpy array or CPU tensor
            Keys (duplicates allowed).
        vals : 1-D contiguous numpy array or CPU tensor of the server dtype
            The values to add (or gradients), concatenated in key order; its length must be the sum of the keys' value lengths.
        asynchronous : bool
            Return at once instead of waiting (AdaPM's ``async``: see :meth:`pull`).

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

        Parameters
        ----------
        keys : 1-D int64 numpy array or CPU tensor
            The keys to write, as :meth:`pull` takes them.
        vals : 1-D contiguous numpy array or CPU tensor of the server dtype
            The new values, laid out as :meth:`pull` fills them.
        asynchronous : bool
            Return without waiting for the write.

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

        Parameters
        ----------
        ts : int
            A timestamp that ``pull``, ``push``, ``set``, ``localize`` or ``pull_sample`` returned.

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

        Parameters
        ----------
        keys : 1-D int64 numpy array or CPU tensor
            The keys.
        asynchronous : bool
            Return at once instead of waiting for the keys to arrive.

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

        Parameters
        ----------
        keys : 1-D int64 numpy array or CPU tensor
            The keys.
        start : int
            First clock of the window (>= 0).
        end : int
            Clock after the window; 0 means ``start + 1``.

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
        """Advance this worker's clock by one (starts a sync round in the background).

        Returns
        -------
        int
            The new clock.

        Raises
        ------
        RuntimeError
            After ``Server.shutdown`` (or if the progress engine failed).
        """
        self.server._check_open()
        return int(self._e.advance_clock(self.customer_id))

    def current_clock(self) -> int:
        """Return this worker's clock.

        Returns
        -------
        int
            The number of ``advance_clock`` calls so far.
        """
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

    def prepare_sample(self, K: int, start: int, end: int = 0) -> int:
        """Draw ``K`` keys to be used during clocks ``[start, end)``.

        Parameters
        ----------
        K : int
            Number of keys (>= 1).
        start : int
            First clock of the sample's window (>= 0).
        end : int
            Clock after the window; 0 means ``start + 1``.

        Returns
        -------
        int
            The sample id for :meth:`pull_sample`.

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
        srv = self.server
        keys = self._samples.draw(cfg, k, self._e.owned_keys, srv.my_rank(), srv.num_ranks())
        if cfg.signals_intent:
            self.intent(keys, s, e)
        return self._samples.add(keys)

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
        chunk = self._samples.next_keys(sid, keys)
        count = int(self.server.lengths[chunk].sum())
        as_values(vals, self.server.dtype, count, writable=True, name="vals")
        self._samples.take(sid, keys, chunk)
        return self.pull(chunk, vals, asynchronous)
