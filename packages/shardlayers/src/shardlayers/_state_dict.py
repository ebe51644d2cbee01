"""collect_state_dict / relocate_state_dict / register_ddp_parameters_to_ignore."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._split import partition_sizes
from ._tag import shard_extent, storage_axis


def _tagged(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for m in model.modules():
        fix = getattr(m, "_register_tags", None)
        if callable(fix):
            fix()
    out = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if storage_axis(t) is not None:  # split (a 1-D tensor tagged 0 is a replicated row bias)
            out.append((name, t))
    return out


def _check_sd(state_dict: Any, prefix: Any) -> None:
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")


def collect_state_dict(
    model: nn.Module, state_dict: dict[str, Any], prefix: str = "", *, rank0_only: bool = False
) -> OrderedDict[str, Any]:
    """Gather the shards of the parallel parameters into full tensors, on the CPU.

    Every shard is copied to the CPU first and gathered over a CPU (gloo) group, so no full copy is
    ever materialised on an accelerator. Entries of unsplit parameters are returned unchanged.

    Parameters
    ----------
    model : nn.Module
        The module the state dict came from (its parameters carry the parallel tags).
    state_dict : dict
        ``model.state_dict()`` (with ``keep_vars`` or not).
    prefix : str
        Prefix of the keys of ``model``'s entries in ``state_dict``.
    rank0_only : bool
        Gather only to rank 0 of each tensor-parallel group; the other ranks get an empty dict.

    Returns
    -------
    OrderedDict
        The full state dict (parallel entries are CPU tensors).

    Raises
    ------
    TypeError
        Bad argument types.
    KeyError
        If a parallel parameter's key is missing from ``state_dict``.
    RuntimeError
        If the model has parallel parameters and the process groups are not initialised.
    """
    _check_sd(state_dict, prefix)
    tagged = _tagged(model)
    out: OrderedDict[str, Any] = OrderedDict(state_dict)
    if not tagged:
        return out
    from .distributed._state import state

    s = state()
    group = s.cpu_tp_group
    p = s.group_size
    me = s.tp_ranks.index(dist.get_rank())
    for name, param in tagged:
        key = prefix + name
        if key not in state_dict:
            raise KeyError(f"parallel parameter {key!r} is missing from the state dict")
        axis, full_n, _, n = shard_extent(param, p, me)
        assert axis is not None
        local = state_dict[key].detach().narrow(axis, 0, n).to("cpu")  # padding rows stay behind
        sizes = partition_sizes(full_n, p)
        if p == 1:
            out[key] = local.clone()
            continue
        big = max(sizes)
        buf = local.contiguous()
        if buf.shape[axis] < big:
            pad = list(buf.shape)
            pad[axis] = big - buf.shape[axis]
            buf = torch.cat([buf, buf.new_zeros(pad)], dim=axis)
        if rank0_only:
            bufs = [torch.empty_like(buf) for _ in range(p)] if me == 0 else None
            dist.gather(buf, bufs, dst=s.tp_ranks[0], group=group)
        else:
            bufs = [torch.empty_like(buf) for _ in range(p)]
            dist.all_gather(bufs, buf, group=group)
        if bufs is not None:
            out[key] = torch.cat([b.narrow(axis, 0, n) for b, n in zip(bufs, sizes, strict=True)], dim=axis)
    if rank0_only and me != 0:
        return OrderedDict()
    return out


def relocate_state_dict(model: nn.Module, state_dict: dict[str, Any], prefix: str = "") -> OrderedDict[str, Any]:
    """Cut the full tensors of a (collected) state dict into this rank's shards.

    Works for any tensor-parallel size, including sizes that do not divide when the model was
    built with ``uneven=True``. Unsplit entries are returned unchanged.

    Parameters
    ----------
    model : nn.Module
        The (parallel) module the state dict will be loaded into.
    state_dict : dict
        A full state dict (e.g. from :func:`collect_state_dict` or a single-process model).
    prefix : str
        Prefix of ``model``'s keys in ``state_dict``.

    Returns
    -------
    OrderedDict
        The state dict to pass to ``model.load_state_dict``.

    Raises
    ------
    TypeError
        Bad argument types.
    ValueError
        If a full tensor's shape does not match the model's parameter.
    RuntimeError
        If the model has parallel parameters and the process groups are not initialised.
    """
    _check_sd(state_dict, prefix)
    tagged = _tagged(model)
    out: OrderedDict[str, Any] = OrderedDict(state_dict)
    if not tagged:
        return out
    from .distributed import get_group_size, get_rank

    p, r = get_group_size(), get_rank()
    for name, param in tagged:
        key = prefix + name
        if key not in state_dict:
            continue
        full = state_dict[key]
        axis, full_n, start, n = shard_extent(param, p, r)
        assert axis is not None
        want = list(param.shape)
        want[axis] = full_n
        if list(full.shape) != want:
            raise ValueError(
                f"{key!r}: expected a full tensor of shape {tuple(want)} (this rank holds {tuple(param.shape)}), "
                f"got {tuple(full.shape)}"
            )
        piece = full.detach().narrow(axis, start, n)
        if param.shape[axis] > n:  # padded storage: real rows first, zero padding after
            pad = list(piece.shape)
            pad[axis] = param.shape[axis] - n
            piece = torch.cat([piece, piece.new_zeros(pad)], dim=axis)
        out[key] = piece.clone()
    return out


def split_parameter_names(module: nn.Module) -> list[str]:
    """Names of the split parameters and buffers of ``module`` (what DDP over the world must ignore).

    Raises
    ------
    TypeError
        If ``module`` is not an ``nn.Module``.
    """
    return [n for n, _ in _tagged(module)]


def register_ddp_parameters_to_ignore(module: nn.Module) -> list[str]:
    """Tell DDP (over the whole world) to skip the split parameters of ``module``.

    Use this when DDP runs on the default (world) group: split shards differ between the ranks
    of a tensor-parallel group and must not be averaged together. With tensor x data parallelism
    prefer ``DistributedDataParallel(model, process_group=ts.distributed.get_data_parallel_group())``,
    which averages every parameter over its data-parallel replicas only.

    Parameters
    ----------
    module : nn.Module
        The module that will be wrapped in DDP.

    Returns
    -------
    list of str
        Names of the ignored (split) parameters.

    Raises
    ------
    TypeError
        If ``module`` is not an ``nn.Module``.
    """
    names = split_parameter_names(module)
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)
    return names
