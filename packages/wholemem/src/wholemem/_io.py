"""Storing to and loading from files: one raw row-major file per part, any number of parts.

A store writes ``<prefix>_<p>.bin`` (rows of part p, contiguous, native byte order) and
``<prefix>.json`` (shape, dtype, parts). Every rank writes its own rows into whichever
part files they fall in, and loads its own rows from whichever files hold them, so the
number of parts is independent of the number of ranks on either side. Rows in GPU
memory (DEVICE tensors, GPU-resident CHUNKED / NCCL tensors, CUDA views) are staged
through host memory one file range at a time.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from distkit_common.collective import agree

from ._comm import WholeMemoryCommunicator
from ._create import create_wm_tensor
from ._layout import local_range
from ._ops import communicator_of, get_local_tensor
from ._tensor import WmTensorType


def _row_bytes(row_shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(row_shape) * torch.empty((), dtype=dtype).element_size()


def _bytes_of(rows: torch.Tensor) -> memoryview:
    flat = rows.detach().contiguous().reshape(-1).cpu()
    return memoryview(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else memoryview(b"")


def store_local(
    comm: WholeMemoryCommunicator,
    nrows: int,
    row_shape: Sequence[int],
    dtype: torch.dtype,
    local: torch.Tensor,
    first: int,
    directory: str | os.PathLike[str],
    prefix: str,
    num_parts: int | None,
    extra: dict[str, Any] | None = None,
) -> list[str]:
    """Collective: write every rank's rows ``local`` (starting at row ``first``) into parts."""
    parts = comm.size if num_parts is None else int(num_parts)
    if parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    d = Path(directory)
    rb = _row_bytes(row_shape, dtype)
    files = [f"{prefix}_{p:05d}.bin" for p in range(parts)]
    ranges = [local_range(nrows, parts, p) for p in range(parts)]
    err: OSError | None = None
    if comm.rank == 0:
        try:
            d.mkdir(parents=True, exist_ok=True)
            for f, (lo, hi) in zip(files, ranges):
                with open(d / f, "wb") as fh:
                    fh.truncate((hi - lo) * rb)
            meta = {
                "shape": [nrows, *row_shape],
                "dtype": str(dtype).removeprefix("torch."),
                "parts": [{"file": f, "first_row": lo, "rows": hi - lo} for f, (lo, hi) in zip(files, ranges)],
                **(extra or {}),
            }
            (d / f"{prefix}.json").write_text(json.dumps(meta, indent=1))
        except OSError as e:
            err = e
    agree(comm, "store_to_files", err)
    n = local.shape[0]
    for f, (lo, hi) in zip(files, ranges):
        a, b = max(lo, first), min(hi, first + n)
        if a >= b:
            continue
        fd = os.open(d / f, os.O_WRONLY)
        try:
            os.pwrite(fd, _bytes_of(local[a - first : b - first]), (a - lo) * rb)
        finally:
            os.close(fd)
    comm.barrier()
    return [str(d / f) for f in files]


def part_files_from_prefix(file_prefix: str | os.PathLike[str]) -> list[Path]:
    """WholeGraph's file-list convention: the file ``file_prefix`` itself, or the parts
    ``<file_prefix>_part_<i>_of_<n>`` for i = 0..n-1, in part order.

    Raises
    ------
    FileNotFoundError
        Neither the file nor any part exists, or a part is missing.
    ValueError
        Parts of different counts (``_of_<n>``) share the prefix.
    """
    p = Path(file_prefix)
    if p.is_file():
        return [p]
    pat = re.compile(re.escape(p.name) + r"_part_(\d+)_of_(\d+)")
    found: dict[int, Path] = {}
    counts = set()
    if p.parent.is_dir():
        for f in p.parent.iterdir():
            m = pat.fullmatch(f.name)
            if m and f.is_file():
                found[int(m.group(1))] = f
                counts.add(int(m.group(2)))
    if not found:
        raise FileNotFoundError(f"no file {p} and no part files {p}_part_<i>_of_<n>")
    if len(counts) != 1:
        raise ValueError(f"part files of {p} disagree on the number of parts: {sorted(counts)}")
    n = counts.pop()
    missing = [i for i in range(n) if i not in found]
    if missing or len(found) != n:
        raise FileNotFoundError(f"part file {p}_part_{missing[0] if missing else n}_of_{n} is missing")
    return [found[i] for i in range(n)]


def _resolve(files: Any, prefix: str) -> tuple[list[Path], dict[str, Any] | None]:
    if isinstance(files, (str, os.PathLike)) and not Path(files).is_dir():
        return part_files_from_prefix(files), None
    if isinstance(files, (str, os.PathLike)) and Path(files).is_dir():
        meta_path = Path(files) / f"{prefix}.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"load_from_files: {meta_path} not found")
        meta = json.loads(meta_path.read_text())
        return [Path(files) / p["file"] for p in meta["parts"]], meta
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if not isinstance(files, (list, tuple)) or not files:
        raise TypeError("files must be a directory written by store_to_files or a non-empty list of file paths")
    return [Path(f) for f in files], None


def load_local(
    comm: WholeMemoryCommunicator,
    nrows: int,
    row_shape: Sequence[int],
    dtype: torch.dtype,
    local: torch.Tensor,
    first: int,
    files: Any,
    prefix: str,
) -> dict[str, Any] | None:
    """Collective: fill every rank's rows ``local`` from the parts; returns the metadata."""
    paths, meta = _resolve(files, prefix)
    if meta is not None:
        if [int(s) for s in meta["shape"][1:]] != list(row_shape) or meta["shape"][0] != nrows:
            raise ValueError(f"load_from_files: files hold shape {meta['shape']}, tensor is {[nrows, *row_shape]}")
        if meta["dtype"] != str(dtype).removeprefix("torch."):
            raise TypeError(f"load_from_files: files hold {meta['dtype']}, tensor is {dtype}")
    rb = _row_bytes(row_shape, dtype)
    starts, total = [], 0
    for p in paths:
        size = p.stat().st_size
        if rb and size % rb:
            raise ValueError(f"load_from_files: {p} has {size} bytes, not a multiple of the row size {rb}")
        starts.append(total)
        total += size // rb if rb else 0
    if rb and total != nrows:
        raise ValueError(f"load_from_files: the files hold {total} rows, the tensor has {nrows}")
    n = local.shape[0]
    for p, lo in zip(paths, starts):
        hi = lo + (p.stat().st_size // rb if rb else 0)
        a, b = max(lo, first), min(hi, first + n)
        if a >= b:
            continue
        with open(p, "rb") as fh:
            fh.seek((a - lo) * rb)
            buf = bytearray(fh.read((b - a) * rb))
        rows = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(b - a, *row_shape)
        local[a - first : b - first] = rows  # copies host rows to the GPU for device memory
    comm.barrier()
    return meta


def store_to_files(
    t: Any, directory: str | os.PathLike[str], *, num_parts: int | None = None, prefix: str = "part"
) -> list[str]:
    """Collective: store a wholemem tensor as ``num_parts`` raw files plus ``<prefix>.json``.

    Parameters
    ----------
    t : torch.Tensor (HOST / DEVICE, or a view of one), ChunkedTensor or NCCLTensor
        Any wholemem tensor; rows in GPU memory are copied to host memory part by part.
    directory : path
        Created if needed; must be visible to every rank (a shared file system across nodes).
    num_parts : int, optional
        Number of part files (default: the number of ranks); rows split evenly.
    prefix : str
        File name prefix.

    Returns
    -------
    list of str
        The part files, in row order.

    Raises
    ------
    TypeError
        ``t`` is not a wholemem tensor.
    ValueError
        ``num_parts < 1``.
    OSError
        The files cannot be written.
    """
    comm = communicator_of(t, "store_to_files")
    local, first = get_local_tensor(t)
    return store_local(comm, int(t.shape[0]), tuple(t.shape[1:]), t.dtype, local, first, directory, prefix, num_parts)


def load_from_files(t: Any, files: Any, *, prefix: str = "part") -> None:
    """Collective: fill a wholemem tensor from part files (any number of parts).

    Parameters
    ----------
    t : torch.Tensor (HOST / DEVICE, or a view of one), ChunkedTensor or NCCLTensor
        Any wholemem tensor; rows for GPU memory are read into host memory and copied.
    files : path or list of paths
        A directory written by :func:`store_to_files` (its ``<prefix>.json`` is checked
        against ``t``); a WholeGraph file prefix (the file itself, or its parts
        ``<prefix>_part_<i>_of_<n>``); or the part files in row order. Part files hold
        raw rows of ``t``'s dtype, each a whole number of rows.
    prefix : str
        File name prefix inside a directory.

    Raises
    ------
    TypeError
        ``t`` is not a wholemem tensor, or the stored dtype differs.
    ValueError
        The files hold a different number of rows or another row shape.
    FileNotFoundError
        A file is missing.
    """
    comm = communicator_of(t, "load_from_files")
    local, first = get_local_tensor(t)
    load_local(comm, int(t.shape[0]), tuple(t.shape[1:]), t.dtype, local, first, files, prefix)


def stat_filelist_element_count(file_prefix: str | os.PathLike[str], dtype: torch.dtype) -> int:
    """Count the elements of ``dtype`` in a WholeGraph file list.

    The file list is the file ``file_prefix`` or its parts ``<file_prefix>_part_<i>_of_<n>``,
    as the original's ``stat_filelist_element_count`` reads it.

    Parameters
    ----------
    file_prefix : path
        The file, or the prefix of its parts.
    dtype : torch.dtype
        The element type.

    Returns
    -------
    int
        Total bytes of the files divided by the element size.

    Raises
    ------
    FileNotFoundError
        No such file or parts, or a part is missing.
    ValueError
        The files are not a whole number of elements.
    TypeError
        ``dtype`` is not a torch dtype.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = sum(f.stat().st_size for f in part_files_from_prefix(file_prefix))
    if total % itemsize:
        raise ValueError(f"{file_prefix}: {total} bytes is not a whole number of {dtype} elements")
    return total // itemsize


def create_wm_tensor_from_file(
    shape: Sequence[int],
    dtype: torch.dtype,
    comm: WholeMemoryCommunicator,
    filename: str | os.PathLike[str],
    tensor_type: Any = None,
    part_count: int = 0,
) -> Any:
    """Create a wholemem tensor filled from a file list (collective).

    WholeGraph's ``create_wm_tensor_from_file(shape, dtype, wm_comm, filename,
    wm_tensor_type=CHUNKED, part_count=0)``.

    Parameters
    ----------
    shape : sequence of int
        The tensor's shape; empty = 1-D with one entry per element of the files.
    dtype : torch.dtype
        The element type of the files and the tensor.
    comm : WholeMemoryCommunicator
        Every rank of it must call with the same arguments.
    filename : path
        The file, or the prefix of ``<filename>_part_<i>_of_<n>`` parts.
    tensor_type : WmTensorType, default CHUNKED
        The kind of tensor (as for :func:`create_wm_tensor`).
    part_count : int
        Accepted for compatibility; the parts found on disk are used (any number).

    Returns
    -------
    torch.Tensor or ChunkedTensor or NCCLTensor
        The new tensor, holding the files' elements in order.

    Raises
    ------
    ValueError
        The files hold a different number of elements than ``shape``.
    FileNotFoundError
        The files are missing.
    """
    count = stat_filelist_element_count(filename, dtype)
    shp = [int(v) for v in shape]
    if not shp:
        shp = [count]
    elif math.prod(shp) != count:
        raise ValueError(
            f"create_wm_tensor_from_file: {filename} holds {count} elements, shape {shp} needs {math.prod(shp)}"
        )
    t = create_wm_tensor(comm, shp, [], dtype, WmTensorType.CHUNKED if tensor_type is None else tensor_type)
    load_from_files(t, filename)
    return t
