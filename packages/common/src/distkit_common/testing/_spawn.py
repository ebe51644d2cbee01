"""Run a Python function on N processes (torch multiprocessing spawn) with a timeout, and
the ``torch.distributed`` set-up and tear-down its bodies use."""

from __future__ import annotations

import datetime
import gc
import importlib.util
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ._process import DEFAULT_TIMEOUT

SPAWN_START_TIMEOUT = 600.0


def _load(module: str, file: str | None, qualname: str) -> Callable[..., Any]:
    """Import fn by module name, or from its file when the module is not importable
    (pytest's importlib mode gives test modules names no child can import)."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(f"_distkit_spawned_{abs(hash(file))}", file)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _spawn_entry(
    target: tuple[str, str | None, str],
    rank: int,
    size: int,
    store: str,
    args: tuple[Any, ...],
    started: Any,
) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    try:
        fn = _load(*target)
        started.send(rank)  # start-up (interpreter, imports) is over: the parent's timeout begins
        started.close()
        fn(rank, size, store, *args)
    except SystemExit as exc:
        sys.stderr.flush()
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _await_start(procs: list[Any], readers: list[Any], start_timeout: float) -> list[str]:
    """Wait until every rank reported that it started; the ranks that did not, as failures."""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + start_timeout
    pending = dict(enumerate(readers))
    while pending:
        ready = wait(list(pending.values()), max(0.0, deadline - time.monotonic()))
        if not ready:
            return [f"rank {r} did not start within {start_timeout:.0f}s" for r in sorted(pending)]
        for r, reader in list(pending.items()):
            if reader in ready:
                try:
                    reader.recv()
                except EOFError:  # the child closed its end without a word: it exited
                    procs[r].join(60)
                    return [f"rank {r} exited with code {procs[r].exitcode} before its body began"]
                del pending[r]
    return []


def run_spawn(
    fn: Callable[..., Any],
    nprocs: int,
    *,
    args: tuple[Any, ...] = (),
    timeout: float = DEFAULT_TIMEOUT,
    start_timeout: float = SPAWN_START_TIMEOUT,
) -> None:
    """Run ``fn(rank, size, store_path, *args)`` in ``nprocs`` spawned processes.

    ``store_path`` names a fresh file for ``torch.distributed.FileStore``
    (see :func:`init_process_group`). ``fn`` must be importable (module level).

    ``timeout`` bounds the bodies: it begins when every rank has started (its
    interpreter is up and ``fn``'s module imported), so a loaded machine that
    takes long to start processes and import torch does not eat into it. The
    start-up itself is bounded by ``start_timeout``.

    Parameters
    ----------
    fn : callable
        A module-level function ``fn(rank, size, store_path, *args)``.
    nprocs : int
        Number of processes.
    args : tuple
        Extra arguments for ``fn`` (picklable).
    timeout : float
        Seconds the bodies may run once every rank has started.
    start_timeout : float
        Seconds the ranks may take to start.

    Raises
    ------
    AssertionError
        If any child exits non-zero, or does not start within ``start_timeout``,
        or the bodies run past ``timeout`` (every child is then killed and reaped).
    ValueError
        If ``nprocs`` < 1, or ``timeout`` or ``start_timeout`` <= 0 (nothing is started).

    Examples
    --------
    >>> def body(rank, size, store_path):                 # doctest: +SKIP
    ...     init_process_group(rank, size, store_path)
    ...     t = torch.ones(1) * rank
    ...     torch.distributed.all_reduce(t)
    ...     assert t.item() == size * (size - 1) / 2
    ...     destroy_process_group()
    >>> run_spawn(body, 3, timeout=120)
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not start_timeout > 0:
        raise ValueError(f"start_timeout must be > 0 seconds, got {start_timeout!r}")
    ctx = mp.get_context("spawn")
    module = sys.modules.get(fn.__module__)
    target = (fn.__module__, getattr(module, "__file__", None), fn.__qualname__)
    with tempfile.TemporaryDirectory(prefix="distkit-spawn-") as tmp:
        store = os.path.join(tmp, "store")
        pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
        procs = [
            ctx.Process(target=_spawn_entry, args=(target, r, nprocs, store, args, pipes[r][1]), daemon=True)
            for r in range(nprocs)
        ]
        failed: list[str] = []
        try:
            for p, (_, writer) in zip(procs, pipes, strict=True):
                p.start()
                writer.close()  # the child holds the only writer: a child that dies gives EOF
            failed += _await_start(procs, [reader for reader, _ in pipes], start_timeout)
            deadline = time.monotonic() + timeout
            for r, p in enumerate(procs):
                if failed:
                    break
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    failed.append(f"rank {r} timed out after {timeout:.0f}s")
                    break
                if p.exitcode != 0:
                    failed.append(f"rank {r} exited with code {p.exitcode}")
                    break
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                if p.pid is not None:
                    p.join(60)
            for reader, _ in pipes:
                reader.close()
        if not failed:
            failed += [f"rank {r} exited with code {p.exitcode}" for r, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            raise AssertionError("; ".join(failed))


def init_process_group(rank: int, size: int, store_path: str, backend: str = "gloo") -> None:
    """Initialise ``torch.distributed`` from a FileStore (for :func:`run_spawn` bodies).

    Parameters
    ----------
    rank : int
        This process's rank.
    size : int
        Number of processes.
    store_path : str
        The FileStore's file (:func:`run_spawn` passes it).
    backend : str
        The process group's backend (``"gloo"``, ``"nccl"``).
    """
    import datetime

    import torch.distributed as dist

    store = dist.FileStore(store_path, size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=120))


def run_spawn_rows(
    fn: Callable[..., Any], nprocs: int, cfg: Mapping[str, Any], timeout: float
) -> tuple[list[dict[str, Any]], str | None]:
    """Run :func:`run_spawn` for a benchmark that reports rows as it measures them.

    Runs ``fn(rank, size, store_path, rows_path, cfg)``; ``fn`` appends one JSON object per
    line to ``rows_path``. Returns every row written, also those of a run that failed or
    ran past ``timeout``, and that failure (None when every rank exited 0): one hung
    configuration keeps the results measured before it.

    Parameters
    ----------
    fn : callable
        A module-level function ``fn(rank, size, store_path, rows_path, cfg)``.
    nprocs : int
        Number of processes.
    cfg : mapping
        The benchmark's configuration (passed as a dict).
    timeout : float
        Seconds the bodies may run (as for :func:`run_spawn`).

    Returns
    -------
    rows : list of dict
        Every row written, also those of a run that failed.
    error : str or None
        The failure, or None when every rank exited 0.

    Raises
    ------
    ValueError
        As :func:`run_spawn`, for ``nprocs`` or ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="distkit-rows-") as tmp:
        rows_path = os.path.join(tmp, "rows.jsonl")
        error = None
        try:
            run_spawn(fn, nprocs, args=(rows_path, dict(cfg)), timeout=timeout)
        except AssertionError as e:
            error = str(e)
        rows: list[dict[str, Any]] = []
        if os.path.exists(rows_path):
            with open(rows_path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
    return rows, error


def destroy_process_group() -> None:
    """Destroy the default process group after freeing the DDP modules nothing references any more.

    A DDP module sits in a reference cycle, so it outlives the function that made it until
    the cyclic garbage collector runs: perhaps after the process group was destroyed, inside
    another object's destructor or at interpreter exit. Its reducer then releases the gloo
    process group with the GIL held while gloo's worker threads may need the GIL to free
    their last tensors: the process hangs at exit or aborts ("terminate called without an
    active exception"). Collected here, while the group is alive and idle, it goes quietly.

    The barrier after it matters even without DDP: a gloo worker thread releases a finished
    collective's tensors after ``wait()`` returned, which needs the GIL; a process that reaches
    interpreter exit first aborts the same way (docs/cluster.md, "Ending a gloo job"). A
    barrier waits with the GIL released; the second lets the threads drop the first one's
    references to the collectives before it. Every rank of the default group must call this.
    """
    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    dist.barrier()
    dist.destroy_process_group()


def collective_timeout(default: float = 1800.0) -> datetime.timedelta:
    """Return the collective timeout for ``init_process_group(timeout=...)`` in test scripts.

    ``$DISTKIT_COLLECTIVE_TIMEOUT_S`` (set by :func:`run_cluster` from
    ``cluster.env``, so a lost host ends a gloo collective in seconds),
    else ``default`` (torch's own default for gloo).

    Parameters
    ----------
    default : float
        Seconds when the variable is unset.

    Returns
    -------
    datetime.timedelta
        The timeout.

    Raises
    ------
    ValueError
        If the variable is not a positive number.
    """
    raw = os.environ.get("DISTKIT_COLLECTIVE_TIMEOUT_S")
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"DISTKIT_COLLECTIVE_TIMEOUT_S={raw!r} is not a number") from None
    if not seconds > 0:
        raise ValueError(f"DISTKIT_COLLECTIVE_TIMEOUT_S={raw!r} must be positive")
    return datetime.timedelta(seconds=seconds)
