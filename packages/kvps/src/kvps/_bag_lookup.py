"""One batch's lookup of pooled bags: the distinct rows pulled once, pooled by torch, gradients pushed per key.

The backward pass of "sum"/"mean" bags is kvps's ``bag_grad`` (pooling.hpp),
which gives torch's numbers; on a server without an update rule the output is
guarded so that a backward pass raises before anything is pushed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import _kvps
from ._worker import Worker


def _no_update_rule(what: str) -> str:
    """The error of a backward pass that would push gradients to a server without an update rule."""
    return (
        f"{what}: backward would push gradients, but the kvps server has no update rule "
        "(kvps.Server(..., optimizer=None): a push adds values, as AdaPM's does); nothing was pushed. "
        "To train, create the server with optimizer=kvps.optim.RowWiseAdagrad(...) (or another kvps.optim rule); "
        "for inference, evaluation or serving, run the lookup under torch.no_grad() or torch.inference_mode()"
    )


class _NoUpdateRule(torch.autograd.Function):
    """Identity on a lookup's output whose backward raises :func:`_no_update_rule`'s error.

    It is the first node a backward pass reaches from the output, so it
    raises before any gradient of the rows is computed or pushed.
    """

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, what: str) -> torch.Tensor:
        ctx.what = what
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise RuntimeError(_no_update_rule(ctx.what))


def guard(out: torch.Tensor, worker: Worker, what: str) -> torch.Tensor:
    """``out``, or (grad mode, a server without optimizer) ``out`` behind :class:`_NoUpdateRule`."""
    if worker.server.optimizer is None and out.requires_grad:
        guarded: torch.Tensor = _NoUpdateRule.apply(out, what)
        return guarded
    return out


class Lookup:
    """One batch's rows: every distinct key pulled once into a flat leaf tensor.

    ``keys`` are sorted global keys; ``rows`` holds their values concatenated
    (``dim`` elements each when ``dim`` is given, else each key's value
    length). With ``pending`` (grad mode) the rows require grad, and on a
    server with an optimizer backward pushes ``rows.grad`` of every key except
    ``skip`` (padding rows: never updated, as in torch); the push's timestamp
    goes to ``pending``. (Without optimizer nothing is pushed: the module's
    output is guarded by :class:`_NoUpdateRule`.)
    """

    def __init__(
        self,
        worker: Worker,
        keys: torch.Tensor,
        dim: int | None,
        skip: torch.Tensor | None,
        pending: list[int] | None,
    ) -> None:
        self.worker = worker
        self.keys = keys
        self.dim = dim
        lens = None if dim is not None else torch.from_numpy(worker.server.lengths[keys.numpy()])
        self.lens = lens
        count = keys.numel() * dim if dim is not None else int(lens.sum()) if lens is not None else 0
        self.rows = torch.empty(count, dtype=worker.server.dtype)
        if keys.numel():  # (keys: distinct ids checked at the module's boundary)
            worker._rows(_kvps.PULL, keys, self.rows, False)
        if pending is not None:
            self.rows.requires_grad_(True)
        if pending is not None and worker.server.optimizer is not None:
            push_keys, elems = keys, None
            if skip is not None and bool(skip.any()):
                push_keys = keys[~skip].contiguous()
                per_key = lens if lens is not None else torch.full((keys.numel(),), int(dim or 0), dtype=torch.int64)
                elems = torch.repeat_interleave(~skip, per_key)

            def push(g: torch.Tensor) -> None:
                vals = (g if elems is None else g[elems]).detach().contiguous()
                if push_keys.numel():
                    ts = worker._rows(_kvps.PUSH, push_keys, vals, True)
                    if ts >= 0:
                        pending.append(ts)

            self.rows.register_hook(push)

    def tables(self, counts: list[int], dims: list[int]) -> list[torch.Tensor]:
        """The rows as one ``(counts[t], dims[t])`` view per table (keys grouped by table, in order).

        One split: its backward joins the tables' gradients with one copy.
        """
        if len(counts) == 1:
            return [self.rows.view(counts[0], dims[0])]
        if self.lens is None:
            return list(self.rows.view(-1, dims[0]).split(counts))
        parts = self.rows.split([c * d for c, d in zip(counts, dims)])
        return [p.view(c, d) for p, c, d in zip(parts, counts, dims)]


class _SumMeanBag(torch.autograd.Function):
    """``F.embedding_bag`` ("sum"/"mean") whose backward is kvps's ``bag_grad``: torch's numbers.

    torch's dense backward produces a gradient of the whole (here: the
    batch's) table through several passes; ``bag_grad`` accumulates straight
    into the distinct rows, in the order torch does (see pooling.hpp).
    """

    @staticmethod
    def forward(
        ctx: Any,
        weight: torch.Tensor,
        local: torch.Tensor,
        offsets: torch.Tensor,
        mode: str,
        psw: torch.Tensor | None,
        include_last_offset: bool,
        pad: int | None,
        order: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(local, offsets, psw, order)
        ctx.args = (weight.shape, mode, include_last_offset, pad)
        return F.embedding_bag(
            local,
            weight,
            offsets,
            mode=mode,
            per_sample_weights=psw,
            include_last_offset=include_last_offset,
            padding_idx=pad,
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        local, offsets, psw, order = ctx.saved_tensors
        shape, mode, include_last_offset, pad = ctx.args
        g = grad.contiguous()
        if order is None:
            order = torch.sort(local).indices  # the order torch's own backward visits the ids in
        w = psw.reshape(-1).to(g.dtype).contiguous() if psw is not None else None
        out = torch.empty(shape, dtype=g.dtype)
        _kvps.bag_grad(
            _kvps.VALUE_DTYPES[str(g.dtype).removeprefix("torch.")],
            g.data_ptr(),
            shape[1],
            local.data_ptr(),
            order.data_ptr(),
            offsets.data_ptr(),
            offsets.numel() - (1 if include_last_offset else 0),
            include_last_offset,
            local.numel(),
            0 if w is None else w.data_ptr(),
            mode == "mean",
            shape[0],
            -1 if pad is None else pad,  # padding ids add nothing (nor count in a mean)
            out.data_ptr(),
        )
        return out, None, None, None, None, None, None, None


def pool(
    weight: torch.Tensor,
    local: torch.Tensor,
    offsets: torch.Tensor,
    mode: str,
    psw: torch.Tensor | None,
    include_last_offset: bool,
    pad: int | None,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.embedding_bag`` over a table's pulled rows; ``pad`` is the padding row's local index (or None).

    ``order``: ``torch.sort(local)``'s permutation, when the caller has it.
    """
    if weight.shape[0] == 0 or (pad is not None and pad == weight.shape[0]):
        # no rows (an empty batch) or a padding id the batch does not use: a
        # zero row that no id selects keeps embedding_bag's behaviour
        weight = torch.cat([weight, weight.new_zeros(1, weight.shape[1])])
    if mode != "max" and weight.requires_grad and (psw is None or not psw.requires_grad):
        out: torch.Tensor = _SumMeanBag.apply(weight, local, offsets, mode, psw, include_last_offset, pad, order)
        return out
    return F.embedding_bag(
        local,
        weight,
        offsets,
        mode=mode,
        per_sample_weights=psw,
        include_last_offset=include_last_offset,
        padding_idx=pad,
    )


def distinct(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.unique(ids, return_inverse=True)`` from one ``torch.sort``, whose permutation is kept.

    The permutation is the order torch's embedding_bag backward visits the
    ids in (pooling.hpp), so the backward need not sort again.
    """
    sorted_ids, order = torch.sort(ids)
    first = torch.ones(ids.numel(), dtype=torch.bool)
    if ids.numel() > 1:
        torch.ne(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    local = torch.empty_like(ids)
    local[order] = torch.cumsum(first, 0) - 1
    return sorted_ids[first], local, order


def local_padding(uniq: torch.Tensor, pad_key: int | None) -> int | None:
    """The local index of the padding key among the sorted ``uniq`` keys.

    It keeps its sorted position when present (torch's backward then sums in
    the same order as over the whole table); else the index past the rows.
    """
    if pad_key is None:
        return None
    pos = int(torch.searchsorted(uniq, torch.tensor(pad_key, dtype=torch.int64)))
    return pos if pos < uniq.numel() and int(uniq[pos]) == pad_key else uniq.numel()
