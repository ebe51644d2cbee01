"""The native module builds, loads and agrees with the package metadata."""

from __future__ import annotations

import distkit_common

import shardlayers
from shardlayers import _shardlayers


def test_native_version_matches_package() -> None:
    assert _shardlayers.version() == shardlayers.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _shardlayers.get_num_threads() >= 1
