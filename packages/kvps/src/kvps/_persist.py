"""Checkpoints of the server state: raw bytes + JSON metadata, no pickle.

Layout of a checkpoint directory::

    meta.json            {"format": "kvps-1", "num_keys", "dtype", "rule", "num_shards", "shard_keys": [...]}
    lengths.bin          int64[num_keys], the value length of every key
    shard-<r>.keys       int64 keys owned by rank r when saved
    shard-<r>.vals       their slots (value, then optimizer state), concatenated in key order
                         (raw bytes of the dtype)

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

from distkit_common.dtypes import dtype_name

if TYPE_CHECKING:
    from ._shard import LocalShard

FORMAT = "kvps-1"
_NO_RULE = "add"  # the rule of checkpoints written before server-side optimizers


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


def _elements(shard: LocalShard) -> np.dtype:
    """An opaque numpy element of the value dtype's size (values are moved as bytes)."""
    return np.dtype(f"V{shard.itemsize}")


def _flat_index(slot_lengths: np.ndarray, keys: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """Element positions of ``keys``' slots in a flat array laid out by ``starts`` (default: key order)."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    if starts is None:
        starts = np.concatenate([[0], np.cumsum(slot_lengths)[:-1]]).astype(np.int64)[keys]
    lens = slot_lengths[keys]
    dst = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - dst, lens)


def _check_rule(shard: LocalShard, saved: Any, src: Any) -> None:
    if saved != shard.rule["name"]:
        raise ValueError(
            f"the checkpoint in {src} holds optimizer state of rule {saved!r}, the server applies "
            f"{shard.rule['name']!r}"
        )


def save(shard: LocalShard, path: Any) -> None:
    """Collective atomic save of a server's shards to directory ``path`` (see the module docstring)."""
    coll = shard.comm
    rank = shard.rank
    target = Path(path)
    shard.quiesce()
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
    keys = shard.owned_keys()
    vals = shard.read(keys)
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
                _write(tmp / "lengths.bin", shard.lengths)
                meta = {
                    "format": FORMAT,
                    "num_keys": shard.num_keys,
                    "dtype": dtype_name(shard.dtype),
                    "rule": shard.rule["name"],
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


def load(shard: LocalShard, path: Any) -> None:
    """Collective load of the checkpoint in ``path`` (saved on any number of ranks)."""
    src = Path(path)
    try:
        with open(src / "meta.json") as f:
            meta = json.load(f)
        lengths = np.fromfile(src / "lengths.bin", dtype=np.int64)
    except (OSError, ValueError) as e:
        raise OSError(f"cannot read the kvps checkpoint in {src}: {e}") from e
    if meta.get("format") != FORMAT:
        raise ValueError(f"{src} is not a kvps checkpoint (format {meta.get('format')!r})")
    if meta["num_keys"] != shard.num_keys:
        raise ValueError(f"checkpoint has {meta['num_keys']} keys, the server {shard.num_keys}")
    if meta["dtype"] != dtype_name(shard.dtype):
        raise ValueError(f"checkpoint dtype {meta['dtype']} differs from the server's {dtype_name(shard.dtype)}")
    if lengths.shape != shard.lengths.shape or not np.array_equal(lengths, shard.lengths):
        raise ValueError("checkpoint value lengths differ from the server's value_lengths")
    _check_rule(shard, meta.get("rule", _NO_RULE), src)
    slots = shard.slot_lengths
    elem = _elements(shard)
    shards = []
    for r in range(int(meta["num_shards"])):
        keys = np.fromfile(src / f"shard-{r}.keys", dtype=np.int64)
        raw = np.fromfile(src / f"shard-{r}.vals", dtype=elem)
        if keys.shape[0] != meta["shard_keys"][r] or raw.shape[0] != int(slots[keys].sum()):
            raise ValueError(f"checkpoint shard {r} in {src} is truncated or corrupt")
        shards.append((keys, raw))
    shard.reset_ownership()
    for keys, raw in shards:
        starts = np.concatenate([[0], np.cumsum(slots[keys])[:-1]]).astype(np.int64)
        mine = keys % shard.size == shard.rank
        sel = np.ascontiguousarray(keys[mine])
        if len(sel):
            shard.write(sel, raw[_flat_index(slots, sel, starts[mine])])
    shard.barrier()


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


def save_distx(shard: LocalShard, path: Any) -> None:
    """Collective save through ``distx_fake.checkpoint.save_state_dict`` (atomic, crc32c-checked).

    The state dict is ``{"format", "num_keys", "dtype", "rule", "lengths", "values"}``
    with ``values`` holding every key's slot in key order. Rank 0 gathers the
    shards and writes the checkpoint alone (``no_dist=True``: kvps runs on MPI,
    not on a torch process group); the other ranks wait for its verdict.
    """
    ckpt = _distx_checkpoint()  # every rank fails alike before any communication
    coll = shard.comm
    shard.quiesce()
    keys = shard.owned_keys()
    vals = shard.read(keys)
    shards = coll.gather((keys, vals.view(torch.uint8).numpy()), root=0)
    err = None
    if shard.rank == 0:
        assert shards is not None
        try:
            slots = shard.slot_lengths
            flat = torch.empty(int(slots.sum()), dtype=shard.dtype)
            flat_e = flat.view(torch.uint8).numpy().view(_elements(shard))
            for k, raw in shards:
                flat_e[_flat_index(slots, k)] = raw.view(_elements(shard))
            state = {
                "format": DISTX_FORMAT,
                "num_keys": shard.num_keys,
                "dtype": dtype_name(shard.dtype),
                "rule": shard.rule["name"],
                "lengths": torch.from_numpy(shard.lengths.copy()),
                "values": flat,
            }
            ckpt.save_state_dict(state, ckpt.FileSystemWriter(str(path)), no_dist=True)
        except (OSError, ValueError, TypeError) as e:
            err = f"{type(e).__name__}: {e}"
    failed = coll.bcast(err, root=0)
    if failed is not None:
        raise OSError(f"saving the kvps checkpoint (distx format) to {path} failed: {failed}")


def load_distx(shard: LocalShard, path: Any) -> None:
    """Collective load of a checkpoint written by :func:`save_distx` (any saved rank count)."""
    ckpt = _distx_checkpoint()
    try:
        meta = ckpt.FileSystemReader(str(path)).read_index()
    except (OSError, ValueError) as e:
        raise OSError(f"cannot read the distx checkpoint in {path}: {e}") from e
    entries = {e.get("path", [None])[0]: e for e in meta.get("entries", []) if isinstance(e, dict)}
    if "values" not in entries or "lengths" not in entries:
        raise ValueError(f"{path} is not a kvps checkpoint in distx format (no 'values'/'lengths' entries)")
    slots = shard.slot_lengths
    state: dict[str, Any] = {
        "format": None,
        "num_keys": None,
        "dtype": None,
        "lengths": torch.empty(shard.num_keys, dtype=torch.int64),
        "values": torch.empty(int(slots.sum()), dtype=shard.dtype),
    }
    if "rule" in entries:
        state["rule"] = None
    try:
        ckpt.load_state_dict(state, ckpt.FileSystemReader(str(path)), no_dist=True)
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"the distx checkpoint in {path} does not match this server "
            f"(num_keys={shard.num_keys}, dtype={dtype_name(shard.dtype)}, optimizer {shard.rule['name']!r}, "
            f"its value lengths): {e}"
        ) from e
    if state["format"] != DISTX_FORMAT:
        raise ValueError(f"{path} is not a kvps checkpoint (format {state['format']!r})")
    if state["num_keys"] != shard.num_keys or state["dtype"] != dtype_name(shard.dtype):
        raise ValueError(
            f"checkpoint has {state['num_keys']} keys of {state['dtype']}, the server "
            f"{shard.num_keys} keys of {dtype_name(shard.dtype)}"
        )
    if not np.array_equal(state["lengths"].numpy(), shard.lengths):
        raise ValueError("checkpoint value lengths differ from the server's value_lengths")
    _check_rule(shard, state.get("rule", _NO_RULE), path)
    mine = np.arange(shard.rank, shard.num_keys, shard.size, dtype=np.int64)
    flat_e = state["values"].view(torch.uint8).numpy().view(_elements(shard))
    vals = np.ascontiguousarray(flat_e[_flat_index(slots, mine)])
    shard.reset_ownership()
    shard.write(mine, vals)
    shard.barrier()
