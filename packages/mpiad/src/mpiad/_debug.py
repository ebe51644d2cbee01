"""Debug mode: the switch (``MPIAD_DEBUG``, :func:`set_debug`); the checks are in ``_signatures``."""

from __future__ import annotations

import os


def _env_debug() -> bool:
    return os.environ.get("MPIAD_DEBUG", "0") not in ("", "0", "false", "False")


class _State:
    """One mutable flag object: hot paths read ``state.on`` without a function call."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = _env_debug()


state = _State()


def debug_enabled() -> bool:
    """Whether debug mode is on (``MPIAD_DEBUG=1`` at import, or :func:`mpiad.set_debug`)."""
    return state.on


def set_debug(flag: bool | None) -> None:
    """Switch debug mode on/off for this process (``None``: back to ``MPIAD_DEBUG``).

    Every rank must use the same setting (debug mode adds a collective).
    """
    state.on = _env_debug() if flag is None else bool(flag)
