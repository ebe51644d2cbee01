"""Vocab-parallel cross-entropy: native fused per-row passes + one all-gather of N x 4 statistics."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distkit_common.dtypes import code_of

from . import _shardlayers
from ._split import partition_sizes
from .distributed._ops import exchange_sizes

_REDUCTIONS = ("none", "mean", "sum")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype (float64 for float64 logits, else float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _stream(t: torch.Tensor) -> int:
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def check_same_device(logits: torch.Tensor, target: torch.Tensor) -> None:
    """Raise ``F.cross_entropy``'s error when ``target`` is not on the logits' device.

    The native kernels dereference the target's data pointer on the logits' device: a host
    pointer handed to the CUDA kernel (or a device pointer to the CPU one) is a crash, not an error.

    Raises
    ------
    RuntimeError
        If the devices differ.
    """
    if target.device != logits.device:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{logits.device} and {target.device}! (target of the vocab-parallel cross-entropy)"
        )


def native_stats(
    x: torch.Tensor, target: torch.Tensor, vstart: int, weight: torch.Tensor | None, want_sum: bool
) -> torch.Tensor:
    """Per-row local ``(max, sum exp(x - max), target logit, sum w*x)`` of 2-D logits ``x``."""
    n, c = x.shape
    out = torch.empty((n, 4), dtype=acc_dtype(x.dtype), device=x.device)
    wp = 0 if weight is None else weight.data_ptr()
    args = (x.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), vstart, wp, want_sum, out.data_ptr())
    if x.device.type == "cuda":
        with torch.cuda.device(x.device):  # launch on the tensor's device, whatever the current one
            _shardlayers.xent_stats_cuda(*args, _stream(x))
    else:
        _shardlayers.xent_stats_cpu(*args)
    return out


def native_grad(
    x: torch.Tensor, target: torch.Tensor, vstart: int, weight: torch.Tensor | None, coef: torch.Tensor
) -> torch.Tensor:
    """Gradient ``a * exp(x - m) - cw * w - [j == t] ct`` per row (``coef = [m, a, ct, cw]``: the
    row's global max and ``a = cp / sum exp(x - m)``)."""
    n, c = x.shape
    grad = torch.empty((n, c), dtype=x.dtype, device=x.device)
    wp = 0 if weight is None else weight.data_ptr()
    args = (x.data_ptr(), grad.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), vstart, wp)
    if x.device.type == "cuda":
        with torch.cuda.device(x.device):
            _shardlayers.xent_grad_cuda(*args, coef.data_ptr(), _stream(x))
    else:
        _shardlayers.xent_grad_cpu(*args, coef.data_ptr())
    return grad


def merge_stats(allst: torch.Tensor) -> torch.Tensor:
    """Merge per-shard row statistics into the whole rows' statistics.

    Parameters
    ----------
    allst : torch.Tensor
        ``[p, N, 4]``: each vocabulary shard's ``(max, sum exp(x - max), target logit, sum w*x)``
        per row, as :func:`native_stats` returns them (a shard without the row's target holds 0
        there; a shard whose classes are all masked holds ``(-inf, 0, ...)``).

    Returns
    -------
    torch.Tensor
        ``[N, 4]``: the global ``(max, sum exp(x - max), target logit, sum w*x)``; the max of a row
        masked on every shard is 0 (its sum is 0).
    """
    m = allst[..., 0]
    big = m.max(dim=0).values
    safe = torch.where(torch.isinf(big), torch.zeros_like(big), big)
    scale = torch.where(allst[..., 1] > 0, torch.exp(m - safe), torch.zeros_like(m))
    s = (allst[..., 1] * scale).sum(0)
    rest = allst[..., 2:].sum(0)
    return torch.cat([safe.unsqueeze(-1), s.unsqueeze(-1), rest], dim=-1)


def _combine(stats: torch.Tensor, group: Any, p: int) -> torch.Tensor:
    """Merge the per-rank (m, s, xt, swx) rows into global (M, S, xt, swx)."""
    if p == 1:
        return stats
    bufs = [torch.empty_like(stats) for _ in range(p)]
    dist.all_gather(bufs, stats.contiguous(), group=group)
    return merge_stats(torch.stack(bufs))


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Forward computes loss and the (unscaled) gradient; backward only scales it."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None,
        ignore_index: int,
        reduction: str,
        label_smoothing: float,
        group: Any,
        num_classes: int | None = None,
    ) -> torch.Tensor:
        p = 1 if group is None else int(dist.get_world_size(group))
        rank = 0 if group is None else int(dist.get_rank(group))
        c_local = logits.shape[-1]
        x = logits.reshape(-1, c_local)
        # the native row pass reads rows at x + r * row_stride with unit column stride and needs
        # row_stride >= columns; other layouts (transposed, or expanded logits whose rows share
        # memory: row stride 0) are copied here, as F.cross_entropy computes them too. The copy
        # costs one (rows x local classes) buffer of the logits' dtype for the call.
        if x.stride(-1) != 1 or x.stride(0) < c_local:
            x = x.contiguous()
        t = target.reshape(-1).to(torch.int64).contiguous()
        if num_classes is None:
            sizes = exchange_sizes(c_local, group) if p > 1 else [c_local]
            n_classes, vstart, c_valid = sum(sizes), sum(sizes[:rank]), c_local
        else:
            # a padded vocabulary (shardlayers' layout): every rank holds its torch.chunk share of
            # the real classes first, then padding columns that are left out of the loss
            sizes = partition_sizes(int(num_classes), p)
            n_classes, vstart, c_valid = int(num_classes), sum(sizes[:rank]), sizes[rank]
            if c_valid > c_local:
                raise ValueError(f"logits have {c_local} local classes, fewer than this rank's {c_valid} real ones")
        x_valid = x if c_valid == c_local else x[:, :c_valid]
        valid = t != ignore_index
        if t.numel():
            bad = valid & ((t < 0) | (t >= n_classes))
            if bool(bad.any()):
                idx = int(t[bad][0].item())
                raise IndexError(f"target {idx} is out of bounds for {n_classes} classes")
        acc = acc_dtype(x.dtype)
        w_local = None
        if weight is not None:
            if weight.dim() != 1 or weight.shape[0] != n_classes:
                raise ValueError(f"weight must have shape ({n_classes},), got {tuple(weight.shape)}")
            weight = weight.to(device=x.device, dtype=acc)
            w_local = weight.narrow(0, vstart, c_valid).contiguous()
        eps = float(label_smoothing)
        if c_valid > 0:
            local_stats = native_stats(x_valid, t, vstart, w_local, eps > 0)
        else:  # no real class here (an empty shard, or padding only): contributes nothing
            local_stats = torch.zeros((x.shape[0], 4), dtype=acc, device=x.device)
            local_stats[:, 0] = float("-inf")
        stats = _combine(local_stats, group, p)
        # max and log(sum) stay apart, as in F.cross_entropy's (x - max) - log(sum): one float32
        # lse = max + log(sum) rounds to ~1e-4 at |logits| ~ 2000, and that error lands in exp()
        m, s = stats[:, 0], stats[:, 1]
        log_s = torch.log(s)
        xt, swx = stats[:, 2], stats[:, 3]
        vf = valid.to(acc)
        tc = torch.where(valid, t, torch.zeros_like(t))
        w_t = weight.gather(0, tc) * vf if weight is not None else vf
        w_sum = weight.sum() if weight is not None else torch.tensor(float(n_classes), dtype=acc, device=x.device)
        zero = torch.zeros_like(m)
        rows = (1.0 - eps) * w_t * torch.where(valid, (m - xt) + log_s, zero)
        if eps > 0:
            rows = rows + (eps / n_classes) * torch.where(valid, (w_sum * m - swx) + w_sum * log_s, zero)
        if reduction == "none":
            loss = rows.reshape(target.shape)
            scale = torch.ones_like(m)
        elif reduction == "sum":
            loss = rows.sum()
            scale = torch.ones_like(m)
        else:
            denom = w_t.sum()
            loss = rows.sum() / denom
            scale = (1.0 / denom).expand_as(m)
        cp = scale * ((1.0 - eps) * w_t + (eps / n_classes) * w_sum * vf)
        ct = scale * (1.0 - eps) * w_t
        cw = scale * (eps / n_classes) * vf
        # the kernel writes a * exp(x - max) - cw * w - [j == t] * ct: with a = cp / sum that is
        # cp * exp((x - max) - log(sum)) without a rounded lse in the exponent (a = 0 keeps a row
        # that contributes nothing exactly 0, whatever its sum)
        a = torch.where(cp != 0, cp / s, zero)
        coef = torch.stack([torch.where(valid, m, zero), a, ct, cw], dim=-1).contiguous()
        if c_valid == c_local:
            grad = native_grad(x, t, vstart, w_local, coef)
        else:  # padded columns get no gradient
            grad = torch.zeros_like(x, memory_format=torch.contiguous_format)
            if c_valid > 0:
                grad[:, :c_valid] = native_grad(x_valid, t, vstart, w_local, coef)
        ctx.save_for_backward(grad)
        ctx.reduction = reduction
        ctx.shape = logits.shape
        ctx.scaled = False
        if logits.dtype in (torch.float16, torch.bfloat16):
            return loss.to(torch.float32)
        return loss.to(logits.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (grad,) = ctx.saved_tensors
        if ctx.reduction == "none":
            factor = g.reshape(-1, 1).to(grad.dtype)
        else:
            if bool((g == 1).all()):
                return grad.view(ctx.shape), None, None, None, None, None, None, None
            factor = g.to(grad.dtype)
        if ctx.scaled:
            raise RuntimeError("parallel_cross_entropy: backward through the same loss twice is not supported")
        ctx.scaled = True
        grad.mul_(factor)  # in place: the buffer is ours, no second copy of the logits
        return grad.view(ctx.shape), None, None, None, None, None, None, None
