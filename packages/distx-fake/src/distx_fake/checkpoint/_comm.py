"""The ranks saving or loading together, as a ``distkit_common.collective`` group.

JSON travels between ranks through ``distkit_common.collective`` (never pickled); failures
are agreed on with ``collective.agree`` / ``all_ranks``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from distkit_common import collective


class _Alone:
    """This process alone (``no_dist``), as a collective group."""

    rank = 0
    size = 1

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [data]


class Comm:
    """Rank, size and JSON exchange of the ranks saving together."""

    def __init__(self, group: Any = None, *, alone: bool = False) -> None:
        self.on = not alone and dist.is_available() and dist.is_initialized()
        self.pg = group
        self.group: Any = collective.as_group(group if group is not None else None) if self.on else _Alone()
        self.rank = self.group.rank
        self.size = self.group.size

    def all_gather(self, obj: Any) -> list[Any]:
        return collective.allgather_json(obj, self.group)

    def broadcast(self, obj: Any) -> Any:
        """``obj`` of rank 0 on every rank."""
        return collective.bcast_json(obj, self.group, root=0)
