"""The few collectives the graph code needs, over a communicator's public exchange methods.

Payloads are raw bytes and JSON (never pickle). ``comm=None`` stands for a single
process: every collective returns this process's own contribution.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ._comm import Communicator

#: exception types a failure keeps when it is re-raised on the other ranks
_BUILTIN = {e.__name__: e for e in (TypeError, ValueError, IndexError, KeyError, OSError, FileNotFoundError)}


def allgather_bytes(comm: Communicator | None, data: bytes) -> list[bytes]:
    """Collective: every rank's ``data``, in rank order."""
    if comm is None or comm.size == 1:
        return [data]
    size = comm.size
    counts = comm.exchange_counts(torch.full((size,), len(data), dtype=torch.int64)).tolist()
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    recv = comm.all_to_all(payload.repeat(size), [len(data)] * size, counts)
    out, pos = [], 0
    for c in counts:
        out.append(recv[pos : pos + c].numpy().tobytes())
        pos += c
    return out


def allgather_json(comm: Communicator | None, obj: Any) -> list[Any]:
    """Collective: every rank's JSON-serialisable ``obj``, in rank order."""
    return [json.loads(b.decode()) for b in allgather_bytes(comm, json.dumps(obj, sort_keys=True).encode())]


def allgather_int(comm: Communicator | None, value: int) -> list[int]:
    """Collective: every rank's integer, in rank order."""
    if comm is None or comm.size == 1:
        return [int(value)]
    return [int(v) for v in comm.exchange_counts(torch.full((comm.size,), int(value), dtype=torch.int64)).tolist()]


def agree(comm: Communicator | None, step: str, error: BaseException | None) -> None:
    """Collective: raise on every rank when any rank failed ``step``.

    The failing rank re-raises its own exception; the others raise the first failure's
    builtin type (ValueError, TypeError, IndexError, ... else RuntimeError) with the
    message ``"<step> failed on rank R: <Type>: <message>"``, so no rank is left waiting
    in a later collective.
    """
    report = None if error is None else {"type": type(error).__name__, "message": str(error)}
    if comm is None or comm.size == 1:
        if error is not None:
            raise error
        return
    reports = allgather_json(comm, report)
    if error is not None:
        raise error
    for rank, r in enumerate(reports):
        if r is not None:
            kind = _BUILTIN.get(str(r.get("type")), RuntimeError)
            raise kind(f"{step} failed on rank {rank}: {r.get('type')}: {r.get('message')}")


def run_agreed(comm: Communicator | None, step: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on every rank, then :func:`agree` on its outcome; returns its result."""
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # handed to every rank by agree
        agree(comm, step, e)
        raise  # pragma: no cover - agree always raises here
    agree(comm, step, None)
    return result
