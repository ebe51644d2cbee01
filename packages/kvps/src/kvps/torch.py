"""Torch modules on the parameter server.

* :class:`PSEmbeddingBag` / :class:`PSEmbeddingBagCollection`: pooled bags
  (``torch.nn.EmbeddingBag`` / TorchRec's ``EmbeddingBagCollection``) trained
  by the server's optimizer (:mod:`kvps.optim`); on a server without one
  they serve lookups (forward) only;
* :class:`PSEmbedding`: per-id lookups with Adagrad computed by the worker
  (rows and accumulators are pulled, deltas pushed to a server without
  optimizer, which adds them).
"""

from __future__ import annotations

from ._bag_collection import EmbeddingBagConfig, PSEmbeddingBagCollection, table_lengths
from ._bags import PSEmbeddingBag
from ._embedding import PSEmbedding

__all__ = ["EmbeddingBagConfig", "PSEmbedding", "PSEmbeddingBag", "PSEmbeddingBagCollection", "table_lengths"]
