"""The few collectives the graph code needs, on distkit-common's agreement helpers.

A :class:`WholeMemoryCommunicator` is a ``distkit_common.collective`` group (``rank``, ``size``,
``allgather_bytes``); payloads are JSON, never pickle. ``comm=None`` stands for a single
process: every collective returns this process's own contribution.
"""

from __future__ import annotations

from typing import Any

from distkit_common import collective

from ._comm import WholeMemoryCommunicator


def allgather_json(comm: WholeMemoryCommunicator | None, obj: Any) -> list[Any]:
    """Collective: every rank's JSON-serialisable ``obj``, in rank order."""
    if comm is None:  # this process alone (never distkit-common's default: the torch world group)
        return [obj]
    return collective.allgather_json(obj, comm)


def allgather_int(comm: WholeMemoryCommunicator | None, value: int) -> list[int]:
    """Collective: every rank's integer, in rank order."""
    return [int(v) for v in allgather_json(comm, int(value))]


def agree(comm: WholeMemoryCommunicator | None, step: str, error: BaseException | None) -> None:
    """Collective: raise on every rank when any rank failed ``step``.

    The failing rank re-raises its own exception; the others raise a
    ``distkit_common.collective.CollectiveError`` that is also an instance of the first
    failure's builtin type (ValueError, TypeError, IndexError, ...), with the message
    ``"<step> failed on rank R: <Type>: <message>"``, so no rank is left waiting in a
    later collective.
    """
    if comm is None:
        if error is not None:
            raise error
        return
    collective.agree(comm, step, error)


def run_agreed(comm: WholeMemoryCommunicator | None, step: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on every rank, then :func:`agree` on its outcome; returns its result."""
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # handed to every rank by agree
        agree(comm, step, e)
        raise  # pragma: no cover - agree always raises here
    agree(comm, step, None)
    return result
