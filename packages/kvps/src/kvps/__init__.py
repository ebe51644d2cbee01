"""AdaPM-style parameter server on MPI with intent-driven relocation and replication."""

from __future__ import annotations

import mpi4py.MPI  # noqa: F401  (initialises MPI and loads libmpi first)

from . import optim
from ._args import KeyRangeError
from ._server import Server
from ._setup import TECHNIQUES, setup
from ._version import __version__
from ._worker import Worker

__all__ = ["TECHNIQUES", "KeyRangeError", "Server", "Worker", "__version__", "optim", "setup"]
