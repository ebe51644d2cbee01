"""Checkpoints of the server state: raw bytes + JSON metadata, no pickle.

Layout of a checkpoint directory::

    meta.json            {"format": "kvps-1", "num_keys", "dtype", "num_shards", "shard_keys": [...]}
    lengths.bin          int64[num_keys], the value length of every key
    shard-<r>.keys       int64 keys owned by rank r when saved
    shard-<r>.vals       their values, concatenated in key order (raw bytes of the dtype)

Saving writes into a temporary sibling directory, fsyncs every file and the
directory, then renames it into place (an existing checkpoint is replaced by a
second rename). Loading reads every shard and keeps each key on its home rank,
so a checkpoint loads into any number of ranks.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from ._server import Server

FORMAT = "kvps-1"
_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _write(path: Path, data: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(data).data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(server: Server, path: Any) -> None:
    """Collective atomic save of ``server`` to directory ``path`` (see the module docstring)."""
    eng = server._engine
    coll = server._coll
    rank = server.my_rank()
    target = Path(path)
    eng.wait_sync()  # replica deltas reach their owners
    eng.barrier()
    tmp_name = None
    err = None
    if rank == 0:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".{target.name}.tmp-{secrets.token_hex(8)}"
            tmp.mkdir()
            tmp_name = str(tmp)
        except OSError as e:
            err = e
    tmp_name = coll.bcast(tmp_name if err is None else None, root=0)
    if tmp_name is None:
        raise OSError(f"cannot create a temporary checkpoint directory next to {target}: {err}")
    tmp = Path(tmp_name)
    keys = eng.owned_keys()
    count = int(server.lengths[keys].sum()) if len(keys) else 0
    vals = torch.empty(count, dtype=server.dtype)
    if len(keys):
        eng.read_local(int(keys.ctypes.data), len(keys), vals.data_ptr())
    ok = True
    try:
        _write(tmp / f"shard-{rank}.keys", keys)
        _write(tmp / f"shard-{rank}.vals", vals.view(torch.uint8).numpy())
    except OSError:
        ok = False
    counts = coll.gather(len(keys) if ok else -1, root=0)
    if rank == 0:
        assert counts is not None
        if all(c >= 0 for c in counts):
            try:
                _write(tmp / "lengths.bin", server.lengths)
                meta = {
                    "format": FORMAT,
                    "num_keys": server.num_keys,
                    "dtype": _NAMES[server.dtype],
                    "num_shards": len(counts),
                    "shard_keys": counts,
                }
                with open(tmp / "meta.json", "w") as f:
                    json.dump(meta, f)
                    f.flush()
                    os.fsync(f.fileno())
                _fsync_dir(tmp)
                old = None
                if target.exists():
                    old = target.parent / f".{target.name}.old-{secrets.token_hex(8)}"
                    os.rename(target, old)
                os.rename(tmp, target)
                _fsync_dir(target.parent)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
            except OSError as e:
                err = e
        else:
            err = OSError("a rank failed to write its shard")
        if err is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = coll.bcast(None if err is None else str(err), root=0)
    if failed is not None:
        raise OSError(f"saving the kvps checkpoint to {target} failed: {failed}")


def load(server: Server, path: Any) -> None:
    """Collective load of the checkpoint in ``path`` into ``server`` (any saved rank count)."""
    eng = server._engine
    src = Path(path)
    try:
        with open(src / "meta.json") as f:
            meta = json.load(f)
        lengths = np.fromfile(src / "lengths.bin", dtype=np.int64)
    except (OSError, ValueError) as e:
        raise OSError(f"cannot read the kvps checkpoint in {src}: {e}") from e
    if meta.get("format") != FORMAT:
        raise ValueError(f"{src} is not a kvps checkpoint (format {meta.get('format')!r})")
    if meta["num_keys"] != server.num_keys:
        raise ValueError(f"checkpoint has {meta['num_keys']} keys, the server {server.num_keys}")
    if meta["dtype"] != _NAMES[server.dtype]:
        raise ValueError(f"checkpoint dtype {meta['dtype']} differs from the server's {_NAMES[server.dtype]}")
    if lengths.shape != server.lengths.shape or not np.array_equal(lengths, server.lengths):
        raise ValueError("checkpoint value lengths differ from the server's value_lengths")
    rank, size = server.my_rank(), server.num_ranks()
    isz = torch.empty(0, dtype=server.dtype).element_size()
    shards = []
    for r in range(int(meta["num_shards"])):
        keys = np.fromfile(src / f"shard-{r}.keys", dtype=np.int64)
        raw = np.fromfile(src / f"shard-{r}.vals", dtype=_UINT[isz])
        if keys.shape[0] != meta["shard_keys"][r] or raw.shape[0] != int(lengths[keys].sum()):
            raise ValueError(f"checkpoint shard {r} in {src} is truncated or corrupt")
        shards.append((keys, raw))
    eng.wait_sync()
    eng.barrier()
    eng.reset_ownership()
    eng.barrier()
    for keys, raw in shards:
        lens = lengths[keys]
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        mask = keys % size == rank
        sel = np.ascontiguousarray(keys[mask])
        if not len(sel):
            continue
        slens = lens[mask]
        dst_starts = np.concatenate([[0], np.cumsum(slens)[:-1]]).astype(np.int64)
        idx = np.arange(int(slens.sum()), dtype=np.int64) + np.repeat(starts[mask] - dst_starts, slens)
        vals = np.ascontiguousarray(raw[idx])
        eng.write_local(int(sel.ctypes.data), len(sel), int(vals.ctypes.data))
    eng.barrier()


# ---------------------------------------------------------------------------------------------
# distx-fake's checkpoint format (optional extra ``kvps[distx]``)
# ---------------------------------------------------------------------------------------------
DISTX_FORMAT = "kvps-distx-1"


def _distx_checkpoint() -> Any:
    """Import ``distx_fake.checkpoint`` lazily (kvps does not depend on it)."""
    try:
        from distx_fake import checkpoint
    except ImportError as e:
        raise ImportError(
            "format='distx' needs the distx-fake package (install the extra: pip install 'kvps[distx]')"
        ) from e
    return checkpoint


def _flat_index(lengths: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Element positions of ``keys``' values in the key-ordered flat value array."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    lens = lengths[keys]
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    dst = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts[keys] - dst, lens)


def save_distx(server: Server, path: Any) -> None:
    """Collective save through ``distx_fake.checkpoint.save_state_dict`` (atomic, crc32c-checked).

    The state dict is ``{"format", "num_keys", "dtype", "lengths", "values"}`` with
    ``values`` holding every key's value in key order. Rank 0 gathers the shards
    and writes the checkpoint alone (``no_dist=True``: kvps runs on MPI, not on a
    torch process group); the other ranks wait for its verdict.
    """
    ckpt = _distx_checkpoint()  # every rank fails alike before any communication
    eng = server._engine
    coll = server._coll
    rank = server.my_rank()
    eng.wait_sync()  # replica deltas reach their owners
    eng.barrier()
    keys = eng.owned_keys()
    count = int(server.lengths[keys].sum()) if len(keys) else 0
    vals = torch.empty(count, dtype=server.dtype)
    if len(keys):
        eng.read_local(int(keys.ctypes.data), len(keys), vals.data_ptr())
    shards = coll.gather((keys, vals.view(torch.uint8).numpy()), root=0)
    err = None
    if rank == 0:
        assert shards is not None
        try:
            isz = torch.empty(0, dtype=server.dtype).element_size()
            flat = torch.empty(int(server.lengths.sum()), dtype=server.dtype)
            flat_u = flat.view(torch.uint8).numpy().view(_UINT[isz])
            for k, raw in shards:
                flat_u[_flat_index(server.lengths, k)] = raw.view(_UINT[isz])
            state = {
                "format": DISTX_FORMAT,
                "num_keys": server.num_keys,
                "dtype": _NAMES[server.dtype],
                "lengths": torch.from_numpy(server.lengths.copy()),
                "values": flat,
            }
            ckpt.save_state_dict(state, ckpt.FileSystemWriter(str(path)), no_dist=True)
        except (OSError, ValueError, TypeError) as e:
            err = f"{type(e).__name__}: {e}"
    failed = coll.bcast(err, root=0)
    if failed is not None:
        raise OSError(f"saving the kvps checkpoint (distx format) to {path} failed: {failed}")


def load_distx(server: Server, path: Any) -> None:
    """Collective load of a checkpoint written by :func:`save_distx` (any saved rank count)."""
    ckpt = _distx_checkpoint()
    eng = server._engine
    try:
        meta = ckpt.FileSystemReader(str(path)).read_index()
    except (OSError, ValueError) as e:
        raise OSError(f"cannot read the distx checkpoint in {path}: {e}") from e
    values = {e.get("path", [None])[0]: e for e in meta.get("entries", []) if isinstance(e, dict)}
    if "values" not in values or "lengths" not in values:
        raise ValueError(f"{path} is not a kvps checkpoint in distx format (no 'values'/'lengths' entries)")
    state: dict[str, Any] = {
        "format": None,
        "num_keys": None,
        "dtype": None,
        "lengths": torch.empty(server.num_keys, dtype=torch.int64),
        "values": torch.empty(int(server.lengths.sum()), dtype=server.dtype),
    }
    try:
        ckpt.load_state_dict(state, ckpt.FileSystemReader(str(path)), no_dist=True)
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"the distx checkpoint in {path} does not match this server "
            f"(num_keys={server.num_keys}, dtype={_NAMES[server.dtype]}, its value lengths): {e}"
        ) from e
    if state["format"] != DISTX_FORMAT:
        raise ValueError(f"{path} is not a kvps checkpoint (format {state['format']!r})")
    if state["num_keys"] != server.num_keys or state["dtype"] != _NAMES[server.dtype]:
        raise ValueError(
            f"checkpoint has {state['num_keys']} keys of {state['dtype']}, the server "
            f"{server.num_keys} keys of {_NAMES[server.dtype]}"
        )
    if not np.array_equal(state["lengths"].numpy(), server.lengths):
        raise ValueError("checkpoint value lengths differ from the server's value_lengths")
    rank, size = server.my_rank(), server.num_ranks()
    mine = np.arange(rank, server.num_keys, size, dtype=np.int64)
    isz = torch.empty(0, dtype=server.dtype).element_size()
    flat_u = state["values"].view(torch.uint8).numpy().view(_UINT[isz])
    vals = np.ascontiguousarray(flat_u[_flat_index(server.lengths, mine)])
    eng.wait_sync()
    eng.barrier()
    eng.reset_ownership()
    eng.barrier()
    if len(mine):
        eng.write_local(int(mine.ctypes.data), len(mine), int(vals.ctypes.data))
    eng.barrier()
