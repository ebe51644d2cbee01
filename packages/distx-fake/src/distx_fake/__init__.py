"""torchdistX-style fake tensors, exact deferred module init and verified sharded checkpoints.

``from distx_fake import fake, deferred_init, checkpoint``
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _distx_fake, deferred_init, fake  # noqa: F401  (_distx_fake: load the extension early)
from ._version import __version__

__all__ = ["__version__", "checkpoint", "deferred_init", "fake"]


def __getattr__(name: str) -> Any:
    # `checkpoint` imports torch.distributed.checkpoint (~45 MB, 1-2 s): only when first used
    if name == "checkpoint":
        return importlib.import_module(".checkpoint", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
