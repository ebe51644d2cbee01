"""ParallelCrossEntropyLoss and RegisterParallelDim."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._tag import check_dim, tag_output
from . import functional as PF


class ParallelCrossEntropyLoss(nn.Module):
    """Cross-entropy over logits whose class dim is split (see :func:`parallel_cross_entropy`).

    Parameters
    ----------
    weight : torch.Tensor, optional
        Full per-class weight ``[C]``.
    ignore_index : int
        Ignored target value.
    reduction : {'mean', 'sum', 'none'}
        Reduction.
    label_smoothing : float
        Label smoothing in ``[0, 1]``.

    Raises
    ------
    ValueError
        Bad ``reduction`` or ``label_smoothing``.
    TypeError
        If ``weight`` is not a tensor.
    """

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"reduction must be one of ('none', 'mean', 'sum'), got {reduction!r}")
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
        if weight is not None and not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a tensor or None, got {type(weight).__name__}")
        self.register_buffer("weight", weight)
        self.weight: torch.Tensor | None
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Loss of ``input`` (logits, class dim last and split) against ``target``."""
        return PF.parallel_cross_entropy(
            input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing
        )


class RegisterParallelDim(nn.Module):
    """A module that tags its input with a parallel dim (``ts.register_parallel_dim`` as a layer).

    Parameters
    ----------
    dim : {None, 0, 1, -1}
        The tag to set.

    Raises
    ------
    ValueError
        If ``dim`` is invalid.
    """

    def __init__(self, dim: int | None = -1) -> None:
        super().__init__()
        self.dim = check_dim(dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Return ``input`` tagged with ``dim``."""
        return tag_output(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class SequenceParallelLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` for a sequence-parallel region: each rank normalises its own sequence chunk,
    and the gradients of the (replicated) affine parameters are summed over the tensor-parallel group
    in the backward, so they stay identical on every rank.

    Parameters are those of ``nn.LayerNorm``.

    Raises
    ------
    RuntimeError
        In ``forward``, if the process groups are not initialised.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise ``input`` (a sequence chunk)."""
        from ..distributed import copy

        weight = copy(self.weight) if self.weight is not None else None
        bias = copy(self.bias) if self.bias is not None else None
        return F.layer_norm(input, self.normalized_shape, weight, bias, self.eps)
