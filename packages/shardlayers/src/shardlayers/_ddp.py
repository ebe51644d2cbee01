"""DistributedDataParallel and split parameters: refuse a DDP that would average different shards.

DDP over a group holding several ranks of one tensor-parallel group broadcasts rank 0's
parameters at construction and averages the gradients of every parameter it is not told to
ignore; for a split parameter that mixes different shards, silently. The parallel layers check
the DDP whose forward is running (``DistributedDataParallel._active_ddp_module``, set by its forward) once
per DDP instance and raise instead.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ._tag import storage_axis

#: DDP instance -> ids of the parallel layers already checked under it
_CHECKED: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()


def _shared_tp_ranks(ddp: Any) -> list[int]:
    """Ranks of this rank's tensor-parallel group that ``ddp``'s process group also holds."""
    from .distributed._state import is_initialized, state

    if not is_initialized():
        return []
    s = state()
    if s.group_size == 1:
        return []
    pg = getattr(ddp, "process_group", None)
    ddp_ranks = set(dist.get_process_group_ranks(pg)) if pg is not None else set(range(dist.get_world_size()))
    shared = [r for r in s.tp_ranks if r in ddp_ranks]
    return shared if len(shared) > 1 else []


def check_ddp(module: nn.Module) -> None:
    """Raise if the running DDP forward averages ``module``'s split parameters across tensor-parallel ranks.

    Called by the parallel layers' ``forward``; costs one attribute read outside DDP and one
    set lookup after the first check under a given DDP.

    Parameters
    ----------
    module : nn.Module
        A parallel layer (its own parameters are checked, not its children's).

    Raises
    ------
    RuntimeError
        If the active DDP's process group holds other ranks of this rank's tensor-parallel group
        and reduces a split parameter of ``module`` (not in ``_ddp_params_and_buffers_to_ignore``).
    """
    ddp = getattr(DistributedDataParallel, "_active_ddp_module", None)
    if ddp is None:
        return
    seen = _CHECKED.setdefault(ddp, set())
    if id(module) in seen:
        return
    shared = _shared_tp_ranks(ddp)
    if shared:
        ignored: set[str] = set(getattr(ddp, "parameters_to_ignore", ()))
        reduced = {id(p) for n, p in ddp.module.named_parameters() if n not in ignored}
        split = [
            n
            for n, p in module.named_parameters(recurse=False)
            if id(p) in reduced and p.requires_grad and storage_axis(p) is not None
        ]
        if split:
            full = {id(p): n for n, p in ddp.module.named_parameters()}
            names = [full[id(getattr(module, n))] for n in split]
            raise RuntimeError(
                f"DistributedDataParallel averages the split parameters {names} over ranks {shared} of "
                "one tensor-parallel group, whose shards differ (and its construction already copied "
                "rank 0's shards to the others: rebuild the model). Wrap the model as "
                "DistributedDataParallel(model, process_group=ts.distributed.get_data_parallel_group()) "
                "(tensor x data parallel), or, when the tensor-parallel group is the whole world, call "
                "ts.register_ddp_parameters_to_ignore(model) before DistributedDataParallel(model)"
            )
    seen.add(id(module))


def register_if_world(module: nn.Module) -> nn.Module:
    """As TorchShard's ``convert_parallel_*``: at tensor-parallel size == world size, list the split
    parameters of ``module`` in ``module._ddp_params_and_buffers_to_ignore`` for ``DDP(module)``.

    Names already listed stay first. With tensor x data parallelism (a smaller group) nothing is
    registered: DDP over the data-parallel group must average the shards over their replicas.

    Parameters
    ----------
    module : nn.Module
        The converted module (the one the user will wrap in DDP).

    Returns
    -------
    nn.Module
        ``module``.

    Raises
    ------
    TypeError
        If ``module`` is not an ``nn.Module``.
    """
    from ._state_dict import split_parameter_names
    from .distributed._state import is_initialized, state

    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    if not is_initialized() or state().group_size == 1 or state().group_size != dist.get_world_size():
        return module
    names = split_parameter_names(module)
    if names:
        old = list(getattr(module, "_ddp_params_and_buffers_to_ignore", []))
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            module, old + [n for n in names if n not in old]
        )
    return module
