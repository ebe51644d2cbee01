"""The autograd pieces every collective shares: whether autograd records, the guard of
in-place ops, and JoinDummies' Function.

The per-collective Functions live with their backward rules (``_reductions``, ``_gathers``).
"""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor


def needs_grad(t: Tensor) -> bool:
    """Whether autograd records an operation on ``t``: a forward takes the autograd
    Function, a backward formula records a graph (``create_graph=True``).

    Parameters
    ----------
    t : torch.Tensor
        An input or a gradient.

    Returns
    -------
    bool
        ``t.requires_grad`` with grad mode on.
    """
    return t.requires_grad and torch.is_grad_enabled()


class EagerComm:
    """The communicator of an eager backward rule; the base of the families' ``EagerBackend``.

    Under ``create_graph=True`` (grad mode on inside backward) the communication
    goes through the autograd Functions again, so the backward itself is
    differentiable (double backward, Hessian-vector products), as in mpi4torch,
    whose backward nodes called its differentiable ops.

    Parameters
    ----------
    comm : int
        The MPI communicator handle.
    rank : int, optional
        This process's rank in it (only the rules that use it need it).
    size : int, optional
        Its size (only the rules that use it need it).
    """

    def __init__(self, comm: int, rank: int = -1, size: int = 0) -> None:
        self.comm = comm
        self.rank = rank
        self.size = size


class NoInplaceReuse(torch.autograd.Function):
    """Takes over the history of a tensor passed to an in-place op; using it raises."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, opname: str) -> Tensor:
        ctx.mark_dirty(x)
        ctx.opname = opname
        return x

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[None, None]:
        raise RuntimeError(
            "Reuse of variables passed to in-place MPI kernels not supported! Try using the return value "
            f"(mpiad: a tensor passed to the in-place {ctx.opname} was used again afterwards; its contents were "
            f"overwritten: use the return value of {ctx.opname} instead)."
        )


class JoinDummies(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, *dummies: Tensor) -> Tensor:
        ctx.metas = [(d.shape, d.dtype, d.device) for d in dummies]
        return x.detach()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        return (g, *(torch.zeros(s, dtype=dt, device=dev) for s, dt, dev in ctx.metas))
