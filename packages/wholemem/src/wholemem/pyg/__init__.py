"""PyTorch Geometric on wholemem: feature and graph stores, and a neighbour loader.

Needs the optional extra ``wholemem[pyg]`` (``torch-geometric``, pure Python; no compiled
PyG extension is used). Nothing else of wholemem imports this package.
"""

from __future__ import annotations

from ._feature_store import WholeFeatureStore
from ._graph_store import WholeGraphStore
from ._loader import NeighborLoader, SampledSubgraph, sample_subgraph

__all__ = ["NeighborLoader", "SampledSubgraph", "WholeFeatureStore", "WholeGraphStore", "sample_subgraph"]
