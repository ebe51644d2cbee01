"""Moving rows to and from the ranks that own them (NCCL / DISTRIBUTED tensors, Embedding.step).

Rows are partitioned evenly over the ranks (``_layout.rows_per_rank``); a request is
bucketed by owner with a stable sort, the counts are exchanged, then the indices and
rows travel by all-to-all over the communicator's group (gloo for host tensors, the
device group for GPU tensors). Rows travel as bytes, so every dtype uses one path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Route:
    """Where the rows of one request go: ``order`` sorts the request by owner; the sorted
    request sends ``send[r]`` rows to rank r and receives ``recv[r]`` from it."""

    order: torch.Tensor
    send: list[int]
    recv: list[int]


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, row bytes]`` uint8 (a view when contiguous)."""
    x = x.reshape(x.shape[0], math.prod(x.shape[1:]))
    if x.shape[1] == 0 or x.shape[0] == 0:
        return torch.empty((x.shape[0], x.shape[1] * x.element_size()), dtype=torch.uint8, device=x.device)
    return x.contiguous().view(torch.uint8)


def from_bytes(b: torch.Tensor, dtype: torch.dtype, n: int, row_shape: tuple[int, ...]) -> torch.Tensor:
    """The inverse of :func:`as_bytes`: ``n`` rows of ``row_shape`` and ``dtype``."""
    if b.numel() == 0:
        return torch.empty((n, *row_shape), dtype=dtype, device=b.device)
    return b.contiguous().view(dtype).reshape(n, *row_shape)


def route(comm: Any, rows: torch.Tensor, rows_per_rank: int) -> tuple[Route, torch.Tensor]:
    """Collective: send every global row index in ``rows`` (int64) to its owner.

    Returns the route and the indices this rank received (global, grouped by sender).
    """
    owner = torch.div(rows, rows_per_rank, rounding_mode="floor")
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=comm.size)
    recv_counts = comm.exchange_counts(send_counts)
    r = Route(order, send_counts.tolist(), recv_counts.tolist())
    received = comm.all_to_all(rows[order], r.send, r.recv)
    return r, received


def send_rows(comm: Any, r: Route, values: torch.Tensor) -> torch.Tensor:
    """Collective: rows of ``values`` (one per request entry, request order) to their owners;
    returns the received rows as bytes, grouped by sender."""
    sent = as_bytes(values)[r.order] if values.numel() else as_bytes(values)
    received: torch.Tensor = comm.all_to_all(sent, r.send, r.recv)
    return received


def return_rows(comm: Any, r: Route, rows: torch.Tensor) -> torch.Tensor:
    """Collective: rows answering the received indices back to the requesters; returns them
    as bytes in the sorted request order (``order``)."""
    back: torch.Tensor = comm.all_to_all(as_bytes(rows), r.recv, r.send)
    return back
