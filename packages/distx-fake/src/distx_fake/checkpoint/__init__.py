"""Sharded checkpoints (torchdistX ``checkpoint`` API): JSON metadata, raw bytes, crc32c, atomic.

Split by concern, as ``torch.distributed.checkpoint`` is: ``_metadata`` (the on-disk index),
``_boxes`` (which part of a global tensor a value holds), ``_engine`` (native zero-copy I/O; atomic commit and stale-temporary cleanup come from
``distkit_common.fsio``, failure agreement from ``distkit_common.collective``),
``_storage`` (writer / reader objects),
``_saver`` / ``_loader`` (the collective save and load), ``_async`` (background saves),
``_dcp`` (DCP StorageWriter / StorageReader), ``_safetensors`` (Hugging Face export and loading).
"""

from __future__ import annotations

from ._async import AsyncSave, async_save_state_dict
from ._boxes import LocalShard
from ._loader import load_state_dict
from ._metadata import CheckpointCorruptionError
from ._safetensors import export_safetensors, load_safetensors
from ._saver import CheckpointReplacedError, save_state_dict
from ._storage import FileSystemReader, FileSystemWriter

__all__ = [
    "AsyncSave",
    "CheckpointCorruptionError",
    "CheckpointReplacedError",
    "FileSystemReader",
    "FileSystemWriter",
    "LocalShard",
    "async_save_state_dict",
    "export_safetensors",
    "load_safetensors",
    "load_state_dict",
    "save_state_dict",
]
