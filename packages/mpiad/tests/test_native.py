"""The native module builds, loads and agrees with the package metadata."""

from __future__ import annotations

import distkit_common
import mpiad
from mpiad import _mpiad


def test_native_version_matches_package() -> None:
    assert _mpiad.version() == mpiad.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _mpiad.get_num_threads() >= 1


def test_links_the_mpi_that_mpi4py_loaded() -> None:
    from mpi4py import MPI

    assert _mpiad.mpi_library_version() == MPI.Get_library_version()


def test_mpi_initialised_thread_multiple_by_mpi4py() -> None:
    # backward passes may run on autograd's device threads: MPI must allow any thread
    assert _mpiad.thread_level() == 3
