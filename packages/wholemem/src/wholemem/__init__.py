"""WholeMemory-style multi-process shared and partitioned tensors for PyTorch."""

from __future__ import annotations

from . import _wholemem
from ._version import __version__

__all__ = ["__version__"]
