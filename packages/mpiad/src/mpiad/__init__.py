"""Autograd-aware MPI for PyTorch: a drop-in replacement for mpi4torch.

``import mpiad`` initialises MPI through mpi4py (so both coexist), then offers
mpi4torch's API: the ``MPI_*`` op constants, :data:`COMM_WORLD`,
:func:`comm_from_mpi4py`, :func:`JoinDummies`, :func:`JoinDummiesHandle`,
:class:`WaitHandle` and the differentiable :class:`Communicator` methods.
"""

from __future__ import annotations

import atexit as _atexit

import mpi4py.MPI as _MPI  # noqa: F401  (initialises MPI (MPI_THREAD_MULTIPLE) and loads libmpi first)

from . import _mpiad
from ._algo import configure as _configure_allreduce  # noqa: F401  (reads MPIAD_ALLREDUCE / MPIAD_LARGE_BYTES)
from ._comm import COMM_WORLD, Communicator, MPI_Communicator, comm_from_mpi4py
from ._constants import (
    MPI_AVG,
    MPI_BAND,
    MPI_BOR,
    MPI_BXOR,
    MPI_LAND,
    MPI_LOR,
    MPI_LXOR,
    MPI_MAX,
    MPI_MAXLOC,
    MPI_MIN,
    MPI_MINLOC,
    MPI_PROD,
    MPI_SUM,
)
from ._data_parallel import DataParallel
from ._debug import debug_enabled, set_debug
from ._errors import MpiadTypeError, MpiadValueError
from ._handles import JoinDummiesHandle, WaitHandle
from ._join import JoinDummies
from ._pool import empty_cache
from ._staging import cuda_aware, deactivate_cuda_aware_mpi_support
from ._version import __version__

# the non-blocking engine's worker finishes its queue before mpi4py finalises MPI
_atexit.register(_mpiad.shutdown)

__all__ = [
    "COMM_WORLD",
    "MPI_AVG",
    "MPI_BAND",
    "MPI_BOR",
    "MPI_BXOR",
    "MPI_LAND",
    "MPI_LOR",
    "MPI_LXOR",
    "MPI_MAX",
    "MPI_MAXLOC",
    "MPI_MIN",
    "MPI_MINLOC",
    "MPI_PROD",
    "MPI_SUM",
    "MpiadTypeError",
    "MpiadValueError",
    "Communicator",
    "DataParallel",
    "JoinDummies",
    "JoinDummiesHandle",
    "MPI_Communicator",
    "WaitHandle",
    "__version__",
    "comm_from_mpi4py",
    "cuda_aware",
    "deactivate_cuda_aware_mpi_support",
    "debug_enabled",
    "empty_cache",
    "set_debug",
]
