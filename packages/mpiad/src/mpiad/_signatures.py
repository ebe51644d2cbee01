"""Call signatures: what each rank called, exchanged as a few int64s.

The ops that exchange sizes anyway (Gather, Scatter, Alltoall, ...) send their
signature as that header, so every rank can check every other rank's arguments
and raise the same error before data moves. In debug mode every collective
(blocking or not) exchanges its signature first, so mismatched calls raise on
every rank instead of hanging or corrupting data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from distkit_common.dtypes import NAMES

from . import _mpiad
from ._checks import dtype_code
from ._debug import state as _debug
from ._errors import MpiadValueError

Tensor = torch.Tensor

MAXDIM = 16

# signature ids of the collectives; the non-blocking variants have ids of their own,
# so an Iallreduce matched with an Allreduce is a mismatch too
OPNAMES = {
    1: "Allreduce",
    2: "Bcast_",
    3: "Reduce_",
    4: "Gather",
    5: "Allgather",
    6: "Scatter",
    7: "Alltoall",
    8: "Reduce_scatter",
    101: "Iallreduce",
    102: "Ibcast_",
    103: "Ireduce_",
    104: "Igather",
    105: "Iallgather",
    106: "Iscatter",
    107: "Ialltoall",
    108: "Ireduce_scatter",
}
OP_ALLREDUCE, OP_BCAST, OP_REDUCE, OP_GATHER, OP_ALLGATHER, OP_SCATTER, OP_ALLTOALL, OP_REDUCE_SCATTER = range(1, 9)
#: added to an op id for its non-blocking variant
NONBLOCKING = 100


def signature(opid: int, t: Tensor | None, a: int = 0, b: int = 0, c: int = 0) -> list[int]:
    if t is None:
        return [opid, -1, -1, *([-1] * MAXDIM), a, b, c]
    if t.dim() > MAXDIM:
        raise MpiadValueError(f"tensors with more than {MAXDIM} dimensions are not supported, got {t.dim()}")
    shape = list(t.shape) + [-1] * (MAXDIM - t.dim())
    return [opid, dtype_code(t), t.dim(), *shape, a, b, c]


def describe(sig: Sequence[int]) -> str:
    opid, code, ndim = sig[0], sig[1], sig[2]
    name = OPNAMES.get(opid, f"op#{opid}")
    if code < 0:
        return f"{name}()"
    shape = list(sig[3 : 3 + ndim])
    a, b, c = sig[3 + MAXDIM : 6 + MAXDIM]
    return f"{name}({NAMES.get(code, code)}{shape}, args=({a}, {b}, {c}))"


def exchange(comm: int, sig: list[int]) -> list[list[int]]:
    """Every rank's signature (one MPI_Allgather of small ints)."""
    flat = _mpiad.allgather_i64(comm, sig)
    n = len(sig)
    return [flat[i : i + n] for i in range(0, len(flat), n)]


def check_signatures(sigs: list[list[int]], *, free_axis: int | None = None, shapes: bool = True) -> None:
    """Raise RuntimeError on every rank when the ranks called different things.

    ``free_axis``: a dimension whose size may differ between ranks; ``shapes``:
    whether shapes must match at all.
    """
    ref = sigs[0]
    for r, s in enumerate(sigs):
        bad = s[0] != ref[0] or s[1] != ref[1] or s[3 + MAXDIM : 6 + MAXDIM] != ref[3 + MAXDIM : 6 + MAXDIM]
        if shapes and not bad:
            bad = s[2] != ref[2] or any(
                x != y for i, (x, y) in enumerate(zip(s[3 : 3 + MAXDIM], ref[3 : 3 + MAXDIM])) if i != free_axis
            )
        if bad:
            lines = "\n".join(f"  rank {i}: {describe(x)}" for i, x in enumerate(sigs))
            raise RuntimeError(f"mpiad: ranks called mismatching collectives (rank {r} differs from rank 0):\n{lines}")


def debug_check(comm: int, opid: int, t: Tensor | None, a: int = 0, b: int = 0, c: int = 0, **kw: Any) -> None:
    """In debug mode: exchange and compare this call's signature (a collective)."""
    if _debug.on:
        check_signatures(exchange(comm, signature(opid, t, a, b, c)), **kw)
