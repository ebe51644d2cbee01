"""Communicators by integer handle: how a compiled op (which carries only the handle) finds its
communicator's rank and size.

Below both the communicator (which registers itself on construction) and the custom ops of
``_library`` (which look it up), so neither imports the other.
"""

from __future__ import annotations

from typing import Protocol

from ._errors import MpiadValueError


class Registered(Protocol):
    """What the compiled ops read of a registered communicator."""

    @property
    def handle(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...


_REGISTRY: dict[int, Registered] = {}


def register(comm: Registered) -> None:
    """Make ``comm`` findable by :func:`lookup` under its MPI handle.

    Parameters
    ----------
    comm : Registered
        A communicator (its ``handle``, ``rank`` and ``size``).
    """
    _REGISTRY[comm.handle] = comm


def lookup(handle: int) -> Registered:
    """The communicator registered under ``handle`` (used by the compiled ops).

    Parameters
    ----------
    handle : int
        An MPI communicator handle (``Communicator.handle``).

    Returns
    -------
    Registered
        The :class:`mpiad.Communicator` made for that handle.

    Raises
    ------
    ValueError
        No communicator was made for ``handle``.
    """
    try:
        return _REGISTRY[handle]
    except KeyError:
        raise MpiadValueError(f"no mpiad communicator with handle {handle:#x}") from None
