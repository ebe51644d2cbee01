"""``load_state_dict``: fill any sharding from any saved sharding, every byte verified.

Every target (plain tensor, DTensor, :class:`LocalShard`) describes the global box it wants;
each saved chunk overlapping it is read (only the pieces covering the overlap), its crc32c
verified, and copied in. A destination that is exactly one whole saved chunk is read straight
into its memory.
"""

from __future__ import annotations

from typing import Any

import torch

from distkit_common import dtypes as dk_dtypes

from ._boxes import Box, box_of, check_has_data, intersect
from ._comm import Comm
from ._engine import BATCH_BYTES, DataFiles, direct_read_tuples, read_box, verify
from ._metadata import PathT, flatten, from_json, key_of, name_of
from ._progress import progress
from ._storage import FileSystemReader

#: (path, index entry, destination box) of every tensor to load
LoadPlan = list[tuple[PathT, dict[str, Any], Box]]


def load_state_dict(
    state_dict: dict[Any, Any],
    storage_reader: FileSystemReader,
    process_group: Any = None,
    coordinator_rank: int = 0,
    no_dist: bool = False,
) -> None:
    """Load a checkpoint into ``state_dict`` in place, resharding as needed.

    Tensors (plain, DTensor, :class:`LocalShard`) are filled in place with the part of the
    global tensor they hold, whatever sharding the checkpoint was written with; JSON values
    are replaced in their containers. Every byte read is verified against its crc32c.

    Parameters
    ----------
    state_dict : dict
        The destination, with the structure of the saved state dict.
    storage_reader : FileSystemReader
        The checkpoint to read.
    process_group : object, optional
        Accepted for torchdistX compatibility; loading needs no communication.
    coordinator_rank : int, optional
        Accepted for torchdistX compatibility (default 0).
    no_dist : bool, optional
        Accepted for torchdistX compatibility (default False).

    Raises
    ------
    TypeError
        For a non-dict state dict or a non-FileSystemReader reader.
    KeyError
        If an entry of ``state_dict`` is not in the checkpoint.
    ValueError
        If a tensor's global shape or dtype differs from the checkpoint, or elements of a
        destination tensor share memory (an ``expand`` or overlapping ``as_strided`` view).
    CheckpointCorruptionError
        If a checksum does not match (naming the tensor) or the metadata is invalid.

    Examples
    --------
    >>> import torch
    >>> from distx_fake import checkpoint
    >>> sd = {"model": torch.nn.Linear(4, 2).state_dict(), "step": 0}
    >>> checkpoint.load_state_dict(sd, checkpoint.FileSystemReader("ck"))  # written by save_state_dict
    """
    if not isinstance(storage_reader, FileSystemReader):
        raise TypeError(f"storage_reader must be a FileSystemReader, got {type(storage_reader).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    meta = storage_reader.read_index()
    rank = Comm(process_group, alone=no_dist).rank
    todo = match(state_dict, meta, storage_reader.path)
    bar = progress(storage_reader.progress, rank, sum(box.nbytes for _, _, box in todo), "load")
    try:
        with DataFiles(storage_reader.path, storage_reader.direct) as files:
            load_tensors(todo, files, bar)
    finally:
        if bar is not None:
            bar.close()


def _elements_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (dims sorted by stride, each stride must
    clear the span of those below it)."""
    if t.numel() <= 1:
        return False
    span = 0
    for st, sz in sorted(zip(t.stride(), t.shape)):
        if sz > 1 and st <= span:
            return True
        span += (sz - 1) * st
    return False


def match(state_dict: dict[Any, Any], meta: dict[str, Any], where: str) -> LoadPlan:
    """Pair every leaf of ``state_dict`` with its index entry; set JSON values right away.

    Raises
    ------
    KeyError
        If an entry is not in the checkpoint.
    ValueError
        If kinds, shapes or dtypes differ.
    """
    index = {key_of(tuple(e["path"])): e for e in meta["entries"]}
    todo: LoadPlan = []
    for path, v, container, key in list(flatten(state_dict)):
        entry = index.get(key_of(path))
        if entry is None:
            raise KeyError(f"{name_of(path)!r} is not in the checkpoint at {where!r}")
        box = box_of(v)
        if box is None:
            if entry["kind"] != "value":
                raise ValueError(
                    f"{name_of(path)!r} is a tensor in the checkpoint but {type(v).__name__} in state_dict"
                )
            container[key] = from_json(entry["value"])
            continue
        if entry["kind"] != "tensor":
            raise ValueError(f"{name_of(path)!r} is a value in the checkpoint but a tensor in state_dict")
        check_has_data(path, box.local)
        if _elements_overlap(box.local):
            raise ValueError(
                f"{name_of(path)!r}: elements of the destination (strides {box.local.stride()}) overlap in "
                "memory (an expand or as_strided view); load into a tensor without overlapping elements"
            )
        if list(box.global_shape) != list(entry["shape"]):
            raise ValueError(
                f"{name_of(path)!r}: checkpoint shape {tuple(entry['shape'])} != state_dict shape {box.global_shape}"
            )
        if dk_dtypes.dtype_name(box.local.dtype) != entry["dtype"]:
            raise ValueError(
                f"{name_of(path)!r}: checkpoint dtype {entry['dtype']} != state_dict dtype {box.local.dtype}"
            )
        todo.append((path, entry, box))
    return todo


def load_tensors(todo: LoadPlan, files: DataFiles, bar: Any) -> None:
    """Fill every destination box from the saved chunks overlapping it."""
    # whole-chunk destinations are read straight into their memory, batched into few native calls
    direct: list[tuple[str, dict[str, Any], list[list[Any]], list[tuple[int, int, int]]]] = []
    direct_bytes = 0

    def flush() -> None:
        nonlocal direct, direct_bytes
        by_file: dict[str, list[int]] = {}
        for i, d in enumerate(direct):
            by_file.setdefault(d[1]["file"], []).append(i)
        for fname, idx in by_file.items():
            crcs = files.read(fname, [t for i in idx for t in direct[i][3]])
            at = 0
            for i in idx:
                name, chunk, pieces, tl = direct[i]
                verify(name, chunk, pieces, crcs[at : at + len(tl)])
                at += len(tl)
        if bar is not None:
            bar.update(direct_bytes)
        direct, direct_bytes = [], 0

    for path, entry, box in todo:
        name = name_of(path)
        want = box.ranges()
        for chunk in entry["chunks"]:
            cbox = [(o, o + s) for o, s in zip(chunk["offsets"], chunk["sizes"])]
            inter = intersect(want, cbox)
            if inter is None:
                continue
            if cbox == want:
                got = direct_read_tuples(name, chunk, box.local)
                if got is not None:
                    direct.append((name, chunk, *got))
                    direct_bytes += box.nbytes
                    if direct_bytes >= BATCH_BYTES:
                        flush()
                    continue
            src = read_box(files, name, entry["dtype"], chunk, inter)
            dest = box.local
            dst = dest[tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(inter, box.offsets))] if dest.dim() else dest
            with torch.no_grad():
                dst.copy_(src)
            if bar is not None:
                bar.update(src.numel() * src.element_size())
    flush()
