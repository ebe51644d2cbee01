"""Modules for sequence-parallel regions (activations split along the sequence dim)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..random import _MODEL_PARALLEL_RNG, get_rng_tracker


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


class SequenceParallelDropout(nn.Dropout):
    """``nn.Dropout`` for a sequence-parallel region: each rank holds different tokens, so its
    masks are drawn inside ``ts.random.get_rng_tracker().fork()`` (seeded per tensor-parallel rank by
    :func:`shardlayers.random.manual_seed`), as Megatron does.

    Raises
    ------
    KeyError
        In ``forward`` (training, ``p > 0``), if ``ts.random.manual_seed`` was not called.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Dropout of this rank's sequence chunk."""
        if not self.training or self.p == 0:
            return input
        with get_rng_tracker().fork(_MODEL_PARALLEL_RNG):
            return F.dropout(input, self.p, True, self.inplace)
