"""The on-disk format: ``metadata.json`` (the index) and the keys of state-dict entries.

Layout of a checkpoint directory::

    metadata.json     format/version, world size, and for every state-dict entry either a JSON
                      value or a tensor: dtype, global shape and chunks; each chunk names its
                      file, its global box (offsets, sizes) and its pieces [file offset, bytes,
                      crc32c]
    rank<r>.bin       raw little-endian bytes of the chunks rank r wrote

Nothing is pickled and loading never executes anything from the files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from distkit_common import fsio

from .. import _distx_fake as _native

FORMAT = "distx-fake-checkpoint"
VERSION = 1
METADATA = "metadata.json"

#: a state-dict path: the keys from the root to a leaf (str, ``{"int": k}`` for int keys, list index)
PathT = tuple[Any, ...]


class CheckpointCorruptionError(ValueError):
    """A chunk's crc32c does not match its metadata (or the files are inconsistent)."""


def flatten(obj: Any, prefix: PathT = ()) -> Iterator[tuple[PathT, Any, Any, Any]]:
    """Yield ``(path, value, container, key)`` for every leaf of nested dicts/lists.

    Raises
    ------
    TypeError
        If ``obj`` is not a dict, or a key is neither str nor int.
    """
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"state dict keys must be str or int, got {k!r} at {name_of(prefix)!r}")
            pk: Any = k if isinstance(k, str) else {"int": k}
            if isinstance(v, (dict, list)) and v:
                yield from flatten(v, (*prefix, pk))
            else:
                yield (*prefix, pk), v, obj, k
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, (dict, list)) and v:
                yield from flatten(v, (*prefix, i))
            else:
                yield (*prefix, i), v, obj, i
    else:
        raise TypeError(f"state_dict must be a dict, got {type(obj).__name__}")


def key_of(path: PathT) -> str:
    """The canonical string of a path (JSON of its keys): the index's lookup key."""
    return json.dumps(list(path), separators=(",", ":"))


def name_of(path: PathT) -> str:
    """A path as users write it (``model.layers.0.weight``), for messages and exports."""
    return ".".join(str(p["int"]) if isinstance(p, dict) else str(p) for p in path) or "<root>"


def to_json(path: PathT, v: Any) -> Any:
    """A non-tensor leaf as JSON (tuples tagged, so they come back as tuples).

    Raises
    ------
    TypeError
        If the value is not None, bool, int, float, str, a tuple/list/dict of those.
    """
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (dict, list)) and not v:
        return v
    if isinstance(v, tuple):
        return {"tuple": [to_json(path, x) for x in v]}
    if isinstance(v, list):
        return [to_json(path, x) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v) and set(v) != {"tuple"}:
        return {k: to_json(path, x) for k, x in v.items()}
    raise TypeError(
        f"state dict entry {name_of(path)!r} has type {type(v).__name__}; only tensors, DTensors, "
        "LocalShard and JSON values (None, bool, int, float, str, tuples) can be saved without pickle"
    )


def from_json(v: Any) -> Any:
    """Inverse of :func:`to_json`."""
    if isinstance(v, dict):
        if set(v) == {"tuple"}:
            return tuple(from_json(x) for x in v["tuple"])
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def read_index(path: str) -> dict[str, Any]:
    """Parse and validate ``<path>/metadata.json`` (plain JSON, never pickle).

    Raises
    ------
    FileNotFoundError
        If there is no checkpoint at the path.
    CheckpointCorruptionError
        If the metadata is not a valid distx-fake checkpoint description.
    """
    mpath = os.path.join(path, METADATA)
    fsio.recover(path)  # a save killed inside the two-rename commit left the previous one beside
    if not os.path.exists(mpath):
        raise FileNotFoundError(f"no checkpoint at {path!r} (missing {METADATA})")
    try:
        with open(mpath, encoding="utf-8") as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointCorruptionError(f"{mpath}: metadata is not valid JSON: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointCorruptionError(f"{mpath}: not a {FORMAT} metadata file")
    if meta.get("version") != VERSION:
        raise CheckpointCorruptionError(f"{mpath}: unsupported version {meta.get('version')!r}")
    if not isinstance(meta.get("entries"), list):
        raise CheckpointCorruptionError(f"{mpath}: no entry list")
    return meta


def build_index(
    chunk_lists: list[list[dict[str, Any]]],
    values: dict[str, Any],
    world: int,
    piece_bytes: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The index of a checkpoint from every rank's written chunks and the JSON values.

    Raises
    ------
    ValueError
        If ranks disagree on the dtype or global shape of a tensor.
    """
    entries: dict[str, dict[str, Any]] = {}
    for chunks in chunk_lists:
        for c in chunks:
            k = key_of(tuple(c["path"]))
            e = entries.setdefault(
                k, {"path": c["path"], "kind": "tensor", "dtype": c["dtype"], "shape": c["global_shape"], "chunks": []}
            )
            if e["dtype"] != c["dtype"] or e["shape"] != c["global_shape"]:
                raise ValueError(f"ranks disagree on dtype/shape of {name_of(tuple(c['path']))!r}")
            e["chunks"].append({"file": c["file"], "offsets": c["offsets"], "sizes": c["sizes"], "pieces": c["pieces"]})
    for k, v in values.items():
        entries[k] = {"path": v["path"], "kind": "value", "value": v["value"]}
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "world_size": world,
        "piece_bytes": piece_bytes,
        "checksum": "crc32c",
        "entries": [entries[k] for k in sorted(entries)],
    }
    if extra:
        meta.update(extra)
    return meta


def write_index(folder: str, meta: dict[str, Any], sync: bool) -> None:
    """Write ``metadata.json`` into ``folder`` (fsynced when ``sync``)."""
    with open(os.path.join(folder, METADATA), "w", encoding="utf-8") as f:
        json.dump(meta, f, separators=(",", ":"))
        f.flush()
        if sync:
            _native.fsync_fd(f.fileno())


def replaceable(path: str) -> bool:
    """Only a checkpoint (or an empty folder) is ever replaced by a save.

    Raises
    ------
    FileExistsError
        For anything else at ``path``.
    """
    if os.path.isdir(path) and (
        os.path.exists(os.path.join(path, METADATA))
        or all(n.startswith(fsio.MARKER_PREFIX) for n in os.listdir(path))  # empty, or left by a killed save
    ):
        return True
    raise FileExistsError(f"{path!r} exists and is not a distx-fake checkpoint; refusing to replace it")
