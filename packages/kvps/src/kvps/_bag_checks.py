"""What the pooled-bag modules are given: ids, offsets, weights and options checked as ``nn.EmbeddingBag`` takes them.

Also the server-side table a module spans (:func:`check_table`) and its initial rows (:func:`initialize_table`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from distkit_common.validate import as_index_tensor, check_int

from ._worker import Worker

#: the pooling modes (``nn.EmbeddingBag``'s)
MODES = ("sum", "mean", "max")


def check_bags(
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


def check_weights(psw: Any, flat: torch.Tensor, mode: str, dtype: torch.dtype, name: str) -> torch.Tensor | None:
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


def check_torch_options(max_norm: Any, scale_grad_by_freq: Any) -> None:
    """nn.EmbeddingBag options kvps does not implement: a clear error, not a silent difference."""
    if max_norm is not None:
        raise ValueError(
            "max_norm is not supported: nn.EmbeddingBag renormalises the looked-up rows of its weight in place; "
            "kvps's rows live on the server (clip the gradients, or use the server's optimizer)"
        )
    if scale_grad_by_freq:
        raise ValueError("scale_grad_by_freq is not supported by kvps's bags")


def check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return str(mode)


def check_padding(padding_idx: Any, num_embeddings: int) -> int | None:
    if padding_idx is None:
        return None
    p = check_int(padding_idx, "padding_idx", lo=-num_embeddings, hi=num_embeddings)
    return p + num_embeddings if p < 0 else p  # as nn.EmbeddingBag: negative counts from the end


def check_table(worker: Any, key_offset: int, num: int, dim: int, what: str) -> None:
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


def initialize_table(
    worker: Worker, key_offset: int, num: int, dim: int, std: float, seed: int, pad: int | None
) -> None:
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
