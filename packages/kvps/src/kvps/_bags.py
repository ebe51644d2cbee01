"""Pooled embedding bags on the parameter server: ``PSEmbeddingBag`` and ``PSEmbeddingBagCollection``.

A lookup pulls every distinct key of the batch once, pools with
``torch.nn.functional.embedding_bag`` over those rows (so forward values and
gradients are torch's own), and the backward pass pushes one summed gradient
per distinct key; the server's optimizer (:mod:`kvps.optim`) applies it where
the row lives. On a server without optimizer (no update rule) the modules
serve lookups: forward works (inference, evaluation, a loaded model to serve),
and a backward pass raises ``RuntimeError`` before anything is pushed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from distkit_common.validate import as_index_tensor, check_int

from ._bag_checks import (
    check_bags,
    check_mode,
    check_padding,
    check_table,
    check_torch_options,
    check_weights,
    initialize_table,
)
from ._bag_lookup import Lookup, distinct, guard, local_padding, pool
from ._prefetch import default_ids, prefetch
from ._worker import Worker


class PSEmbeddingBag(nn.Module):
    """``torch.nn.EmbeddingBag`` whose rows live on the kvps server, trained by the server's optimizer.

    Row ``i`` is key ``key_offset + i``; the server needs value length
    ``embedding_dim`` for these keys and, to train, an optimizer
    (:mod:`kvps.optim`). A forward pass pulls every distinct id of the batch once and pools with
    ``torch.nn.functional.embedding_bag`` (the same values and gradients as
    ``nn.EmbeddingBag`` with the same weights); backward pushes one summed
    gradient per distinct id, asynchronously (``flush`` waits for them), and
    the server applies the optimizer step. Use one forward per training step
    (a second forward before backward is a second optimizer step). On a
    server without optimizer the bag only serves lookups: forward (under
    ``torch.no_grad()`` or not) gives the same values, and a backward pass
    through its output raises ``RuntimeError`` (nothing is pushed).

    Parameters
    ----------
    num_embeddings, embedding_dim : int
        Table shape.
    worker : kvps.Worker
        The worker of the calling thread.
    mode : {"sum", "mean", "max"}
        Pooling, as ``nn.EmbeddingBag`` (default "mean").
    key_offset : int
        First key of the table.
    padding_idx : int, optional
        Ids equal to it do not contribute to a bag (nor to its size for
        "mean") and the row is never updated; negative counts from the end.
    include_last_offset : bool
        As ``nn.EmbeddingBag``: ``offsets`` has one more entry (the end).
    init_std : float
        Rows start as ``N(0, init_std**2)`` drawn from ``seed`` (the same for
        any rank count; ``nn.EmbeddingBag``'s default is ``N(0, 1)``); the
        padding row starts at 0.
    seed : int
        Seed of the initialisation.
    initialize : bool
        Write the initial rows (collective: every rank writes its home keys,
        then a barrier). False keeps the server's values.
    max_norm : float, optional
        Not supported (``ValueError`` unless None).
    norm_type : float
        Accepted for drop-in use (it applies only with ``max_norm``).
    scale_grad_by_freq : bool
        Not supported (``ValueError`` unless False).
    sparse : bool
        Accepted for drop-in use. These four are ``nn.EmbeddingBag``'s options, for drop-in use. ``sparse`` changes
        nothing (the server always receives one gradient row per distinct
        id); ``max_norm`` (renormalising pulled rows in place) and
        ``scale_grad_by_freq`` are not supported and raise ``ValueError``.

    Raises
    ------
    TypeError
        ``worker`` is not a Worker, or a size is not an int.
    ValueError
        Bad mode, sizes, padding index; the table does not fit the key range
        or its keys' value lengths are not ``embedding_dim``; ``max_norm`` or
        ``scale_grad_by_freq`` set.

    Examples
    --------
    >>> server = kvps.Server(16, optimizer=kvps.optim.RowWiseAdagrad(lr=0.1))  # doctest: +SKIP
    >>> bag = kvps.torch.PSEmbeddingBag(1000, 16, kvps.Worker(0, server), mode="sum")  # doctest: +SKIP
    >>> out = bag(torch.tensor([3, 4, 5, 9]), torch.tensor([0, 2]))  # two bags  # doctest: +SKIP
    >>> out.sum().backward(); bag.flush()  # the server applies the step  # doctest: +SKIP
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        worker: Worker,
        mode: str = "mean",
        key_offset: int = 0,
        *,
        padding_idx: int | None = None,
        include_last_offset: bool = False,
        init_std: float = 1.0,
        seed: int = 0,
        initialize: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> None:
        super().__init__()
        check_torch_options(max_norm, scale_grad_by_freq)
        self.num_embeddings = check_int(num_embeddings, "num_embeddings", lo=1)
        self.embedding_dim = check_int(embedding_dim, "embedding_dim", lo=1)
        self.mode = check_mode(mode)
        self.key_offset = check_int(key_offset, "key_offset", lo=0)
        self.padding_idx = check_padding(padding_idx, self.num_embeddings)
        self.include_last_offset = bool(include_last_offset)
        self.max_norm, self.norm_type, self.scale_grad_by_freq = None, float(norm_type), False  # (as nn.EmbeddingBag)
        self.sparse = bool(sparse)
        check_table(worker, self.key_offset, self.num_embeddings, self.embedding_dim, "PSEmbeddingBag")
        self.worker = worker
        self._pending: list[int] = []
        if initialize:
            initialize_table(
                worker,
                self.key_offset,
                self.num_embeddings,
                self.embedding_dim,
                float(init_std),
                int(seed),
                self.padding_idx,
            )

    def forward(self, input: Any, offsets: Any = None, per_sample_weights: Any = None) -> torch.Tensor:
        """Pool the embeddings of the bags.

        On a server without optimizer a backward pass through the result
        raises ``RuntimeError`` (nothing is pushed); forward works either way.

        Parameters
        ----------
        input : torch.Tensor
            The int64/int32 ids: 1-D with ``offsets``, or 2-D ``(B, N)`` for ``B`` bags of ``N`` ids.
        offsets : torch.Tensor, optional
            Start of each bag in ``input`` (1-D input only).
        per_sample_weights : torch.Tensor, optional
            One weight per id (mode "sum" only), the server's dtype.

        Returns
        -------
        torch.Tensor
            ``(num_bags, embedding_dim)``, the server's dtype.

        Raises
        ------
        TypeError, ValueError, IndexError
            Bad ids, offsets or weights (see ``nn.EmbeddingBag``).
        """
        flat, off, last = check_bags(input, offsets, self.include_last_offset, self.num_embeddings)
        psw = check_weights(per_sample_weights, flat, self.mode, self.worker.server.dtype, "PSEmbeddingBag")
        uniq, local, order = distinct(flat)
        keys = (uniq + self.key_offset).contiguous() if self.key_offset else uniq
        skip = uniq == self.padding_idx if self.padding_idx is not None else None
        pending = self._pending if torch.is_grad_enabled() else None
        lk = Lookup(self.worker, keys, self.embedding_dim, skip, pending)
        pad = local_padding(uniq, self.padding_idx)
        out = pool(
            lk.tables([keys.numel()], [self.embedding_dim])[0],
            local,
            off,
            self.mode,
            psw,
            last,
            pad,
            order,
        )
        return guard(out, self.worker, "PSEmbeddingBag")

    def flush(self) -> None:
        """Wait until every gradient pushed by earlier backward passes reached the server."""
        pending, self._pending[:] = list(self._pending), []
        for ts in pending:
            self.worker.wait(ts)

    def pull_rows(self, ids: Any) -> torch.Tensor:
        """Pull the current rows of ``ids``.

        Parameters
        ----------
        ids : torch.Tensor
            1-D int64 ids in ``[0, num_embeddings)``.

        Returns
        -------
        torch.Tensor
            ``(len(ids), embedding_dim)``, the server's dtype.

        Raises
        ------
        TypeError, ValueError, IndexError
            Bad ids.
        """
        t = as_index_tensor(ids, "ids", upper=self.num_embeddings)
        out = torch.empty(t.numel() * self.embedding_dim, dtype=self.worker.server.dtype)
        self.worker.pull((t + self.key_offset).contiguous(), out)
        return out.view(-1, self.embedding_dim)

    def prefetch(
        self,
        batches: Iterable[Any],
        ahead: int = 2,
        keys_fn: Callable[[Any], torch.Tensor] | None = None,
    ) -> Iterator[Any]:
        """Iterate ``batches``, signalling intent for each batch's ids ``ahead`` batches early.

        Batch ``i`` is used at clock ``c0 + i`` (``c0``: the worker's clock at
        the start); after each batch the gradients are flushed and the
        worker's clock advances by one.

        Parameters
        ----------
        batches : iterable
            The batches.
        ahead : int
            How many batches ahead intent is signalled.
        keys_fn : callable, optional
            Maps a batch to its id tensor (default: the batch itself or its first element).

        Returns
        -------
        iterator of object
            The batches, unchanged.
        """
        kf = keys_fn or default_ids

        def keys_of(b: Any) -> torch.Tensor:
            ids = as_index_tensor(kf(b).reshape(-1), "ids", upper=self.num_embeddings, dtypes=("int64", "int32"))
            return ids.long() + self.key_offset

        return prefetch(self.worker, batches, ahead, keys_of, self.flush)
