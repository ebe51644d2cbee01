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
    """Tell whether debug mode is on (``MPIAD_DEBUG=1`` at import, or :func:`mpiad.set_debug`).

    Returns
    -------
    bool
        ``True`` while every collective checks that all ranks called it alike.
    """
    return state.on


def set_debug(flag: bool | None) -> None:
    """Switch debug mode on/off for this process (``None``: back to ``MPIAD_DEBUG``).

    Every rank must use the same setting (debug mode adds a collective).

    Parameters
    ----------
    flag : bool or None
        ``True`` / ``False``; ``None`` goes back to what ``MPIAD_DEBUG`` says.
    """
    state.on = _env_debug() if flag is None else bool(flag)
