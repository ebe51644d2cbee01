"""The one place wholemem imports PyTorch Geometric (the optional extra ``wholemem[pyg]``)."""

from __future__ import annotations

import warnings

try:
    with warnings.catch_warnings():
        # torch_geometric's import scripts TorchScript classes, which torch 2.13 deprecates;
        # the notice is PyG's to act on, not the caller's
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit.*")
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        import torch_geometric
        from torch_geometric.data import Data, EdgeAttr, FeatureStore, GraphStore, TensorAttr
        from torch_geometric.data.graph_store import EdgeLayout
except ImportError as e:  # pragma: no cover - the extra is installed wherever the tests run
    raise ImportError(
        "wholemem.pyg needs PyTorch Geometric: pip install 'wholemem[pyg]' (torch-geometric, pure Python)"
    ) from e

__all__ = ["Data", "EdgeAttr", "EdgeLayout", "FeatureStore", "GraphStore", "TensorAttr", "torch_geometric"]
