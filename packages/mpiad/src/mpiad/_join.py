"""``JoinDummies``: an autograd dependency without data (mpi4torch's ordering tool).

Below the communicator and the handles (both use it); scriptable (TorchScript).
"""

from __future__ import annotations

import torch

from . import _functions as F
from ._errors import MpiadTypeError

Tensor = torch.Tensor

_is_compiling = torch.compiler.is_compiling
_is_scripting = torch.jit.is_scripting  # (TorchScript: the constant True; Python: False)


def JoinDummies(loopthrough: Tensor, dummies: list[Tensor]) -> Tensor:
    """Return ``loopthrough`` unchanged, but make autograd see a dependency on ``dummies``.

    The dummies receive zero gradients (after ``loopthrough``'s gradient is known),
    which orders communication in the backward pass. Scriptable (TorchScript).

    Parameters
    ----------
    loopthrough : torch.Tensor
        The tensor to return.
    dummies : list of torch.Tensor
        The tensors it should depend on (``handle.dummy`` for a :class:`WaitHandle`).

    Returns
    -------
    torch.Tensor
        ``loopthrough`` (the same values; under autograd a new node depending on ``dummies``).

    Raises
    ------
    TypeError
        ``loopthrough`` or an entry of ``dummies`` is not a tensor.

    Examples
    --------
    >>> import torch, mpiad
    >>> comm = mpiad.COMM_WORLD
    >>> x = torch.ones(3, requires_grad=True)
    >>> h = comm.Isend(x, (comm.rank + 1) % comm.size, 0)
    >>> y = mpiad.JoinDummies(2 * x, [h.dummy])  # y's backward also runs the Isend's
    """
    if _is_scripting():
        return torch.ops.mpiad.join_dummies(loopthrough, dummies)
    else:
        if not isinstance(loopthrough, torch.Tensor):
            raise MpiadTypeError(f"JoinDummies: loopthrough must be a torch.Tensor, got {type(loopthrough).__name__}")
        ds = list(dummies) if isinstance(dummies, (list, tuple)) else None
        if ds is None:
            raise MpiadTypeError(f"JoinDummies: dummies must be a list of tensors, got {type(dummies).__name__}")
        for i, d in enumerate(ds):
            if not isinstance(d, torch.Tensor):
                raise MpiadTypeError(
                    f"JoinDummies: dummies[{i}] must be a torch.Tensor, got {type(d).__name__} (pass handle.dummy for handles)"
                )
        if _is_compiling():
            return torch.ops.mpiad.join_dummies(loopthrough, ds)
        if torch.is_grad_enabled() and any(d.requires_grad for d in ds):
            return F.JoinDummies.apply(loopthrough, *ds)
        return loopthrough
