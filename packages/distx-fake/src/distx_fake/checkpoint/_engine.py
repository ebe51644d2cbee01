"""The zero-copy I/O engine seen from Python: chunk layout, batched native writes and reads.

The native calls (``write_pieces`` / ``read_pieces``) take ``(address, bytes, file offset)``
triples, run them on a thread pool with the GIL released and return one crc32c per piece.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import Any

import torch

from distkit_common import dtypes as dk_dtypes

from .. import _distx_fake as _native
from ._metadata import CheckpointCorruptionError, PathT

ALIGN = _native.DIRECT_ALIGN
#: one native call (and one progress update) per ~512 MiB
BATCH_BYTES = 512 << 20
#: a data file at least this much in the page cache is read through the cache (memory speed);
#: O_DIRECT would read it from the disk again
CACHED_ENOUGH = 0.9


def as_bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the data of ``t`` (a copy only when needed)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


def open_file(fname: str, flags: int, direct: bool) -> tuple[int, bool]:
    """Open with O_DIRECT when asked and supported; return (fd, direct)."""
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(fname, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
    return os.open(fname, flags, 0o644), False


def open_for_reading(fname: str, direct: bool) -> tuple[int, bool]:
    """Open a data file for reading: with O_DIRECT when asked, unless the page cache already
    holds it (a checkpoint written with buffered I/O a moment ago, or read before); return
    (fd, direct)."""
    flags = os.O_RDONLY | os.O_CLOEXEC
    if direct:
        fd = os.open(fname, flags)
        try:
            cached = _native.cached_fraction(fd) >= CACHED_ENOUGH
        except BaseException:
            os.close(fd)
            raise
        if cached:
            return fd, False
        os.close(fd)
    return open_file(fname, flags, direct)


def write_chunks(
    fname: str,
    items: Iterable[tuple[PathT, torch.Tensor, tuple[int, ...], tuple[int, ...]]],
    *,
    piece_bytes: int,
    direct: bool,
    sync: bool,
    bar: Any = None,
) -> list[dict[str, Any]]:
    """Write ``(path, local tensor, global shape, offsets)`` chunks into one file; return their metadata.

    Each chunk starts in the file at the same remainder modulo 4096 as its memory address (the
    allocator gives every large tensor the same one), so direct I/O streams whole blocks between
    the file and the tensor storage without a bounce copy, here and when loading into tensors
    from the same allocator. Pieces end on block boundaries.
    """
    chunks: list[dict[str, Any]] = []
    fd, direct = open_file(fname, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, direct)
    base_name = os.path.basename(fname)
    try:
        offset = 0
        batch: list[tuple[int, int, int]] = []
        batch_refs: list[tuple[dict[str, Any], torch.Tensor]] = []
        batch_bytes = 0

        def flush() -> None:
            nonlocal batch, batch_refs, batch_bytes
            if not batch:
                return
            crcs = _native.write_pieces(fd, batch, direct)
            i = 0
            for chunk, _ in batch_refs:
                for p in chunk["pieces"]:
                    if p[2] is None:
                        p[2] = crcs[i]
                        i += 1
            if bar is not None:
                bar.update(batch_bytes)
            batch, batch_refs, batch_bytes = [], [], 0

        for path, tensor, global_shape, offsets in items:
            data = as_bytes_view(tensor)
            nbytes = data.numel() * data.element_size()
            chunk: dict[str, Any] = {
                "path": list(path),
                "dtype": dk_dtypes.dtype_name(data.dtype),
                "global_shape": list(global_shape),
                "offsets": list(offsets),
                "sizes": list(data.shape),
                "file": base_name,
                "pieces": [],
            }
            base = data.data_ptr() if nbytes else 0
            offset += base % ALIGN
            pos = 0
            if nbytes == 0:
                chunk["pieces"].append([offset, 0, 0])
            while pos < nbytes:
                n = min(piece_bytes - (offset % ALIGN if pos == 0 else 0), nbytes - pos)
                chunk["pieces"].append([offset, n, None])
                batch.append((base + pos, n, offset))
                batch_bytes += n
                pos += n
                offset += n
            offset = -(-offset // ALIGN) * ALIGN
            batch_refs.append((chunk, data))  # keeps `data` alive until written
            chunks.append(chunk)
            if batch_bytes >= BATCH_BYTES:
                flush()
        flush()
        if sync:
            _native.fsync_fd(fd)
    finally:
        os.close(fd)
    return chunks


class DataFiles:
    """The open data files of one checkpoint (read side), verified reads of pieces."""

    def __init__(self, root: str, direct: bool) -> None:
        self.root = root
        self.direct = direct
        self.fds: dict[str, tuple[int, bool]] = {}

    def handle(self, name: str) -> tuple[int, bool]:
        """``(fd, direct)`` of a data file, opened on first use."""
        return self._get(name)

    def _get(self, name: str) -> tuple[int, bool]:
        if "/" in name or name.startswith("."):
            raise CheckpointCorruptionError(f"invalid data file name {name!r} in metadata")
        if name not in self.fds:
            self.fds[name] = open_for_reading(os.path.join(self.root, name), self.direct)
        return self.fds[name]

    def read(self, name: str, tuples: list[tuple[int, int, int]]) -> list[int]:
        """Read ``(address, bytes, offset)`` pieces of a file; return their crc32c."""
        fd, direct = self._get(name)
        return _native.read_pieces(fd, tuples, direct)

    def close(self) -> None:
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __enter__(self) -> DataFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def verify(name: str, chunk: dict[str, Any], pieces: list[list[Any]], crcs: list[int]) -> None:
    """Compare read crc32c values with the metadata.

    Raises
    ------
    CheckpointCorruptionError
        On the first mismatch, naming the tensor, the file and the byte range.
    """
    for p, c in zip(pieces, crcs):
        if int(p[2]) != c:
            raise CheckpointCorruptionError(
                f"checksum mismatch in tensor {name!r}: {chunk['file']} bytes {p[0]}..{p[0] + p[1]} "
                f"have crc32c {c:#010x}, metadata says {int(p[2]):#010x} (the checkpoint is corrupted)"
            )


def read_range(files: DataFiles, name: str, chunk: dict[str, Any], b0: int, b1: int) -> tuple[torch.Tensor, int]:
    """Read the pieces of ``chunk`` covering chunk bytes [b0, b1), verified; return (buffer, start)."""
    sel: list[list[Any]] = []
    pos = 0
    start = -1
    for p in chunk["pieces"]:
        n = int(p[1])
        if pos + n > b0 and pos < b1:
            if start < 0:
                start = pos
            sel.append(p)
        pos += n
    total = sum(int(p[1]) for p in sel)
    buf = torch.empty(total, dtype=torch.uint8)
    ptr, at, tuples = buf.data_ptr(), 0, []
    for p in sel:
        tuples.append((ptr + at, int(p[1]), int(p[0])))
        at += int(p[1])
    crcs = files.read(chunk["file"], tuples)
    verify(name, chunk, sel, crcs)
    return buf, max(start, 0)


def read_box(
    files: DataFiles,
    name: str,
    dtype_name: str,
    chunk: dict[str, Any],
    inter: list[tuple[int, int]],
) -> torch.Tensor:
    """The part ``inter`` (global ranges) of a saved chunk, read (only the pieces it needs) and verified."""
    dtype = dk_dtypes.torch_dtype(dtype_name)
    item = torch.empty((), dtype=dtype).element_size()
    cbox = [(o, o + s) for o, s in zip(chunk["offsets"], chunk["sizes"])]
    sizes = [hi - lo for lo, hi in cbox]
    row = item
    for s in sizes[1:]:
        row *= s
    if len(sizes) == 0:
        b0, b1 = 0, item
    elif all(inter[d] == cbox[d] for d in range(1, len(sizes))):
        # restricted along dim 0 only: a contiguous byte range of the chunk
        b0, b1 = (inter[0][0] - cbox[0][0]) * row, (inter[0][1] - cbox[0][0]) * row
    else:
        b0, b1 = 0, row * (sizes[0] if sizes else 1)
    buf, start = read_range(files, name, chunk, b0, b1)
    sub = buf[b0 - start : b1 - start]
    if len(sizes) == 0:
        return sub.view(dtype).reshape(())
    first = cbox[0][0] + b0 // row  # global index of the first row in `sub`
    src = sub.view(dtype).reshape([(b1 - b0) // row, *sizes[1:]])
    base = [first] + [lo for lo, _ in cbox[1:]]
    return src[tuple(slice(lo - b, hi - b) for (lo, hi), b in zip(inter, base))]


def direct_read_tuples(
    name: str, chunk: dict[str, Any], dest: torch.Tensor
) -> tuple[list[list[Any]], list[tuple[int, int, int]]] | None:
    """Pieces and native read tuples that fill ``dest`` straight from a whole chunk, if possible.

    Possible when ``dest`` is a contiguous CPU tensor holding exactly the chunk.

    Raises
    ------
    CheckpointCorruptionError
        If the chunk's pieces do not add up to the destination's size.
    """
    if dest.device.type != "cpu" or not dest.is_contiguous() or dest.is_conj() or dest.is_neg():
        return None
    pieces = [p for p in chunk["pieces"] if int(p[1]) > 0]
    base, at, tl = dest.data_ptr(), 0, []
    for p in pieces:
        tl.append((base + at, int(p[1]), int(p[0])))
        at += int(p[1])
    nbytes = dest.numel() * dest.element_size()
    if at != nbytes:
        raise CheckpointCorruptionError(f"tensor {name!r}: chunk holds {at} bytes, expected {nbytes}")
    return pieces, tl
