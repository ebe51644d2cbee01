"""``torch.distributed.checkpoint`` storage on distkit's format: DCP plans, distkit bytes.

:class:`~distx_fake.checkpoint.FileSystemWriter` / ``FileSystemReader`` implement DCP's
``StorageWriter`` / ``StorageReader`` with the methods below, so ``dcp.save`` / ``dcp.load`` /
``dcp.async_save`` keep their planner (resharding, dedup of replicated tensors, ``Stateful``
objects) while the folder is distkit's: ``metadata.json`` (DCP's ``Metadata`` as JSON next to
the distkit index), ``rank<r>.bin`` written by the zero-copy engine with a crc32c per piece,
an atomic commit, nothing pickled. Non-tensor values are stored as JSON (tuples kept).

Save: the coordinator picks the temporary folder in ``prepare_global_plan`` and hands each
rank its file through ``SavePlan.storage_data``; ``write_data`` writes the rank's chunks;
``finish`` writes the index and commits. Load: ``read_metadata`` rebuilds DCP's ``Metadata``
(also for checkpoints written by :func:`save_state_dict`, keyed by dotted names), and
``read_data`` reads only the pieces each ``ReadItem`` needs, verified.
"""

from __future__ import annotations

import dataclasses
import io
import os
import secrets
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from distkit_common import dtypes as dk_dtypes
from distkit_common import fsio

from ._boxes import check_has_data
from ._engine import BATCH_BYTES, DataFiles, direct_read_tuples, read_box, verify, write_chunks
from ._metadata import build_index, from_json, key_of, name_of, read_index, replaceable, to_json, write_index

#: the key of DCP's metadata inside ``metadata.json``
DCP_KEY = "dcp"


@dataclasses.dataclass(frozen=True)
class _RankFile:
    """What the coordinator tells each rank (``SavePlan.storage_data``): folder token and file."""

    token: str
    file: str


def _done(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


# --- DCP Metadata <-> JSON -------------------------------------------------------------------
def metadata_to_json(md: Metadata) -> dict[str, Any]:
    """DCP's ``Metadata`` (less ``storage_data``, which the distkit index holds) as JSON.

    Raises
    ------
    TypeError
        If a field holds something JSON cannot carry (e.g. a custom planner's objects).
    """
    sdm: dict[str, Any] = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            sdm[fqn] = {
                "kind": "tensor",
                "dtype": dk_dtypes.dtype_name(m.properties.dtype),
                "size": list(m.size),
                "chunks": [[list(c.offsets), list(c.sizes)] for c in m.chunks],
            }
        elif isinstance(m, BytesStorageMetadata):
            sdm[fqn] = {"kind": "bytes"}
        else:
            raise TypeError(f"DCP metadata of {fqn!r} has type {type(m).__name__}, which cannot be stored as JSON")
    sm = md.storage_meta
    return {
        "state_dict_metadata": sdm,
        "planner_data": to_json(("DCP planner_data",), md.planner_data),
        "storage_meta": None
        if sm is None
        else {
            "checkpoint_id": None if sm.checkpoint_id is None else os.fspath(sm.checkpoint_id),
            "save_id": sm.save_id,
            "modules": list(sm.modules),
        },
        "version": md.version,
    }


def metadata_from_index(index: dict[str, Any]) -> tuple[Metadata, dict[MetadataIndex, dict[str, Any]]]:
    """DCP ``Metadata`` of a checkpoint and, per saved chunk, where it lies.

    A checkpoint written by :func:`save_state_dict` has no DCP section: its entries are named
    by their dotted paths (``model.layer.weight``), as DCP's flattening names them.
    """
    where: dict[MetadataIndex, dict[str, Any]] = {}
    by_fqn: dict[str, dict[str, Any]] = {}
    for e in index["entries"]:
        fqn = _fqn_of(e)
        by_fqn[fqn] = e
        if e["kind"] == "tensor":
            for c in e["chunks"]:
                where[MetadataIndex(fqn, c["offsets"])] = c
    dcp = index.get(DCP_KEY)
    if dcp is None:
        sdm: dict[str, Any] = {}
        for fqn, e in by_fqn.items():
            sdm[fqn] = (
                _tensor_md(e["dtype"], e["shape"], [[c["offsets"], c["sizes"]] for c in e["chunks"]])
                if (e["kind"] == "tensor")
                else BytesStorageMetadata()
            )
        return Metadata(state_dict_metadata=sdm, storage_meta=StorageMeta()), where
    sdm = {
        fqn: _tensor_md(m["dtype"], m["size"], m["chunks"]) if m["kind"] == "tensor" else BytesStorageMetadata()
        for fqn, m in dcp["state_dict_metadata"].items()
    }
    sm = dcp.get("storage_meta")
    md = Metadata(
        state_dict_metadata=sdm,
        planner_data=from_json(dcp.get("planner_data")),
        storage_meta=StorageMeta(sm.get("checkpoint_id"), sm.get("save_id"), None, list(sm.get("modules", [])))
        if sm
        else StorageMeta(),
        version=dcp.get("version"),
    )
    return md, where


def _tensor_md(dtype: str, size: list[int], chunks: list[list[list[int]]]) -> TensorStorageMetadata:
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=dk_dtypes.torch_dtype(dtype)),
        size=torch.Size(size),
        chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in chunks],
    )


def _fqn_of(entry: dict[str, Any]) -> str:
    fqn = entry.get("fqn")
    return fqn if isinstance(fqn, str) else name_of(tuple(entry["path"]))


# --- the StorageWriter half --------------------------------------------------------------------
class DcpWriterMixin:
    """DCP ``StorageWriter`` methods of :class:`~distx_fake.checkpoint.FileSystemWriter`."""

    path: str
    piece_bytes: int
    sync: bool
    direct: bool

    def _dcp_state(self) -> dict[str, Any]:
        st: dict[str, Any] | None = self.__dict__.get("_dcp")
        if st is None:
            st = self.__dict__["_dcp"] = {"save_id": secrets.token_hex(8), "rank": 0, "tmp": None}
        return st

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save (DCP): ``checkpoint_id``, when given, is the checkpoint folder."""
        if checkpoint_id:
            self.path = os.path.abspath(os.fspath(checkpoint_id))
        self.__dict__["_dcp"] = None
        self._dcp_state()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Called by DCP on every rank before planning.

        Raises
        ------
        ValueError
            With ``use_collectives=False``: the atomic commit needs the ranks to agree.
        """
        if kwargs.get("use_collectives", True) is False:
            raise ValueError(
                "distx_fake's FileSystemWriter commits a checkpoint atomically once every rank has "
                "written, which needs rank coordination: use_collectives=False is not supported"
            )
        st = self._dcp_state()
        st["coordinator"] = bool(is_coordinator)
        st["rank"] = kwargs.get("rank", 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator: make the temporary folder and give every rank its file."""
        try:
            fsio.clean_stale(self.path)
        except OSError:
            pass  # cleanup is best effort; the save itself must not fail for it
        token = secrets.token_hex(8)
        tmp = fsio.temporary_sibling(self.path, token)
        fsio.claim(tmp, 0)  # creates tmp, never leaving it unclaimed (a kill in between would)
        return [dataclasses.replace(p, storage_data=_RankFile(token, f"rank{i}.bin")) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items into its file (tensors) or the results (JSON values).

        Raises
        ------
        TypeError
            For a value JSON cannot hold, or a planner that cannot give back the original
            object of a non-tensor item (``lookup_object``).
        """
        info: _RankFile = plan.storage_data
        st = self._dcp_state()
        tmp = fsio.temporary_sibling(self.path, info.token)
        st["tmp"] = tmp
        try:
            fsio.claim(tmp, st["rank"])
            results: list[WriteResult] = []
            tensors: list[Any] = []
            for item in plan.items:
                fqn = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    lookup = getattr(planner, "lookup_object", None)
                    if lookup is None:
                        raise TypeError(
                            f"{type(planner).__name__} has no lookup_object: distx_fake stores non-tensor "
                            f"values such as {fqn!r} as JSON and needs the original object"
                        )
                    value = to_json((fqn,), lookup(item.index))
                    results.append(WriteResult(item.index, 0, {"value": value}))
                    continue
                td = item.tensor_data
                assert td is not None
                t = planner.resolve_data(item)
                assert isinstance(t, torch.Tensor)
                check_has_data((fqn,), t)
                dk_dtypes.code_of(t.dtype)
                tensors.append((item, t, tuple(td.size), tuple(td.chunk.offsets)))
            chunks = write_chunks(
                os.path.join(tmp, info.file),
                (((it.index.fqn,), t, size, off) for it, t, size, off in tensors),
                piece_bytes=self.piece_bytes,
                direct=self.direct,
                sync=self.sync,
            )
            for (item, t, _, _), chunk in zip(tensors, chunks):
                results.append(WriteResult(item.index, t.numel() * t.element_size(), chunk))
        except BaseException:
            # the save fails on every rank (DCP raises everywhere and never calls finish):
            # nothing of this attempt may stay behind
            fsio.discard_claimed(tmp)
            raise
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator: write the index (distkit entries + DCP's metadata as JSON) and commit."""
        tmp = self._dcp_state().get("tmp")
        if tmp is None:
            raise RuntimeError("finish called before write_data")
        try:
            metadata.storage_meta = self.storage_meta()
            mappings = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
            chunk_lists: list[list[dict[str, Any]]] = []
            values: dict[str, Any] = {}
            for rank_results in results:
                chunks = []
                for wr in rank_results:
                    path = _path_of(wr.index.fqn, mappings)
                    data = wr.storage_data
                    if "value" in data:
                        values[key_of(path)] = {"path": list(path), "value": data["value"]}
                    else:
                        chunks.append({**data, "path": list(path)})
                chunk_lists.append(chunks)
            index = build_index(
                chunk_lists, values, len(results), self.piece_bytes, {DCP_KEY: metadata_to_json(metadata)}
            )
            fqns = {key_of(_path_of(f, mappings)): f for f in metadata.state_dict_metadata}
            for e in index["entries"]:
                e["fqn"] = fqns.get(key_of(tuple(e["path"])), name_of(tuple(e["path"])))
            write_index(tmp, index, self.sync)
            fsio.commit_dir(tmp, self.path, sync=self.sync, replaceable=replaceable)
        except BaseException:
            fsio.discard_claimed(tmp)
            raise

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self._dcp_state()["save_id"])

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _path_of(fqn: str, mappings: dict[str, Any]) -> tuple[Any, ...]:
    """The nested path of a flattened DCP key (from the planner's mappings), else the key."""
    p = mappings.get(fqn)
    if isinstance(p, tuple) and p and all(isinstance(x, (str, int)) for x in p):
        return p
    return (fqn,)


# --- the StorageReader half --------------------------------------------------------------------
class DcpReaderMixin:
    """DCP ``StorageReader`` methods of :class:`~distx_fake.checkpoint.FileSystemReader`."""

    path: str
    direct: bool

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load (DCP): ``checkpoint_id``, when given, is the checkpoint folder."""
        if checkpoint_id:
            self.path = os.path.abspath(os.fspath(checkpoint_id))
        self.__dict__["_where"] = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's ``Metadata`` of the checkpoint, rebuilt from ``metadata.json`` (never unpickled).

        Raises
        ------
        FileNotFoundError
            If there is no checkpoint at the path.
        CheckpointCorruptionError
            If the metadata is not a valid distx-fake checkpoint description.
        """
        index = read_index(self.path)
        md, where = metadata_from_index(index)
        md.storage_meta = md.storage_meta or StorageMeta()
        md.storage_meta.load_id = secrets.token_hex(8)
        self.__dict__["_index"] = index
        self.__dict__["_where"] = where
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.__dict__.get("_where") is None:
            self.read_metadata()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read every item of the plan: only the pieces it needs, each crc32c verified.

        Raises
        ------
        CheckpointCorruptionError
            If a checksum does not match (naming the tensor).
        KeyError
            If the plan asks for something the checkpoint does not hold.
        """
        where: dict[MetadataIndex, dict[str, Any]] = self.__dict__["_where"]
        values = {_fqn_of(e): e for e in self.__dict__["_index"]["entries"] if e["kind"] == "value"}
        entries = {_fqn_of(e): e for e in self.__dict__["_index"]["entries"] if e["kind"] == "tensor"}
        pending: list[tuple[Any, torch.Tensor, str, dict[str, Any], list[list[Any]], list[tuple[int, int, int]]]] = []
        pending_bytes = 0

        def flush() -> None:
            nonlocal pending, pending_bytes
            by_file: dict[str, list[int]] = {}
            for i, p in enumerate(pending):
                by_file.setdefault(p[3]["file"], []).append(i)
            for fname, idx in by_file.items():
                crcs = files.read(fname, [t for i in idx for t in pending[i][5]])
                at = 0
                for i in idx:
                    req, dest, name, chunk, pieces, tl = pending[i]
                    verify(name, chunk, pieces, crcs[at : at + len(tl)])
                    at += len(tl)
                    planner.commit_tensor(req, dest)
            pending, pending_bytes = [], 0

        with DataFiles(self.path, self.direct) as files:
            for req in plan.items:
                fqn = req.storage_index.fqn
                if req.type == LoadItemType.BYTE_IO:
                    if fqn not in values:
                        raise KeyError(f"{fqn!r} is not a value in the checkpoint at {self.path!r}")
                    buf = io.BytesIO()
                    # the planner's interface takes torch.save bytes: made here, in memory, from JSON
                    torch.save(from_json(values[fqn]["value"]), buf)
                    buf.seek(0)
                    planner.load_bytes(req, buf)
                    continue
                chunk = where.get(req.storage_index)
                if chunk is None:
                    chunk = _find_chunk(where, req.storage_index)
                dest = planner.resolve_tensor(req).detach()
                sizes = list(req.lengths)
                whole = all(o == 0 for o in req.storage_offsets) and sizes == list(chunk["sizes"])
                if whole:
                    got = direct_read_tuples(fqn, chunk, dest)
                    if got is not None:
                        pending.append((req, dest, fqn, chunk, *got))
                        pending_bytes += dest.numel() * dest.element_size()
                        if pending_bytes >= BATCH_BYTES:
                            flush()
                        continue
                inter = [(c + o, c + o + n) for c, o, n in zip(chunk["offsets"], req.storage_offsets, req.lengths)]
                src = read_box(files, fqn, entries[fqn]["dtype"], chunk, inter)
                if tuple(dest.shape) != tuple(src.shape):
                    raise ValueError(
                        f"{fqn!r}: destination of shape {tuple(dest.shape)} for a box of {tuple(src.shape)}"
                    )
                dest.copy_(src)
                planner.commit_tensor(req, dest)
            flush()
        return _done(None)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and os.path.isfile(
            os.path.join(os.fspath(checkpoint_id), "metadata.json")
        )


def _find_chunk(where: dict[MetadataIndex, dict[str, Any]], idx: MetadataIndex) -> dict[str, Any]:
    for k, c in where.items():
        if k.fqn == idx.fqn and (idx.offset is None or list(k.offset or ()) == list(idx.offset)):
            return c
    raise KeyError(f"no saved chunk of {idx.fqn!r} at offsets {None if idx.offset is None else list(idx.offset)}")
