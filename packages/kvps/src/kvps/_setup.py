"""``setup``: the process-wide configuration a :class:`kvps.Server` is created with.

AdaPM configures the parameter server in two steps, ``setup(num_keys,
num_threads, use_techniques)`` and then the server; kvps keeps that order.
This module holds what ``setup`` recorded and reads the environment's link
rate (``KVPS_LINK_RATE``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from distkit_common.rates import parse_rate
from distkit_common.validate import check_int

from . import _kvps

#: ``use_techniques`` name -> the engine's code
TECHNIQUES: dict[str, int] = dict(_kvps.TECHNIQUES)


@dataclass(frozen=True)
class Config:
    """What :func:`setup` recorded."""

    num_keys: int
    num_threads: int
    technique: str


_config: Config | None = None


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
        ``num_keys``, ``num_threads`` or ``num_channels`` is not an int.
    ValueError
        A value is out of range or ``use_techniques`` is unknown.

    Examples
    --------
    >>> import kvps  # doctest: +SKIP
    >>> kvps.setup(num_keys=1000, num_threads=1)  # doctest: +SKIP
    >>> server = kvps.Server(16)  # doctest: +SKIP
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
    _config = Config(n, t, use_techniques)


def configured() -> Config:
    """The configuration of the last :func:`setup` call.

    Returns
    -------
    Config
        ``num_keys``, ``num_threads`` and ``technique``.

    Raises
    ------
    RuntimeError
        ``setup`` was not called.
    """
    if _config is None:
        raise RuntimeError("call kvps.setup(num_keys, num_threads, use_techniques) before creating a Server")
    return _config


def link_rate() -> float:
    """The link rate between hosts that ``KVPS_LINK_RATE`` gives, in bytes/s.

    tc's syntax (``"1gbit"``, ``"100mbit"``, ``"125MBps"``); ``"off"`` (or
    ``"0"``) weighs no bytes, so the ledger judges intent by engine work alone;
    unset, -1: the server measures the link when it starts.

    Returns
    -------
    float
        The rate in bytes/s, 0 for ``"off"``, -1 when unset.

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
    try:
        return parse_rate(text) / 8
    except ValueError as e:
        raise ValueError(f"KVPS_LINK_RATE: {e}") from None
