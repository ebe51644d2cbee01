"""Key sampling (AdaPM's ``enable_sampling_support`` / ``prepare_sample`` / ``pull_sample``).

A server's :class:`SamplingConfig` says how keys are drawn; each worker keeps
its own :class:`Samples`: a generator seeded per worker and the samples it
prepared, each with how many of its keys were pulled so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distkit_common.validate import check_int

#: the sampling schemes ``enable_sampling_support`` takes (AdaPM's names)
SCHEMES = ("naive", "preloc", "pool", "local")
#: the distributions keys are drawn from
DISTRIBUTIONS = ("uniform", "log-uniform")


@dataclass(frozen=True)
class SamplingConfig:
    """How a server's workers draw keys (see :meth:`kvps.Server.enable_sampling_support`)."""

    scheme: str
    with_replacement: bool
    lo: int
    hi: int
    seed: int
    distribution: str = "uniform"

    @property
    def signals_intent(self) -> bool:
        """Whether a prepared sample's keys are intended over its clock window ("preloc", "pool")."""
        return self.scheme in ("preloc", "pool")


def sampling_config(
    num_keys: int,
    rank: int,
    scheme: Any,
    with_replacement: Any,
    distribution: Any,
    lo_args: tuple[Any, Any],
    hi_args: tuple[Any, Any],
    seed: Any,
) -> SamplingConfig:
    """Check the arguments of ``enable_sampling_support`` and return the configuration.

    Parameters
    ----------
    num_keys : int
        The server's number of keys.
    rank : int
        This rank (the default seed depends on it).
    scheme, with_replacement, distribution, seed
        As :meth:`kvps.Server.enable_sampling_support` takes them.
    lo_args, hi_args : tuple of (int or None, int or None)
        The range's bounds as given under AdaPM's names (``min``, ``max``) and
        under kvps's keywords (``min_key``, ``max_key``); None where not given.

    Returns
    -------
    SamplingConfig
        The checked configuration.

    Raises
    ------
    TypeError
        A bound given under both names, or a bound or the seed that is not an int.
    ValueError
        Unknown scheme/distribution or an empty/out-of-range key range.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be 'naive', 'preloc', 'pool' or 'local', got {scheme!r}")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be 'uniform' or 'log-uniform', got {distribution!r}")
    if lo_args[0] is not None and lo_args[1] is not None:
        raise TypeError("give min or min_key, not both")
    if hi_args[0] is not None and hi_args[1] is not None:
        raise TypeError("give max or max_key, not both")
    lo_arg = ("min_key", lo_args[1]) if lo_args[1] is not None else ("min", lo_args[0])
    hi_arg = ("max_key", hi_args[1]) if hi_args[1] is not None else ("max", hi_args[0])
    hi = num_keys if hi_arg[1] is None else check_int(hi_arg[1], hi_arg[0], lo=1, hi=num_keys + 1)
    lo = 0 if lo_arg[1] is None else check_int(lo_arg[1], lo_arg[0], lo=0, hi=hi)
    s = (12345 + 7919 * rank) if seed is None else check_int(seed, "seed", lo=0)
    return SamplingConfig(scheme, bool(with_replacement), lo, hi, s, distribution)


class Samples:
    """One worker's key sampler and the samples it prepared.

    Parameters
    ----------
    customer_id : int
        The worker's id (the generator's seed depends on it).
    """

    def __init__(self, customer_id: int) -> None:
        self._customer_id = customer_id
        self._drawn: dict[int, list[Any]] = {}  # sample id -> [keys, how many were pulled]
        self._next = 0
        self._rng: np.random.Generator | None = None

    def draw(self, cfg: SamplingConfig, k: int, owned_keys: Callable[[], Any], rank: int, size: int) -> np.ndarray:
        """Draw ``k`` keys as ``cfg`` says (:meth:`add` keeps them as a sample).

        Parameters
        ----------
        cfg : SamplingConfig
            The server's configuration.
        k : int
            Number of keys (>= 1).
        owned_keys : callable
            Returns the keys this rank holds now (scheme "local" only).
        rank, size : int
            This rank and the number of ranks (the home keys of scheme "local").

        Returns
        -------
        numpy.ndarray
            The keys (int64, contiguous).

        Raises
        ------
        ValueError
            More distinct keys than the candidates hold.
        """
        if self._rng is None:
            self._rng = np.random.default_rng(cfg.seed + 104729 * self._customer_id)
        cand: np.ndarray | None = None  # None: the whole range [lo, hi)
        if cfg.scheme == "local":
            owned = np.asarray(owned_keys(), dtype=np.int64)
            cand = np.sort(owned[(owned >= cfg.lo) & (owned < cfg.hi)])
            if cand.size == 0:  # nothing held here: this rank's home keys
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
        return np.ascontiguousarray(keys, dtype=np.int64)

    def add(self, keys: np.ndarray) -> int:
        """Keep ``keys`` (from :meth:`draw`) as a new sample.

        Parameters
        ----------
        keys : numpy.ndarray
            The sample's keys.

        Returns
        -------
        int
            The sample id.
        """
        sid = self._next
        self._next += 1
        self._drawn[sid] = [keys, 0]
        return sid

    def next_keys(self, sid: int, out: Any) -> np.ndarray:
        """The next ``len(out)`` keys of sample ``sid`` (not yet taken: see :meth:`take`).

        Parameters
        ----------
        sid : int
            A sample id from :meth:`add`.
        out : 1-D int64 numpy array or tensor
            The caller's key buffer (its length is how many keys to take).

        Returns
        -------
        numpy.ndarray
            The keys (a view of the sample).

        Raises
        ------
        KeyError
            Unknown or exhausted sample id.
        TypeError
            ``out`` is not a 1-D int64 array or tensor.
        ValueError
            ``out`` is longer than what remains of the sample.
        """
        if sid not in self._drawn:
            raise KeyError(f"unknown or exhausted sample id {sid}")
        drawn, used = self._drawn[sid]
        if not isinstance(out, (np.ndarray, torch.Tensor)):
            raise TypeError(f"keys must be an int64 numpy array or tensor, got {type(out).__name__}")
        if out.dtype not in (np.int64, torch.int64) or out.ndim != 1:
            raise TypeError(f"keys must be a 1-D int64 array, got dtype {out.dtype}, ndim {out.ndim}")
        m = int(out.shape[0])
        if used + m > len(drawn):
            raise ValueError(f"sample {sid} has {len(drawn) - used} keys left, keys asks for {m}")
        return drawn[used : used + m]

    def take(self, sid: int, out: Any, chunk: np.ndarray) -> None:
        """Write ``chunk`` (from :meth:`next_keys`) into ``out`` and count it as pulled.

        Parameters
        ----------
        sid : int
            The sample id.
        out : 1-D int64 numpy array or tensor
            Receives the keys.
        chunk : numpy.ndarray
            What :meth:`next_keys` returned for ``sid`` and ``out``.
        """
        if isinstance(out, np.ndarray):
            out[:] = chunk
        else:
            out.copy_(torch.from_numpy(chunk))
        drawn, used = self._drawn[sid]
        if used + len(chunk) == len(drawn):
            del self._drawn[sid]
        else:
            self._drawn[sid][1] = used + len(chunk)
