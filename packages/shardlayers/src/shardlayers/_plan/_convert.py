"""One module + its :class:`Spec` -> a check (before anything changes) and a conversion.

Linear layers and embeddings are replaced by shardlayers' parallel layers built on ``meta`` and
given this rank's shards of the original parameters (sliced, or materialized shard-only from a
``distx_fake.deferred_init`` module); norms and dropout stay in place or become their
sequence-parallel variants. Parameters shared by several converted modules (tied embeddings)
stay shared: each shard is made once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._materialize import full_of, shard_of
from .._split import padded_size, partition_range
from ..nn._embedding import ParallelEmbedding
from ..nn._linear import ColumnParallelLinear, RowParallelLinear
from ..nn._sequence import SequenceParallelDropout
from ._hooks import gather_first_input, gather_inputs, gather_outputs, sum_grads_over_group
from ._styles import Spec

_COLUMN = ("colwise", "colwise_gather", "vocab_head")


@dataclass
class Options:
    """Plan-wide options of ``parallelize_module``."""

    group: Any
    size: int
    rank: int
    uneven: bool
    pad_multiple: int | None
    shards: dict[tuple[int, int, int, int, int], nn.Parameter] = field(default_factory=dict)


def _plain(m: nn.Module, base: type) -> bool:
    """An instance of ``base`` that computes as ``base`` does (no overridden forward)."""
    return isinstance(m, base) and type(m).forward is base.forward  # type: ignore[attr-defined]


def _is_norm(m: nn.Module) -> bool:
    if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
        return True
    # model-specific norms (LlamaRMSNorm, T5LayerNorm, ...): per-token modules with 1-D parameters
    name = type(m).__name__
    params = list(m.parameters(recurse=False))
    return name.endswith("Norm") and not list(m.children()) and all(p.dim() == 1 for p in params)


def _divides(n: int, parts: int, what: str, name: str, uneven: bool) -> None:
    if n % parts and not uneven:
        raise ValueError(
            f"{name}: {what} {n} is not divisible by the tensor-parallel size {parts} (pass uneven=True for "
            "uneven shards" + (", or make_vocab_size_divisible_by=... to pad)" if "vocab" in what else ")")
        )


def check(name: str, m: nn.Module, spec: Spec, parent: nn.Module | None, opt: Options) -> None:
    """Raise if ``spec`` cannot be applied to ``m`` (nothing is changed).

    Raises
    ------
    TypeError
        A style on a module it does not apply to.
    ValueError
        A size that does not divide, or attention heads that would be cut.
    """
    p = opt.size
    kind = spec.kind
    if kind in ("prepare_input", "prepare_output", "sequence_gather"):
        return
    if isinstance(m, (ColumnParallelLinear, RowParallelLinear, ParallelEmbedding)):
        raise TypeError(f"{name}: {type(m).__name__} is already parallel")
    if kind == "sequence":
        if not (_is_norm(m) or _plain(m, nn.Dropout)):
            raise TypeError(
                f"{name}: style 'sequence' applies to LayerNorm / RMSNorm-like modules and Dropout, not {type(m).__name__}"
            )
        return
    if _plain(m, nn.Linear):
        assert isinstance(m, nn.Linear)
        if kind == "vocab":
            raise TypeError(f"{name}: style 'vocab' applies to nn.Embedding, not nn.Linear (use 'vocab_head')")
        head = getattr(parent, "head_dim", None)
        if kind in _COLUMN:
            if kind == "vocab_head" and opt.pad_multiple is not None:
                return
            _divides(m.out_features, p, "vocab size" if kind == "vocab_head" else "out_features", name, opt.uneven)
            if isinstance(head, int) and head > 0 and m.out_features % (p * head):
                raise ValueError(
                    f"{name}: {m.out_features // head} heads of {head} cannot be split over {p} ranks "
                    "(the number of heads, and of key/value heads, must be divisible by the tensor-parallel size)"
                )
        else:  # rowwise
            _divides(m.in_features, p, "in_features", name, opt.uneven)
            if isinstance(head, int) and head > 0 and m.in_features % (p * head):
                raise ValueError(f"{name}: {m.in_features // head} heads of {head} cannot be split over {p} ranks")
        return
    if _plain(m, nn.Embedding):
        assert isinstance(m, nn.Embedding)
        if kind in ("vocab", "rowwise"):
            if opt.pad_multiple is None:
                _divides(m.num_embeddings, p, "vocab size", name, opt.uneven)
            return
        if kind in ("colwise", "colwise_gather"):
            _divides(m.embedding_dim, p, "embedding_dim", name, opt.uneven)
            return
        raise TypeError(f"{name}: style {kind!r} does not apply to nn.Embedding ('vocab' or 'colwise' do)")
    raise TypeError(f"{name}: style {kind!r} ({spec.source}) does not apply to {type(m).__name__}")


def _shard(param: torch.Tensor, axis: int, opt: Options, rows: int | None = None) -> nn.Parameter:
    full = param.shape[axis]
    start, n = partition_range(full, opt.size, opt.rank)
    key = (id(param), axis, start, n, rows or n)
    hit = opt.shards.get(key)
    if hit is None:
        hit = nn.Parameter(shard_of(param, axis, start, n, rows), requires_grad=param.requires_grad)
        opt.shards[key] = hit
    return hit


def _replicated(param: torch.Tensor, opt: Options) -> nn.Parameter:
    key = (id(param), -1, 0, 0, 0)
    hit = opt.shards.get(key)
    if hit is None:
        hit = nn.Parameter(full_of(param).clone(), requires_grad=param.requires_grad)
        opt.shards[key] = hit
    return hit


def convert(m: nn.Module, spec: Spec, opt: Options) -> nn.Module:
    """The module that replaces ``m`` (``m`` itself for in-place styles)."""
    kind = spec.kind
    if kind == "prepare_input":
        gather_inputs(m, spec, opt.group)
        return m
    if kind == "prepare_output":
        gather_outputs(m, spec, opt.group)
        return m
    if kind == "sequence_gather":
        gather_first_input(m, spec.sequence_dim, opt.group)
        return m
    if kind == "sequence":
        if isinstance(m, nn.Dropout):
            return SequenceParallelDropout(m.p, m.inplace)
        return m  # the gradient hooks come after materialization (finish), on the final parameters
    if isinstance(m, nn.Linear):
        return _linear(m, spec, opt)
    assert isinstance(m, nn.Embedding)
    return _embedding(m, spec, opt)


def finish(m: nn.Module, spec: Spec, opt: Options) -> None:
    """In-place parts applied once every tensor of the model is real."""
    if spec.kind == "sequence" and not isinstance(m, nn.Dropout):
        sum_grads_over_group(m, opt.group)


def _linear(m: nn.Linear, spec: Spec, opt: Options) -> nn.Module:
    w = m.weight
    has_bias = m.bias is not None
    kw: dict[str, Any] = {"uneven": True, "device": "meta", "dtype": w.dtype}
    if spec.kind == "rowwise":
        new: nn.Module = RowParallelLinear(
            m.in_features,
            m.out_features,
            has_bias,
            input_is_parallel=spec.input_is_parallel,
            sequence_parallel=spec.output_seq_dim is not None,
            sequence_dim=spec.output_seq_dim if spec.output_seq_dim is not None else 0,
            **kw,
        )
        new.weight = _shard(w, 1, opt)
        if has_bias:
            assert m.bias is not None
            new.bias = _replicated(m.bias, opt)
        return new
    pad = opt.pad_multiple if spec.kind == "vocab_head" else None
    rows = padded_size(m.out_features, opt.size, pad) if pad is not None else None
    new = ColumnParallelLinear(
        m.in_features,
        m.out_features,
        has_bias,
        gather_output=spec.kind == "colwise_gather",
        sequence_parallel=spec.input_seq_dim is not None,
        sequence_dim=spec.input_seq_dim if spec.input_seq_dim is not None else 0,
        local_output=spec.local_output,
        pad_to_multiple_of=pad,
        **kw,
    )
    new.weight = _shard(w, 0, opt, rows)
    if has_bias:
        assert m.bias is not None
        new.bias = _shard(m.bias, 0, opt, rows)
    return new


def _embedding(m: nn.Embedding, spec: Spec, opt: Options) -> nn.Module:
    vocab = spec.kind in ("vocab", "rowwise")
    pad = opt.pad_multiple if vocab else None
    new = ParallelEmbedding(
        m.num_embeddings,
        m.embedding_dim,
        m.padding_idx,
        m.max_norm,
        m.norm_type,
        m.scale_grad_by_freq,
        m.sparse,
        dim=0 if vocab else -1,
        gather_output=spec.kind == "colwise_gather",
        uneven=True,
        pad_to_multiple_of=pad,
        sequence_parallel=vocab and spec.output_seq_dim is not None,
        sequence_dim=spec.output_seq_dim if spec.output_seq_dim is not None else 0,
        device="meta",
        dtype=m.weight.dtype,
    )
    if vocab:
        rows = padded_size(m.num_embeddings, opt.size, pad) if pad is not None else None
        new.weight = _shard(m.weight, 0, opt, rows)
    else:
        new.weight = _shard(m.weight, 1, opt)
    return new
