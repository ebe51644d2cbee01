from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def cmake_dir() -> Path:
    """Folder holding ``distkit_common-config.cmake`` (pass it as ``distkit_common_DIR``).

    Returns
    -------
    pathlib.Path
        ``<site-packages>/distkit_common/cmake``.
    """
    return _HERE / "cmake"


def include_dir() -> Path:
    """Folder holding the ``distkit/*.hpp`` headers.

    Returns
    -------
    pathlib.Path
        ``<site-packages>/distkit_common/include`` (add it to the include path).
    """
    return _HERE / "include"
