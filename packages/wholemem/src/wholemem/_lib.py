"""Library state: ``init_lib`` / ``finalize_lib`` and the checks every entry point runs."""

from __future__ import annotations

import weakref
from typing import Any

_state: dict[str, Any] = {"initialized": False, "finalized": False}
# Live communicators (destroyed by finalize_lib) and TCPStore servers started by get_unique_id.
_communicators: weakref.WeakSet[Any] = weakref.WeakSet()
_servers: dict[str, Any] = {}


def init_lib() -> None:
    """Initialise wholemem (idempotent; also re-initialises after :func:`finalize_lib`).

    Call it before any other wholemem function (the original required it before
    any CUDA call; here it only resets the library state).
    """
    _state["initialized"] = True
    _state["finalized"] = False


def finalize_lib() -> None:
    """Destroy every communicator of this process and stop the rendezvous servers.

    Tensors created before become unusable: any wholemem operation on them raises
    ``RuntimeError``. Memory is released once the tensors are garbage collected.
    """
    for comm in list(_communicators):
        comm._mark_destroyed()
    _communicators.clear()
    _servers.clear()
    _state["initialized"] = False
    _state["finalized"] = True


def require_init(what: str) -> None:
    """Raise ``RuntimeError`` unless the library is initialised.

    Raises
    ------
    RuntimeError
        After :func:`finalize_lib`, or before :func:`init_lib`.
    """
    if _state["finalized"]:
        raise RuntimeError(f"wholemem.{what}: the library was finalized (finalize_lib); call init_lib() again first")
    if not _state["initialized"]:
        raise RuntimeError(f"wholemem.{what}: call wholemem.init_lib() first")
