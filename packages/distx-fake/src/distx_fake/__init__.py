"""torchdistX-style fake tensors, exact deferred module init and verified sharded checkpoints."""

from __future__ import annotations

from . import _distx_fake
from ._version import __version__

__all__ = ["__version__"]
