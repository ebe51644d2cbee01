"""The native module builds, loads and agrees with the package metadata."""

from __future__ import annotations

import distkit_common
import kvps
from kvps import _kvps


def test_native_version_matches_package() -> None:
    assert _kvps.version() == kvps.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _kvps.get_num_threads() >= 1


def test_links_the_mpi_that_mpi4py_loaded() -> None:
    from mpi4py import MPI

    assert _kvps.mpi_library_version() == MPI.Get_library_version()
