from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def cmake_dir() -> Path:
    """Folder holding ``distkit_common-config.cmake`` (pass it as ``distkit_common_DIR``)."""
    return _HERE / "cmake"


def include_dir() -> Path:
    """Folder holding the ``distkit/*.hpp`` headers."""
    return _HERE / "include"
