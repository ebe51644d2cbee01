"""Library state: ``init_lib`` / ``finalize_lib`` and the checks every entry point runs."""

from __future__ import annotations

import weakref
from typing import Any

state: dict[str, Any] = {"initialized": False, "finalized": False}
# Live communicators (destroyed by finalize_lib) and TCPStore servers started by get_unique_id.
communicators: weakref.WeakSet[Any] = weakref.WeakSet()
servers: dict[str, Any] = {}


def init_lib() -> None:
    """Initialise wholemem (idempotent; also re-initialises after :func:`finalize_lib`).

    Call it before any other wholemem function (the original required it before
    any CUDA call; here it only resets the library state).
    """
    state["initialized"] = True
    state["finalized"] = False


def finalize_lib() -> None:
    """Destroy every communicator of this process and stop the rendezvous servers.

    Tensors created before become unusable: any wholemem operation on them raises
    ``RuntimeError``. Memory is released once the tensors are garbage collected.
    """
    for comm in list(communicators):
        comm.close_locally()
    communicators.clear()
    servers.clear()
    state["initialized"] = False
    state["finalized"] = True


def require_init(what: str) -> None:
    """Raise ``RuntimeError`` unless the library is initialised.

    Raises
    ------
    RuntimeError
        After :func:`finalize_lib`, or before :func:`init_lib`.
    """
    if state["finalized"]:
        raise RuntimeError(f"wholemem.{what}: the library was finalized (finalize_lib); call init_lib() again first")
    if not state["initialized"]:
        raise RuntimeError(f"wholemem.{what}: call wholemem.init_lib() first")
