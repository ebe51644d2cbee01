"""``PSEmbedding``: an embedding table whose rows and Adagrad state live on the server (client-side Adagrad)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from distkit_common.validate import check_int

from ._prefetch import default_ids, prefetch
from ._worker import Worker


class PSEmbedding(nn.Module):
    """An ``nn.Embedding``-like lookup backed by kvps, trained with Adagrad computed by the worker.

    Row ``i`` is key ``key_offset + i``; its value holds ``2 * embedding_dim``
    floats: the row, then its Adagrad accumulator (so the server must be
    created with value length ``2 * embedding_dim`` for these keys). A forward
    pass pulls the rows and accumulators of the unique ids of the batch and
    returns ``nn.functional.embedding(ids, rows)``; the backward hook computes
    the Adagrad step on the worker, ``acc += g**2``,
    ``row -= lr * g / (sqrt(acc) + eps)``, from the pulled state and pushes
    both deltas asynchronously, which the server adds (so concurrent updates
    from other ranks add up, as in any asynchronous parameter server).

    The update rule is the module's own: the server must have none
    (``kvps.Server(..., optimizer=None)``, whose push adds, AdaPM's push).
    Forward works on any float32 server with the right value lengths (for
    inference or serving, under ``torch.no_grad()`` or not); on a server
    with an optimizer, which would apply the pushed deltas as gradients, a
    backward pass raises ``RuntimeError`` before anything is pushed (use
    :class:`PSEmbeddingBag` for a server-side rule).

    Parameters
    ----------
    num_embeddings, embedding_dim : int
        Table shape.
    worker : kvps.Worker
        The worker of the calling thread.
    key_offset : int
        First key of the table.
    lr, eps : float
        Adagrad step size and denominator guard.
    init_std : float
        Rows start as ``N(0, init_std**2)`` drawn from ``seed`` (identical for
        every rank count); the accumulators start at 0.
    seed : int
        Seed of the initialisation.
    initialize : bool
        Write the initial rows (collective: every rank writes its home keys,
        then a barrier). Pass False to keep the server's values.

    Raises
    ------
    TypeError
        ``worker`` is not a Worker, or the server is not float32.
    ValueError
        The server's value length of the table's keys is not ``2 * embedding_dim``,
        or the table does not fit the key range.

    Examples
    --------
    >>> server = kvps.Server(2 * 16)  # row + accumulator per key, no optimizer  # doctest: +SKIP
    >>> emb = kvps.torch.PSEmbedding(1000, 16, kvps.Worker(0, server), lr=0.1)  # doctest: +SKIP
    >>> emb(torch.tensor([[1, 2], [3, 1]])).sum().backward(); emb.flush()  # doctest: +SKIP
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        worker: Worker,
        *,
        key_offset: int = 0,
        lr: float = 0.1,
        eps: float = 1e-10,
        init_std: float = 0.1,
        seed: int = 0,
        initialize: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(worker, Worker):
            raise TypeError(f"worker must be a kvps.Worker, got {type(worker).__name__}")
        self.num_embeddings = check_int(num_embeddings, "num_embeddings", lo=1)
        self.embedding_dim = check_int(embedding_dim, "embedding_dim", lo=1)
        self.key_offset = check_int(key_offset, "key_offset", lo=0)
        if self.key_offset + self.num_embeddings > worker.num_keys:
            raise ValueError(
                f"keys [{self.key_offset}, {self.key_offset + self.num_embeddings}) exceed the server's "
                f"{worker.num_keys} keys"
            )
        if worker.server.dtype != torch.float32:
            raise TypeError(f"PSEmbedding needs a float32 server, got {worker.server.dtype}")
        lens = worker.server.lengths[self.key_offset : self.key_offset + self.num_embeddings]
        if not np.all(lens == 2 * self.embedding_dim):
            raise ValueError(f"the table's keys need value length 2 * embedding_dim = {2 * self.embedding_dim}")
        self.worker = worker
        self.lr = float(lr)
        self.eps = float(eps)
        self._pending: list[int] = []
        if initialize:
            self._initialize(float(init_std), int(seed))

    def _initialize(self, std: float, seed: int) -> None:
        srv = self.worker.server
        rank, size = srv.my_rank(), srv.num_ranks()
        chunk = 65536
        d = self.embedding_dim
        for lo in range(0, self.num_embeddings, chunk):
            hi = min(lo + chunk, self.num_embeddings)
            g = torch.Generator().manual_seed(seed * 1_000_003 + lo)
            rows = torch.randn(hi - lo, d, generator=g) * std
            keys = torch.arange(lo, hi, dtype=torch.int64) + self.key_offset
            mine = keys % size == rank
            if not bool(mine.any()):
                continue
            vals = torch.cat([rows[mine], torch.zeros(int(mine.sum()), d)], dim=1).reshape(-1)
            self.worker.set(keys[mine].contiguous(), vals.contiguous())
        srv.barrier()

    def _keys(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64:
            raise TypeError(f"ids must be an int64 tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            bad = flat[(flat < 0) | (flat >= self.num_embeddings)][0]
            raise IndexError(f"id {int(bad)} is out of range [0, {self.num_embeddings})")
        return flat

    def pull_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pull the rows and Adagrad accumulators of ``ids``.

        Parameters
        ----------
        ids : torch.Tensor
            The table's ids to pull (1-D, int64, each in ``[0, num_embeddings)``).

        Returns
        -------
        rows : torch.Tensor
            The rows, ``(len(ids), embedding_dim)``, float32.
        acc : torch.Tensor
            Their Adagrad accumulators, the same shape.

        Raises
        ------
        TypeError, IndexError
            Bad ids.
        """
        flat = self._keys(ids)
        buf = torch.empty(flat.numel() * 2 * self.embedding_dim)
        self.worker.pull((flat + self.key_offset).contiguous(), buf)
        st = buf.view(-1, 2, self.embedding_dim)
        return st[:, 0].clone(), st[:, 1].clone()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up ``ids``.

        The values are the stored rows (``nn.functional.embedding(ids, rows)``).
        In grad mode a backward pass through them runs the worker's Adagrad
        step (it raises ``RuntimeError`` on a server with an optimizer).

        Parameters
        ----------
        ids : torch.Tensor
            The int64 ids in ``[0, num_embeddings)``, any shape.

        Returns
        -------
        torch.Tensor
            ``ids.shape + (embedding_dim,)``, float32.

        Raises
        ------
        TypeError, IndexError
            Bad ids.
        """
        flat = self._keys(ids)
        uniq, inv = torch.unique(flat, return_inverse=True)
        rows, acc = self.pull_rows(uniq)
        keys = (uniq + self.key_offset).contiguous()
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            rows.register_hook(lambda g: self._push_adagrad_step(keys, g, acc))
        out = rows[inv]
        return out.view(*ids.shape, self.embedding_dim)

    def _push_adagrad_step(self, keys: torch.Tensor, g: torch.Tensor, acc: torch.Tensor) -> None:
        if self.worker.server.optimizer is not None:
            raise RuntimeError(
                "PSEmbedding: backward would push Adagrad deltas computed on the worker, but the kvps server has "
                f"an update rule ({type(self.worker.server.optimizer).__name__}) that would apply them as "
                "gradients; nothing was pushed. Train PSEmbedding on a server without optimizer "
                "(kvps.Server(lengths)), or use kvps.torch.PSEmbeddingBag for a server-side rule; for "
                "inference, run the lookup under torch.no_grad()"
            )
        # The Adagrad step of distkit/adagrad.hpp with Fused = false (g * g rounded, then
        # added), spelled here in torch instead of calling it: the step is taken on the
        # worker from the pulled (possibly stale) accumulator and pushed as two deltas, the
        # row's step and g * g, which a server without optimizer adds, so that concurrent
        # steps of other ranks add up (the native update writes w and acc in place where
        # they live). torch's CPU sqrt may differ from a correctly rounded one in the last bit.
        g = g.detach().float()
        g2 = g * g
        delta = -self.lr * g / ((acc + g2).sqrt() + self.eps)
        buf = torch.stack([delta, g2], dim=1).reshape(-1).contiguous()
        ts = self.worker.push(keys, buf, True)
        if ts >= 0:
            self._pending.append(ts)

    def flush(self) -> None:
        """Wait until every pushed update reached the server."""
        for ts in self._pending:
            self.worker.wait(ts)
        self._pending.clear()

    def prefetch(
        self,
        batches: Iterable[Any],
        ahead: int = 2,
        keys_fn: Callable[[Any], torch.Tensor] | None = None,
    ) -> Iterator[Any]:
        """Iterate ``batches``, signalling intent for each batch's ids ``ahead`` batches early.

        Batch ``i`` is used at clock ``c0 + i`` (``c0`` = the worker's clock at
        the start); after each batch the worker's clock advances by one.

        Parameters
        ----------
        batches : iterable
            The batches.
        ahead : int
            How many batches ahead intent is signalled.
        keys_fn : callable, optional
            Maps a batch to its int64 id tensor (default: the batch itself or its first element).

        Returns
        -------
        iterator of object
            The batches, unchanged.
        """
        kf = keys_fn or default_ids
        return prefetch(self.worker, batches, ahead, lambda b: self._keys(kf(b)) + self.key_offset, self.flush)
