"""Functional forms of the parallel layers: ``parallel_linear``, ``parallel_embedding``,
``parallel_cross_entropy``.

Weights passed here are the local shards (as held by the modules); the parallel dim says how the
full weight was split.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .._split import partition_sizes
from .._tag import _FULL_SIZE, _PARALLEL_DIM, check_dim, tag_output, untag, valid_size
from .._xent import _FLOATS, _REDUCTIONS, VocabParallelCrossEntropy, check_same_device
from ..distributed import _ops
from ..distributed._ops import group_info
from ..distributed._region import Region, enter_region
from ..distributed._sequence import gather_sequence, is_gathered

__all__ = ["parallel_cross_entropy", "parallel_embedding", "parallel_linear"]


#: Overlap the column-parallel input-gradient all-reduce with the (last reader's) weight-gradient matmul.
OVERLAP_GRAD_ALLREDUCE = True


def _is_column_tag(t: torch.Tensor) -> bool:
    return getattr(t, _PARALLEL_DIM, None) in (1, -1)


class _ColumnLinear(torch.autograd.Function):
    """y = x W^T + b on a full (replicated or sequence-gathered) input.

    Backward: the input gradient joins ``region`` (the all-reduce shared by every column layer
    reading the same replicated tensor, see ``shardlayers.distributed._region``; the last reader
    starts it and its weight-gradient matmul runs while it is in flight). Without a region (a
    sequence-gathered input, whose gather reduce-scatters the summed gradient, or one rank) the
    input gradient is returned as is.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        region: Region | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.region, ctx.has_bias = region, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        total, weight = ctx.saved_tensors
        region = ctx.region
        g = g.contiguous()
        grad_in = None
        if ctx.needs_input_grad[0]:
            grad_in = g.matmul(weight)
            if region is not None:
                region.add(grad_in)  # the region's entry node returns the reduced sum
                grad_in = None
        g2 = g.reshape(-1, g.shape[-1])
        grad_w = g2.t().matmul(total.reshape(-1, total.shape[-1])) if ctx.needs_input_grad[1] else None
        grad_b = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_in, grad_w, grad_b, None


def _full_size(t: torch.Tensor, axis: int, p: int) -> int:
    return int(getattr(t, _FULL_SIZE, t.shape[axis] * p))


def column_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    gather_output: bool = False,
    sequence_dim: int | None = None,
    local_output: bool = False,
    num_outputs: int | None = None,
) -> torch.Tensor:
    """Column-parallel linear on local shards ``weight [out_local, in]``, ``bias [out_local]``.

    ``sequence_dim``: the input is split along it (sequence parallel) and is all-gathered first,
    once per tensor (see ``shardlayers.distributed._sequence``). ``local_output``: return the
    local output as a plain tensor instead of a tagged ``ParallelTensor``. ``num_outputs``: the
    real number of output features when the weight's rows are padded (a padded vocabulary):
    padding columns of the output are ``-inf`` and the output records the real size, so the
    vocab-parallel cross-entropy leaves them out.
    """
    group, p, rank = group_info()
    if _is_column_tag(input) and sequence_dim is None:
        raise ValueError(
            "tag mismatch: the input of a column-parallel linear (dim=-1) is tagged as split along its "
            "last dim; gather it first (ts.distributed.gather) or use a row-parallel layer (dim=0)"
        )
    x = untag(input)
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"input has {x.shape[-1]} features, the layer expects {weight.shape[-1]}")
    region = None
    if is_gathered(x):  # already the whole sequence; its gather reduce-scatters the gradient
        pass
    elif sequence_dim is not None:
        x = gather_sequence(x, sequence_dim, group)
    else:
        x, region = enter_region(x, group, OVERLAP_GRAD_ALLREDUCE)
    out: torch.Tensor = _ColumnLinear.apply(x, weight, bias, region)
    full = _full_size(weight, 0, p)
    real = partition_sizes(full, p)[rank]
    padded = out.shape[-1] > real
    if padded:  # padding rows of a padded vocabulary: no class there
        out.narrow(-1, real, out.shape[-1] - real).fill_(float("-inf"))
    if gather_output:
        if padded:
            raise ValueError("gather_output is not supported with padded outputs")
        return _ops._Gather.apply(out, out.dim() - 1, group, partition_sizes(full, p))
    if local_output:
        return out
    return tag_output(out, -1, num_outputs)


def row_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    input_is_parallel: bool | None = None,
    sequence_dim: int | None = None,
) -> torch.Tensor:
    """Row-parallel linear on local shards ``weight [out, in_local]`` and a replicated ``bias``.

    The partial products are all-reduced (or reduce-scattered along ``sequence_dim``) and the
    bias is added once, after the reduction, so it stays identical on every rank.
    """
    group, p, _ = group_info()
    tag = getattr(input, _PARALLEL_DIM, None)
    if tag == 0:
        raise ValueError(
            "tag mismatch: the input of a row-parallel linear (dim=0) is tagged as split along dim 0; "
            "expected a last-dim split (-1) or an unsplit input"
        )
    x = untag(input)
    parallel = tag in (1, -1) if input_is_parallel is None else bool(input_is_parallel)
    if parallel:
        if x.shape[-1] != weight.shape[-1]:
            raise ValueError(
                f"tag mismatch: input is split along its last dim with local size {x.shape[-1]}, "
                f"but this rank's weight shard expects {weight.shape[-1]} input features"
            )
    else:
        full = _full_size(weight, 1, p)
        if x.shape[-1] != full:
            raise ValueError(f"input has {x.shape[-1]} features, the layer expects {full}")
        x = _ops._Scatter.apply(x, x.dim() - 1, group, partition_sizes(full, p))
    partial = F.linear(x, weight)
    if sequence_dim is not None:
        out: torch.Tensor = _ops._ReduceScatter.apply(partial, sequence_dim % partial.dim(), group, None)
        if bias is not None:
            out = out + _ops._Copy.apply(bias, group)  # each rank saw part of the sequence: sum bias grads
        return out
    out = _ops._Reduce.apply(partial, group, True)
    if bias is not None:
        out = out + bias
    return out


def parallel_linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """Linear layer over the tensor-parallel group, on this rank's weight shard.

    Parameters
    ----------
    input : torch.Tensor
        ``[*, in]`` (or ``[*, in_local]`` tagged -1 for ``dim=0``).
    weight : torch.Tensor
        ``[out, in]`` for ``dim=None``; ``[out_local, in]`` for ``dim=-1``/``1``;
        ``[out, in_local]`` for ``dim=0`` (``nn.Linear`` layout, order type 0).
    bias : torch.Tensor, optional
        ``[out_local]`` for column parallel, ``[out]`` (replicated) otherwise.
    dim : {None, 0, 1, -1}
        Parallel dim: None plain, -1/1 column (output split and tagged -1), 0 row (input split
        or scattered, partial outputs all-reduced, bias added once).

    Returns
    -------
    torch.Tensor
        ``[*, out]``, or ``[*, out_local]`` tagged -1 for a column split (``dim=-1``/``1``).

    Raises
    ------
    ValueError
        If ``dim`` is invalid, the sizes do not match, or the input's tag does not fit the layer.
    RuntimeError
        If ``dim`` is not None and the process groups are not initialised.
    """
    check_dim(dim)
    if dim is None:
        return F.linear(input, weight, bias)
    if dim in (1, -1):
        return column_linear(input, weight, bias)
    return row_linear(input, weight, bias)


def parallel_embedding(
    input: torch.Tensor,
    weight: torch.Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
    num_embeddings: int | None = None,
    dim: int | None = None,
    *,
    gather_output: bool = True,
    sequence_dim: int | None = None,
) -> torch.Tensor:
    """Embedding lookup over the tensor-parallel group, on this rank's weight shard.

    Same signature as TorchShard's ``parallel_embedding`` (``num_embeddings`` before ``dim``).
    ``dim=0`` (vocab parallel): ``weight`` is ``[V_local, D]``, ids of other ranks give zeros,
    and the results are all-reduced (full output). ``dim=-1``/``1``: ``weight`` is
    ``[V, D_local]``; as in TorchShard the local lookups are all-gathered into the full output
    ``[*, D]`` (untagged), or, with ``gather_output=False``, kept split along the last dim and
    tagged -1. ``padding_idx`` is the global index.

    Parameters
    ----------
    input : torch.Tensor
        Integer ids (global indices).
    weight : torch.Tensor
        This rank's shard of the table.
    padding_idx : int, optional
        As in ``F.embedding`` (a global row index).
    max_norm : float, optional
        As in ``F.embedding`` (not with ``dim=-1``).
    norm_type : float, default 2.0
        As in ``F.embedding``.
    scale_grad_by_freq : bool, default False
        As in ``F.embedding``.
    sparse : bool, default False
        As in ``F.embedding``.
    num_embeddings : int, optional
        Full vocabulary size (needed for uneven ``dim=0`` splits of functional callers;
        default: taken from the module's parameter, else ``weight.shape[0] * group_size``).
    dim : {None, 0, 1, -1}
        Parallel dim of the table.
    gather_output : bool
        For ``dim=-1``: all-gather the output (default, TorchShard) or keep it split.
    sequence_dim : int, optional
        For ``dim=0``: reduce-scatter the output along this dim (sequence parallel) instead of
        all-reducing it. The weight may hold padding rows after this rank's real rows.

    Returns
    -------
    torch.Tensor
        Embeddings ``[*, D]`` (the last dim split and tagged -1 for ``dim=-1`` without
        ``gather_output``; split along ``sequence_dim`` when it is given).

    Raises
    ------
    ValueError
        If ``dim`` is invalid, or ``max_norm`` is used with ``dim=-1`` (norms would be partial).
    TypeError
        If ``input`` is not an integer tensor.
    RuntimeError
        If ``dim`` is not None and the process groups are not initialised, or ``input`` is on
        another device than ``weight`` (torch's ``F.embedding`` returned uninitialised memory
        for ``meta`` indices into a CPU weight).
    """
    check_dim(dim)
    if not isinstance(input, torch.Tensor) or input.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input must be an int64 or int32 tensor, got {getattr(input, 'dtype', type(input))}")
    if input.device != weight.device:
        raise RuntimeError(f"input is on {input.device} but the embedding weight on {weight.device}")
    ids = untag(input)
    if dim is None:
        return F.embedding(ids, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    group, p, rank = group_info()
    if dim in (1, -1):
        if max_norm is not None:
            raise ValueError("max_norm is not supported with dim=-1 (each rank holds part of every row)")
        out = F.embedding(ids, weight, padding_idx, None, norm_type, scale_grad_by_freq, sparse)
        if gather_output:
            full: torch.Tensor = _ops._Gather.apply(
                out, out.dim() - 1, group, partition_sizes(_full_size(weight, 1, p), p)
            )
            return full
        return tag_output(out, -1)
    n_full = int(num_embeddings) if num_embeddings is not None else _full_size(weight, 0, p)
    sizes = partition_sizes(n_full, p)
    start, n = sum(sizes[:rank]), sizes[rank]
    if weight.shape[0] < n:
        raise ValueError(f"weight shard has {weight.shape[0]} rows, expected {n}")
    outside = (ids < start) | (ids >= start + n)
    local = torch.where(outside, torch.zeros_like(ids), ids - start)
    pad = None
    if padding_idx is not None:
        pi = padding_idx + sum(sizes) if padding_idx < 0 else padding_idx
        pad = pi - start if start <= pi < start + n else None
    out = F.embedding(local, weight, pad, max_norm, norm_type, scale_grad_by_freq, sparse)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    if sequence_dim is not None:
        scattered: torch.Tensor = _ops._ReduceScatter.apply(out, sequence_dim % out.dim(), group, None)
        return scattered
    result: torch.Tensor = _ops._Reduce.apply(out, group, True)
    return result


def legacy_reduction(size_average: bool | None, reduce: bool | None) -> str:
    """``reduction`` from the legacy ``size_average`` / ``reduce`` flags (torch's rule)."""
    size_average = True if size_average is None else bool(size_average)
    reduce = True if reduce is None else bool(reduce)
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def parallel_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy whose class dimension (the last) is split over the tensor-parallel group.

    When ``input`` is tagged -1/1 (e.g. the output of a column-parallel ``ParallelLinear``), the
    loss is computed without gathering the logits: a native per-row pass computes local max, sum of
    exponentials, target logit (and the smoothing sum), one all-gather of ``N x 4`` numbers
    combines them, and a second native pass writes the gradient (memory: one buffer the size of the
    local logits). float16/bfloat16 logits are computed in float32 and the loss is float32.
    Logits whose rows are not laid out one after another with unit class stride (transposed, or
    expanded so that rows share memory: row stride 0) are first copied to a contiguous buffer,
    which costs one more buffer the size of the local logits for the call.
    An input not tagged -1/1 (untagged, or tagged 0: rows split, classes full) holds full logits
    and is handed to ``F.cross_entropy``, as in TorchShard.

    Parameters
    ----------
    input : torch.Tensor
        Logits ``[*, C_local]`` (class dim last).
    target : torch.Tensor
        Class indices ``[*]`` (int64/int32); ``ignore_index`` entries contribute nothing.
    weight : torch.Tensor, optional
        Full per-class weight ``[C]`` (replicated).
    size_average : bool, optional
        Deprecated legacy argument (as in ``F.cross_entropy`` and TorchShard); when it or
        ``reduce`` is given they override ``reduction``.
    ignore_index : int, default -100
        Target value to ignore.
    reduce : bool, optional
        Deprecated legacy argument, see ``size_average``.
    reduction : {'mean', 'sum', 'none'}
        As in ``F.cross_entropy`` (weighted mean divides by the sum of target weights).
    label_smoothing : float, default 0.0
        In ``[0, 1]``, as in ``F.cross_entropy``.

    Returns
    -------
    torch.Tensor
        The loss: a scalar for ``'mean'`` / ``'sum'``, ``[*]`` for ``'none'``; float32 for
        float16/bfloat16 logits, else the logits' dtype. Its backward gives the logits' gradient
        (local classes only).

    Raises
    ------
    TypeError
        If ``input`` is not a floating tensor or ``target`` not an integer tensor.
    ValueError
        Bad ``reduction``, ``label_smoothing``, shapes or weight size.
    IndexError
        If a target is outside ``[0, C)`` and not ``ignore_index``.
    RuntimeError
        If the input is tagged and the process groups are not initialised, or ``target`` is on
        another device than ``input`` (``F.cross_entropy``'s error).

    Examples
    --------
    One process holding every class (a tensor-parallel group of 1):

    >>> import torch, torch.distributed as dist
    >>> import shardlayers as ts
    >>> dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29512", rank=0, world_size=1)
    >>> ts.distributed.init_process_group(1)
    >>> logits = ts.nn.RegisterParallelDim(-1)(torch.tensor([[2.0, 0.0, 0.0]], requires_grad=True))
    >>> loss = ts.nn.functional.parallel_cross_entropy(logits, torch.tensor([0]))
    >>> round(loss.item(), 4)  # log(e^2 + 2) - 2
    0.2395
    >>> loss.backward()
    """
    if not isinstance(input, torch.Tensor) or input.dtype not in _FLOATS:
        raise TypeError(f"input must be a floating tensor, got {getattr(input, 'dtype', type(input))}")
    if not isinstance(target, torch.Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"target must be an int64/int32 tensor of class indices, got {getattr(target, 'dtype', type(target))}"
        )
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a tensor or None, got {type(weight).__name__}")
    tag = getattr(input, _PARALLEL_DIM, None)
    if tag not in (1, -1):  # not split along the classes (as TorchShard: untagged, or tagged 0 = rows split)
        return F.cross_entropy(
            untag(input),
            target,
            weight,
            ignore_index=ignore_index,
            reduction=reduction,
            label_smoothing=label_smoothing,
        )
    if input.dim() < 1 or tuple(target.shape) != tuple(input.shape[:-1]):
        raise ValueError(
            f"target shape {tuple(target.shape)} must equal the logits shape without the class dim "
            f"{tuple(input.shape[:-1])}"
        )
    check_same_device(input, target)
    group, _, _ = group_info()
    loss: torch.Tensor = VocabParallelCrossEntropy.apply(
        untag(input), target, weight, int(ignore_index), reduction, float(label_smoothing), group, valid_size(input)
    )
    return loss
