"""Graphs on disk: WholeGraph's raw CSR file lists, and whole graphs saved with their attributes.

``save`` writes each array with :func:`store_to_files` under its own prefix
(``row_ptr``, ``col_idx``, ``edge_<name>``, ``node_<name>``) plus ``graph.json``
(counts, dtypes, row shapes). Nothing read back is unpickled: the JSON is checked field
by field, the arrays are raw rows, and the CSR content is checked before use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ._comm import WholeMemoryCommunicator
from ._graph_collective import agree, run_agreed
from ._graph_tensors import (
    create_array,
    create_from_file,
    element_count,
    is_wholemem,
    load_files,
    store_files,
)
from ._layout import SUPPORTED_DTYPES
from ._tensor import WmTensorType

_FORMAT, _VERSION = "wholemem-graph", 1
_DTYPES = {str(d).removeprefix("torch."): d for d in SUPPORTED_DTYPES}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_wholegraph_files(
    comm: WholeMemoryCommunicator,
    row_ptr_file: Any,
    col_file: Any,
    col_dtype: torch.dtype,
    tensor_type: WmTensorType,
    weight_file: Any,
    weight_dtype: torch.dtype,
) -> list[Any]:
    """Collective: WholeGraph's raw row pointer / column (/ weight) file lists, as arrays.

    Returns ``[row_ptr, col]`` or ``[row_ptr, col, weight]`` (``weight_file`` given); the
    caller checks the CSR content when it builds the graph.
    """
    if col_dtype not in (torch.int32, torch.int64):
        raise TypeError(f"col_dtype must be torch.int32 or torch.int64, got {col_dtype!r}")
    if weight_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"weight_dtype must be torch.float32 or torch.float64, got {weight_dtype!r}")
    step = "GraphStructure.from_files"
    files = [(row_ptr_file, torch.int64), (col_file, col_dtype)]
    if weight_file is not None:
        files.append((weight_file, weight_dtype))
    # sizes first (local, agreed), so that no rank enters a collective another one left
    counts = run_agreed(comm, step, lambda: [element_count(f, dt) for f, dt in files])
    return [create_from_file(comm, f, dt, tensor_type, n) for (f, dt), n in zip(files, counts)]


def _describe(t: Any) -> dict[str, Any]:
    return {"dtype": _dtype_name(t.dtype), "shape": [int(s) for s in t.shape]}


def save_graph(
    comm: WholeMemoryCommunicator | None,
    arrays: dict[str, Any],
    node_count: int,
    edge_count: int,
    directory: str | os.PathLike[str],
    num_parts: int | None,
) -> None:
    """Collective: a graph's ``arrays`` (wholemem tensors named ``row_ptr``, ``col_idx``,
    ``edge_<name>``, ``node_<name>``) plus ``graph.json``; ``comm`` is None only for a private
    graph (plain tensors), which raises ``TypeError``."""
    for name, t in arrays.items():
        if not is_wholemem(t):
            raise TypeError(f"GraphStructure.save: {name} is a plain tensor; save stores wholemem graphs only")
    assert comm is not None
    d = Path(directory)
    for prefix, t in arrays.items():
        store_files(t, d, num_parts, prefix)
    meta = {
        "format": _FORMAT,
        "version": _VERSION,
        "node_count": node_count,
        "edge_count": edge_count,
        "arrays": {k: _describe(v) for k, v in arrays.items()},
    }
    err: Exception | None = None
    if comm.rank == 0:
        try:
            tmp = d / f"graph.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, d / "graph.json")
        except OSError as e:
            err = e
    agree(comm, "GraphStructure.save", err)


def _read_meta(directory: Path) -> dict[str, Any]:
    path = directory / "graph.json"
    if not path.is_file():
        raise FileNotFoundError(f"GraphStructure.load: {path} not found")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"GraphStructure.load: {path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
        raise ValueError(f"GraphStructure.load: {path} is not a {_FORMAT} v{_VERSION} description")
    arrays = meta.get("arrays")
    if not isinstance(arrays, dict) or "row_ptr" not in arrays or "col_idx" not in arrays:
        raise ValueError(f"GraphStructure.load: {path} lists no row_ptr / col_idx arrays")
    for name, a in arrays.items():
        ok = (
            isinstance(name, str)
            and isinstance(a, dict)
            and a.get("dtype") in _DTYPES
            and isinstance(a.get("shape"), list)
            and len(a["shape"]) >= 1
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in a["shape"])
        )
        if not ok or not (name in ("row_ptr", "col_idx") or name.startswith(("edge_", "node_"))):
            raise ValueError(f"GraphStructure.load: {path}: bad entry for array {name!r}: {a!r}")
    return meta


def _check_parts(d: Path, name: str, shape: list[int], dtype: torch.dtype) -> None:
    """The files of array ``name`` exist, describe ``shape`` / ``dtype`` and hold its bytes."""
    path = d / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"GraphStructure.load: {path} not found")
    try:
        meta = json.loads(path.read_text())
        parts = [(d / str(p["file"]), int(p["rows"])) for p in meta["parts"]]
        ok = meta["shape"] == shape and meta["dtype"] == _dtype_name(dtype)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"GraphStructure.load: {path} is malformed: {e!r}") from None
    if not ok:
        raise ValueError(f"GraphStructure.load: {path} describes {meta['shape']} {meta['dtype']}, graph.json {shape}")
    row_bytes = torch.empty(shape[1:], dtype=dtype).numel() * torch.empty((), dtype=dtype).element_size()
    if sum(r for _, r in parts) != shape[0]:
        raise ValueError(
            f"GraphStructure.load: the parts of {name} hold {sum(r for _, r in parts)} rows, not {shape[0]}"
        )
    for f, rows in parts:
        if f.parent != d or not f.is_file():
            raise FileNotFoundError(f"GraphStructure.load: part file {f} not found in {d}")
        if f.stat().st_size != rows * row_bytes:
            raise ValueError(f"GraphStructure.load: {f} has {f.stat().st_size} bytes, expected {rows * row_bytes}")


def _read_all_meta(d: Path) -> dict[str, Any]:
    meta = _read_meta(d)
    for name, a in meta["arrays"].items():
        _check_parts(d, name, a["shape"], _DTYPES[a["dtype"]])
    return meta


def load_graph(comm: WholeMemoryCommunicator, directory: Any, tensor_type: WmTensorType) -> dict[str, Any]:
    """Collective: the arrays of the graph saved under ``directory`` (named as
    :func:`save_graph` names them), in tensors of ``tensor_type``; every file is checked."""
    d = Path(directory)
    # every file is checked (locally, agreed) before any rank enters a collective load
    meta = run_agreed(comm, "GraphStructure.load", _read_all_meta, d)
    arrays: dict[str, Any] = {}
    for name, a in meta["arrays"].items():
        t = create_array(comm, a["shape"], _DTYPES[a["dtype"]], tensor_type)
        load_files(t, d, name)
        arrays[name] = t
    return arrays
