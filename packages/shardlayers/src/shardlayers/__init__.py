"""TorchShard-style tensor-parallel layers and sharded state dicts for PyTorch."""

from __future__ import annotations

from . import _shardlayers
from ._version import __version__

__all__ = ["__version__"]
