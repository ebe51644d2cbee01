"""Where checkpoints are written and read: :class:`FileSystemWriter`, :class:`FileSystemReader`."""

from __future__ import annotations

import os
from typing import Any

from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

from ._dcp import DcpReaderMixin, DcpWriterMixin
from ._engine import ALIGN
from ._metadata import read_index


class FileSystemWriter(DcpWriterMixin, StorageWriter):
    """Where and how :func:`save_state_dict` writes; also a DCP ``StorageWriter``.

    ``torch.distributed.checkpoint.save(state_dict, storage_writer=FileSystemWriter(path))``
    (and ``async_save``) plan with DCP and write this package's format (see ``_dcp``).

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory (replaced atomically if it exists).
    piece_bytes : int, optional
        Granularity of checksums and of parallel I/O (default 32 MiB).
    sync : bool, optional
        Whether to fsync files and directories (default True; turning it off forfeits durability).
    progress : bool or None, optional
        Show a progress bar on rank 0; ``None`` (default) = only when stderr is a terminal.
    direct : bool, optional
        Write with ``O_DIRECT`` through aligned bounce buffers (default True; falls back to
        buffered I/O where the filesystem refuses it). Bypasses the page cache like ``dd
        oflag=direct``, so the final fsync has nothing left to flush.

    Raises
    ------
    TypeError
        If ``path`` is not a path.
    ValueError
        If ``piece_bytes`` is not a positive multiple of 4096.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        piece_bytes: int = 32 << 20,
        sync: bool = True,
        progress: bool | None = None,
        direct: bool = True,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or PathLike, got {type(path).__name__}")
        if not isinstance(piece_bytes, int) or piece_bytes < ALIGN or piece_bytes % ALIGN:
            raise ValueError(f"piece_bytes must be a positive multiple of {ALIGN}, got {piece_bytes!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.piece_bytes = piece_bytes
        self.sync = bool(sync)
        self.progress = progress
        self.direct = bool(direct)


class FileSystemReader(DcpReaderMixin, StorageReader):
    """Where :func:`load_state_dict` reads from; also a DCP ``StorageReader``.

    ``torch.distributed.checkpoint.load(state_dict, storage_reader=FileSystemReader(path))``
    reads checkpoints written through DCP or by :func:`save_state_dict`.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory written by :func:`save_state_dict`.
    progress : bool or None, optional
        Show a progress bar on rank 0; ``None`` (default) = only when stderr is a terminal.
    direct : bool, optional
        Read with ``O_DIRECT`` through aligned bounce buffers (default True; falls back to
        buffered reads where the filesystem refuses it). A data file that is already in the
        page cache (90 % of its pages or more) is read through the cache instead.

    Raises
    ------
    TypeError
        If ``path`` is not a path.
    """

    def __init__(self, path: str | os.PathLike[str], *, progress: bool | None = None, direct: bool = True) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or PathLike, got {type(path).__name__}")
        self.path = os.path.abspath(os.fspath(path))
        self.progress = progress
        self.direct = bool(direct)

    def read_index(self) -> dict[str, Any]:
        """Parse and validate ``metadata.json`` (plain JSON, never pickle).

        Returns
        -------
        dict
            The checkpoint's index: format, version, world size and every entry.

        Raises
        ------
        FileNotFoundError
            If there is no checkpoint at the path.
        CheckpointCorruptionError
            If the metadata is not a valid distx-fake checkpoint description.
        """
        return read_index(self.path)
