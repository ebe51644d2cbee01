"""Modules for sequence-parallel regions (activations split along the sequence dim)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..random import _MODEL_PARALLEL_RNG, get_rng_tracker


class SequenceParallelLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` for a sequence-parallel region.

    Each rank normalises its own sequence chunk, and the gradients of the (replicated) affine
    parameters are summed over the tensor-parallel group in the backward, so they stay identical
    on every rank.

    Parameters
    ----------
    normalized_shape : int or list of int
        As in ``nn.LayerNorm``.
    eps : float, default 1e-5
        As in ``nn.LayerNorm``.
    elementwise_affine : bool, default True
        As in ``nn.LayerNorm``.
    bias : bool, default True
        As in ``nn.LayerNorm``.
    device : torch.device, optional
        As in ``nn.LayerNorm``.
    dtype : torch.dtype, optional
        As in ``nn.LayerNorm``.

    Raises
    ------
    RuntimeError
        In ``forward``, if the process groups are not initialised.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise ``input`` (a sequence chunk).

        Parameters
        ----------
        input : torch.Tensor
            This rank's sequence chunk, ``[..., *normalized_shape]``.

        Returns
        -------
        torch.Tensor
            The normalised chunk.
        """
        from ..distributed import copy

        weight = copy(self.weight) if self.weight is not None else None
        bias = copy(self.bias) if self.bias is not None else None
        return F.layer_norm(input, self.normalized_shape, weight, bias, self.eps)


class SequenceParallelDropout(nn.Dropout):
    """``nn.Dropout`` for a sequence-parallel region.

    Each rank holds different tokens, so its masks are drawn inside
    ``ts.random.get_rng_tracker().fork()`` (seeded per tensor-parallel rank by
    :func:`shardlayers.random.manual_seed`), as Megatron does.

    Parameters
    ----------
    p : float, default 0.5
        As in ``nn.Dropout``.
    inplace : bool, default False
        As in ``nn.Dropout``.

    Raises
    ------
    KeyError
        In ``forward`` (training, ``p > 0``), if ``ts.random.manual_seed`` was not called.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Apply dropout to this rank's sequence chunk.

        Parameters
        ----------
        input : torch.Tensor
            This rank's sequence chunk.

        Returns
        -------
        torch.Tensor
            ``input`` itself when not training or ``p == 0``, else the chunk with dropout applied.
        """
        if not self.training or self.p == 0:
            return input
        with get_rng_tracker().fork(_MODEL_PARALLEL_RNG):
            return F.dropout(input, self.p, True, self.inplace)
