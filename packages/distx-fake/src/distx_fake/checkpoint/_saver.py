"""``save_state_dict``: every rank writes its shards, rank 0 writes the index and commits.

Every rank writes the chunks it owns (its DTensor / LocalShard shards, plus a size-balanced
share of the replicated tensors, so each replicated tensor is written once) into
``<path>.tmp-<token>/rank<r>.bin`` and fsyncs it; rank 0 gathers the chunk lists, writes and
fsyncs ``metadata.json``, then swaps the folder with the previous checkpoint atomically. A
failure on any rank before the swap leaves the previous checkpoint untouched and is raised on
every rank.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import torch

from distkit_common import collective, fsio
from distkit_common import dtypes as dk_dtypes

from ._boxes import Box, box_of, check_has_data, is_dtensor
from ._comm import Comm
from ._engine import write_chunks
from ._metadata import PathT, build_index, flatten, key_of, name_of, replaceable, to_json, write_index
from ._progress import progress
from ._storage import FileSystemWriter


def plan(state_dict: dict[Any, Any], rank: int, size: int) -> tuple[list[tuple[PathT, Box]], dict[str, Any]]:
    """Split the local state dict into the tensors this rank writes and the JSON values.

    Raises
    ------
    TypeError
        For unsupported entries (named in the message).
    """
    mine: list[tuple[PathT, Box]] = []
    values: dict[str, Any] = {}
    replicated: list[tuple[PathT, Box]] = []
    for path, v, _, _ in flatten(state_dict):
        box = box_of(v)
        if box is not None:
            if box.local.is_sparse or box.local.layout != torch.strided:
                raise TypeError(f"state dict entry {name_of(path)!r}: only dense (strided) tensors are supported")
            dk_dtypes.code_of(box.local.dtype)  # raises for unsupported dtypes
            check_has_data(path, box.local)
            if box.writes:
                (replicated if box.replicated else mine).append((path, box))
        elif is_dtensor(v):
            continue
        else:
            values[key_of(path)] = {"path": list(path), "value": to_json(path, v)}
    # each replicated tensor is written by exactly one rank: the biggest first, each to the
    # rank with the fewest bytes so far (ties by key), so ranks get similar byte counts
    load = [0] * size
    for path, box in sorted(replicated, key=lambda pb: (-pb[1].nbytes, key_of(pb[0]))):
        owner = min(range(size), key=lambda r: (load[r], r))
        load[owner] += box.nbytes
        if owner == rank:
            mine.append((path, box))
    return mine, values


def save_state_dict(
    state_dict: dict[Any, Any],
    storage_writer: FileSystemWriter,
    process_group: Any = None,
    coordinator_rank: int = 0,
    no_dist: bool = False,
) -> None:
    """Save a (sharded) state dict: every rank writes its shards, then an atomic commit.

    Parameters
    ----------
    state_dict : dict
        Nested dicts/lists of tensors, DTensors, :class:`LocalShard` and JSON values.
        Plain tensors must be identical on all ranks (they are written once).
    storage_writer : FileSystemWriter
        The destination.
    process_group : ProcessGroup, optional
        The group of ranks saving together (default: the default group if initialized).
    coordinator_rank : int, optional
        Accepted for torchdistX compatibility; rank 0 of the group coordinates.
    no_dist : bool, optional
        Save from this process alone even if a process group is initialized.

    Raises
    ------
    TypeError
        For a non-dict state dict, a non-FileSystemWriter writer, or unsupported entries
        (named in the message).
    OSError
        If writing fails (on any rank; the previous checkpoint is kept).

    Examples
    --------
    >>> import torch
    >>> from distx_fake import checkpoint
    >>> m = torch.nn.Linear(4, 2)
    >>> writer = checkpoint.FileSystemWriter("ck")
    >>> checkpoint.save_state_dict({"model": m.state_dict(), "step": 10}, writer, no_dist=True)
    >>> sd = {"model": torch.nn.Linear(4, 2).state_dict(), "step": 0}
    >>> checkpoint.load_state_dict(sd, checkpoint.FileSystemReader("ck"))
    >>> sd["step"]
    10
    """
    if not isinstance(storage_writer, FileSystemWriter):
        raise TypeError(f"storage_writer must be a FileSystemWriter, got {type(storage_writer).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    save(state_dict, storage_writer, Comm(process_group, alone=no_dist))


class CheckpointReplacedError(RuntimeError):
    """An async save was stopped by a newer one (``if_busy="replace"``); nothing was committed."""


Planned = tuple[list[tuple[PathT, Box]], dict[str, Any]]


def save(
    state_dict: dict[Any, Any] | None,
    writer: FileSystemWriter,
    comm: Comm,
    *,
    planned: Planned | BaseException | None = None,
    stage: Callable[[list[tuple[PathT, Box]]], list[tuple[PathT, Box]]] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """The collective save.

    Async saves run it on their background thread with the plan made at call time
    (``planned``: the plan, or the error planning raised), ``stage``, which copies the
    tensors to write into host buffers before anything is written, and ``stop``, set when a
    newer save replaces this one (checked before writing and before reporting success).
    """
    err: BaseException | None = None
    chunks: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    items: list[tuple[PathT, Box]] = []
    try:
        if isinstance(planned, BaseException):
            raise planned
        items, values = planned if planned is not None else plan(state_dict or {}, comm.rank, comm.size)
        if stage is not None:
            items = stage(items)
    except BaseException as e:  # agreed on collectively below, then re-raised
        err = e
    if comm.rank == 0:
        # a crashed earlier save may have left its temporary folder: remove it if its
        # writers provably died on this host (never a live save, never another host's)
        try:
            fsio.clean_stale(writer.path)
        except OSError:
            pass
    tmp = fsio.temporary_sibling(writer.path, comm.broadcast(secrets.token_hex(8) if comm.rank == 0 else None))
    if err is None and stop is not None and stop.is_set():
        err = CheckpointReplacedError("replaced by a newer save before it was written")
    total = sum(box.nbytes for _, box in items)
    bar = progress(writer.progress, comm.rank, total * comm.size, "save")
    if err is None:
        try:
            fsio.claim(tmp, comm.rank)  # creates tmp, never leaving it unclaimed (a kill in between would)
            chunks = write_chunks(
                os.path.join(tmp, f"rank{comm.rank}.bin"),
                ((path, box.local, box.global_shape, box.offsets) for path, box in items),
                piece_bytes=writer.piece_bytes,
                direct=writer.direct,
                sync=writer.sync,
                bar=bar,
            )
        except BaseException as e:
            err = e
    if err is None and stop is not None and stop.is_set():
        err = CheckpointReplacedError("replaced by a newer save before it was committed")
    if bar is not None:
        bar.close()
    try:
        collective.agree(comm.group, "checkpoint save (previous checkpoint kept)", err)
    except BaseException:
        if comm.rank == 0:
            fsio.discard_claimed(tmp)
        raise
    every = comm.all_gather(chunks)
    with collective.all_ranks(comm.group, "checkpoint commit on rank 0 (previous checkpoint kept)"):
        if comm.rank == 0:
            try:
                write_index(tmp, build_index(every, values, comm.size, writer.piece_bytes), writer.sync)
                fsio.commit_dir(tmp, writer.path, sync=writer.sync, replaceable=replaceable)
            except BaseException:
                fsio.discard_claimed(tmp)
                raise
