"""Allreduce algorithm choice: the setting (the choice itself is made natively, per call).

From ``MPIAD_LARGE_BYTES`` (default 32 MiB) a communicator whose ranks share one
node uses MPI_Reduce + MPI_Bcast instead of MPI_Allreduce (measurements in the
README's benchmark section). ``MPIAD_ALLREDUCE=mpi`` keeps MPI_Allreduce
everywhere, ``=reduce_bcast`` forces the other, ``=auto`` is the default.
Every rank must use the same setting.
"""

from __future__ import annotations

import os

from . import _mpiad
from ._errors import MpiadValueError

MODES: dict[str, int] = {
    "auto": _mpiad.ALGO_AUTO,
    "mpi": _mpiad.ALGO_MPI,
    "reduce_bcast": _mpiad.ALGO_REDUCE_BCAST,
}
DEFAULT_LARGE_BYTES = 32 << 20


def configure(mode: str | None = None, large_bytes: int | None = None) -> None:
    """Set the algorithm (``None``: from the environment, as at import).

    Raises
    ------
    ValueError
        Unknown mode or a negative threshold.
    """
    mode = os.environ.get("MPIAD_ALLREDUCE", "auto") if mode is None else mode
    if mode not in MODES:
        raise MpiadValueError(f"MPIAD_ALLREDUCE / mode = {mode!r} is not one of {sorted(MODES)}")
    if large_bytes is None:
        large_bytes = int(os.environ.get("MPIAD_LARGE_BYTES", str(DEFAULT_LARGE_BYTES)))
    _mpiad.configure_allreduce(MODES[mode], large_bytes)


def large_bytes() -> int:
    """Messages from this many bytes use the large-message algorithm."""
    return int(_mpiad.allreduce_settings()[1])


configure()
