"""Autograd-aware MPI for PyTorch: a drop-in replacement for mpi4torch.

``import mpiad`` initialises MPI through mpi4py (so both coexist), then offers
mpi4torch's API: the ``MPI_*`` op constants, :data:`COMM_WORLD`,
:func:`comm_from_mpi4py`, :func:`JoinDummies`, :func:`JoinDummiesHandle`,
:class:`WaitHandle` and the differentiable :class:`Communicator` methods.
"""

from __future__ import annotations

import mpi4py.MPI as _MPI  # initialises MPI (MPI_THREAD_MULTIPLE) and loads libmpi first

from . import _library  # noqa: F401  (registers the torch.compile custom ops)
from ._comm import Communicator, JoinDummies, JoinDummiesHandle, MPI_Communicator, comm_from_mpi4py
from ._constants import (
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
from ._errors import MpiadTypeError, MpiadValueError
from ._p2p import WaitHandle
from ._raw import cuda_aware, deactivate_cuda_aware_mpi_support, debug_enabled, empty_cache, set_debug
from ._version import __version__

#: The world communicator (``MPI_COMM_WORLD``).
COMM_WORLD: Communicator = Communicator(_MPI.COMM_WORLD)

__all__ = [
    "COMM_WORLD",
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
