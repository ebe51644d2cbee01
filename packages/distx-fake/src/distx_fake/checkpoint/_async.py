"""``async_save_state_dict``: a save that does not stall training.

The call plans (which boxes this rank writes: a few microseconds per entry); a background
thread then copies those boxes into reusable host buffers (pinned when
the tensors live on a GPU, copied on a side stream) -- the *staging*, which overlaps with the
next forward and backward passes with ``overlap=True`` -- and resolves ``future.staged``;
then it writes and commits exactly as :func:`save_state_dict` does. With ``overlap=True``
training must not change the saved tensors until ``future.wait_staged()`` returns (call it
right before ``optimizer.step()``); by default the call itself waits for the staging.

Memory is bounded: the buffers hold one copy of this rank's share of the state dict and are
reused by the next save (a buffer whose shape or dtype changed is reallocated; entries that
disappeared are freed). Hence one save runs at a time: a new call waits for the previous one
(``if_busy="wait"``) or stops it (``if_busy="replace"``: its future then raises
:class:`CheckpointReplacedError`, and the previous checkpoint stays).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import torch
import torch.distributed as dist

from distkit_common.validate import check_choice

from ._boxes import Box
from ._comm import Comm
from ._metadata import PathT, key_of
from ._saver import CheckpointReplacedError, plan, save
from ._storage import FileSystemWriter


class AsyncSave(concurrent.futures.Future[None]):
    """The future of an async save: resolves when the checkpoint is committed, or raises its error.

    Attributes
    ----------
    staged : concurrent.futures.Future
        Resolves once the tensors are copied (from then on training may change them).
    """

    def __init__(self) -> None:
        super().__init__()
        self.staged: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.stop = threading.Event()

    def wait_staged(self, timeout: float | None = None) -> None:
        """Block until the snapshot is taken (re-raising a staging error).

        Parameters
        ----------
        timeout : float or None, optional
            Seconds to wait at most (default: no limit).

        Raises
        ------
        TimeoutError
            If ``timeout`` seconds pass first.
        """
        self.staged.result(timeout)


class _Buffers:
    """Reusable host buffers, one per saved box (bounded: one copy of this rank's share)."""

    def __init__(self) -> None:
        self.by_key: dict[str, torch.Tensor] = {}

    def stage(self, items: list[tuple[PathT, Box]], job: AsyncSave) -> list[tuple[PathT, Box]]:
        keep: dict[str, torch.Tensor] = {}
        out: list[tuple[PathT, Box]] = []
        cuda = [b.local for _, b in items if b.local.device.type == "cuda"]
        stream = torch.cuda.Stream(device=cuda[0].device) if cuda else None
        for path, box in items:
            if job.stop.is_set():
                raise CheckpointReplacedError("replaced by a newer save before it was staged")
            src = box.local.detach()
            pinned = src.device.type == "cuda"
            k = key_of(path)
            buf = self.by_key.get(k)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.is_pinned() != pinned:
                buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=pinned)
            if stream is not None and pinned:
                stream.wait_stream(torch.cuda.current_stream(src.device))
                with torch.cuda.stream(stream):
                    buf.copy_(src, non_blocking=True)
            else:
                buf.copy_(src)
            keep[k] = buf
            out.append((path, Box(buf, box.global_shape, box.offsets, box.replicated, True)))
        if stream is not None:
            stream.synchronize()
        self.by_key = keep  # entries no longer saved are released
        return out


_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_current: AsyncSave | None = None
_buffers = _Buffers()
_groups: dict[Any, Any] = {}


def async_save_state_dict(
    state_dict: dict[Any, Any],
    storage_writer: FileSystemWriter,
    process_group: Any = None,
    *,
    overlap: bool = False,
    if_busy: str = "wait",
) -> AsyncSave:
    """Save in the background: copy into reusable host buffers while training goes on, then write.

    By default the call returns once the tensors are copied (training may then change them at
    once). With ``overlap=True`` it returns at once and the copy overlaps with what follows:
    call ``future.wait_staged()`` before changing the saved tensors (e.g. right before
    ``optimizer.step()``). ``future.result()`` waits for the commit. In a process
    group every rank calls this collectively, in the same order; the background work runs on
    a dedicated gloo group so it never interleaves with the training's collectives.

    Parameters
    ----------
    state_dict : dict
        As for :func:`save_state_dict`.
    storage_writer : FileSystemWriter
        The destination.
    process_group : ProcessGroup, optional
        The saving ranks (default: the default group if initialized).
    overlap : bool, optional
        Return before the tensors are copied (see above; default False).
    if_busy : {"wait", "replace"}, optional
        When a previous async save is still running: wait for it (default), or stop it (its
        future raises :class:`CheckpointReplacedError`; nothing of it is committed unless every
        rank had already finished writing).

    Returns
    -------
    AsyncSave
        A ``concurrent.futures.Future`` resolving to ``None`` once committed (or raising the
        save's error, on every rank), with ``staged`` / ``wait_staged()``.

    Raises
    ------
    TypeError
        For a non-dict state dict or a non-FileSystemWriter writer.
    ValueError
        If ``if_busy`` is not "wait" or "replace".
    """
    global _executor, _current
    if not isinstance(storage_writer, FileSystemWriter):
        raise TypeError(f"storage_writer must be a FileSystemWriter, got {type(storage_writer).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    check_choice(if_busy, "if_busy", ("wait", "replace"))
    with _lock:
        prev = _current
        if prev is not None and not prev.done():
            if if_busy == "replace":
                prev.stop.set()
            concurrent.futures.wait([prev])  # its buffers are reused; its error stays in its future
        comm = Comm(process_group)
        if comm.on and comm.size > 1:
            if process_group not in _groups:
                ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
                # created by the members alone: ranks outside a subgroup never call this
                _groups[process_group] = dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=True)
            comm = Comm(_groups[process_group])
        try:
            planned: Any = plan(state_dict, comm.rank, comm.size)
        except Exception as e:  # reported through the future, on every rank
            planned = e
        job = AsyncSave()
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="distx-ckpt")
        _executor.submit(_run, job, planned, storage_writer, comm)
        _current = job
    if not overlap:
        concurrent.futures.wait([job.staged])  # a staging error is raised by the future
    return job


def _run(job: AsyncSave, planned: Any, writer: FileSystemWriter, comm: Comm) -> None:
    def stage(items: list[tuple[PathT, Box]]) -> list[tuple[PathT, Box]]:
        try:
            staged = _buffers.stage(items, job)
        except BaseException as e:
            job.staged.set_exception(e)
            raise
        job.staged.set_result(None)
        return staged

    try:
        save(None, writer, comm, planned=planned, stage=stage, stop=job.stop)
    except BaseException as e:
        if not job.staged.done():
            job.staged.set_exception(e)
        job.set_exception(e)
    else:
        job.set_result(None)
