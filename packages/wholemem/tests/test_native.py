"""The native module builds, loads and agrees with the package metadata."""

from __future__ import annotations

import distkit_common

import wholemem
from wholemem import _wholemem


def test_native_version_matches_package() -> None:
    assert _wholemem.version() == wholemem.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _wholemem.get_num_threads() >= 1
