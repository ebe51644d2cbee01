"""safetensors and Hugging Face folders: export a sharded checkpoint, load into any sharding.

The format (the ``safetensors`` package is its reference): an 8-byte little-endian header
length, a JSON header (``dtype``, ``shape``, ``data_offsets`` per tensor, ``__metadata__``),
then the tensors' raw bytes back to back. A Hugging Face folder shards the weights into
``model-0000k-of-0000n.safetensors`` files listed by ``model.safetensors.index.json``.

Export consolidates the chunks that any number of ranks wrote (each read once, crc32c
verified) into files of bounded size. Loading reads, for every destination box (plain tensor,
DTensor, :class:`LocalShard`), only the byte ranges of that box: one range for a row block,
one per row segment for a column block, straight into the destination when its layout allows.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator
from typing import Any

import torch

from distkit_common import dtypes as dk_dtypes

from .. import _distx_fake as _native
from ._boxes import Box, box_of, check_has_data
from ._engine import BATCH_BYTES, DataFiles, verify
from ._hf_commit import INDEX, ExportCommit
from ._metadata import CheckpointCorruptionError, flatten, name_of, read_index
from ._progress import progress

SINGLE = "model.safetensors"
#: distkit dtype name <-> safetensors dtype code
_CODES = {
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "bool": "BOOL",
    "complex64": "C64",
}
_NAMES = {v: k for k, v in _CODES.items()}
#: refuse headers larger than this (the safetensors package's own limit)
_MAX_HEADER = 100_000_000
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(size: int | str) -> int:
    """``5GB`` (decimal, as Hugging Face counts), ``512MiB``, or a number of bytes.

    Raises
    ------
    ValueError
        If the size is not positive or not understood.
    """
    if isinstance(size, bool):
        raise ValueError(f"max_shard_size must be a size like '5GB' or a number of bytes, got {size!r}")
    if isinstance(size, int):
        n = size
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(size))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"max_shard_size must be a size like '5GB' or a number of bytes, got {size!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return n


# --- reading headers -----------------------------------------------------------------------------
def read_header(fname: str) -> tuple[dict[str, Any], int]:
    """The tensors of a safetensors file and the offset where its data starts.

    Raises
    ------
    ValueError
        If the file is not a well-formed safetensors file (named in the message).
    """
    size = os.path.getsize(fname)
    with open(fname, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{fname}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{fname}: not a safetensors file (header length {n} for a file of {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{fname}: safetensors header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError(f"{fname}: safetensors header is not a JSON object")
    data_start = 8 + n
    tensors: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _NAMES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{fname}: tensor {name!r}: unsupported or malformed entry {info!r}") from e
        numel = 1
        for s in shape:
            if s < 0:
                raise ValueError(f"{fname}: tensor {name!r} has a negative dimension {shape}")
            numel *= s
        if end - begin != numel * dk_dtypes.ITEMSIZE[dtype] or begin < 0 or data_start + end > size:
            raise ValueError(f"{fname}: tensor {name!r}: data_offsets {begin}..{end} do not fit {dtype}{shape}")
        tensors[name] = {"dtype": dtype, "shape": shape, "start": data_start + begin, "file": fname}
    return tensors, data_start


def _catalog(path: str) -> dict[str, dict[str, Any]]:
    """Every tensor of a safetensors file or folder (an index, or one ``model.safetensors``)."""
    if os.path.isfile(path):
        return read_header(path)[0]
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map")
        files = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(path, SINGLE)):
        files = [SINGLE]
    else:
        found = sorted(n for n in os.listdir(path) if n.endswith(".safetensors")) if os.path.isdir(path) else []
        if len(found) != 1:
            raise FileNotFoundError(f"no {INDEX} or {SINGLE} in {path!r}")
        files = found
    out: dict[str, dict[str, Any]] = {}
    for fn in files:
        if "/" in fn or fn.startswith("."):
            raise ValueError(f"invalid file name {fn!r} in {index}")
        out.update(read_header(os.path.join(path, fn))[0])
    return out


# --- loading into any sharding -------------------------------------------------------------------
def _segments(shape: list[int], box: list[tuple[int, int]], item: int) -> Iterator[tuple[int, int]]:
    """(byte offset in the tensor, bytes) of the contiguous runs of a box, in the box's row-major order."""
    nd = len(shape)
    if nd == 0:
        yield 0, item
        return
    k = nd - 1
    while k > 0 and box[k] == (0, shape[k]):
        k -= 1
    inner = item
    for s in shape[k + 1 :]:
        inner *= s
    run = (box[k][1] - box[k][0]) * inner
    strides = [0] * nd
    acc = item
    for d in range(nd - 1, -1, -1):
        strides[d] = acc
        acc *= shape[d]
    ranges = [range(lo, hi) for lo, hi in box[:k]]

    def walk(d: int, base: int) -> Iterator[tuple[int, int]]:
        if d == k:
            yield base + box[k][0] * strides[k], run
            return
        for i in ranges[d]:
            yield from walk(d + 1, base + i * strides[d])

    yield from walk(0, 0)


def _read_box(entry: dict[str, Any], box: Box, fds: dict[str, int]) -> None:
    shape = entry["shape"]
    dtype = dk_dtypes.torch_dtype(entry["dtype"])
    item = dk_dtypes.ITEMSIZE[entry["dtype"]]
    dest = box.local
    if dest.numel() == 0:
        return
    direct = (
        dest.dtype == dtype
        and dest.device.type == "cpu"
        and dest.is_contiguous()
        and not (dest.is_conj() or dest.is_neg())
    )
    buf = dest if direct else torch.empty(box.sizes, dtype=dtype)
    fd = fds.get(entry["file"])
    if fd is None:
        fd = fds[entry["file"]] = os.open(entry["file"], os.O_RDONLY | os.O_CLOEXEC)
    ptr, at, tuples = buf.data_ptr(), 0, []
    for off, n in _segments(shape, box.ranges(), item):
        tuples.append((ptr + at, n, entry["start"] + off))
        at += n
    _native.read_pieces(fd, tuples, False)
    if not direct:
        with torch.no_grad():
            dest.copy_(buf)


def load_safetensors(
    state_dict: dict[Any, Any], path: str | os.PathLike[str], *, prefix: str = "", strict: bool = True
) -> list[str]:
    """Fill ``state_dict`` in place from a safetensors file or Hugging Face folder.

    Each destination (a plain tensor, a DTensor, a :class:`LocalShard`) receives its box of
    the global tensor, and only the bytes of that box are read. Dtypes are converted when
    they differ (as ``from_pretrained`` does).

    Parameters
    ----------
    state_dict : dict
        Destination; its leaves are named by their dotted paths (``model.layers.0.weight``).
    path : str or os.PathLike
        A ``.safetensors`` file, or a folder with ``model.safetensors.index.json`` or
        ``model.safetensors``.
    prefix : str, optional
        Prepended to each destination name to find it in the files (e.g. ``"model."``).
    strict : bool, optional
        Raise for destinations missing from the files (default); else skip and return them.

    Returns
    -------
    list of str
        The names of the destinations that were not found (empty when ``strict``).

    Raises
    ------
    TypeError
        For a non-dict state dict or path, or a fake/meta destination.
    KeyError
        If ``strict`` and a destination is not in the files.
    ValueError
        If a global shape differs, or a file is malformed.
    FileNotFoundError
        If ``path`` holds no safetensors weights.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or PathLike, got {type(path).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    catalog = _catalog(os.fspath(path))
    missing: list[str] = []
    todo: list[tuple[dict[str, Any], Box]] = []
    for p, v, _, _ in flatten(state_dict):
        box = box_of(v)
        if box is None:
            continue
        name = prefix + name_of(p)
        entry = catalog.get(name)
        if entry is None:
            if strict:
                raise KeyError(f"{name!r} is not in the safetensors weights at {os.fspath(path)!r}")
            missing.append(name)
            continue
        check_has_data(p, box.local)
        if list(box.global_shape) != entry["shape"]:
            raise ValueError(
                f"{name!r}: safetensors shape {tuple(entry['shape'])} != state_dict shape {box.global_shape}"
            )
        todo.append((entry, box))
    fds: dict[str, int] = {}
    try:
        for entry, box in todo:
            _read_box(entry, box, fds)
    finally:
        for fd in fds.values():
            os.close(fd)
    return missing


# --- export -------------------------------------------------------------------------------------
def export_safetensors(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    prefix: str = "",
    sync: bool = True,
    progress_bar: bool | None = None,
) -> dict[str, Any]:
    """Export a checkpoint (written by any number of ranks) to a Hugging Face safetensors folder.

    Writes shard files of at most ``max_shard_size`` bytes (a tensor larger than that gets a
    file of its own) and ``model.safetensors.index.json`` into ``dst`` (created if needed;
    other files such as ``config.json`` are left alone). Every piece read is verified against
    its crc32c. The shards are named ``model-0000k-of-0000n.safetensors``, or, when they
    replace an export that uses those names, ``model-<8 hex>-0000k-of-0000n.safetensors``
    (the index names them; every Hugging Face loader reads it): an export killed at any
    point leaves the previous export or the new one, complete, and the next export removes
    what the killed one left, as well as the replaced export's shards.

    Parameters
    ----------
    src : str or os.PathLike
        A checkpoint written by :func:`save_state_dict` or through DCP with this package's writer.
    dst : str or os.PathLike
        The output folder.
    max_shard_size : int or str, optional
        ``"5GB"`` (default; decimal units as Hugging Face, or ``"MiB"``/``"GiB"``) or bytes.
    prefix : str, optional
        Export only the tensors whose dotted name starts with it, without it (e.g. ``"model."``
        for a checkpoint of ``{"model": model.state_dict(), "optim": ...}``).
    sync : bool, optional
        Whether to fsync every file and the folder (default True; ``save_pretrained`` does not).
    progress_bar : bool or None, optional
        Show a progress bar (default: when stderr is a terminal).

    Returns
    -------
    dict
        The index written (``metadata.total_size`` and ``weight_map``).

    Raises
    ------
    FileNotFoundError
        If ``src`` holds no checkpoint.
    ValueError
        If ``max_shard_size`` is invalid, or no tensor matches ``prefix``.
    TypeError
        If a tensor's dtype has no safetensors code (complex128).
    CheckpointCorruptionError
        If a checksum does not match.
    RuntimeError
        If another export is writing into ``dst``.
    """
    src_s, dst_s = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))
    limit = parse_size(max_shard_size)
    meta = read_index(src_s)
    tensors = []
    for e in meta["entries"]:
        if e["kind"] != "tensor":
            continue
        name = e.get("fqn") if isinstance(e.get("fqn"), str) else name_of(tuple(e["path"]))
        if not name.startswith(prefix):
            continue
        if e["dtype"] not in _CODES:
            raise TypeError(f"tensor {name!r} has dtype {e['dtype']}, which safetensors cannot hold")
        nbytes = dk_dtypes.ITEMSIZE[e["dtype"]]
        for s in e["shape"]:
            nbytes *= s
        tensors.append((name[len(prefix) :], e, nbytes))
    if not tensors:
        raise ValueError(f"no tensor in {src_s!r} starts with prefix {prefix!r}")
    shards: list[list[tuple[str, dict[str, Any], int]]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t[2] > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t[2]
    total = sum(t[2] for t in tensors)
    bar = progress(progress_bar, 0, total, "export")
    fds: list[int] = []
    try:
        with ExportCommit(dst_s, sync) as commit:
            names = commit.names(len(shards))
            with DataFiles(src_s, True) as files:
                copy = _Copy(files, fds, sync)
                for k, shard in enumerate(shards):
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                    fds.append(os.open(commit.staged(names[k]), flags, 0o644))
                    raw = _header(shard)
                    os.pwrite(fds[k], raw, 0)
                    pos = len(raw)
                    for name, e, nbytes in shard:
                        copy.add(name, e, k, pos, bar)
                        pos += nbytes
                copy.run(bar)
            if sync:
                for fd in fds:
                    _native.fsync_fd(fd)
            for k, fd in enumerate(fds):
                os.close(fd)
                fds[k] = -1
            weight_map = {n: names[k] for k, shard in enumerate(shards) for n, _, _ in shard}
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            commit.commit(names, json.dumps(index, indent=2).encode())
    finally:
        for fd in fds:
            if fd >= 0:
                os.close(fd)  # (the staging folder with the file goes as the commit is left)
        if bar is not None:
            bar.close()
    return index


def _header(shard: list[tuple[str, dict[str, Any], int]]) -> bytes:
    """The length prefix and JSON header of one file (tensors back to back, in ``shard`` order)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, e, nbytes in shard:
        header[name] = {"dtype": _CODES[e["dtype"]], "shape": e["shape"], "data_offsets": [at, at + nbytes]}
        at += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the safetensors writer does
    return struct.pack("<Q", len(raw)) + raw


class _Copy:
    """The saved pieces of the exported tensors and where their bytes go in the output files.

    Each piece is read once and its bytes written straight to their places (one run for a
    chunk that is a row block of its tensor, one per row for a column block) by the native
    engine, reading and writing overlapped; the crc32c of every piece is checked afterwards,
    before any output file gets its final name.
    """

    def __init__(self, files: DataFiles, dsts: list[int], sync: bool) -> None:
        self.files = files
        self.dsts = dsts  # the output fds, appended to as files are opened
        self.sync = sync  # hand pages to the disk as they are written (the final fsync waits less)
        self.sources: list[tuple[int, bool]] = []
        self.source_of: dict[str, int] = {}
        self.pieces: list[tuple[int, int, int]] = []
        self.runs: list[tuple[int, int, int, int, int]] = []
        self.expect: list[tuple[str, dict[str, Any], list[Any]]] = []
        self.pending = 0

    def add(self, name: str, e: dict[str, Any], dst: int, start: int, bar: Any) -> None:
        """Plan the copy of tensor entry ``e`` to destination file ``dst`` at byte ``start``."""
        shape = [int(s) for s in e["shape"]]
        item = dk_dtypes.ITEMSIZE[e["dtype"]]
        numel = 1
        for s in shape:
            numel *= s
        covered = 0
        for chunk in e["chunks"]:
            sizes = [int(s) for s in chunk["sizes"]]
            box = [(int(o), int(o) + z) for o, z in zip(chunk["offsets"], sizes)]
            if len(box) != len(shape) or any(lo < 0 or hi > s for (lo, hi), s in zip(box, shape)):
                raise CheckpointCorruptionError(f"tensor {name!r}: chunk box {box} outside its shape {shape}")
            count = 1
            for z in sizes:
                count *= z
            covered += count
            if chunk["file"] not in self.source_of:
                self.source_of[chunk["file"]] = len(self.sources)
                self.sources.append(self.files.handle(chunk["file"]))
            src = self.source_of[chunk["file"]]
            segments = _segments(shape, box, item) if count else iter(())
            seg_at, seg_left = 0, 0
            chunk_bytes = 0
            for p in chunk["pieces"]:
                n = int(p[1])
                if n == 0:
                    continue
                k = len(self.pieces)
                self.pieces.append((src, int(p[0]), n))
                self.expect.append((name, chunk, p))
                at = 0
                while at < n:
                    if seg_left == 0:
                        got = next(segments, None)
                        if got is None:
                            raise CheckpointCorruptionError(
                                f"tensor {name!r}: {chunk['file']} holds more bytes than its chunk {box}"
                            )
                        seg_at, seg_left = got
                    m = min(seg_left, n - at)
                    self.runs.append((k, at, m, dst, start + seg_at))
                    at += m
                    seg_at += m
                    seg_left -= m
                chunk_bytes += n
            if chunk_bytes != count * item:
                raise CheckpointCorruptionError(
                    f"tensor {name!r}: chunk {box} has {chunk_bytes} bytes in {chunk['file']}, expected {count * item}"
                )
        if covered != numel:
            raise CheckpointCorruptionError(f"tensor {name!r}: its saved chunks hold {covered} of its {numel} elements")
        self.pending += numel * item
        if self.pending >= BATCH_BYTES:
            self.run(bar)

    def run(self, bar: Any) -> None:
        """Copy what is planned so far; raise if a piece's crc32c does not match."""
        if not self.pieces:
            return
        crcs = _native.copy_pieces(self.sources, self.dsts, self.pieces, self.runs, self.sync)
        for (name, chunk, p), c in zip(self.expect, crcs):
            verify(name, chunk, [p], [c])
        if bar is not None:
            bar.update(self.pending)
        self.pieces, self.runs, self.expect, self.pending = [], [], [], 0
