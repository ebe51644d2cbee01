"""Checkpoints of the server state: raw bytes + JSON metadata, no pickle.

Layout of a checkpoint directory::

    meta.json            {"format": "kvps-1", "num_keys", "dtype", "rule", "num_shards", "shard_keys": [...]}
    lengths.bin          int64[num_keys], the value length of every key
    shard-<r>.keys       int64 keys owned by rank r when saved
    shard-<r>.vals       their slots (value, then optimizer state), concatenated in key order
                         (raw bytes of the dtype)

Saving follows distkit-common's atomic directory commit (``distkit_common.fsio``):
every rank writes into a temporary sibling directory it claims, the files are
fsynced, rank 0 swaps the directory into place (an existing kvps checkpoint is
replaced atomically where the filesystem can exchange directories) and a later
save removes temporary directories whose writers died. A failure on any rank
raises on every rank (``distkit_common.collective``) and keeps the previous
checkpoint. Loading reads every shard and keeps each key on its home rank, so a
checkpoint loads into any number of ranks.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from mpi4py import MPI

from distkit_common import collective, fsio
from distkit_common.dtypes import dtype_name

from ._shard import wait_polling

if TYPE_CHECKING:
    from ._shard import LocalShard

FORMAT = "kvps-1"
_NO_RULE = "add"  # the rule of checkpoints written before server-side optimizers


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


def _is_checkpoint(path: str) -> bool:
    """Whether ``path`` holds a kvps checkpoint (what a save may replace)."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def save(shard: LocalShard, path: Any) -> None:
    """Collective atomic save of a server's shards to directory ``path`` (see the module docstring)."""
    comm = shard.group
    rank = shard.rank
    target = os.fspath(path)
    shard.quiesce()
    if rank == 0:
        # a crashed earlier save may have left its temporary directory: remove it if
        # its writers provably died on this host (never a live save's, never another host's)
        try:
            fsio.clean_stale(target)
        except OSError:
            pass
    tmp = fsio.temporary_sibling(target, collective.bcast_json(secrets.token_hex(8) if rank == 0 else None, comm))
    with collective.all_ranks(comm, f"kvps save: creating {tmp}"):
        if rank == 0:
            fsio.claim(tmp, 0)  # creates tmp, never leaving it unclaimed (a kill in between would)
    keys = shard.owned_keys()
    err: BaseException | None = None
    try:
        fsio.claim(tmp, rank)
        vals = shard.read(keys)
        fsio.write_file(os.path.join(tmp, f"shard-{rank}.keys"), keys.tobytes())
        fsio.write_file(os.path.join(tmp, f"shard-{rank}.vals"), vals.view(torch.uint8).numpy().tobytes())
    except BaseException as e:  # agreed on below, then re-raised
        err = e
    try:
        collective.agree(comm, f"kvps save to {target} (previous checkpoint kept)", err)
    except BaseException:
        if rank == 0:
            fsio.discard_claimed(tmp)
        raise
    counts = collective.allgather_json(len(keys), comm)
    with collective.all_ranks(comm, f"kvps save: commit of {target} on rank 0 (previous checkpoint kept)"):
        if rank == 0:
            try:
                fsio.write_file(os.path.join(tmp, "lengths.bin"), np.ascontiguousarray(shard.lengths).tobytes())
                meta = {
                    "format": FORMAT,
                    "num_keys": shard.num_keys,
                    "dtype": dtype_name(shard.dtype),
                    "rule": shard.rule["name"],
                    "num_shards": len(counts),
                    "shard_keys": counts,
                }
                fsio.write_file(os.path.join(tmp, "meta.json"), json.dumps(meta).encode())
                os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
                fsio.commit_dir(tmp, target, replaceable=_is_checkpoint)
            except BaseException:
                fsio.discard_claimed(tmp)
                raise


def _read_checkpoint(shard: LocalShard, src: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    fsio.recover(src)  # a save killed inside the two-rename commit left the previous one beside
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
    shards = []
    for r in range(int(meta["num_shards"])):
        keys = np.fromfile(src / f"shard-{r}.keys", dtype=np.int64)
        raw = np.fromfile(src / f"shard-{r}.vals", dtype=_elements(shard))
        if keys.shape[0] != meta["shard_keys"][r] or raw.shape[0] != int(slots[keys].sum()):
            raise ValueError(f"checkpoint shard {r} in {src} is truncated or corrupt")
        shards.append((keys, raw))
    return shards


def load(shard: LocalShard, path: Any) -> None:
    """Collective load of the checkpoint in ``path`` (saved on any number of ranks)."""
    src = Path(path)
    shards: list[tuple[np.ndarray, np.ndarray]] = []
    with collective.all_ranks(shard.group, f"kvps load of {src}"):
        shards = _read_checkpoint(shard, src)
    slots = shard.slot_lengths
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
    comm, group = shard.comm, shard.group
    shard.quiesce()
    keys = shard.owned_keys()
    raw = shard.read(keys).view(torch.uint8).numpy()
    # every rank's keys and raw slot bytes to rank 0, as plain buffers (no pickle)
    nkeys = collective.allgather_json(len(keys), group)
    nbytes = collective.allgather_json(int(raw.nbytes), group)
    all_keys = np.empty(sum(nkeys), dtype=np.int64) if shard.rank == 0 else None
    all_raw = np.empty(sum(nbytes), dtype=np.uint8) if shard.rank == 0 else None
    wait_polling(comm.Igatherv(keys, [all_keys, nkeys, MPI.INT64_T] if shard.rank == 0 else None, root=0))
    wait_polling(comm.Igatherv(raw, [all_raw, nbytes, MPI.BYTE] if shard.rank == 0 else None, root=0))
    with collective.all_ranks(group, f"kvps save (distx format) to {path} on rank 0"):
        if shard.rank == 0:
            assert all_keys is not None and all_raw is not None
            slots = shard.slot_lengths
            flat = torch.empty(int(slots.sum()), dtype=shard.dtype)
            flat_e = flat.view(torch.uint8).numpy().view(_elements(shard))
            flat_e[_flat_index(slots, all_keys)] = all_raw.view(_elements(shard))
            state = {
                "format": DISTX_FORMAT,
                "num_keys": shard.num_keys,
                "dtype": dtype_name(shard.dtype),
                "rule": shard.rule["name"],
                "lengths": torch.from_numpy(np.ascontiguousarray(shard.lengths).copy()),
                "values": flat,
            }
            ckpt.save_state_dict(state, ckpt.FileSystemWriter(str(path)), no_dist=True)


def load_distx(shard: LocalShard, path: Any) -> None:
    """Collective load of a checkpoint written by :func:`save_distx` (any saved rank count)."""
    ckpt = _distx_checkpoint()
    mine = np.arange(shard.rank, shard.num_keys, shard.size, dtype=np.int64)
    vals = np.zeros(0, dtype=np.uint8)
    with collective.all_ranks(shard.group, f"kvps load (distx format) of {path}"):
        vals = _read_distx(ckpt, shard, path, mine)
    shard.reset_ownership()
    shard.write(mine, vals)
    shard.barrier()


def _read_distx(ckpt: Any, shard: LocalShard, path: Any, mine: np.ndarray) -> np.ndarray:
    """The slots of ``mine`` from a distx-format checkpoint, after checking it fits the server."""
    try:
        meta = ckpt.FileSystemReader(str(path)).read_index()
    except (OSError, ValueError) as e:
        raise OSError(f"cannot read the distx checkpoint in {path}: {e}") from e
    entries = {e.get("path", [None])[0]: e for e in meta.get("entries", []) if isinstance(e, dict)}
    if "values" not in entries or "lengths" not in entries:
        raise ValueError(f"{path} is not a kvps checkpoint in distx format (no 'values'/'lengths' entries)")
    # first the scalars, so that a checkpoint of another server is named for what differs
    head: dict[str, Any] = {"format": None, "num_keys": None, "dtype": None}
    if "rule" in entries:
        head["rule"] = None
    try:
        ckpt.load_state_dict(head, ckpt.FileSystemReader(str(path)), no_dist=True)
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path} is not a kvps checkpoint in distx format: {e}") from e
    if head["format"] != DISTX_FORMAT:
        raise ValueError(f"{path} is not a kvps checkpoint (format {head['format']!r})")
    if head["num_keys"] != shard.num_keys or head["dtype"] != dtype_name(shard.dtype):
        raise ValueError(
            f"checkpoint has {head['num_keys']} keys of {head['dtype']}, the server "
            f"{shard.num_keys} keys of {dtype_name(shard.dtype)}"
        )
    _check_rule(shard, head.get("rule", _NO_RULE), path)
    slots = shard.slot_lengths
    state: dict[str, Any] = {
        "lengths": torch.empty(shard.num_keys, dtype=torch.int64),
        "values": torch.empty(int(slots.sum()), dtype=shard.dtype),
    }
    try:
        ckpt.load_state_dict(state, ckpt.FileSystemReader(str(path)), no_dist=True)
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"the distx checkpoint in {path} does not match this server's value lengths "
            f"(num_keys={shard.num_keys}, dtype={dtype_name(shard.dtype)}, optimizer {shard.rule['name']!r}): {e}"
        ) from e
    if not np.array_equal(state["lengths"].numpy(), shard.lengths):
        raise ValueError("checkpoint value lengths differ from the server's value_lengths")
    flat_e = state["values"].view(torch.uint8).numpy().view(_elements(shard))
    return np.ascontiguousarray(flat_e[_flat_index(slots, mine)])


#: checkpoint format name -> (save, load)
_FORMATS = {"kvps": (save, load), "distx": (save_distx, load_distx)}


def _format(format: Any) -> tuple[Callable[[LocalShard, Any], None], Callable[[LocalShard, Any], None]]:
    if not isinstance(format, str) or format not in _FORMATS:
        raise ValueError(f"format must be 'kvps' or 'distx', got {format!r}")
    return _FORMATS[format]


def save_checkpoint(shard: LocalShard, path: Any, format: str) -> None:
    """Write ``shard``'s server state to ``path`` in ``format`` ("kvps" or "distx"); :meth:`kvps.Server.save`."""
    _format(format)[0](shard, path)


def load_checkpoint(shard: LocalShard, path: Any, format: str) -> None:
    """Replace ``shard``'s server state by the ``format`` checkpoint in ``path``; :meth:`kvps.Server.load`."""
    _format(format)[1](shard, path)
