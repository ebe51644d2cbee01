"""Which part of a global tensor a state-dict value holds: its box, computed in one place.

A value is a plain tensor (the whole tensor, identical on every rank), a ``DTensor`` (its
local shard on the device mesh) or a :class:`LocalShard` (a shard described explicitly, as
shardlayers and other hand-written tensor parallelism keep them). Save, load, async staging,
DCP and safetensors all ask :func:`box_of`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from .._fake import is_fake
from ._metadata import PathT, name_of


@dataclasses.dataclass
class LocalShard:
    """This rank's part of a tensor sharded without DTensor.

    Parameters
    ----------
    tensor : torch.Tensor
        The local data (the box ``offsets`` .. ``offsets + tensor.shape`` of the global tensor).
    global_shape : sequence of int
        Shape of the whole tensor.
    offsets : sequence of int
        Global index of ``tensor[0, 0, ...]``.

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor.
    ValueError
        If the box does not fit in ``global_shape`` or the ranks differ.
    """

    tensor: torch.Tensor
    global_shape: Sequence[int]
    offsets: Sequence[int]

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, torch.Tensor):
            raise TypeError(f"LocalShard.tensor must be a tensor, got {type(self.tensor).__name__}")
        gs, off = tuple(int(x) for x in self.global_shape), tuple(int(x) for x in self.offsets)
        if len(gs) != self.tensor.dim() or len(off) != self.tensor.dim():
            raise ValueError(
                f"LocalShard: global_shape {gs} and offsets {off} must have {self.tensor.dim()} dims "
                f"like the local tensor of shape {tuple(self.tensor.shape)}"
            )
        for d, (o, s, g) in enumerate(zip(off, self.tensor.shape, gs)):
            if o < 0 or o + s > g:
                raise ValueError(f"LocalShard: dim {d}: offset {o} + size {s} exceeds global size {g}")
        self.global_shape, self.offsets = gs, off


@dataclasses.dataclass
class Box:
    """The part of a global tensor one rank holds."""

    local: torch.Tensor  # the rank's data (any device, maybe a view)
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    replicated: bool  # a plain tensor: the same whole tensor on every rank
    writes: bool  # False for a DTensor box another rank (coordinate 0 of its Replicate dims) writes

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(self.local.shape)

    @property
    def nbytes(self) -> int:
        return self.local.numel() * self.local.element_size()

    def ranges(self) -> list[tuple[int, int]]:
        """``[(start, stop)]`` per dimension, in global indices."""
        return [(o, o + s) for o, s in zip(self.offsets, self.local.shape)]


def is_dtensor(x: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(x, DTensor)


def box_of(value: Any) -> Box | None:
    """The box of a state-dict value, or ``None`` when it holds no tensor."""
    if isinstance(value, LocalShard):
        return Box(value.tensor, tuple(value.global_shape), tuple(value.offsets), False, True)
    if is_dtensor(value):
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, off = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
        # a copy of this box also lives on the ranks that differ only in Replicate mesh dims:
        # only the one at coordinate 0 of those dims writes it
        coord = value.device_mesh.get_coordinate() or []
        dup = any(isinstance(p, Replicate) and coord[i] != 0 for i, p in enumerate(value.placements))
        return Box(value._local_tensor, tuple(value.shape), tuple(off), False, not dup)
    if isinstance(value, torch.Tensor):
        return Box(value, tuple(value.shape), (0,) * value.dim(), True, True)
    return None


def check_has_data(path: PathT, t: torch.Tensor) -> None:
    """Raise for tensors without data (fake or meta).

    Raises
    ------
    TypeError
        If ``t`` is a fake or meta tensor.
    """
    if is_fake(t) or t.device.type == "meta":
        raise TypeError(
            f"state dict entry {name_of(path)!r} is a fake/meta tensor without data; "
            "materialize it first (deferred_init.materialize_module)"
        )


def intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """The intersection of two boxes, or ``None`` when empty (0-d boxes always intersect)."""
    inter = [(max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b)]
    if a and any(lo >= hi for lo, hi in inter):
        return None
    return inter
