"""Hooks that parallelize modules in place: gradient sums of replicated parameters used on
sequence chunks, and DTensor's ``PrepareModuleInput`` / ``PrepareModuleOutput`` redistributions."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..distributed._ops import _Gather, _Scatter, all_reduce_
from ..distributed._sequence import gather_sequence
from ._styles import Spec


def sum_grads_over_group(m: nn.Module, group: Any) -> None:
    """A norm applied to this rank's sequence chunk: its replicated parameters' gradients are
    summed over the tensor-parallel group (each rank saw only its tokens), so every rank applies
    the gradient of the whole sequence and the copies stay identical."""
    if getattr(m, "_ts_sequence_parallel", False):
        return
    for p in m.parameters(recurse=False):
        if p.requires_grad:
            p.register_hook(lambda g: all_reduce_(g.contiguous().clone(), group))
    m._ts_sequence_parallel = True  # type: ignore[assignment]


def _redistribute(x: Any, how: tuple[str, int] | None, group: Any) -> Any:
    if how is None or not isinstance(x, torch.Tensor):
        return x
    op, dim = how
    if op == "gather":  # Shard(dim) -> Replicate: the whole sequence, once per tensor
        return gather_sequence(x, dim, group)
    return _Scatter.apply(x, dim % x.dim(), group, None)  # Replicate -> Shard(dim)


def gather_inputs(m: nn.Module, spec: Spec, group: Any) -> None:
    """``PrepareModuleInput``: redistribute the listed positional and keyword inputs."""

    def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        new_args = tuple(
            _redistribute(a, spec.arg_dims[i] if i < len(spec.arg_dims) else None, group) for i, a in enumerate(args)
        )
        new_kwargs = dict(kwargs)
        for k, how in spec.kwarg_dims:
            if k in new_kwargs:
                new_kwargs[k] = _redistribute(new_kwargs[k], how, group)
        return new_args, new_kwargs

    m.register_forward_pre_hook(hook, with_kwargs=True)


def gather_first_input(m: nn.Module, dim: int, group: Any) -> None:
    """``"sequence_gather"``: the module's first input (positional, or by its parameter name) is
    split along ``dim``; gather it before the module runs, so that code deriving shapes from it
    (attention's ``hidden_states.shape[:-1]`` head reshapes) sees the whole sequence."""
    try:
        first = next(iter(inspect.signature(m.forward).parameters))
    except (StopIteration, TypeError, ValueError):
        first = None

    def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if args:
            return (_redistribute(args[0], ("gather", dim), group), *args[1:]), kwargs
        if first is not None and first in kwargs:
            new = dict(kwargs)
            new[first] = _redistribute(kwargs[first], ("gather", dim), group)
            return args, new
        return args, kwargs

    m.register_forward_pre_hook(hook, with_kwargs=True)


def gather_outputs(m: nn.Module, spec: Spec, group: Any) -> None:
    """``PrepareModuleOutput``: redistribute the module's output(s)."""

    def one(x: Any, how: tuple[str, int] | None) -> Any:
        if how is None or not isinstance(x, torch.Tensor):
            return x
        op, dim = how
        if op == "gather":
            return _Gather.apply(x, dim % x.dim(), group, None)
        return _Scatter.apply(x, dim % x.dim(), group, None)

    def hook(mod: nn.Module, args: Any, out: Any) -> Any:
        if isinstance(out, tuple):
            return tuple(one(o, spec.arg_dims[i] if i < len(spec.arg_dims) else None) for i, o in enumerate(out))
        return one(out, spec.arg_dims[0] if spec.arg_dims else None)

    m.register_forward_hook(hook)


def full_positions(root: nn.Module) -> None:
    """Sequence parallel splits the embedding output, from which Hugging Face models derive the
    token positions (``inputs_embeds.shape[1]``): hand the root's forward the positions of the
    whole sequence when the caller gives ``input_ids`` and no ``position_ids`` (and no cache)."""
    try:
        sig = inspect.signature(root.forward)
    except (TypeError, ValueError):
        return
    if "position_ids" not in sig.parameters or "input_ids" not in sig.parameters:
        return

    def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
        try:
            bound = sig.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return None
        ids = bound.get("input_ids")
        if bound.get("position_ids") is not None or bound.get("past_key_values") is not None:
            return None
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return None
        new = dict(kwargs)
        new["position_ids"] = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return args, new

    root.register_forward_pre_hook(hook, with_kwargs=True)
