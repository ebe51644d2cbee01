"""torchdistX-style fake tensors, exact deferred module init and verified sharded checkpoints.

``from distx_fake import fake, deferred_init, checkpoint``
"""

from __future__ import annotations

from . import _distx_fake, checkpoint, deferred_init, fake  # noqa: F401  (_distx_fake: load the extension early)
from ._version import __version__

__all__ = ["__version__", "checkpoint", "deferred_init", "fake"]
