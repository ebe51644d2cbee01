"""All ranks agree on failure, and exchange JSON (never pickle) over a communicator.

``comm`` is anything with ``rank``, ``size`` and ``allgather_bytes(bytes) -> list[bytes]``
(a wholemem :class:`~wholemem.Communicator`).
"""

from __future__ import annotations

import builtins
import json
from typing import Any

_TYPES = ("TypeError", "ValueError", "IndexError", "KeyError", "FileNotFoundError", "OSError", "RuntimeError")


class CollectiveError(RuntimeError):
    """Raised on every rank but the failing one when a collective step failed elsewhere.

    ``step`` names the step, ``failures`` maps each failing rank to ``(type name, message)``.
    Instances are also instances of the first failure's builtin exception type.
    """

    def __init__(self, message: str, step: str, failures: dict[int, tuple[str, str]]) -> None:
        super().__init__(message)
        self.step = step
        self.failures = failures


def allgather_json(comm: Any, obj: Any) -> list[Any]:
    """Every rank's JSON-serialisable ``obj``, in rank order."""
    return [json.loads(b) for b in comm.allgather_bytes(json.dumps(obj).encode())]


def _kind(e: BaseException) -> str:
    for name in _TYPES:
        if type(e) is getattr(builtins, name):
            return name
    for name in _TYPES:
        if isinstance(e, getattr(builtins, name)):
            return name
    return "RuntimeError"


def agree(comm: Any, step: str, error: BaseException | None = None) -> None:
    """Collective: return if no rank failed; else the failing rank re-raises ``error`` and
    every other rank raises a :class:`CollectiveError` that is also an instance of the first
    failure's builtin type, with the message ``"<step> failed on rank R: <Type>: <message>"``.
    """
    mine = None if error is None else [_kind(error), str(error)]
    reports = allgather_json(comm, mine)
    failures = {r: (f[0], f[1]) for r, f in enumerate(reports) if f is not None}
    if not failures:
        return
    if error is not None:
        raise error
    rank, (kind, message) = min(failures.items())
    base = getattr(builtins, kind) if kind in _TYPES else RuntimeError
    cls = CollectiveError if base is RuntimeError else type(f"CollectiveError[{kind}]", (CollectiveError, base), {})
    raise cls(f"{step} failed on rank {rank}: {kind}: {message}", step, failures)
