"""Partition sizes (even or uneven) and ``slice``."""

from __future__ import annotations

import torch


def partition_sizes(n: int, parts: int, *, uneven: bool = True, what: str = "size") -> list[int]:
    """Sizes of ``parts`` consecutive chunks covering ``n``, as ``torch.chunk`` and DTensor's
    ``Shard`` cut them: ``ceil(n / parts)`` each, the last ones smaller (possibly empty).

    Following DTensor's rule makes every shard of a parallel layer a valid local shard of a
    ``DTensor`` (see :func:`shardlayers.sharded_state_dict`).

    Raises
    ------
    ValueError
        If ``parts < 1``, or ``n`` is not divisible by ``parts`` and ``uneven`` is False.
    """
    if parts < 1:
        raise ValueError(f"number of partitions must be >= 1, got {parts}")
    if n % parts and not uneven:
        raise ValueError(f"{what} {n} is not divisible by {parts} partitions (pass uneven=True to allow uneven splits)")
    chunk = -(-n // parts)
    return [max(0, min(chunk, n - i * chunk)) for i in range(parts)]


def padded_size(n: int, parts: int, multiple: int) -> int:
    """Rows each rank stores for a dimension of ``n`` split over ``parts`` ranks and padded so
    that every rank holds a multiple of ``multiple`` (Megatron's ``make_vocab_size_divisible_by``:
    ``parts * padded_size(...)`` is the padded total). A rank's real rows come first; the rest
    are padding."""
    chunk = -(-n // parts)
    return -(-chunk // multiple) * multiple


def partition_range(n: int, parts: int, index: int, *, uneven: bool = True, what: str = "size") -> tuple[int, int]:
    """``(start, length)`` of chunk ``index`` of :func:`partition_sizes`."""
    sizes = partition_sizes(n, parts, uneven=uneven, what=what)
    return sum(sizes[:index]), sizes[index]


def slice(
    tensor: torch.Tensor,
    num_partitions: int,
    dim: int | None = -1,
    contiguous: bool = False,
    *,
    uneven: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Split ``tensor`` into ``num_partitions`` chunks along ``dim`` (like ``torch.split``).

    Parameters
    ----------
    tensor : torch.Tensor
        Input tensor.
    num_partitions : int
        Number of chunks.
    dim : int or None
        Dimension to split (any valid dim; default -1). ``None`` means "not split": every
        partition is ``tensor`` itself (TorchShard crashed here).
    contiguous : bool
        Return contiguous chunks (copies when needed).
    uneven : bool
        Allow a size that does not divide; chunks are then cut as ``torch.chunk`` cuts them
        (``ceil(size / num_partitions)`` each, the last ones smaller, possibly empty).

    Returns
    -------
    tuple of torch.Tensor
        The ``num_partitions`` chunks along ``dim`` (views, or contiguous copies with
        ``contiguous=True``).

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor or ``num_partitions`` not an int.
    ValueError
        If ``num_partitions < 1`` or the size does not divide (and not ``uneven``).
    IndexError
        If ``dim`` is out of range.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise TypeError(f"num_partitions must be an int, got {num_partitions!r}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if dim is None:
        return (tensor,) * num_partitions
    nd = max(tensor.dim(), 1)
    if not -nd <= dim < nd:
        raise IndexError(f"dim {dim} out of range for a tensor of shape {tuple(tensor.shape)}")
    sizes = partition_sizes(tensor.shape[dim], num_partitions, uneven=uneven, what=f"dimension {dim} of size")
    chunks = torch.split(tensor, sizes, dim=dim)
    if contiguous:
        chunks = tuple(c.contiguous() for c in chunks)
    return tuple(chunks)
