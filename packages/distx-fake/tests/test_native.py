"""The native module builds, loads and agrees with the package metadata."""

from __future__ import annotations

import distkit_common

import distx_fake
from distx_fake import _distx_fake


def test_native_version_matches_package() -> None:
    assert _distx_fake.version() == distx_fake.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _distx_fake.get_num_threads() >= 1
