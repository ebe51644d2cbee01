"""The parallel-dim tag: which dimension of a tensor is split over the tensor-parallel group.

Parameters carry the tag as plain attributes (``ts._PARALLEL_DIM``, ``ts._ORDER_TYPE``).
Activations returned by the parallel layers are :class:`ParallelTensor` instances: a thin
``torch.Tensor`` subclass whose ``__torch_function__`` copies the tag to the results of
shape-preserving ops (activations, dropout, arithmetic, views and reshapes that keep the split
dimension), so the tag is no longer lost after the first op as in TorchShard.

Tag values follow TorchShard: ``-1`` or ``1`` mean "split along the last dimension" (column
parallel), ``0`` means "split along the first dimension", ``None`` means "not split".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ._split import partition_range

#: name of the attribute holding the parallel dimension of a tensor (TorchShard's
#: ``_PARALLEL_DIM = 'parallel_dim'``, so ``t.parallel_dim`` works as there).
_PARALLEL_DIM = "parallel_dim"
#: the seed documentation's other name for the same attribute.
_PARALLEL_ATTR = _PARALLEL_DIM
#: name of the attribute holding the order type of a parameter (TorchShard's ``_ORDER_ATTR =
#: 'order_type'``; 0: weight stored ``[out, in]`` like nn.Linear, 1: ``[in, out]`` like nn.Embedding).
_ORDER_TYPE = "order_type"
#: TorchShard's name of the constant.
_ORDER_ATTR = _ORDER_TYPE
#: attribute holding the full (unsplit) size of a parameter along its split storage axis.
_FULL_SIZE = "_PARALLEL_FULL_SIZE"
#: attribute of an activation split along its last dim whose global size includes padding (a
#: padded vocabulary): the number of real entries; the rest (at the end of each rank's shard,
#: see shardlayers._pad) are padding, left out of the loss.
_VALID_SIZE = "_PARALLEL_VALID_SIZE"

_VALID_DIMS = (None, 0, 1, -1)


def check_dim(dim: Any, name: str = "dim", allowed: tuple[Any, ...] = _VALID_DIMS) -> int | None:
    """Validate a parallel dim value.

    Raises
    ------
    ValueError
        If ``dim`` is not one of ``allowed``.
    """
    if isinstance(dim, bool) or dim not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {dim!r}")
    return dim


def get_parallel_dim(tensor: torch.Tensor | None) -> int | None:
    """Return the parallel dim tag of ``tensor`` (``None`` when it is not split).

    Parameters
    ----------
    tensor : torch.Tensor
        Any tensor or parameter.

    Returns
    -------
    int or None
        ``-1``, ``1``, ``0`` or ``None`` (also for ``tensor=None``, e.g. an absent bias, as in
        TorchShard).

    Raises
    ------
    TypeError
        If ``tensor`` is neither a tensor nor None.
    """
    if tensor is None:
        return None
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    return getattr(tensor, _PARALLEL_DIM, None)


def register_parallel_dim(tensor: torch.Tensor, parallel_dim: int | None = None) -> None:
    """Tag ``tensor`` (in place) as split along ``parallel_dim``.

    Parameters
    ----------
    tensor : torch.Tensor
        The tensor to tag.
    parallel_dim : {None, 0, 1, -1}
        Its parallel dimension (default None, as in TorchShard).

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor.
    ValueError
        If ``parallel_dim`` is not one of None, 0, 1, -1.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    check_dim(parallel_dim, "parallel_dim")
    setattr(tensor, _PARALLEL_DIM, parallel_dim)


def register_parallel_attribute(tensor: torch.Tensor, parallel_dim: int | None, order_type: int = 0) -> None:
    """Tag a parameter with its parallel dim and order type (in place).

    Parameters
    ----------
    tensor : torch.Tensor
        Usually an ``nn.Parameter`` of a custom parallel layer.
    parallel_dim : {None, 0, 1, -1}
        The logical split: ``-1``/``1`` = output features, ``0`` = input features.
    order_type : {0, 1}
        ``0``: the weight is stored ``[out, in]`` (like ``nn.Linear``), so the storage axis is the
        reverse of the logical one; ``1``: stored ``[in, out]`` (like ``nn.Embedding``).

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor.
    ValueError
        If ``parallel_dim`` or ``order_type`` is out of range.
    """
    register_parallel_dim(tensor, parallel_dim)
    if isinstance(order_type, bool) or order_type not in (0, 1):
        raise ValueError(f"order_type must be 0 or 1, got {order_type!r}")
    setattr(tensor, _ORDER_TYPE, order_type)


def set_attribute(tensor: torch.Tensor, value: int | None = None, order_type: int = 0) -> None:
    """Set the parallel attributes of ``tensor``: TorchShard's inner helper ``ts.set_attribute``.

    The same as :func:`register_parallel_attribute`.

    Parameters
    ----------
    tensor : torch.Tensor
        The tensor (a parameter) to tag.
    value : {None, 0, 1, -1}
        The parallel dim.
    order_type : {0, 1}
        ``0``: stored ``[out, in]`` (like ``nn.Linear``); ``1``: stored ``[in, out]`` (like
        ``nn.Embedding``).

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor.
    ValueError
        If ``value`` or ``order_type`` is out of range.
    """
    register_parallel_attribute(tensor, value, order_type)


def storage_axis(tensor: torch.Tensor) -> int | None:
    """The axis of ``tensor``'s storage that is split (from its dim tag and order type), or None
    when the tensor is not split.

    As in TorchShard's serialization: a 1-D tensor tagged row-parallel (``0``) with order type 0 (the
    bias of a row-parallel linear, which TorchShard's layers and templates tag ``0``) and a 1-D
    tensor tagged column-parallel with order type 1 are replicated, not split.
    """
    dim = get_parallel_dim(tensor)
    if dim is None:
        return None
    order = getattr(tensor, _ORDER_TYPE, 0)
    column = dim in (1, -1)
    if tensor.dim() <= 1:
        return 0 if column == (order == 0) else None
    if order == 0:  # stored [out, in]: output features are axis 0
        return 0 if column else tensor.dim() - 1
    return tensor.dim() - 1 if column else 0


def shard_extent(tensor: torch.Tensor, parts: int, index: int) -> tuple[int | None, int, int, int]:
    """``(axis, full_size, start, length)`` of a tagged parameter's real shard on rank ``index``.

    ``axis`` is None for a replicated tensor. The tensor's storage along ``axis`` may hold more
    rows than ``length`` (padding at the end, see :func:`padded_size`).
    """
    axis = storage_axis(tensor)
    if axis is None:
        return None, 0, 0, 0
    full = int(getattr(tensor, _FULL_SIZE, tensor.shape[axis] * parts))
    start, length = partition_range(full, parts, index)
    return axis, full, start, length


# ----------------------------------------------------------------------------------------------
# activation tags that survive shape-preserving ops

_CONTRACTIONS: set[Callable[..., Any]] = {
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.Tensor.__rmatmul__,
    torch.mm,
    torch.Tensor.mm,
    torch.bmm,
    torch.Tensor.bmm,
    torch.einsum,
    torch.tensordot,
    torch.inner,
    torch.outer,
    F.linear,
    F.bilinear,
    torch.transpose,
    torch.Tensor.transpose,
    torch.t,
    torch.Tensor.t,
    torch.permute,
    torch.Tensor.permute,
    torch.Tensor.mT.__get__,  # type: ignore[attr-defined]
    torch.Tensor.T.__get__,  # type: ignore[attr-defined]
}


_CROSS_ENTROPY = {F.cross_entropy}
_RESHAPES = {torch.Tensor.view, torch.Tensor.reshape, torch.reshape}


def _local_shape(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Rewrite ``x.view(..., V)`` / ``reshape`` of a tensor split along its last dim whose real
    global size is ``V`` (a vocabulary head's logits) into ``x.view(..., V_local)``: model code
    written for full logits (e.g. ``logits.view(-1, vocab_size)`` before the loss) then keeps the
    split instead of silently mixing rows."""
    x = args[0] if args else None
    valid = valid_size(x) if isinstance(x, torch.Tensor) else None
    if valid is None or getattr(x, _PARALLEL_DIM, None) not in (1, -1) or "shape" in kwargs:
        return args
    rest = args[1:]
    shape = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)) else rest
    if not shape or not all(isinstance(d, int) for d in shape) or shape[-1] != valid:
        return args
    assert isinstance(x, torch.Tensor)
    local = (*shape[:-1], x.shape[-1])
    return (x, local)


def _axis(tag: int) -> int:
    return 0 if tag == 0 else -1


def _find_tag(obj: Any, found: list[tuple[int, torch.Tensor]]) -> None:
    if isinstance(obj, torch.Tensor):
        if isinstance(obj, torch.nn.Parameter):
            return  # parameter tags describe the storage split, not an activation's
        tag = getattr(obj, _PARALLEL_DIM, None)
        if tag is not None:
            found.append((tag, obj))
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _find_tag(o, found)


def _keeps_split(ret: torch.Tensor, src: torch.Tensor, tag: int) -> bool:
    if ret.dim() == 0 or src.dim() == 0:
        return False
    ax = _axis(tag)
    return bool(ret.shape[ax] == src.shape[ax])


def tag_output(t: torch.Tensor, tag: int | None, valid: int | None = None) -> torch.Tensor:
    """Return ``t`` as a :class:`ParallelTensor` tagged ``tag`` (or a plain tensor for None);
    ``valid`` records the real (unpadded) global size of the split dim."""
    if tag is None:
        return untag(t)
    out = t if type(t) is ParallelTensor else t.as_subclass(ParallelTensor)
    setattr(out, _PARALLEL_DIM, tag)
    if valid is not None:
        setattr(out, _VALID_SIZE, int(valid))
    return out


def valid_size(t: torch.Tensor) -> int | None:
    """The real global size of a padded split dim (None when not padded)."""
    return t.__dict__.get(_VALID_SIZE) if isinstance(t, torch.Tensor) else None


def untag(t: torch.Tensor) -> torch.Tensor:
    """A plain ``torch.Tensor`` alias of ``t`` without tag."""
    if type(t) is torch.Tensor:
        return t
    out = t.as_subclass(torch.Tensor)
    for attr in (_PARALLEL_DIM, _VALID_SIZE):
        if attr in out.__dict__:
            delattr(out, attr)
    return out


class ParallelTensor(torch.Tensor):
    """An activation split over the tensor-parallel group; its tag follows shape-preserving ops.

    The tag is copied to the result of any torch op whose input carries it, when the result keeps
    the size of the split dimension (last dim for tag -1/1, first dim for tag 0); matrix products,
    transposes and permutations never propagate it. Two inputs tagged differently raise
    ``ValueError`` (tag mismatch).

    Logits of a vocabulary head (split along the classes, real class count known) also make
    ``F.cross_entropy`` compute the vocab-parallel loss, and ``view``/``reshape`` to
    ``(..., vocab_size)`` keep the local class count, so model code that computes its own loss
    (e.g. Hugging Face's ``labels=``) works unchanged.
    """

    #: The vocab-parallel loss that ``F.cross_entropy`` on class-split logits dispatches to:
    #: :func:`shardlayers.nn.functional.parallel_cross_entropy`, attached by the package
    #: ``__init__`` (it is built on the communication ops, which build on this module).
    _vocab_parallel_loss: Callable[..., torch.Tensor] | None = None

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _CROSS_ENTROPY:
            inp = args[0] if args else kwargs.get("input")
            if getattr(inp, _PARALLEL_DIM, None) in (1, -1):
                # logits split along the classes (a vocab-parallel head): F.cross_entropy on the
                # local shard would be wrong; compute the vocab-parallel loss instead
                loss = ParallelTensor._vocab_parallel_loss
                assert loss is not None, "shardlayers/__init__ attaches the vocab-parallel loss"
                return loss(*args, **kwargs)
        if func in _RESHAPES:
            args = _local_shape(func, args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **kwargs)
        if func in _CONTRACTIONS:
            return ret
        found: list[tuple[int, torch.Tensor]] = []
        _find_tag(args, found)
        _find_tag(list(kwargs.values()), found)
        if not found:
            return ret
        tags = {_axis(t) for t, _ in found}
        if len(tags) > 1:
            raise ValueError(
                f"tag mismatch: inputs of {getattr(func, '__name__', func)} are split along different dims"
            )
        tag, src = found[0]
        valid = valid_size(src)
        if isinstance(ret, torch.Tensor):
            if type(ret) is torch.Tensor and _keeps_split(ret, src, tag):
                return tag_output(ret, tag, valid)
            return ret
        if type(ret) in (tuple, list):
            items = [
                tag_output(r, tag, valid)
                if isinstance(r, torch.Tensor) and type(r) is torch.Tensor and _keeps_split(r, src, tag)
                else r
                for r in ret
            ]
            return type(ret)(items)
        return ret
