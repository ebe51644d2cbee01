"""Content checks of CSR arrays, run collectively on every rank's own part.

The samplers index ``col`` with the values of ``row_ptr``, so a row pointer read from a
file or handed in by a user is checked before any sampling: it starts at 0, never
decreases, ends at the number of edges; column ids lie in ``[0, node_count)``; edge
weights are finite and non-negative. Each rank checks its rows of each array (under the
partition plan) and the ranks agree on the outcome, so a bad part raises on every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from ._comm import WholeMemoryCommunicator
from ._graph_collective import agree
from ._graph_tensors import device_of, local_part, read_rows


def _boundary_next(row_ptr: Any, first: int, n_local: int) -> torch.Tensor:
    """The row pointer entry right after this rank's part (empty at the end); every rank
    calls the gather (collective for NCCL tensors)."""
    nxt = first + n_local
    idx = torch.tensor([nxt] if n_local and nxt < int(row_ptr.shape[0]) else [], dtype=torch.int64)
    return read_rows(row_ptr, idx.to(device_of(row_ptr))).cpu()


def _check_row_ptr_part(local: torch.Tensor, first: int, nxt: torch.Tensor, num_edges: int, total: int) -> None:
    n = int(local.numel())
    if n == 0:
        return
    if first == 0 and int(local[0]) != 0:
        raise ValueError(f"csr_row_ptr[0] must be 0, got {int(local[0])}")
    steps = local[1:] < local[:-1]
    if bool(steps.any()):
        pos = int(torch.nonzero(steps)[0, 0]) + 1
        raise ValueError(
            f"csr_row_ptr must not decrease: csr_row_ptr[{first + pos}] = {int(local[pos])} < "
            f"csr_row_ptr[{first + pos - 1}] = {int(local[pos - 1])}"
        )
    if nxt.numel() and int(nxt[0]) < int(local[-1]):
        raise ValueError(
            f"csr_row_ptr must not decrease: csr_row_ptr[{first + n}] = {int(nxt[0])} < "
            f"csr_row_ptr[{first + n - 1}] = {int(local[-1])}"
        )
    if first + n == total and int(local[-1]) != num_edges:
        raise ValueError(
            f"csr_row_ptr[{total - 1}] must equal the number of edges {num_edges} (len(csr_col_ind)), "
            f"got {int(local[-1])}"
        )
    hi = int(local.max())
    if hi > num_edges:
        pos = int(torch.nonzero(local > num_edges)[0, 0])
        raise ValueError(f"csr_row_ptr[{first + pos}] = {hi} exceeds the number of edges {num_edges}")


def _check_col_part(local: torch.Tensor, first: int, num_nodes: int) -> None:
    if local.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(local))
    if lo < 0 or hi >= num_nodes:
        bad = (local < 0) | (local >= num_nodes)
        pos = int(torch.nonzero(bad)[0, 0])
        raise IndexError(f"csr_col_ind[{first + pos}] = {int(local[pos])} is out of range [0, {num_nodes})")


def check_csr_content(comm: WholeMemoryCommunicator | None, row_ptr: Any, col: Any) -> None:
    """Collective: the row pointer and column ids form a valid CSR (see the module doc).

    Raises
    ------
    ValueError
        A malformed row pointer (on every rank).
    IndexError
        A column id outside ``[0, node_count)`` (on every rank).
    """
    err: Exception | None = None
    rp_local, rp_first = local_part(row_ptr)
    nxt = _boundary_next(row_ptr, rp_first, int(rp_local.numel()))
    try:
        _check_row_ptr_part(rp_local, rp_first, nxt, int(col.shape[0]), int(row_ptr.shape[0]))
        col_local, col_first = local_part(col)
        _check_col_part(col_local, col_first, int(row_ptr.shape[0]) - 1)
    except Exception as e:
        err = e
    agree(comm, "GraphStructure: CSR check", err)


def check_weights_content(comm: WholeMemoryCommunicator | None, name: str, weights: Any) -> None:
    """Collective: edge weights are finite and >= 0 (ValueError on every rank otherwise)."""
    err: Exception | None = None
    try:
        local, first = local_part(weights)
        if local.numel():
            bad = ~torch.isfinite(local) | (local < 0)
            if bool(bad.any()):
                pos = int(torch.nonzero(bad)[0, 0])
                raise ValueError(
                    f"edge attribute {name!r}: weights must be finite and >= 0, got {float(local[pos])} at edge "
                    f"{first + pos}"
                )
    except Exception as e:
        err = e
    agree(comm, f"GraphStructure: edge weights {name!r}", err)
