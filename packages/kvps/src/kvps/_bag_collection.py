"""``PSEmbeddingBagCollection``: several pooled tables on one server (TorchRec's ``EmbeddingBagCollection``).

Every table is a :class:`EmbeddingBagConfig`; one lookup pulls the distinct
rows of every feature of the batch at once and pools each feature as
:class:`kvps.torch.PSEmbeddingBag` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from distkit_common.validate import as_index_tensor, check_int

from ._bag_checks import check_bags, check_mode, check_padding, check_table, check_weights, initialize_table
from ._bag_lookup import Lookup, guard, local_padding, pool
from ._prefetch import default_ids, prefetch
from ._worker import Worker


@dataclass(frozen=True)
class EmbeddingBagConfig:
    """One table of a :class:`PSEmbeddingBagCollection` (TorchRec's ``EmbeddingBagConfig``).

    Parameters
    ----------
    name : str
        Table name.
    num_embeddings, embedding_dim : int
        Table shape.
    feature_names : sequence of str
        The features looked up in this table (default: ``[name]``).
    mode : {"sum", "mean", "max"}
        Pooling (TorchRec's default: sum).
    padding_idx : int, optional
        As :class:`PSEmbeddingBag`.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: Sequence[str] = field(default_factory=tuple)
    mode: str = "sum"
    padding_idx: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str, got {self.name!r}")
        object.__setattr__(self, "num_embeddings", check_int(self.num_embeddings, "num_embeddings", lo=1))
        object.__setattr__(self, "embedding_dim", check_int(self.embedding_dim, "embedding_dim", lo=1))
        names = tuple(self.feature_names) or (self.name,)
        if not all(isinstance(f, str) and f for f in names):
            raise TypeError(f"feature_names must be non-empty strings, got {self.feature_names!r}")
        object.__setattr__(self, "feature_names", names)
        object.__setattr__(self, "mode", check_mode(self.mode))
        object.__setattr__(self, "padding_idx", check_padding(self.padding_idx, self.num_embeddings))


def table_lengths(tables: Sequence[EmbeddingBagConfig]) -> np.ndarray:
    """Compute the ``value_lengths`` of a server holding ``tables`` one after another (from key 0).

    ``kvps.setup(len(lengths), ...)`` and ``kvps.Server(lengths, optimizer=...)``
    then fit a :class:`PSEmbeddingBagCollection` over the same tables.

    Parameters
    ----------
    tables : sequence of EmbeddingBagConfig
        The tables, in key order.

    Returns
    -------
    numpy.ndarray
        One int64 length (the table's ``embedding_dim``) per key.

    Raises
    ------
    TypeError
        An entry is not an EmbeddingBagConfig.
    """
    for t in tables:
        if not isinstance(t, EmbeddingBagConfig):
            raise TypeError(f"tables must be EmbeddingBagConfig entries, got {type(t).__name__}")
    if not tables:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.full(t.num_embeddings, t.embedding_dim, dtype=np.int64) for t in tables])


def _feature(value: Any, name: str) -> tuple[Any, Any, bool, Any]:
    """(values, offsets-or-lengths, is_lengths, weights) of one feature's input."""
    if isinstance(value, Mapping):
        if "values" not in value or ("offsets" in value) == ("lengths" in value):
            raise ValueError(f"feature {name!r}: give a dict with 'values' and one of 'offsets' / 'lengths'")
        if "lengths" in value:
            return value["values"], value["lengths"], True, value.get("weights")
        return value["values"], value["offsets"], False, value.get("weights")
    if isinstance(value, (tuple, list)) and len(value) in (2, 3):
        return value[0], value[1], False, value[2] if len(value) == 3 else None
    raise TypeError(
        f"feature {name!r} must be (values, offsets[, weights]) or a dict with 'values' and "
        f"'offsets' or 'lengths', got {type(value).__name__}"
    )


def _split_keyed_jagged(kjt: Any) -> dict[str, Any]:
    """A TorchRec ``KeyedJaggedTensor`` (read through its public methods) as per-feature dicts."""
    keys = list(kjt.keys())
    values, lengths = kjt.values(), kjt.lengths()
    weights = kjt.weights_or_none() if hasattr(kjt, "weights_or_none") else None
    if keys and lengths.numel() % len(keys):
        raise ValueError(f"KeyedJaggedTensor: {lengths.numel()} lengths for {len(keys)} keys")
    per = lengths.view(len(keys), -1) if keys else lengths.view(0, 0)
    out: dict[str, Any] = {}
    start = 0
    for i, k in enumerate(keys):
        n = int(per[i].sum())
        d = {"values": values[start : start + n], "lengths": per[i]}
        if weights is not None:
            d["weights"] = weights[start : start + n]
        out[k] = d
        start += n
    return out


class PSEmbeddingBagCollection(nn.Module):
    """Several pooled embedding tables on one kvps server (TorchRec's ``EmbeddingBagCollection``).

    Table ``t`` holds keys ``[key_offset + o_t, key_offset + o_t + num_embeddings_t)``
    with ``o_t`` the rows of the tables before it (``table_lengths(tables)``
    gives the server's value lengths). A forward pass pulls every distinct key
    of every feature once, pools each feature with
    ``torch.nn.functional.embedding_bag`` over its table's rows, and backward
    pushes one summed gradient per distinct key in one push (features sharing
    a table add up), applied by the server's optimizer. Without optimizer the
    collection serves lookups only, as :class:`PSEmbeddingBag`.

    Parameters
    ----------
    tables : sequence of EmbeddingBagConfig
        The tables (feature names must be unique across tables).
    worker : kvps.Worker
        The worker of the calling thread.
    key_offset : int
        First key of the first table.
    init_std : float
        As :class:`PSEmbeddingBag`.
    seed : int
        As :class:`PSEmbeddingBag`; table ``t`` is seeded with ``seed + t``.
    initialize : bool
        As :class:`PSEmbeddingBag`.

    Raises
    ------
    TypeError
        Bad tables or worker.
    ValueError
        Duplicate feature names, tables beyond the key range or with other
        value lengths.

    Examples
    --------
    >>> from kvps.torch import EmbeddingBagConfig  # doctest: +SKIP
    >>> tables = [EmbeddingBagConfig("user", 1000, 16), EmbeddingBagConfig("item", 500, 8)]  # doctest: +SKIP
    >>> lengths = kvps.torch.table_lengths(tables)  # doctest: +SKIP
    >>> kvps.setup(len(lengths))  # doctest: +SKIP
    >>> server = kvps.Server(lengths, optimizer=kvps.optim.RowWiseAdagrad(lr=0.1))  # doctest: +SKIP
    >>> ebc = kvps.torch.PSEmbeddingBagCollection(tables, kvps.Worker(0, server))  # doctest: +SKIP
    >>> bags = {"user": (torch.tensor([1, 2]), torch.tensor([0])), "item": (torch.tensor([7]), torch.tensor([0]))}  # doctest: +SKIP
    >>> out = ebc(bags)  # {"user": (1, 16), "item": (1, 8)}  # doctest: +SKIP
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        worker: Worker,
        *,
        key_offset: int = 0,
        init_std: float = 1.0,
        seed: int = 0,
        initialize: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(tables, Sequence) or not tables:
            raise TypeError("tables must be a non-empty sequence of EmbeddingBagConfig")
        lengths = table_lengths(tables)
        self.tables = list(tables)
        self.key_offset = check_int(key_offset, "key_offset", lo=0)
        base = np.concatenate([[0], np.cumsum([t.num_embeddings for t in self.tables])]).astype(np.int64)
        self._base = [self.key_offset + int(b) for b in base]
        self._feature_table: dict[str, int] = {}
        for i, t in enumerate(self.tables):
            for f in t.feature_names:
                if f in self._feature_table:
                    raise ValueError(f"feature {f!r} appears in more than one table")
                self._feature_table[f] = i
        if not isinstance(worker, Worker):
            raise TypeError(f"worker must be a kvps.Worker, got {type(worker).__name__}")
        if self.key_offset + len(lengths) > worker.num_keys:
            raise ValueError(
                f"PSEmbeddingBagCollection: keys [{self.key_offset}, {self.key_offset + len(lengths)}) exceed the "
                f"server's {worker.num_keys} keys"
            )
        for i, t in enumerate(self.tables):
            check_table(worker, self._base[i], t.num_embeddings, t.embedding_dim, f"table {t.name!r}")
        self.worker = worker
        dims = {t.embedding_dim for t in self.tables}
        self._dim = dims.pop() if len(dims) == 1 else None  # one row width: no per-key lengths needed
        self._pending: list[int] = []
        if initialize:
            for i, t in enumerate(self.tables):
                initialize_table(
                    worker,
                    self._base[i],
                    t.num_embeddings,
                    t.embedding_dim,
                    float(init_std),
                    int(seed) + i,
                    t.padding_idx,
                )

    @property
    def feature_names(self) -> list[str]:
        """Every feature, in table order.

        Returns
        -------
        list of str
            The tables' ``feature_names``, concatenated.
        """
        return [f for t in self.tables for f in t.feature_names]

    def _inputs(self, features: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Per feature: validated flat ids (table-local), offsets and weights."""
        if not isinstance(features, Mapping) and all(hasattr(features, a) for a in ("keys", "values", "lengths")):
            features = _split_keyed_jagged(features)
        if not isinstance(features, Mapping):
            raise TypeError(
                f"features must be a dict of feature name -> (values, offsets) or a KeyedJaggedTensor, "
                f"got {type(features).__name__}"
            )
        unknown = [f for f in features if f not in self._feature_table]
        if unknown:
            raise ValueError(f"unknown features {unknown}; the tables serve {self.feature_names}")
        missing = [f for f in self.feature_names if f not in features]
        if missing:
            raise ValueError(f"features {missing} are missing from the input")
        out = {}
        for f in self.feature_names:
            t = self.tables[self._feature_table[f]]
            values, second, is_lengths, w = _feature(features[f], f)
            if is_lengths:
                lens = as_index_tensor(second, f"feature {f!r} lengths", dtypes=("int64", "int32")).long()
                n = values.numel() if isinstance(values, torch.Tensor) else -1
                if int(lens.sum()) != n:
                    raise ValueError(f"feature {f!r}: lengths sum to {int(lens.sum())}, the values hold {n} ids")
                second = torch.cumsum(lens, 0) - lens  # each bag's start (no bags for no lengths)
            flat, off, _ = check_bags(values, second, False, t.num_embeddings, f"feature {f!r}")
            out[f] = (flat, off, check_weights(w, flat, t.mode, self.worker.server.dtype, f"feature {f!r}"))
        return out

    def forward(self, features: Any) -> dict[str, torch.Tensor]:
        """Pool the embeddings of every feature, in table order.

        On a server without optimizer a backward pass through a result
        raises ``RuntimeError`` (nothing is pushed); forward works either way.

        Parameters
        ----------
        features : dict or KeyedJaggedTensor
            Per feature name: ``(values, offsets)``, ``(values, offsets, weights)``,
            or a dict with ``"values"`` and ``"offsets"`` or ``"lengths"`` (and
            optionally ``"weights"``, mode "sum" only); or a TorchRec
            ``KeyedJaggedTensor``. Every feature of every table must be given.

        Returns
        -------
        dict of str to torch.Tensor
            ``{name: (num_bags, embedding_dim)}`` per feature, in table order.

        Raises
        ------
        TypeError, ValueError, IndexError
            Unknown or missing features, bad ids, offsets, lengths or weights.
        """
        inputs = self._inputs(features)
        parts = [inputs[f][0] + self._base[self._feature_table[f]] for f in self.feature_names]
        allkeys = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        keys = torch.unique(allkeys)
        pad_keys = [self._base[i] + t.padding_idx for i, t in enumerate(self.tables) if t.padding_idx is not None]
        skip = torch.isin(keys, torch.tensor(pad_keys, dtype=torch.int64)) if pad_keys else None
        lk = Lookup(self.worker, keys, self._dim, skip, self._pending if torch.is_grad_enabled() else None)
        bounds = torch.searchsorted(keys, torch.tensor(self._base, dtype=torch.int64)).tolist()
        counts = [bounds[i + 1] - bounds[i] for i in range(len(self.tables))]
        weights = lk.tables(counts, [t.embedding_dim for t in self.tables])
        out: dict[str, torch.Tensor] = {}
        for f in self.feature_names:
            i = self._feature_table[f]
            t = self.tables[i]
            uniq = keys[bounds[i] : bounds[i + 1]] - self._base[i]
            flat, off, psw = inputs[f]
            local = torch.searchsorted(uniq, flat)
            pad = local_padding(uniq, t.padding_idx)
            out[f] = guard(
                pool(weights[i], local, off, t.mode, psw, False, pad), self.worker, "PSEmbeddingBagCollection"
            )
        return out

    def flush(self) -> None:
        """Wait until every gradient pushed by earlier backward passes reached the server."""
        pending, self._pending[:] = list(self._pending), []
        for ts in pending:
            self.worker.wait(ts)

    def keys(self, features: Any) -> torch.Tensor:
        """Return the distinct server keys a batch of ``features`` looks up (every table's).

        Parameters
        ----------
        features : dict or KeyedJaggedTensor
            As :meth:`forward` takes them.

        Returns
        -------
        torch.Tensor
            Sorted distinct int64 keys.

        Raises
        ------
        TypeError, ValueError, IndexError
            As :meth:`forward`.
        """
        inputs = self._inputs(features)
        parts = [inputs[f][0] + self._base[self._feature_table[f]] for f in self.feature_names]
        return torch.unique(torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.int64)

    def prefetch(
        self,
        batches: Iterable[Any],
        ahead: int = 2,
        keys_fn: Callable[[Any], Any] | None = None,
    ) -> Iterator[Any]:
        """Iterate ``batches``, signalling intent for every table's keys of each batch ``ahead`` batches early.

        Parameters
        ----------
        batches : iterable
            The batches.
        ahead : int
            How many batches ahead intent is signalled.
        keys_fn : callable, optional
            Maps a batch to its features (as :meth:`forward` takes them;
            default: the batch itself or its first element).

        Returns
        -------
        iterator of object
            The batches, unchanged.
        """
        kf = keys_fn or default_ids
        return prefetch(self.worker, batches, ahead, lambda b: self.keys(kf(b)), self.flush)
