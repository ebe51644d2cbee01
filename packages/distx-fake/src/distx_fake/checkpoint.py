"""Sharded checkpoints (torchdistX ``checkpoint`` API): JSON metadata, raw bytes, crc32c, atomic."""

from __future__ import annotations

from ._checkpoint import (
    CheckpointCorruptionError,
    FileSystemReader,
    FileSystemWriter,
    LocalShard,
    async_save_state_dict,
    load_state_dict,
    save_state_dict,
)

__all__ = [
    "CheckpointCorruptionError",
    "FileSystemReader",
    "FileSystemWriter",
    "LocalShard",
    "async_save_state_dict",
    "load_state_dict",
    "save_state_dict",
]
