"""What every ``torch.library`` custom op of mpiad shares: the plumbing of the compiled path.

Under ``torch.compile`` (and TorchScript) the communicator calls the ``torch.ops.mpiad``
custom ops. Each collective's op is defined next to its eager autograd Function and its
backward rule (``_reductions``, ``_gathers``); this module holds what they all use: the
rank and size of a communicator handle, the shape check of the real kernels, the
``join_dummies`` op, and the two measures that keep collectives in program order.

Each op is functional (a new output, the input untouched; ``Bcast_`` / ``Reduce_`` are
therefore functionalised inside compiled code), has a fake kernel for tracing and, as its
autograd formula, the collective's backward rule run on the custom ops themselves, so a
compiled backward graph contains the matching communication. The real kernels validate
their arguments as the communicator's methods do (TorchScript calls them directly, without
the method's Python checks); a bad argument raises before any communication.

Fake kernels cannot see the other ranks, so compiled code assumes equal sizes along gather
axes and non-root ``Scatter`` inputs shaped like root's tensor; the real kernel raises
``ValueError`` when that does not hold.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._library.effects import EffectType

from ._errors import MpiadValueError
from ._registry import lookup

Tensor = torch.Tensor


def rank_size(comm: int) -> tuple[int, int]:
    """This process's rank and the size of the communicator with handle ``comm``.

    Parameters
    ----------
    comm : int
        A communicator handle (``Communicator.handle``).

    Returns
    -------
    tuple of (int, int)
        ``(rank, size)``.

    Raises
    ------
    ValueError
        No communicator was made for ``comm``.
    """
    c = lookup(comm)
    return c.rank, c.size


def check_shape(out: Tensor, want: list[int], what: str) -> Tensor:
    """``out``, after checking that it has the shape the fake kernel promised.

    Parameters
    ----------
    out : torch.Tensor
        A real kernel's result.
    want : list of int
        The shape the fake kernel computed.
    what : str
        The collective, for the message.

    Returns
    -------
    torch.Tensor
        ``out``.

    Raises
    ------
    ValueError
        The shapes differ (the ranks' sizes were not what compiled code assumes).
    """
    if list(out.shape) != want:
        raise MpiadValueError(
            f"mpiad (torch.compile): {what} produced shape {list(out.shape)}, but the compiled graph assumed "
            f"{want}; compiled code needs equal sizes along gather axes on every rank (and non-root Scatter inputs "
            f"shaped like root's tensor)"
        )
    return out


# JoinDummies under torch.compile / TorchScript
@torch.library.custom_op("mpiad::join_dummies", mutates_args=())
def join_dummies(x: Tensor, dummies: list[Tensor]) -> Tensor:
    return x.clone()


@join_dummies.register_fake
def _(x: Tensor, dummies: list[Tensor]) -> Tensor:
    return torch.empty_like(x)


def _join_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.n = len(inputs[1])
    ctx.dummies = [(d.shape, d.dtype, d.device) for d in inputs[1]]


def _join_bwd(ctx: Any, g: Tensor) -> tuple[Tensor, list[Tensor]]:
    return g, [join(torch.zeros(s, dtype=dt, device=dev), [g]) for s, dt, dev in ctx.dummies]


join_dummies.register_autograd(_join_bwd, setup_context=_join_setup)


def join(x: Tensor, dummies: list[Tensor]) -> Tensor:
    """``x`` with an autograd (and ordering) dependency on ``dummies``: the ``join_dummies`` op."""
    return torch.ops.mpiad.join_dummies(x, dummies)


def ordered(op: Any) -> None:
    """Make the custom op ``op`` keep program order among the collectives.

    Collectives must run in the same order on every rank. The ops are functional, so a
    compiler may reorder independent ones. ORDERED effects make AOTAutograd thread a
    token through them (program order in the FX graphs, forward and backward) ...
    (continued in :func:`keep_collective_order`).

    Parameters
    ----------
    op : torch.library.CustomOpDef
        A collective's custom op.
    """
    op.register_effect(EffectType.ORDERED)


def keep_collective_order() -> None:
    """... but inductor's peak-memory reordering (torch 2.13) ignores that token chain
    and reorders the collectives by estimated memory, which differs between ranks
    whose shapes differ (a Gather root, uneven sizes): rank 0 entered an Allgather
    while rank 1 waited in an Allreduce (a deadlock, reproduced by
    tests/scripts/compiled.py). So tracing any mpiad collective switches that pass
    off, process-wide (it only trades peak memory, never values)."""
    import torch._inductor.config as cfg

    if getattr(cfg, "reorder_for_peak_memory", False):
        cfg.reorder_for_peak_memory = False
