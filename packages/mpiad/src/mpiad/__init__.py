"""Autograd-aware MPI collectives for PyTorch (a drop-in for mpi4torch)."""

from __future__ import annotations

import mpi4py.MPI  # noqa: F401  (initialises MPI and loads libmpi first)

from . import _mpiad
from ._version import __version__

__all__ = ["__version__"]
