"""Sharded, checksummed, atomic checkpoints with JSON metadata and raw-byte data.

Layout of a checkpoint directory::

    metadata.json     format/version, world size, and for every state-dict entry either a JSON
                      value or a tensor: dtype, global shape and chunks; each chunk names its
                      file, its global box (offsets, sizes) and its pieces [file offset, bytes,
                      crc32c]
    rank<r>.bin       raw little-endian bytes of the chunks rank r wrote

Nothing is pickled and loading never executes anything from the files.

Save: every rank writes the chunks it owns (its DTensor / LocalShard shards, plus a
round-robin share of the replicated tensors, so each replicated tensor is written once) into
``<path>.tmp-<token>/`` with the native engine (parallel pwrite + crc32c, GIL released),
fsyncs its file; rank 0 gathers the chunk lists, writes and fsyncs ``metadata.json`` and the
directory, then atomically swaps the new directory with the old checkpoint
(``renameat2(RENAME_EXCHANGE)``, falling back to two renames) and removes the old one.
A crash before the swap leaves the previous checkpoint untouched.

Load: every target tensor (plain, DTensor or LocalShard) describes the global box it wants;
each overlapping chunk is read (only the pieces covering the overlap), its crc32c verified,
and copied in, so a checkpoint written by N ranks loads into M ranks with another sharding.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import json
import os
import secrets
import shutil
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distkit_common import dtypes as dk_dtypes

from . import _distx_fake as _native
from ._fake import is_fake

__all__ = [
    "CheckpointCorruptionError",
    "FileSystemReader",
    "FileSystemWriter",
    "LocalShard",
    "async_save_state_dict",
    "load_state_dict",
    "save_state_dict",
]

FORMAT = "distx-fake-checkpoint"
VERSION = 1
METADATA = "metadata.json"
_ALIGN = 4096
_BATCH_BYTES = 512 << 20  # one native call (and one progress update) per ~512 MiB


class _Skip:
    """Placeholder for a DTensor box another rank writes (async staging)."""


_SKIP = _Skip()


class CheckpointCorruptionError(ValueError):
    """A chunk's crc32c does not match its metadata (or the files are inconsistent)."""


@dataclasses.dataclass
class LocalShard:
    """This rank's part of a tensor sharded without DTensor.

    Parameters
    ----------
    tensor : torch.Tensor
        The local data (the box ``offsets`` .. ``offsets + tensor.shape`` of the global tensor).
    global_shape : sequence of int
        Shape of the whole tensor.
    offsets : sequence of int
        Global index of ``tensor[0, 0, ...]``.

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor.
    ValueError
        If the box does not fit in ``global_shape`` or the ranks differ.
    """

    tensor: torch.Tensor
    global_shape: Sequence[int]
    offsets: Sequence[int]

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, torch.Tensor):
            raise TypeError(f"LocalShard.tensor must be a tensor, got {type(self.tensor).__name__}")
        gs, off = tuple(int(x) for x in self.global_shape), tuple(int(x) for x in self.offsets)
        if len(gs) != self.tensor.dim() or len(off) != self.tensor.dim():
            raise ValueError(
                f"LocalShard: global_shape {gs} and offsets {off} must have {self.tensor.dim()} dims "
                f"like the local tensor of shape {tuple(self.tensor.shape)}"
            )
        for d, (o, s, g) in enumerate(zip(off, self.tensor.shape, gs)):
            if o < 0 or o + s > g:
                raise ValueError(f"LocalShard: dim {d}: offset {o} + size {s} exceeds global size {g}")
        self.global_shape, self.offsets = gs, off


class FileSystemWriter:
    """Where and how :func:`save_state_dict` writes.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory (replaced atomically if it exists).
    piece_bytes : int, optional
        Granularity of checksums and of parallel I/O (default 32 MiB).
    sync : bool, optional
        fsync files and directories (default True; turning it off forfeits durability).
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
        if not isinstance(piece_bytes, int) or piece_bytes < _ALIGN or piece_bytes % _ALIGN:
            raise ValueError(f"piece_bytes must be a positive multiple of {_ALIGN}, got {piece_bytes!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.piece_bytes = piece_bytes
        self.sync = bool(sync)
        self.progress = progress
        self.direct = bool(direct)


class FileSystemReader:
    """Where :func:`load_state_dict` reads from.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory written by :func:`save_state_dict`.
    progress : bool or None, optional
        Show a progress bar on rank 0; ``None`` (default) = only when stderr is a terminal.
    direct : bool, optional
        Read with ``O_DIRECT`` through aligned bounce buffers (default True; falls back to
        buffered reads where the filesystem refuses it).

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

    def read_metadata(self) -> dict[str, Any]:
        """Parse and validate ``metadata.json`` (plain JSON, never pickle).

        Raises
        ------
        FileNotFoundError
            If there is no checkpoint at the path.
        CheckpointCorruptionError
            If the metadata is not a valid distx-fake checkpoint description.
        """
        mpath = os.path.join(self.path, METADATA)
        if not os.path.exists(mpath):
            raise FileNotFoundError(f"no checkpoint at {self.path!r} (missing {METADATA})")
        try:
            with open(mpath, encoding="utf-8") as f:
                meta = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointCorruptionError(f"{mpath}: metadata is not valid JSON: {e}") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointCorruptionError(f"{mpath}: not a {FORMAT} metadata file")
        if meta.get("version") != VERSION:
            raise CheckpointCorruptionError(f"{mpath}: unsupported version {meta.get('version')!r}")
        return meta


# --------------------------------------------------------------------------------------------
# state-dict flattening
# --------------------------------------------------------------------------------------------
PathT = tuple[Any, ...]


def _flatten(obj: Any, prefix: PathT = ()) -> Iterator[tuple[PathT, Any, Any, Any]]:
    """Yield (path, value, container, key) for every leaf of nested dicts/lists."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"state dict keys must be str or int, got {k!r} at {_name(prefix)!r}")
            pk: Any = k if isinstance(k, str) else {"int": k}
            if isinstance(v, (dict, list)) and v:
                yield from _flatten(v, (*prefix, pk))
            else:
                yield (*prefix, pk), v, obj, k
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, (dict, list)) and v:
                yield from _flatten(v, (*prefix, i))
            else:
                yield (*prefix, i), v, obj, i
    else:
        raise TypeError(f"state_dict must be a dict, got {type(obj).__name__}")


def _key(path: PathT) -> str:
    return json.dumps(list(path), separators=(",", ":"))


def _name(path: PathT) -> str:
    return ".".join(str(p["int"]) if isinstance(p, dict) else str(p) for p in path) or "<root>"


def _is_dtensor(x: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, DTensor)


def _json_value(path: PathT, v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (dict, list)) and not v:
        return v
    if isinstance(v, tuple):
        return {"tuple": [_json_value(path, x) for x in v]}
    raise TypeError(
        f"state dict entry {_name(path)!r} has type {type(v).__name__}; only tensors, DTensors, "
        "LocalShard and JSON values (None, bool, int, float, str, tuples) can be saved without pickle"
    )


def _from_json(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"tuple"}:
        return tuple(_from_json(x) for x in v["tuple"])
    return v


@dataclasses.dataclass
class _Item:
    """A tensor entry of the local state dict: the global box this rank holds."""

    path: PathT
    tensor: torch.Tensor  # local data (dense, any device)
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    replicated: bool  # identical on every rank -> written once


def _tensor_item(path: PathT, v: Any) -> _Item | None:
    if isinstance(v, LocalShard):
        return _Item(path, v.tensor, tuple(v.global_shape), tuple(v.offsets), False)
    if _is_dtensor(v):
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, off = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
        local = v._local_tensor
        # a copy of this box also lives on ranks that differ only in Replicate mesh dims:
        # only the one at coordinate 0 of those dims writes it
        coord = v.device_mesh.get_coordinate() or []
        dup = any(isinstance(p, Replicate) and coord[i] != 0 for i, p in enumerate(v.placements))
        item = _Item(path, local, tuple(v.shape), tuple(off), False)
        return None if dup else item
    if isinstance(v, torch.Tensor):
        return _Item(path, v, tuple(v.shape), (0,) * v.dim(), True)
    return None


# --------------------------------------------------------------------------------------------
# distributed helpers
# --------------------------------------------------------------------------------------------
class _Comm:
    def __init__(self, group: Any) -> None:
        self.on = dist.is_available() and dist.is_initialized()
        self.group = group
        self.rank = dist.get_rank(group) if self.on else 0
        self.size = dist.get_world_size(group) if self.on else 1

    def all_gather(self, obj: Any) -> list[Any]:
        # objects are small dicts of ints/strings produced by this module (never user data)
        if not self.on or self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        if not self.on or self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        return box[0]


def _progress(enabled: bool | None, rank: int, total: int, desc: str) -> Any:
    if rank != 0:
        return None
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextBar(total, desc)
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr)


class _TextBar:
    """Minimal stand-in for tqdm (used when tqdm is not installed)."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n = max(total, 1), desc, 0
        self._show()

    def _show(self) -> None:
        pct = 100 * self.n // self.total
        sys.stderr.write(f"\r{self.desc}: {pct:3d}% {self.n / 1e6:.1f}/{self.total / 1e6:.1f} MB")
        sys.stderr.flush()

    def update(self, n: int) -> None:
        self.n = min(self.total, self.n + n)
        self._show()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# save
# --------------------------------------------------------------------------------------------
def _as_bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the data of ``t`` (a copy only when needed)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


def _check_has_data(path: PathT, t: torch.Tensor) -> None:
    if is_fake(t) or t.device.type == "meta":
        raise TypeError(
            f"state dict entry {_name(path)!r} is a fake/meta tensor without data; "
            "materialize it first (deferred_init.materialize_module)"
        )


def _plan(state_dict: dict[Any, Any], comm: _Comm) -> tuple[list[_Item], dict[str, Any]]:
    """Split the local state dict into the tensors this rank writes and the JSON values."""
    mine: list[_Item] = []
    values: dict[str, Any] = {}
    replicated: list[_Item] = []
    for path, v, _, _ in _flatten(state_dict):
        item = _tensor_item(path, v)
        if item is not None:
            if item.tensor.is_sparse or item.tensor.layout != torch.strided:
                raise TypeError(f"state dict entry {_name(path)!r}: only dense (strided) tensors are supported")
            dk_dtypes.code_of(item.tensor.dtype)  # raises for unsupported dtypes
            _check_has_data(path, item.tensor)
            (replicated if item.replicated else mine).append(item)
        elif isinstance(v, (torch.Tensor, _Skip)) or _is_dtensor(v):
            continue  # a DTensor box duplicated on another rank
        else:
            values[_key(path)] = {"path": list(path), "value": _json_value(path, v)}
    # each replicated tensor is written by exactly one rank: round-robin over the sorted keys,
    # weighted by size so ranks get similar byte counts
    replicated.sort(key=lambda it: _key(it.path))
    load = [0] * comm.size
    for it in sorted(replicated, key=lambda it: (-it.tensor.numel() * it.tensor.element_size(), _key(it.path))):
        owner = min(range(comm.size), key=lambda r: (load[r], r))
        load[owner] += it.tensor.numel() * it.tensor.element_size()
        if owner == comm.rank:
            mine.append(it)
    return mine, values


def _write_rank_file(fname: str, items: list[_Item], writer: FileSystemWriter, bar: Any) -> list[dict[str, Any]]:
    """Write this rank's chunks into one file; return their metadata."""
    chunks: list[dict[str, Any]] = []
    fd, direct = _open(fname, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, writer.direct)
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

        for it in items:
            data = _as_bytes_view(it.tensor)
            nbytes = data.numel() * data.element_size()
            chunk: dict[str, Any] = {
                "path": list(it.path),
                "dtype": dk_dtypes.dtype_name(data.dtype),
                "global_shape": list(it.global_shape),
                "offsets": list(it.offsets),
                "sizes": list(data.shape),
                "pieces": [],
            }
            base = data.data_ptr() if nbytes else 0
            # The chunk starts at the same remainder modulo 4096 as its memory address (the
            # allocator gives every large tensor the same one), so direct I/O streams whole
            # blocks between the file and the tensor storage without a bounce copy, here and
            # when loading into tensors from the same allocator. Pieces end on block boundaries.
            offset += base % _ALIGN
            pos = 0
            if nbytes == 0:
                chunk["pieces"].append([offset, 0, 0])
            while pos < nbytes:
                n = min(writer.piece_bytes - (offset % _ALIGN if pos == 0 else 0), nbytes - pos)
                chunk["pieces"].append([offset, n, None])
                batch.append((base + pos, n, offset))
                batch_bytes += n
                pos += n
                offset += n
            offset = -(-offset // _ALIGN) * _ALIGN
            batch_refs.append((chunk, data))  # keeps `data` alive until written
            chunks.append(chunk)
            if batch_bytes >= _BATCH_BYTES:
                flush()
        flush()
        if writer.sync:
            _native.fsync_fd(fd)
    finally:
        os.close(fd)
    return chunks


def _open(fname: str, flags: int, direct: bool) -> tuple[int, bool]:
    """Open with O_DIRECT when asked and supported; return (fd, direct)."""
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(fname, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
    return os.open(fname, flags, 0o644), False


# --------------------------------------------------------------------------------------------
# ownership markers and stale temporary directories
# --------------------------------------------------------------------------------------------
_MARKER_PREFIX = ".distx-owner-rank"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _proc_start(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot) or None if there is no such process.

    A zombie counts as gone: it will never write again.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""  # exists but unreadable
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else ""


def _owner_record() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start": _proc_start(pid) or ""}


def _write_marker(tmp: str, rank: int) -> None:
    """Record which process writes into ``tmp`` (read by :func:`_is_abandoned`)."""
    with open(os.path.join(tmp, f"{_MARKER_PREFIX}{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(_owner_record(), f)


def _owner_alive(rec: Any) -> bool:
    """False only if the recorded owner provably no longer runs (same host, pid gone)."""
    if not isinstance(rec, dict) or rec.get("host") != socket.gethostname():
        return True  # another host (or garbage): cannot tell
    boot = _boot_id()
    if boot and rec.get("boot_id") and rec["boot_id"] != boot:
        return False  # written before this host rebooted
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    start = _proc_start(pid)
    if start is None:
        return False
    # the pid exists: still the owner unless the pid was reused by a later process
    return not (start and rec.get("start") and start != rec["start"])


def _is_abandoned(tmp: str) -> bool:
    """True if every process that wrote into ``tmp`` is provably dead on this host."""
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(_MARKER_PREFIX)]
    except OSError:
        return False
    if not names:
        return False  # no owner recorded (foreign folder, or created a moment ago)
    for n in names:
        try:
            with open(os.path.join(tmp, n), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return False
        if _owner_alive(rec):
            return False
    return True


def _clean_stale_tmp(path: str) -> list[str]:
    """Remove the ``<path>.tmp-*`` folders left by saves whose processes died; return them.

    Only folders whose ownership markers all name processes of this host that no longer run
    are removed; a live save (here or on another host) and unmarked folders are left alone.
    """
    parent, base = os.path.split(path)
    prefix = base + ".tmp-"
    removed: list[str] = []
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return removed
    for n in names:
        full = os.path.join(parent, n)
        if n.startswith(prefix) and os.path.isdir(full) and not os.path.islink(full) and _is_abandoned(full):
            shutil.rmtree(full, ignore_errors=True)
            removed.append(full)
    return removed


def _drop_markers(path: str) -> None:
    with contextlib.suppress(OSError):
        for n in os.listdir(path):
            if n.startswith(_MARKER_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, n))


def _commit(tmp: str, path: str, sync: bool) -> None:
    parent = os.path.dirname(path) or "."
    if sync:
        _native.fsync_path(tmp)
    if os.path.exists(path):
        if not os.path.exists(os.path.join(path, METADATA)) and os.listdir(path):
            raise FileExistsError(f"{path!r} exists and is not a distx-fake checkpoint; refusing to replace it")
        if _native.exchange_paths(tmp, path):
            shutil.rmtree(tmp)  # now holds the previous checkpoint
        else:  # no RENAME_EXCHANGE on this filesystem: two renames (a tiny window without `path`)
            old = f"{path}.old-{secrets.token_hex(4)}"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
    else:
        os.rename(tmp, path)
    if sync:
        _native.fsync_path(parent)


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
    """
    if not isinstance(storage_writer, FileSystemWriter):
        raise TypeError(f"storage_writer must be a FileSystemWriter, got {type(storage_writer).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    comm = _Comm(process_group)
    if no_dist:
        comm.on, comm.rank, comm.size = False, 0, 1
    _save(state_dict, storage_writer, comm)


def _save(state_dict: dict[Any, Any], writer: FileSystemWriter, comm: _Comm) -> None:
    err: BaseException | None = None
    chunks: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    items: list[_Item] = []
    try:
        items, values = _plan(state_dict, comm)
    except BaseException as e:  # reported collectively below, then re-raised
        err = e
    if comm.rank == 0:
        # a crashed earlier save may have left its temporary folder: remove it if its
        # writers provably died (never a concurrent live save)
        with contextlib.suppress(OSError):
            _clean_stale_tmp(writer.path)
    token = comm.broadcast(secrets.token_hex(8) if comm.rank == 0 else None)
    tmp = f"{writer.path}.tmp-{token}"
    total = sum(it.tensor.numel() * it.tensor.element_size() for it in items)
    bar = _progress(writer.progress, comm.rank, total * comm.size, "save")
    if err is None:
        try:
            os.makedirs(tmp, exist_ok=True)
            _write_marker(tmp, comm.rank)
            fname = f"rank{comm.rank}.bin"
            chunks = _write_rank_file(os.path.join(tmp, fname), items, writer, bar)
            for c in chunks:
                c["file"] = fname
        except BaseException as e:
            err = e
    status = comm.all_gather({"ok": err is None, "error": repr(err) if err else "", "chunks": chunks})
    if bar is not None:
        bar.close()
    failed = [f"rank {r}: {s['error']}" for r, s in enumerate(status) if not s["ok"]]
    commit_err = ""
    if comm.rank == 0:
        if failed:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            try:
                _write_metadata(tmp, status, values, comm.size, writer)
                _commit(tmp, writer.path, writer.sync)
                _drop_markers(writer.path)  # after the commit: the folder is never unowned
            except BaseException as e:
                commit_err = repr(e)
                shutil.rmtree(tmp, ignore_errors=True)
                if not comm.on:
                    raise
    commit_err = comm.broadcast(commit_err)
    if err is not None:
        raise err
    if failed:
        raise OSError("checkpoint save failed on other ranks (previous checkpoint kept): " + "; ".join(failed))
    if commit_err:
        raise OSError(f"checkpoint commit failed on rank 0 (previous checkpoint kept): {commit_err}")


def _write_metadata(
    tmp: str, status: list[dict[str, Any]], values: dict[str, Any], world: int, writer: FileSystemWriter
) -> None:
    entries: dict[str, dict[str, Any]] = {}
    for s in status:
        for c in s["chunks"]:
            k = _key(tuple(c["path"]))
            e = entries.setdefault(
                k, {"path": c["path"], "kind": "tensor", "dtype": c["dtype"], "shape": c["global_shape"], "chunks": []}
            )
            if e["dtype"] != c["dtype"] or e["shape"] != c["global_shape"]:
                raise ValueError(f"ranks disagree on dtype/shape of {_name(tuple(c['path']))!r}")
            e["chunks"].append({"file": c["file"], "offsets": c["offsets"], "sizes": c["sizes"], "pieces": c["pieces"]})
    for k, v in values.items():
        entries[k] = {"path": v["path"], "kind": "value", "value": v["value"]}
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "world_size": world,
        "piece_bytes": writer.piece_bytes,
        "checksum": "crc32c",
        "entries": [entries[k] for k in sorted(entries)],
    }
    mpath = os.path.join(tmp, METADATA)
    with open(mpath, "w", encoding="utf-8") as f:
        json.dump(meta, f, separators=(",", ":"))
        f.flush()
        if writer.sync:
            _native.fsync_fd(f.fileno())


# --------------------------------------------------------------------------------------------
# load
# --------------------------------------------------------------------------------------------
def _target(path: PathT, v: Any) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]] | None:
    """(destination local tensor, global shape, global offsets) of a load target."""
    if isinstance(v, LocalShard):
        return v.tensor, tuple(v.global_shape), tuple(v.offsets)
    if _is_dtensor(v):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, off = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
        return v._local_tensor, tuple(v.shape), tuple(off)
    if isinstance(v, torch.Tensor):
        return v, tuple(v.shape), (0,) * v.dim()
    return None


class _Files:
    def __init__(self, root: str, direct: bool) -> None:
        self.root = root
        self.direct = direct
        self.fds: dict[str, tuple[int, bool]] = {}

    def _get(self, name: str) -> tuple[int, bool]:
        if "/" in name or name.startswith("."):
            raise CheckpointCorruptionError(f"invalid data file name {name!r} in metadata")
        if name not in self.fds:
            self.fds[name] = _open(os.path.join(self.root, name), os.O_RDONLY | os.O_CLOEXEC, self.direct)
        return self.fds[name]

    def read(self, name: str, tuples: list[tuple[int, int, int]]) -> list[int]:
        fd, direct = self._get(name)
        return _native.read_pieces(fd, tuples, direct)

    def close(self) -> None:
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _verify(name: str, chunk: dict[str, Any], pieces: list[list[Any]], crcs: list[int]) -> None:
    for p, c in zip(pieces, crcs):
        if int(p[2]) != c:
            raise CheckpointCorruptionError(
                f"checksum mismatch in tensor {name!r}: {chunk['file']} bytes {p[0]}..{p[0] + p[1]} "
                f"have crc32c {c:#010x}, metadata says {int(p[2]):#010x} (the checkpoint is corrupted)"
            )


def _read_range(files: _Files, name: str, chunk: dict[str, Any], b0: int, b1: int) -> tuple[torch.Tensor, int]:
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
    _verify(name, chunk, sel, crcs)
    return buf, max(start, 0)


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
    process_group, coordinator_rank, no_dist
        Accepted for torchdistX compatibility; loading needs no communication.

    Raises
    ------
    TypeError
        For a non-dict state dict or a non-FileSystemReader reader.
    KeyError
        If an entry of ``state_dict`` is not in the checkpoint.
    ValueError
        If a tensor's global shape or dtype differs from the checkpoint.
    CheckpointCorruptionError
        If a checksum does not match (naming the tensor) or the metadata is invalid.
    """
    if not isinstance(storage_reader, FileSystemReader):
        raise TypeError(f"storage_reader must be a FileSystemReader, got {type(storage_reader).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    meta = storage_reader.read_metadata()
    index = {_key(tuple(e["path"])): e for e in meta["entries"]}
    comm = _Comm(process_group)
    plan: list[tuple[PathT, dict[str, Any], torch.Tensor, tuple[int, ...]]] = []
    for path, v, container, key in list(_flatten(state_dict)):
        k = _key(path)
        entry = index.get(k)
        if entry is None:
            raise KeyError(f"{_name(path)!r} is not in the checkpoint at {storage_reader.path!r}")
        tgt = _target(path, v)
        if tgt is None:
            if entry["kind"] != "value":
                raise ValueError(f"{_name(path)!r} is a tensor in the checkpoint but {type(v).__name__} in state_dict")
            container[key] = _from_json(entry["value"])
            continue
        if entry["kind"] != "tensor":
            raise ValueError(f"{_name(path)!r} is a value in the checkpoint but a tensor in state_dict")
        dest, gshape, off = tgt
        _check_has_data(path, dest)
        if list(gshape) != list(entry["shape"]):
            raise ValueError(f"{_name(path)!r}: checkpoint shape {tuple(entry['shape'])} != state_dict shape {gshape}")
        if dk_dtypes.dtype_name(dest.dtype) != entry["dtype"]:
            raise ValueError(f"{_name(path)!r}: checkpoint dtype {entry['dtype']} != state_dict dtype {dest.dtype}")
        plan.append((path, entry, dest, off))
    total = sum(d.numel() * d.element_size() for _, _, d, _ in plan)
    bar = _progress(storage_reader.progress, comm.rank if not no_dist else 0, total, "load")
    files = _Files(storage_reader.path, storage_reader.direct)
    try:
        _load_tensors(plan, files, bar)
    finally:
        files.close()
        if bar is not None:
            bar.close()


def _load_tensors(
    plan: list[tuple[PathT, dict[str, Any], torch.Tensor, tuple[int, ...]]], files: _Files, bar: Any
) -> None:
    # fast path: a destination that is exactly one whole chunk and contiguous on the CPU is
    # read straight into its memory; these reads are batched into few native calls
    direct: list[tuple[str, dict[str, Any], list[list[Any]], list[tuple[int, int, int]]]] = []
    direct_bytes = 0

    def flush() -> None:
        nonlocal direct, direct_bytes
        by_file: dict[str, list[int]] = {}
        for i, d in enumerate(direct):
            by_file.setdefault(d[1]["file"], []).append(i)
        for fname, idx in by_file.items():
            tuples = [t for i in idx for t in direct[i][3]]
            crcs = files.read(fname, tuples)
            at = 0
            for i in idx:
                name, chunk, pieces, tl = direct[i]
                _verify(name, chunk, pieces, crcs[at : at + len(tl)])
                at += len(tl)
        if bar is not None:
            bar.update(direct_bytes)
        direct, direct_bytes = [], 0

    for path, entry, dest, off in plan:
        name = _name(path)
        box = [(o, o + s) for o, s in zip(off, dest.shape)]
        nbytes_dest = dest.numel() * dest.element_size()
        for chunk in entry["chunks"]:
            cbox = [(o, o + s) for o, s in zip(chunk["offsets"], chunk["sizes"])]
            inter = [(max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(box, cbox)]
            if any(lo >= hi for lo, hi in inter) and dest.dim() > 0:
                continue
            if (
                cbox == box
                and dest.device.type == "cpu"
                and dest.is_contiguous()
                and not dest.is_conj()
                and not dest.is_neg()
            ):
                pieces = [p for p in chunk["pieces"] if int(p[1]) > 0]
                base, at, tl = dest.data_ptr(), 0, []
                for p in pieces:
                    tl.append((base + at, int(p[1]), int(p[0])))
                    at += int(p[1])
                if at != nbytes_dest:
                    raise CheckpointCorruptionError(f"tensor {name!r}: chunk holds {at} bytes, expected {nbytes_dest}")
                direct.append((name, chunk, pieces, tl))
                direct_bytes += at
                if direct_bytes >= _BATCH_BYTES:
                    flush()
                continue
            _copy_overlap(files, name, entry, chunk, cbox, inter, dest, off)
            if bar is not None:
                bar.update(int(torch.Size([hi - lo for lo, hi in inter]).numel()) * dest.element_size())
    flush()


def _copy_overlap(
    files: _Files,
    name: str,
    entry: dict[str, Any],
    chunk: dict[str, Any],
    cbox: list[tuple[int, int]],
    inter: list[tuple[int, int]],
    dest: torch.Tensor,
    off: tuple[int, ...],
) -> None:
    dtype = dk_dtypes.torch_dtype(entry["dtype"])
    item = torch.empty((), dtype=dtype).element_size()
    sizes = [hi - lo for lo, hi in cbox]
    row = item
    for s in sizes[1:]:
        row *= s
    if len(sizes) == 0:
        b0, b1 = 0, item
    elif all(inter[d] == cbox[d] for d in range(1, len(sizes))):
        # overlap restricted along dim 0 only: a contiguous byte range of the chunk
        b0, b1 = (inter[0][0] - cbox[0][0]) * row, (inter[0][1] - cbox[0][0]) * row
    else:
        b0, b1 = 0, row * (sizes[0] if sizes else 1)
    buf, start = _read_range(files, name, chunk, b0, b1)
    sub = buf[b0 - start : b1 - start]
    if len(sizes) == 0:
        src = sub.view(dtype).reshape(())
    else:
        first = cbox[0][0] + b0 // row  # global index of the first row in `sub`
        src = sub.view(dtype).reshape([(b1 - b0) // row, *sizes[1:]])
        base = [first] + [lo for lo, _ in cbox[1:]]
        src = src[tuple(slice(lo - b, hi - b) for (lo, hi), b in zip(inter, base))]
    dst = dest[tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(inter, off))] if dest.dim() else dest
    with torch.no_grad():
        dst.copy_(src)


# --------------------------------------------------------------------------------------------
# async save
# --------------------------------------------------------------------------------------------
_async_lock = threading.Lock()
_async_exec: concurrent.futures.ThreadPoolExecutor | None = None
_async_prev: concurrent.futures.Future[None] | None = None
_async_groups: dict[Any, Any] = {}


def _stage(obj: Any) -> Any:
    """Copy every tensor of a state dict to the CPU (the snapshot the background write uses)."""
    if isinstance(obj, dict):
        return {k: _stage(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_stage(v) for v in obj]
    if isinstance(obj, LocalShard):
        return LocalShard(_stage(obj.tensor), obj.global_shape, obj.offsets)
    if _is_dtensor(obj):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, off = compute_local_shape_and_global_offset(obj.shape, obj.device_mesh, obj.placements)
        from torch.distributed.tensor import Replicate

        coord = obj.device_mesh.get_coordinate() or []
        if any(isinstance(p, Replicate) and coord[i] != 0 for i, p in enumerate(obj.placements)):
            return _SKIP  # another rank writes this box
        return LocalShard(_stage(obj._local_tensor), tuple(obj.shape), off)
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
    global _async_exec, _async_prev
    if not isinstance(storage_writer, FileSystemWriter):
        raise TypeError(f"storage_writer must be a FileSystemWriter, got {type(storage_writer).__name__}")
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    with _async_lock:
        if _async_prev is not None:
            with contextlib.suppress(BaseException):
                _async_prev.result()  # its error belongs to its own future
        comm = _Comm(process_group)
        if comm.on and comm.size > 1:
            if process_group not in _async_groups:
                ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
                _async_groups[process_group] = dist.new_group(ranks=ranks, backend="gloo")
            comm = _Comm(_async_groups[process_group])
        staged = _stage(state_dict)
        if _async_exec is None:
            _async_exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="distx-ckpt")
        fut = _async_exec.submit(_save, staged, storage_writer, comm)
        _async_prev = fut
        return fut
