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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distkit_common.validate import as_index_tensor, check_int

from . import _kvps
from ._prefetch import default_ids, prefetch
from ._server import Worker

MODES = ("sum", "mean", "max")


# ----------------------------------------------------------------------------- input checks
def _bags(
    input: Any, offsets: Any, include_last_offset: bool, upper: int, name: str = "input"
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate ``input`` (+ ``offsets``) as ``nn.EmbeddingBag`` takes them.

    Returns flat int64 ids, offsets, and whether the offsets end with the end
    of the ids (``include_last_offset``, which applies to 1-D input only, as in
    torch). Every id belongs to a bag: trailing ids that torch would ignore
    (``include_last_offset`` with a last offset short of the end, or ids with
    empty offsets) are refused.

    Raises
    ------
    TypeError
        Not an integer tensor (int32/int64), or offsets of another dtype.
    ValueError
        Bad shapes, offsets that are not non-decreasing from 0 within the input.
    IndexError
        An id outside ``[0, upper)`` (the message names it and its position).
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{name} must be an int64 or int32 tensor, got {type(input).__name__}")
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError(f"{name} is 2-D (fixed-length bags): offsets must be None")
        b, n = input.shape
        flat = as_index_tensor(input.reshape(-1), name, upper=upper, dtypes=("int64", "int32")).long()
        # (torch ignores include_last_offset for 2-D input: B bags)
        return flat, torch.arange(0, b * n, n, dtype=torch.int64) if n else torch.zeros(b, dtype=torch.int64), False
    if input.dim() != 1:
        raise ValueError(
            f"{name} must be 1-D (with offsets) or 2-D (fixed-length bags), got shape {tuple(input.shape)}"
        )
    if offsets is None:
        raise ValueError(f"{name} is 1-D: offsets are required")
    flat = as_index_tensor(input, name, upper=upper, dtypes=("int64", "int32")).long()
    off = as_index_tensor(offsets, f"{name} offsets", dtypes=("int64", "int32")).long()
    if off.numel() == 0:
        if include_last_offset:
            raise ValueError(f"{name} offsets: include_last_offset needs at least one offset (the end of the ids)")
        if flat.numel():
            raise ValueError(f"{name} offsets are empty (no bags), but {name} holds {flat.numel()} ids")
        return flat, off, False
    if int(off[0]) != 0:
        raise ValueError(f"{name} offsets must start at 0, got {int(off[0])}")
    if off.numel() > 1 and bool((off[1:] < off[:-1]).any()):
        pos = int((off[1:] < off[:-1]).nonzero()[0]) + 1
        raise ValueError(
            f"{name} offsets must be non-decreasing: offsets[{pos}] = {int(off[pos])} < {int(off[pos - 1])}"
        )
    if int(off[-1]) > flat.numel():
        raise ValueError(f"{name} offsets[-1] = {int(off[-1])} exceeds the {flat.numel()} ids")
    if include_last_offset and int(off[-1]) != flat.numel():
        raise ValueError(
            f"include_last_offset: the last offset must equal the number of ids ({flat.numel()}), got {int(off[-1])}"
        )
    return flat, off, include_last_offset


def _weights(psw: Any, flat: torch.Tensor, mode: str, dtype: torch.dtype, name: str) -> torch.Tensor | None:
    if psw is None:
        return None
    if mode != "sum":
        raise ValueError(f"{name}: per_sample_weights are only supported for mode='sum', not {mode!r}")
    if not isinstance(psw, torch.Tensor):
        raise TypeError(f"{name}: per_sample_weights must be a tensor, got {type(psw).__name__}")
    if psw.dtype != dtype:
        raise TypeError(f"{name}: per_sample_weights must have dtype {dtype} (the server's), got {psw.dtype}")
    if psw.device.type != "cpu":
        raise ValueError(f"{name}: per_sample_weights must be on the CPU, got {psw.device}")
    if psw.numel() != flat.numel():
        raise ValueError(
            f"{name}: per_sample_weights must have one weight per id ({flat.numel()}), got shape {tuple(psw.shape)}"
        )
    return psw.reshape(-1)


def _check_torch_options(max_norm: Any, scale_grad_by_freq: Any) -> None:
    """nn.EmbeddingBag options kvps does not implement: a clear error, not a silent difference."""
    if max_norm is not None:
        raise ValueError(
            "max_norm is not supported: nn.EmbeddingBag renormalises the looked-up rows of its weight in place; "
            "kvps's rows live on the server (clip the gradients, or use the server's optimizer)"
        )
    if scale_grad_by_freq:
        raise ValueError("scale_grad_by_freq is not supported by kvps's bags")


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return str(mode)


def _check_padding(padding_idx: Any, num_embeddings: int) -> int | None:
    if padding_idx is None:
        return None
    p = check_int(padding_idx, "padding_idx", lo=-num_embeddings, hi=num_embeddings)
    return p + num_embeddings if p < 0 else p  # as nn.EmbeddingBag: negative counts from the end


def _check_table(worker: Any, key_offset: int, num: int, dim: int, what: str) -> None:
    if not isinstance(worker, Worker):
        raise TypeError(f"worker must be a kvps.Worker, got {type(worker).__name__}")
    if key_offset + num > worker.num_keys:
        raise ValueError(f"{what}: keys [{key_offset}, {key_offset + num}) exceed the server's {worker.num_keys} keys")
    lens = worker.server.lengths[key_offset : key_offset + num]
    if not np.all(lens == dim):
        bad = int(np.nonzero(lens != dim)[0][0])
        raise ValueError(
            f"{what}: key {key_offset + bad} has value length {int(lens[bad])}, the table needs embedding_dim = {dim}"
        )


def _initialize(worker: Worker, key_offset: int, num: int, dim: int, std: float, seed: int, pad: int | None) -> None:
    """Collective: rows ~ N(0, std^2) from ``seed`` (the same for any rank count), the padding row 0."""
    srv = worker.server
    rank, size = srv.my_rank(), srv.num_ranks()
    chunk = 65536
    for lo in range(0, num, chunk):
        hi = min(lo + chunk, num)
        g = torch.Generator().manual_seed(seed * 1_000_003 + lo)
        rows = (torch.randn(hi - lo, dim, generator=g) * std).to(srv.dtype)
        if pad is not None and lo <= pad < hi:
            rows[pad - lo] = 0
        keys = torch.arange(lo, hi, dtype=torch.int64) + key_offset
        mine = keys % size == rank
        if bool(mine.any()):
            worker.set(keys[mine].contiguous(), rows[mine].reshape(-1).contiguous())
    srv.barrier()


def _no_update_rule(what: str) -> str:
    """The error of a backward pass that would push gradients to a server without an update rule."""
    return (
        f"{what}: backward would push gradients, but the kvps server has no update rule "
        "(kvps.Server(..., optimizer=None): a push adds values, as AdaPM's does); nothing was pushed. "
        "To train, create the server with optimizer=kvps.optim.RowWiseAdagrad(...) (or another kvps.optim rule); "
        "for inference, evaluation or serving, run the lookup under torch.no_grad() or torch.inference_mode()"
    )


class _NoUpdateRule(torch.autograd.Function):
    """Identity on a lookup's output whose backward raises :func:`_no_update_rule`'s error.

    It is the first node a backward pass reaches from the output, so it
    raises before any gradient of the rows is computed or pushed.
    """

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, what: str) -> torch.Tensor:
        ctx.what = what
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise RuntimeError(_no_update_rule(ctx.what))


def _guard(out: torch.Tensor, worker: Worker, what: str) -> torch.Tensor:
    """``out``, or (grad mode, a server without optimizer) ``out`` behind :class:`_NoUpdateRule`."""
    if worker.server.optimizer is None and out.requires_grad:
        guarded: torch.Tensor = _NoUpdateRule.apply(out, what)
        return guarded
    return out


# ----------------------------------------------------------------------------- the lookup
class _Lookup:
    """One batch's rows: every distinct key pulled once into a flat leaf tensor.

    ``keys`` are sorted global keys; ``rows`` holds their values concatenated
    (``dim`` elements each when ``dim`` is given, else each key's value
    length). With ``pending`` (grad mode) the rows require grad, and on a
    server with an optimizer backward pushes ``rows.grad`` of every key except
    ``skip`` (padding rows: never updated, as in torch); the push's timestamp
    goes to ``pending``. (Without optimizer nothing is pushed: the module's
    output is guarded by :class:`_NoUpdateRule`.)
    """

    def __init__(
        self,
        worker: Worker,
        keys: torch.Tensor,
        dim: int | None,
        skip: torch.Tensor | None,
        pending: list[int] | None,
    ) -> None:
        self.worker = worker
        self.keys = keys
        self.dim = dim
        lens = None if dim is not None else torch.from_numpy(worker.server.lengths[keys.numpy()])
        self.lens = lens
        count = keys.numel() * dim if dim is not None else int(lens.sum()) if lens is not None else 0
        self.rows = torch.empty(count, dtype=worker.server.dtype)
        if keys.numel():  # (keys: distinct ids checked at the module's boundary)
            worker._rows(_kvps.PULL, keys, self.rows, False)
        if pending is not None:
            self.rows.requires_grad_(True)
        if pending is not None and worker.server.optimizer is not None:
            push_keys, elems = keys, None
            if skip is not None and bool(skip.any()):
                push_keys = keys[~skip].contiguous()
                per_key = lens if lens is not None else torch.full((keys.numel(),), int(dim or 0), dtype=torch.int64)
                elems = torch.repeat_interleave(~skip, per_key)

            def push(g: torch.Tensor) -> None:
                vals = (g if elems is None else g[elems]).detach().contiguous()
                if push_keys.numel():
                    ts = worker._rows(_kvps.PUSH, push_keys, vals, True)
                    if ts >= 0:
                        pending.append(ts)

            self.rows.register_hook(push)

    def tables(self, counts: list[int], dims: list[int]) -> list[torch.Tensor]:
        """The rows as one ``(counts[t], dims[t])`` view per table (keys grouped by table, in order).

        One split: its backward joins the tables' gradients with one copy.
        """
        if len(counts) == 1:
            return [self.rows.view(counts[0], dims[0])]
        if self.lens is None:
            return list(self.rows.view(-1, dims[0]).split(counts))
        parts = self.rows.split([c * d for c, d in zip(counts, dims)])
        return [p.view(c, d) for p, c, d in zip(parts, counts, dims)]


class _SumMeanBag(torch.autograd.Function):
    """``F.embedding_bag`` ("sum"/"mean") whose backward is kvps's ``bag_grad``: torch's numbers.

    torch's dense backward produces a gradient of the whole (here: the
    batch's) table through several passes; ``bag_grad`` accumulates straight
    into the distinct rows, in the order torch does (see pooling.hpp).
    """

    @staticmethod
    def forward(
        ctx: Any,
        weight: torch.Tensor,
        local: torch.Tensor,
        offsets: torch.Tensor,
        mode: str,
        psw: torch.Tensor | None,
        include_last_offset: bool,
        pad: int | None,
        order: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(local, offsets, psw, order)
        ctx.args = (weight.shape, mode, include_last_offset, pad)
        return F.embedding_bag(
            local,
            weight,
            offsets,
            mode=mode,
            per_sample_weights=psw,
            include_last_offset=include_last_offset,
            padding_idx=pad,
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        local, offsets, psw, order = ctx.saved_tensors
        shape, mode, include_last_offset, pad = ctx.args
        g = grad.contiguous()
        if order is None:
            order = torch.sort(local).indices  # the order torch's own backward visits the ids in
        w = psw.reshape(-1).to(g.dtype).contiguous() if psw is not None else None
        out = torch.empty(shape, dtype=g.dtype)
        _kvps.bag_grad(
            _kvps.VALUE_DTYPES[str(g.dtype).removeprefix("torch.")],
            g.data_ptr(),
            shape[1],
            local.data_ptr(),
            order.data_ptr(),
            offsets.data_ptr(),
            offsets.numel() - (1 if include_last_offset else 0),
            include_last_offset,
            local.numel(),
            0 if w is None else w.data_ptr(),
            mode == "mean",
            shape[0],
            -1 if pad is None else pad,  # padding ids add nothing (nor count in a mean)
            out.data_ptr(),
        )
        return out, None, None, None, None, None, None, None


def _pool(
    weight: torch.Tensor,
    local: torch.Tensor,
    offsets: torch.Tensor,
    mode: str,
    psw: torch.Tensor | None,
    include_last_offset: bool,
    pad: int | None,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.embedding_bag`` over a table's pulled rows; ``pad`` is the padding row's local index (or None).

    ``order``: ``torch.sort(local)``'s permutation, when the caller has it.
    """
    if weight.shape[0] == 0 or (pad is not None and pad == weight.shape[0]):
        # no rows (an empty batch) or a padding id the batch does not use: a
        # zero row that no id selects keeps embedding_bag's behaviour
        weight = torch.cat([weight, weight.new_zeros(1, weight.shape[1])])
    if mode != "max" and weight.requires_grad and (psw is None or not psw.requires_grad):
        out: torch.Tensor = _SumMeanBag.apply(weight, local, offsets, mode, psw, include_last_offset, pad, order)
        return out
    return F.embedding_bag(
        local,
        weight,
        offsets,
        mode=mode,
        per_sample_weights=psw,
        include_last_offset=include_last_offset,
        padding_idx=pad,
    )


def _distinct(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.unique(ids, return_inverse=True)`` from one ``torch.sort``, whose permutation is kept.

    The permutation is the order torch's embedding_bag backward visits the
    ids in (pooling.hpp), so the backward need not sort again.
    """
    sorted_ids, order = torch.sort(ids)
    first = torch.ones(ids.numel(), dtype=torch.bool)
    if ids.numel() > 1:
        torch.ne(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    local = torch.empty_like(ids)
    local[order] = torch.cumsum(first, 0) - 1
    return sorted_ids[first], local, order


def _local_padding(uniq: torch.Tensor, pad_key: int | None) -> int | None:
    """The local index of the padding key among the sorted ``uniq`` keys.

    It keeps its sorted position when present (torch's backward then sums in
    the same order as over the whole table); else the index past the rows.
    """
    if pad_key is None:
        return None
    pos = int(torch.searchsorted(uniq, torch.tensor(pad_key, dtype=torch.int64)))
    return pos if pos < uniq.numel() and int(uniq[pos]) == pad_key else uniq.numel()


# ----------------------------------------------------------------------------- PSEmbeddingBag
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
    max_norm, norm_type, scale_grad_by_freq, sparse
        ``nn.EmbeddingBag``'s options, for drop-in use. ``sparse`` changes
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
        _check_torch_options(max_norm, scale_grad_by_freq)
        self.num_embeddings = check_int(num_embeddings, "num_embeddings", lo=1)
        self.embedding_dim = check_int(embedding_dim, "embedding_dim", lo=1)
        self.mode = _check_mode(mode)
        self.key_offset = check_int(key_offset, "key_offset", lo=0)
        self.padding_idx = _check_padding(padding_idx, self.num_embeddings)
        self.include_last_offset = bool(include_last_offset)
        self.max_norm, self.norm_type, self.scale_grad_by_freq = None, float(norm_type), False  # (as nn.EmbeddingBag)
        self.sparse = bool(sparse)
        _check_table(worker, self.key_offset, self.num_embeddings, self.embedding_dim, "PSEmbeddingBag")
        self.worker = worker
        self._pending: list[int] = []
        if initialize:
            _initialize(
                worker,
                self.key_offset,
                self.num_embeddings,
                self.embedding_dim,
                float(init_std),
                int(seed),
                self.padding_idx,
            )

    def forward(self, input: Any, offsets: Any = None, per_sample_weights: Any = None) -> torch.Tensor:
        """Pooled embeddings of the bags, ``(num_bags, embedding_dim)``.

        On a server without optimizer a backward pass through the result
        raises ``RuntimeError`` (nothing is pushed); forward works either way.

        Parameters
        ----------
        input : torch.Tensor
            int64/int32 ids: 1-D with ``offsets``, or 2-D ``(B, N)`` for ``B`` bags of ``N`` ids.
        offsets : torch.Tensor, optional
            Start of each bag in ``input`` (1-D input only).
        per_sample_weights : torch.Tensor, optional
            One weight per id (mode "sum" only), the server's dtype.

        Raises
        ------
        TypeError, ValueError, IndexError
            Bad ids, offsets or weights (see ``nn.EmbeddingBag``).
        """
        flat, off, last = _bags(input, offsets, self.include_last_offset, self.num_embeddings)
        psw = _weights(per_sample_weights, flat, self.mode, self.worker.server.dtype, "PSEmbeddingBag")
        uniq, local, order = _distinct(flat)
        keys = (uniq + self.key_offset).contiguous() if self.key_offset else uniq
        skip = uniq == self.padding_idx if self.padding_idx is not None else None
        pending = self._pending if torch.is_grad_enabled() else None
        lk = _Lookup(self.worker, keys, self.embedding_dim, skip, pending)
        pad = _local_padding(uniq, self.padding_idx)
        out = _pool(
            lk.tables([keys.numel()], [self.embedding_dim])[0],
            local,
            off,
            self.mode,
            psw,
            last,
            pad,
            order,
        )
        return _guard(out, self.worker, "PSEmbeddingBag")

    def flush(self) -> None:
        """Wait until every gradient pushed by earlier backward passes reached the server."""
        pending, self._pending[:] = list(self._pending), []
        for ts in pending:
            self.worker.wait(ts)

    def pull_rows(self, ids: Any) -> torch.Tensor:
        """The current rows of ``ids`` (1-D int64), ``(len(ids), embedding_dim)``.

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

        Yields
        ------
        object
            The batches, unchanged.
        """
        kf = keys_fn or default_ids

        def keys_of(b: Any) -> torch.Tensor:
            ids = as_index_tensor(kf(b).reshape(-1), "ids", upper=self.num_embeddings, dtypes=("int64", "int32"))
            return ids.long() + self.key_offset

        return prefetch(self.worker, batches, ahead, keys_of, self.flush)


# ----------------------------------------------------------------------------- the collection
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
        object.__setattr__(self, "mode", _check_mode(self.mode))
        object.__setattr__(self, "padding_idx", _check_padding(self.padding_idx, self.num_embeddings))


def table_lengths(tables: Sequence[EmbeddingBagConfig]) -> np.ndarray:
    """The ``value_lengths`` of a server holding ``tables`` one after another (from key 0).

    ``kvps.setup(len(lengths), ...)`` and ``kvps.Server(lengths, optimizer=...)``
    then fit a :class:`PSEmbeddingBagCollection` over the same tables.

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
    init_std, seed, initialize
        As :class:`PSEmbeddingBag` (table ``t`` is seeded with ``seed + t``).

    Raises
    ------
    TypeError
        Bad tables or worker.
    ValueError
        Duplicate feature names, tables beyond the key range or with other
        value lengths.
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
            _check_table(worker, self._base[i], t.num_embeddings, t.embedding_dim, f"table {t.name!r}")
        self.worker = worker
        dims = {t.embedding_dim for t in self.tables}
        self._dim = dims.pop() if len(dims) == 1 else None  # one row width: no per-key lengths needed
        self._pending: list[int] = []
        if initialize:
            for i, t in enumerate(self.tables):
                _initialize(
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
        """Every feature, in table order."""
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
            flat, off, _ = _bags(values, second, False, t.num_embeddings, f"feature {f!r}")
            out[f] = (flat, off, _weights(w, flat, t.mode, self.worker.server.dtype, f"feature {f!r}"))
        return out

    def forward(self, features: Any) -> dict[str, torch.Tensor]:
        """Pooled embeddings per feature: ``{name: (num_bags, embedding_dim)}``, in table order.

        On a server without optimizer a backward pass through a result
        raises ``RuntimeError`` (nothing is pushed); forward works either way.

        Parameters
        ----------
        features : dict or KeyedJaggedTensor
            Per feature name: ``(values, offsets)``, ``(values, offsets, weights)``,
            or a dict with ``"values"`` and ``"offsets"`` or ``"lengths"`` (and
            optionally ``"weights"``, mode "sum" only); or a TorchRec
            ``KeyedJaggedTensor``. Every feature of every table must be given.

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
        lk = _Lookup(self.worker, keys, self._dim, skip, self._pending if torch.is_grad_enabled() else None)
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
            pad = _local_padding(uniq, t.padding_idx)
            out[f] = _guard(
                _pool(weights[i], local, off, t.mode, psw, False, pad), self.worker, "PSEmbeddingBagCollection"
            )
        return out

    def flush(self) -> None:
        """Wait until every gradient pushed by earlier backward passes reached the server."""
        pending, self._pending[:] = list(self._pending), []
        for ts in pending:
            self.worker.wait(ts)

    def keys(self, features: Any) -> torch.Tensor:
        """The distinct server keys a batch of ``features`` looks up (every table's).

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

        Yields
        ------
        object
            The batches, unchanged.
        """
        kf = keys_fn or default_ids
        return prefetch(self.worker, batches, ahead, lambda b: self.keys(kf(b)), self.flush)
