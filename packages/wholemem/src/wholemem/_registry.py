"""What wholemem remembers about the plain ``torch.Tensor`` objects it returns.

HOST and DEVICE tensors (and their views) are normal torch tensors, so the
communicator, the whole tensor's layout and the memory that keeps them alive cannot
live on a wholemem object. They are kept here, keyed weakly by tensor identity: an
attribute on the tensor would break ``torch.save`` / ``copy.deepcopy``, which would try
to pickle the process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._layout import Layout


@dataclass(frozen=True)
class HostInfo:
    """The wholemem facts of a HOST / DEVICE tensor or of a view of one."""

    comm: Any  #: the WholeMemoryCommunicator it was created on
    layout: Layout  #: of the whole tensor
    memory: Any  #: keeps the mapping alive: a shared-memory Segment, or the device allocation
    tensor_type: Any  #: WmTensorType.HOST or WmTensorType.DEVICE
    row_offset: int = 0  #: first row of this view in the whole tensor


_INFO: WeakIdKeyDictionary = WeakIdKeyDictionary()


def register(t: torch.Tensor, info: HostInfo) -> torch.Tensor:
    """Remember ``info`` for ``t`` as long as ``t`` lives; returns ``t``."""
    _INFO[t] = info
    return t


def lookup(t: Any) -> HostInfo | None:
    """The :class:`HostInfo` of a tensor made by wholemem, or None for any other object."""
    if not isinstance(t, torch.Tensor):
        return None
    info: HostInfo | None = _INFO.get(t)
    return info
