"""Sharded state dicts: local shards as DTensors, for DCP and ``distx_fake.checkpoint``.

Every shard of a parallel layer is cut as DTensor's ``Shard`` cuts (``torch.chunk``), so this
rank's real rows are exactly the local tensor of a ``DTensor`` with the parameter's full
(unpadded) shape. Checkpoint libraries then save every shard without gathering and load into any
other tensor-parallel size, or into a plain model in one process.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._tag import shard_extent, storage_axis

__all__ = ["load_sharded_state_dict", "sharded_state_dict"]


def device_mesh() -> Any:
    """The 2-D ``DeviceMesh`` ``("dp", "tp")`` of shardlayers' groups (made once per
    :func:`~shardlayers.distributed.init_process_group`, from the existing process groups: no
    new communicator)."""
    # kept on the groups' state, never in a cache keyed by id() of it: a regrouping's new state
    # may be allocated at the destroyed one's address, and would then get the previous layout's
    # mesh, whose coordinate for this rank (fixed when the mesh is made) places shards wrongly
    from torch.distributed.device_mesh import DeviceMesh

    from .distributed._state import state

    s = state()
    if s.mesh is None:
        world = dist.get_world_size()
        dp = world // s.group_size
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        layout = torch.arange(world).view(dp, s.group_size)
        s.mesh = DeviceMesh.from_group([s.dp_group, s.tp_group], device, mesh=layout, mesh_dim_names=("dp", "tp"))
    return s.mesh


def _owners(model: nn.Module) -> dict[str, torch.Tensor]:
    """state-dict key -> the parameter / buffer object (which carries the parallel tags)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for m in model.modules():
        fix = getattr(m, "_register_tags", None)
        if callable(fix):
            fix()
    out: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    out.update(model.named_buffers(remove_duplicate=False))
    return out


def _contiguous_stride(shape: list[int]) -> tuple[int, ...]:
    stride = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        stride[k] = stride[k + 1] * shape[k + 1]
    return tuple(stride)


def sharded_state_dict(model: nn.Module) -> OrderedDict[str, Any]:
    """The model's state dict with every tensor as a ``DTensor`` on the ``("dp", "tp")`` mesh.

    Split parameters are ``[Replicate(), Shard(d)]`` (their local tensor is a view of this rank's
    real shard, padding left out), the others ``[Replicate(), Replicate()]``. Nothing is copied or
    gathered: saving it with ``distx_fake.checkpoint.save_state_dict`` or DCP writes each shard
    once, and loading into it (any tensor-parallel size) writes straight into the parameters.
    Without process groups (one process) the plain ``model.state_dict()`` is returned.

    Parameters
    ----------
    model : nn.Module
        A model with shardlayers' parallel layers (e.g. from :func:`parallelize_module`).

    Returns
    -------
    OrderedDict
        Key -> DTensor (or the model's non-tensor extra state).

    Raises
    ------
    TypeError
        If ``model`` is not an ``nn.Module``.
    RuntimeError
        If the model has split parameters but the process groups are not initialised.
    """
    from .distributed._state import is_initialized, state

    owners = _owners(model)
    sd = model.state_dict()
    if not is_initialized():
        if any(storage_axis(owners[k]) is not None for k in sd if k in owners):
            state()  # raises the no-process-group error
        return OrderedDict(sd)
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = device_mesh()
    s = state()
    p, r = s.group_size, s.tp_ranks.index(dist.get_rank())
    out: OrderedDict[str, Any] = OrderedDict()
    for key, t in sd.items():
        owner = owners.get(key)
        if not isinstance(t, torch.Tensor) or owner is None:
            out[key] = t
            continue
        axis, full, _, n = shard_extent(owner, p, r)
        if axis is None:
            out[key] = DTensor.from_local(t, mesh, [Replicate(), Replicate()], run_check=False)
            continue
        shape = list(t.shape)
        shape[axis] = full
        local = t.narrow(axis, 0, n)
        out[key] = DTensor.from_local(
            local,
            mesh,
            [Replicate(), Shard(axis)],
            run_check=False,
            shape=torch.Size(shape),
            stride=_contiguous_stride(shape),
        )
    return out


def load_sharded_state_dict(model: nn.Module, state_dict: dict[str, Any], *, strict: bool = True) -> Any:
    """Load a state dict of DTensors, full tensors, or this rank's local shards into ``model``.

    DTensors are as made by :func:`sharded_state_dict` and filled by a checkpoint library.
    A DTensor on shardlayers' mesh is redistributed to this model's layout when its placements
    differ; a DTensor on another mesh is gathered first (``full_tensor``). A full tensor is cut to
    this rank's shard; padding rows of padded vocabularies stay zero.

    Parameters
    ----------
    model : nn.Module
        The (parallel) model.
    state_dict : dict
        Key -> DTensor / tensor / extra state.
    strict : bool
        As ``nn.Module.load_state_dict``.

    Returns
    -------
    NamedTuple
        ``missing_keys`` and ``unexpected_keys``, as ``nn.Module.load_state_dict``.

    Raises
    ------
    TypeError
        Bad argument types.
    ValueError
        A tensor whose shape is neither the full nor the local shape.
    RuntimeError
        Missing / unexpected keys with ``strict``, or no process group for a split parameter.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    from torch.distributed.tensor import DTensor

    from .distributed._state import is_initialized, state

    owners = _owners(model)
    split = is_initialized()
    p, r = (state().group_size, state().tp_ranks.index(dist.get_rank())) if split else (1, 0)
    local_sd: OrderedDict[str, Any] = OrderedDict()
    for key, v in state_dict.items():
        owner = owners.get(key)
        if owner is None or not isinstance(v, torch.Tensor):
            local_sd[key] = v
            continue
        axis = storage_axis(owner)
        if axis is not None and not split:
            state()  # raises the no-process-group error
        if isinstance(v, DTensor):
            v = _to_layout(v, owner, p, r)
        local_sd[key] = _fit(key, v.detach(), owner, p, r)
    return model.load_state_dict(local_sd, strict=strict)


def _to_layout(v: Any, owner: torch.Tensor, p: int, r: int) -> torch.Tensor:
    """The local tensor of ``v`` in this model's layout (or the full tensor)."""
    from torch.distributed.tensor import Replicate, Shard

    axis = storage_axis(owner)
    want = [Replicate(), Shard(axis) if axis is not None else Replicate()]
    if is_our_mesh(v.device_mesh):
        if list(v.placements) != want:
            v = v.redistribute(v.device_mesh, want)
        return v.to_local()
    return v.full_tensor()


def is_our_mesh(mesh: Any) -> bool:
    # by value, not only identity: a DeviceMesh's tensor of ranks fixes each rank's coordinate,
    # and so the offsets of its shard; a mesh with the same ranks in the same places (the mesh of
    # an earlier grouping at the same group size, or the user's own ("dp", "tp") mesh) cuts the
    # same shards. A permuted or resized layout has another tensor and loads via full_tensor().
    try:
        ours = device_mesh()
    except RuntimeError:
        return False
    return bool(
        mesh is ours or (mesh.mesh.tolist() == ours.mesh.tolist() and mesh.mesh_dim_names == ours.mesh_dim_names)
    )


def _fit(key: str, v: torch.Tensor, owner: torch.Tensor, p: int, r: int) -> torch.Tensor:
    """``v`` (full, or this rank's real shard) as the parameter's local storage (padding included)."""
    axis, full, start, n = shard_extent(owner, p, r)
    if axis is None:
        return v
    local_shape = list(owner.shape)
    real_shape = list(owner.shape)
    real_shape[axis] = n
    full_shape = list(owner.shape)
    full_shape[axis] = full
    if list(v.shape) == full_shape and full_shape != real_shape:
        v = v.narrow(axis, start, n)
    elif list(v.shape) not in (real_shape, local_shape):
        raise ValueError(
            f"{key!r}: expected the full shape {tuple(full_shape)} or this rank's shard {tuple(real_shape)}, got {tuple(v.shape)}"
        )
    if list(v.shape) != local_shape:  # padded storage: real rows first, zero padding
        pad = list(v.shape)
        pad[axis] = local_shape[axis] - v.shape[axis]
        v = torch.cat([v, v.new_zeros(pad)], dim=axis)
    return v
