"""``WholeFeatureStore``: a PyG ``FeatureStore`` over wholemem tensors and ``Embedding``s."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import Embedding, WholeMemoryCommunicator, WmTensorType
from .._graph_collective import agree, allgather_int, allgather_json
from .._graph_tensors import create_array, is_array, is_collective, is_wholemem, read_rows, scatter_rows
from ._pyg import FeatureStore, TensorAttr

#: what the store keeps per (group_name, attr_name)
Feature = Any


def as_index(index: Any, rows: int, what: str) -> torch.Tensor:
    """A PyG index (tensor, ndarray, int or slice) as an int64 tensor of valid rows."""
    if isinstance(index, slice):
        return torch.arange(rows, dtype=torch.int64)[index]
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        index = torch.tensor([int(index)])
    if isinstance(index, np.ndarray):
        index = torch.from_numpy(index)
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"{what}: index must be a tensor, ndarray, int or slice, got {type(index).__name__}")
    if index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{what}: index must have dtype int32 or int64, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"{what}: index must be 1-D, got shape {tuple(index.shape)}")
    idx = index.to(torch.int64)
    if idx.numel():
        lo, hi = (int(v) for v in torch.aminmax(idx))
        if lo < 0 or hi >= rows:
            pos = int(torch.nonzero((idx < 0) | (idx >= rows))[0, 0])
            raise IndexError(f"{what}: index[{pos}] = {int(idx[pos])} is out of range [0, {rows})")
    return idx


def feature_rows(f: Feature) -> int:
    """Number of rows of a stored feature."""
    return int(f.num_embeddings) if isinstance(f, Embedding) else int(f.shape[0])


def fetch_rows(f: Feature, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` of a feature: an Embedding's lookup (differentiable), a gather, or indexing.
    Collective for NCCL tensors and NCCL-backed Embeddings."""
    if isinstance(f, Embedding):
        out: torch.Tensor = f(idx)
        return out
    return read_rows(f, idx)


def is_collective_feature(f: Feature) -> bool:
    """Whether reading ``f`` is a collective (or must run on the training thread)."""
    if isinstance(f, Embedding):
        return True  # lookups record gradients for the optimizer step: the training thread's job
    return is_collective(f)


class WholeFeatureStore(FeatureStore):
    """A PyG :class:`~torch_geometric.data.FeatureStore` whose tensors are wholemem tensors.

    Every rank sees the whole feature table; rows are read with :func:`wholemem.gather`
    (from shared memory for HOST / CHUNKED tensors, by all-to-all for NCCL tensors)
    and, for an :class:`wholemem.Embedding`, by its differentiable lookup, so a PyG model
    trains a node embedding through the store (``Embedding.step()`` applies the update).

    ``put_tensor`` takes:

    - a wholemem tensor (HOST / CHUNKED / NCCL / DEVICE) or an ``Embedding``, stored by
      reference (no copy; later writes are seen);
    - a plain tensor / ndarray: with a communicator, **collective**, each rank passing
      its own part (rows are concatenated in rank order, as cugraph-pyg's store) into a
      new wholemem tensor of ``tensor_type``; without one, kept as a private tensor.
      With ``index`` (an existing attribute), the rows ``index`` are overwritten.

    ``get_tensor(..., index=idx)`` returns the rows ``idx`` as a torch tensor (collective
    for NCCL tensors); without an index, the stored object itself.

    Parameters
    ----------
    comm : WholeMemoryCommunicator, optional
        Where tensors put as plain tensors are created.
    tensor_type : WmTensorType, default HOST
        The type of those tensors.
    """

    def __init__(
        self, comm: WholeMemoryCommunicator | None = None, *, tensor_type: WmTensorType = WmTensorType.HOST
    ) -> None:
        super().__init__()
        if comm is not None and not isinstance(comm, WholeMemoryCommunicator):
            raise TypeError(f"comm must be a wholemem.WholeMemoryCommunicator or None, got {type(comm).__name__}")
        if not isinstance(tensor_type, WmTensorType):
            raise TypeError(f"tensor_type must be a wholemem.WmTensorType, got {tensor_type!r}")
        self.comm = comm
        self.tensor_type = tensor_type
        self._features: dict[tuple[Any, str], Feature] = {}

    def __repr__(self) -> str:
        return f"WholeFeatureStore({sorted((str(g), a) for g, a in self._features)})"

    @staticmethod
    def _key(attr: TensorAttr) -> tuple[Any, str]:
        return (attr.group_name, attr.attr_name)

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        key = self._key(attr)
        index = attr.index if attr.is_set("index") else None
        if isinstance(tensor, Embedding) or is_wholemem(tensor):
            if index is not None:
                raise ValueError(f"put_tensor {key}: a wholemem tensor or Embedding is stored whole, without an index")
            self._features[key] = tensor
            return True
        if isinstance(tensor, np.ndarray):
            tensor = torch.from_numpy(tensor)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"put_tensor {key}: expected a tensor, ndarray, wholemem tensor or Embedding")
        if index is not None:
            if key not in self._features:
                raise KeyError(f"put_tensor {key}: rows can be written into an existing attribute only")
            target = self._features[key]
            if isinstance(target, Embedding):
                raise TypeError(f"put_tensor {key}: write an Embedding's rows through its optimizer or load()")
            idx = as_index(index, feature_rows(target), f"put_tensor {key}")
            scatter_rows(target, idx, tensor.to(target.dtype).reshape(idx.numel(), *target.shape[1:]))
            return True
        self._features[key] = self._share(tensor, key)
        return True

    def _share(self, local: torch.Tensor, key: tuple[Any, str]) -> Feature:
        """Collective: the ranks' parts concatenated into one new wholemem tensor."""
        comm = self.comm
        if comm is None:
            return local
        err: Exception | None = None
        desc = {"dtype": str(local.dtype), "row_shape": list(local.shape[1:]), "dim": local.dim()}
        if local.dim() < 1:
            err = ValueError(f"put_tensor {key}: a feature needs a row dimension, got a scalar")
        agree(comm, "WholeFeatureStore.put_tensor", err)
        descs = allgather_json(comm, desc)
        if any(d != desc for d in descs):
            raise ValueError(f"put_tensor {key}: ranks disagree on dtype / row shape: {descs}")
        counts = allgather_int(comm, int(local.shape[0]))
        first, total = sum(counts[: comm.rank]), sum(counts)
        t = create_array(comm, [total, *local.shape[1:]], local.dtype, self.tensor_type)
        scatter_rows(t, torch.arange(first, first + local.shape[0], dtype=torch.int64), local.contiguous())
        comm.barrier()
        return t

    def _get_tensor(self, attr: TensorAttr) -> Any:
        key = self._key(attr)
        if key not in self._features:
            return None
        f = self._features[key]
        index = attr.index if attr.is_set("index") else None
        if index is None:
            return f
        return fetch_rows(f, as_index(index, feature_rows(f), f"get_tensor {key}"))

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._features.pop(self._key(attr), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        f = self._features.get(self._key(attr))
        if f is None:
            return None
        if isinstance(f, Embedding):
            return (int(f.num_embeddings), int(f.embedding_dim))
        return tuple(int(s) for s in f.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """List every stored feature (PyG's ``FeatureStore`` hook).

        Returns
        -------
        list of TensorAttr
            One per (group, name).
        """
        return [TensorAttr(group_name=g, attr_name=a) for g, a in self._features]

    def features(self, group_name: Any = None) -> dict[str, Feature]:
        """Return the stored features of one group, by name.

        Parameters
        ----------
        group_name : optional
            The group (PyG's ``None`` for homogeneous graphs).

        Returns
        -------
        dict of str to feature
            Name -> wholemem tensor, torch tensor or ``wholemem.Embedding``.
        """
        return {a: f for (g, a), f in self._features.items() if g == group_name}


def check_feature(f: Any, name: str) -> None:
    """A feature source the loader can read: a tensor, a wholemem tensor or an Embedding."""
    if not (isinstance(f, Embedding) or is_array(f)):
        raise TypeError(f"feature {name!r} must be a tensor, a wholemem tensor or a wholemem.Embedding")
