"""ParallelCrossEntropyLoss and RegisterParallelDim."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._tag import check_dim, register_parallel_dim, tag_output
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
    size_average, reduce : bool, optional
        Keyword-only legacy flags of TorchShard / ``nn.CrossEntropyLoss``; override ``reduction``.

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
        *,
        size_average: bool | None = None,
        reduce: bool | None = None,
    ) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = PF.legacy_reduction(size_average, reduce)
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
        """Return the loss of ``input`` against ``target`` (:func:`parallel_cross_entropy`).

        Parameters
        ----------
        input : torch.Tensor
            Logits ``[*, C_local]``, class dim last (split over the group when tagged -1/1).
        target : torch.Tensor
            Class indices ``[*]``.

        Returns
        -------
        torch.Tensor
            The loss, reduced as ``reduction`` says.
        """
        return PF.parallel_cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class RegisterParallelDim(nn.Module):
    """A module that tags its input with a parallel dim (``ts.register_parallel_dim`` as a layer).

    As in TorchShard, the input tensor (or every tensor of an input list / tuple) is tagged in
    place and returned; a tag other than None is returned as a :class:`ts.ParallelTensor` view of
    the same data so that the tag also follows the next shape-preserving ops.

    Parameters
    ----------
    dim : {None, 0, 1, -1}
        The tag to set (default None, as in TorchShard).

    Raises
    ------
    ValueError
        If ``dim`` is invalid.
    """

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = check_dim(dim)

    def forward(self, input: Any) -> Any:
        """Return ``input`` tagged with ``dim`` (a tensor, or a list / tuple of tensors).

        Parameters
        ----------
        input : torch.Tensor or list or tuple
            A tensor, or a list / tuple of tensors.

        Returns
        -------
        Any
            The same tensors, tagged (a :class:`ts.ParallelTensor` view for a tag other than None),
            in a container of the input's type.

        Raises
        ------
        TypeError
            If ``input`` is neither a tensor nor a list / tuple of tensors.
        """
        if isinstance(input, (list, tuple)):
            return type(input)(self._tag(x) for x in input)
        return self._tag(input)

    def _tag(self, x: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"RegisterParallelDim expects a tensor or a list/tuple of tensors, got {type(x).__name__}")
        register_parallel_dim(x, self.dim)
        return tag_output(x, self.dim)

    def extra_repr(self) -> str:
        """Return the module's argument for its ``repr``.

        Returns
        -------
        str
            ``dim=...``.
        """
        return f"dim={self.dim}"
