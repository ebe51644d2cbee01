"""``async_save_state_dict``: snapshot the state dict, write it on a background thread."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from typing import Any

import torch
import torch.distributed as dist

from ._boxes import LocalShard, box_of, is_dtensor
from ._comm import Comm
from ._saver import SKIP, save
from ._storage import FileSystemWriter

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_previous: concurrent.futures.Future[None] | None = None
_groups: dict[Any, Any] = {}


def _stage(obj: Any) -> Any:
    """Copy every tensor of a state dict to the CPU (the snapshot the background write uses)."""
    if isinstance(obj, dict):
        return {k: _stage(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_stage(v) for v in obj]
    if isinstance(obj, LocalShard) or is_dtensor(obj):
        box = box_of(obj)
        assert box is not None
        if not box.writes:
            return SKIP  # another rank writes this box
        return LocalShard(_stage(box.local), box.global_shape, box.offsets)
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True).contiguous()
    return obj


def async_save_state_dict(
    state_dict: dict[Any, Any],
    storage_writer: FileSystemWriter,
    process_group: Any = None,
) -> concurrent.futures.Future[None]:
    """Snapshot the state dict to CPU memory, then save it in a background thread.

    The call returns once the snapshot is taken (training may then modify the tensors).
    At most one save is in flight: a new call first waits for the previous one, so staging
    memory is bounded by one copy of the state dict, and each staged buffer is released when
    the save completes. In a process group, every rank must call this collectively; the
    background work runs on a dedicated gloo group so it never interleaves with the
    training's collectives.

    Parameters
    ----------
    state_dict : dict
        As for :func:`save_state_dict`.
    storage_writer : FileSystemWriter
        The destination.
    process_group : ProcessGroup, optional
        The saving ranks (default: the default group if initialized).

    Returns
    -------
    concurrent.futures.Future
        Resolves to ``None`` when the checkpoint is committed, or raises the save's error.

    Raises
    ------
    TypeError
        For a non-dict state dict or a non-FileSystemWriter writer.
    """
    global _executor, _previous
    if not isinstance(storage_writer, FileSystemWriter):
        raise TypeError(f"storage_writer must be a FileSystemWriter, got {type(storage_writer).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    with _lock:
        if _previous is not None:
            with contextlib.suppress(BaseException):
                _previous.result()  # its error belongs to its own future
        comm = Comm(process_group)
        if comm.on and comm.size > 1:
            if process_group not in _groups:
                ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
                _groups[process_group] = dist.new_group(ranks=ranks, backend="gloo")
            comm = Comm(_groups[process_group])
        staged = _stage(state_dict)
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="distx-ckpt")
        fut = _executor.submit(save, staged, storage_writer, comm)
        _previous = fut
        return fut
