"""Collectives on the tensor-parallel group and the autograd ops built on them."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distkit_common.validate import Checks, check_tensor

from .._split import partition_sizes
from .._tag import tag_output, untag
from ._state import state


def group_info() -> tuple[Any, int, int]:
    """``(group, size, rank)`` of the tensor-parallel group (RuntimeError when absent)."""
    s = state()
    return s.tp_group, s.group_size, s.tp_ranks.index(dist.get_rank())


def _size(group: Any) -> int:
    return int(dist.get_world_size(group))


def all_reduce_(x: torch.Tensor, group: Any) -> torch.Tensor:
    """In-place sum over ``group`` (no-op for one rank)."""
    if _size(group) > 1:
        dist.all_reduce(x, group=group)
    return x


def exchange_sizes(n: int, group: Any) -> list[int]:
    """Every rank's ``n`` (one tiny all-gather)."""
    p = _size(group)
    if p == 1:
        return [n]
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":  # NCCL only moves device memory
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([n], dtype=torch.int64, device=device)
    out = [torch.empty_like(t) for _ in range(p)]
    dist.all_gather(out, t, group=group)
    return [int(o.item()) for o in out]


def all_gather(x: torch.Tensor, dim: int, group: Any, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (chunks may differ in size along ``dim``)."""
    p = _size(group)
    if p == 1:
        return x
    dim = dim % x.dim()
    if sizes is None:
        sizes = exchange_sizes(x.shape[dim], group)
    big = max(sizes)
    xs = x.contiguous()
    if xs.shape[dim] < big:
        pad = list(xs.shape)
        pad[dim] = big - xs.shape[dim]
        xs = torch.cat([xs, xs.new_zeros(pad)], dim=dim)
    bufs = [torch.empty_like(xs) for _ in range(p)]
    dist.all_gather(bufs, xs, group=group)
    if any(s != big for s in sizes):
        bufs = [b.narrow(dim, 0, s) for b, s in zip(bufs, sizes, strict=True)]
    return torch.cat(bufs, dim=dim)


def split(x: torch.Tensor, dim: int, group: Any, sizes: list[int] | None = None) -> torch.Tensor:
    """This rank's chunk of ``x`` along ``dim`` (``sizes`` default: even/uneven partition)."""
    p = _size(group)
    if p == 1:
        return x
    rank = dist.get_rank(group)
    if sizes is None:
        sizes = partition_sizes(x.shape[dim], p, uneven=True)
    start = sum(sizes[:rank])
    return x.narrow(dim, start, sizes[rank]).contiguous()


def reduce_scatter(x: torch.Tensor, dim: int, group: Any, sizes: list[int] | None = None) -> torch.Tensor:
    """Sum over ``group`` and keep this rank's chunk along ``dim``."""
    p = _size(group)
    if p == 1:
        return x
    if sizes is None:
        sizes = partition_sizes(x.shape[dim], p, uneven=True)
    if dist.get_backend(group) != "gloo" and dim % x.dim() == 0 and len(set(sizes)) == 1:
        out = x.new_empty((sizes[0], *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out
    # gloo (and uneven or non-leading splits): all-reduce + split works for any dim and sizes;
    # reduce_scatter_tensor cuts dim 0 evenly only, so a sequence dim 1 would need copies
    y = x.contiguous().clone()
    dist.all_reduce(y, group=group)
    return split(y, dim, group, sizes)


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        return all_reduce_(g.contiguous().clone(), ctx.group), None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, inplace: bool) -> torch.Tensor:
        y = x.contiguous() if inplace else x.contiguous().clone()
        return all_reduce_(y, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        return g, None, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any, sizes: list[int] | None) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        ctx.sizes = sizes if sizes is not None else partition_sizes(x.shape[dim], _size(group), uneven=True)
        return split(x, dim, group, ctx.sizes)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        return all_gather(g, ctx.dim, ctx.group, ctx.sizes), None, None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any, sizes: list[int] | None) -> torch.Tensor:
        if sizes is None:
            sizes = exchange_sizes(x.shape[dim], group)
        ctx.dim, ctx.group, ctx.sizes = dim, group, sizes
        return all_gather(x, dim, group, sizes)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        return split(g, ctx.dim, ctx.group, ctx.sizes), None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any, sizes: list[int] | None) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        ctx.sizes = sizes if sizes is not None else partition_sizes(x.shape[dim], _size(group), uneven=True)
        return reduce_scatter(x, dim, group, ctx.sizes)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        return all_gather(g, ctx.dim, ctx.group, ctx.sizes), None, None, None


#: a dim out of range is an IndexError, as in torch
_CHECKS = Checks(value_error=IndexError)


def _check_tensor(x: Any) -> None:
    check_tensor(x, "input")


def _check_axis(x: torch.Tensor, dim: int) -> int:
    return int(_CHECKS.axis(dim, "dim", x.dim()))


def copy(input: torch.Tensor) -> torch.Tensor:
    """Identity forward, all-reduce (sum) of the gradient over the tensor-parallel group backward.

    Parameters
    ----------
    input : torch.Tensor
        The tensor, the same on every rank of the group.

    Returns
    -------
    torch.Tensor
        A tensor equal to ``input`` (untagged) whose gradient is all-reduced over the group.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor.
    RuntimeError
        If the process groups are not initialised.
    """
    _check_tensor(input)
    group, _, _ = group_info()
    out: torch.Tensor = _Copy.apply(untag(input), group)
    return out


def reduce(input: torch.Tensor) -> torch.Tensor:
    """All-reduce (sum) over the tensor-parallel group forward, identity backward.

    As in TorchShard, a tensor outside autograd (no ``requires_grad``, or grad mode off) is
    reduced **in place** (``ts.distributed.reduce(t)`` leaves the sum in ``t``) and returned
    (untagged); a tensor that requires grad is not modified: the sum is a new tensor.

    Parameters
    ----------
    input : torch.Tensor
        This rank's partial sum.

    Returns
    -------
    torch.Tensor
        The sum over the group: ``input`` itself (reduced in place) outside autograd, else a new tensor.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor.
    RuntimeError
        If the process groups are not initialised.
    """
    _check_tensor(input)
    group, _, _ = group_info()
    x = untag(input)
    if not (torch.is_grad_enabled() and x.requires_grad):
        if x.is_contiguous():
            all_reduce_(x, group)
        else:
            x.copy_(all_reduce_(x.contiguous(), group))
        return x
    out: torch.Tensor = _Reduce.apply(x, group, False)
    return out


def scatter(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Keep this rank's chunk along ``dim`` forward, all-gather the gradient backward.

    The chunk is tagged like in TorchShard: ``0`` for a split along dim 0, ``-1`` (or ``1`` when
    ``dim=1`` names the last dim) for a split along the last dim (a :class:`ts.ParallelTensor`);
    a split along a middle dim is untagged.

    Sizes that do not divide are split as ``torch.chunk`` splits them (``ceil(n/p)`` per rank, the
    last ones smaller).

    Parameters
    ----------
    input : torch.Tensor
        The full tensor, the same on every rank of the group.
    dim : int, default -1
        The dimension to split.

    Returns
    -------
    torch.Tensor
        This rank's chunk (a view's copy), tagged as described above.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor.
    IndexError
        If ``dim`` is out of range.
    RuntimeError
        If the process groups are not initialised.
    """
    _check_tensor(input)
    axis = _check_axis(input, dim)
    group, _, _ = group_info()
    out: torch.Tensor = _Scatter.apply(untag(input), axis, group, None)
    last = input.dim() - 1
    # TorchShard tags the chunk with the ``dim`` it was split along: 0, 1 or -1
    tag: int | None
    if dim == 0 or (axis == 0 and axis != last):
        tag = 0
    elif axis == last:
        tag = 1 if dim == 1 else -1
    else:
        tag = None
    return tag_output(out, tag)


def gather(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """All-gather along ``dim`` forward (untagged result), keep this rank's chunk backward.

    Parameters
    ----------
    input : torch.Tensor
        This rank's chunk.
    dim : int, default -1
        The dimension to concatenate along.

    Returns
    -------
    torch.Tensor
        The chunks of every rank of the group concatenated along ``dim``, untagged.

    Raises
    ------
    TypeError
        If ``input`` is not a tensor.
    IndexError
        If ``dim`` is out of range.
    RuntimeError
        If the process groups are not initialised.
    """
    _check_tensor(input)
    axis = _check_axis(input, dim)
    group, _, _ = group_info()
    out: torch.Tensor = _Gather.apply(untag(input), axis, group, None)
    return out
