"""Allreduce algorithm choice: the setting (the choice itself is made natively, per call).

Large messages (measurements in docs/packages/mpiad/performance.md, Allreduce algorithms):

* ranks on one node: from ``MPIAD_LARGE_BYTES`` (default 32 MiB) MPI_Reduce +
  MPI_Bcast, which beats Open MPI's default MPI_Allreduce there;
* ranks on several nodes: from ``MPIAD_RING_BYTES`` (default 256 KiB) a
  pipelined ring (reduce-scatter + allgather in pieces of 1 MiB), which moves
  every byte across the network once each way.

``MPIAD_ALLREDUCE=mpi`` keeps MPI_Allreduce everywhere; ``=reduce_bcast`` and
``=ring`` force one algorithm from ``MPIAD_LARGE_BYTES``; ``=auto`` is the
default. Every rank must use the same settings.
"""

from __future__ import annotations

import os

from . import _mpiad
from ._errors import MpiadValueError

MODES: dict[str, int] = {
    "auto": _mpiad.ALGO_AUTO,
    "mpi": _mpiad.ALGO_MPI,
    "reduce_bcast": _mpiad.ALGO_REDUCE_BCAST,
    "ring": _mpiad.ALGO_RING,
}
DEFAULT_LARGE_BYTES = 32 << 20


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise MpiadValueError(f"{name} = {raw!r} is not a number of bytes") from None


def configure(mode: str | None = None, large_bytes: int | None = None, ring_bytes: int | None = None) -> None:
    """Set the algorithms (``None``: from the environment, as at import).

    Parameters
    ----------
    mode : str, optional
        ``"auto"``, ``"mpi"``, ``"reduce_bcast"`` or ``"ring"``.
    large_bytes : int, optional
        Messages from this size use Reduce + Bcast on one node (``"auto"``), or the
        forced algorithm (``"reduce_bcast"``, ``"ring"``).
    ring_bytes : int, optional
        Messages from this size use the ring when the ranks span nodes (``"auto"``).

    Raises
    ------
    ValueError
        Unknown mode, or a negative or non-numeric threshold.
    """
    mode = os.environ.get("MPIAD_ALLREDUCE", "auto") if mode is None else mode
    if mode not in MODES:
        raise MpiadValueError(f"MPIAD_ALLREDUCE / mode = {mode!r} is not one of {sorted(MODES)}")
    if large_bytes is None:
        large_bytes = _env_bytes("MPIAD_LARGE_BYTES", DEFAULT_LARGE_BYTES)
    if ring_bytes is None:
        ring_bytes = _env_bytes("MPIAD_RING_BYTES", _mpiad.RING_BYTES)
    _mpiad.configure_allreduce(MODES[mode], large_bytes, ring_bytes)


def large_bytes() -> int:
    """Messages from this many bytes use the large-message algorithm on one node."""
    return int(_mpiad.allreduce_settings()[1])


def ring_bytes() -> int:
    """Messages from this many bytes use the ring when the ranks span nodes."""
    return int(_mpiad.allreduce_settings()[2])


configure()
