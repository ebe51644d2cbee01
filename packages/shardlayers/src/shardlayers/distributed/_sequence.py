"""Entering a tensor-parallel region from a sequence-parallel one: all-gather once per tensor.

In a sequence-parallel plan the residual stream is split along the sequence dim; every
column-parallel layer needs the whole sequence. Sibling layers reading the same tensor (q/k/v
projections, gate/up projections) share one all-gather: the gathered tensor is cached per source
tensor, so the forward all-gathers once and the backward sums the siblings' gradients (autograd)
before one reduce-scatter. Megatron gets the same by fusing QKV into one linear; here the model's
own modules stay untouched.

A gathered tensor is remembered as such, so that a column-parallel layer fed the output of an
explicit gather (DTensor's ``PrepareModuleInput(Shard -> Replicate)``) neither gathers again nor
all-reduces its input gradient (the gather's reduce-scatter does).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._ops import all_gather, exchange_sizes, reduce_scatter

#: seq-split source tensor -> (its _version when gathered, dim, group, gathered tensor)
_SOURCES: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: tensors produced by gather_sequence
_GATHERED: WeakIdKeyDictionary = WeakIdKeyDictionary()


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dim forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        sizes = exchange_sizes(x.shape[dim], group)
        ctx.dim, ctx.group, ctx.sizes = dim, group, sizes
        ctx.source = weakref.ref(x)
        return all_gather(x, dim, group, sizes)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        src = ctx.source()
        if src is not None:  # the graph through this gather is consumed: gather afresh next time
            _SOURCES.pop(src, None)
        return reduce_scatter(g.contiguous(), ctx.dim, ctx.group, ctx.sizes), None, None


def is_gathered(x: torch.Tensor) -> bool:
    """True for a tensor produced by :func:`gather_sequence` (its gradient is reduce-scattered)."""
    return x in _GATHERED


def gather_sequence(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """The whole sequence of the seq-split ``x`` (one all-gather per tensor and version)."""
    dim = dim % x.dim()
    hit = _SOURCES.get(x)
    if hit is not None:
        version, hdim, hgroup, gathered = hit
        if (
            version == x._version
            and hdim == dim
            and hgroup is group
            and gathered.requires_grad == (torch.is_grad_enabled() and x.requires_grad)
        ):
            return gathered
    out: torch.Tensor = _GatherSequence.apply(x, dim, group)
    _SOURCES[x] = (x._version, dim, group, out)
    _GATHERED[out] = True
    return out
