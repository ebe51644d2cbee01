"""Helpers shared by the spawned test bodies."""

from __future__ import annotations

from typing import Any

import torch


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5, what: str = "") -> None:
    a = a.detach().to(torch.float64).as_subclass(torch.Tensor)
    b = b.detach().to(torch.float64).as_subclass(torch.Tensor)
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True), f"{what}: max abs err {err}"


def shard(t: torch.Tensor, axis: int, p: int, r: int) -> torch.Tensor:
    """Rank r's piece of t along axis, cut as torch.chunk / DTensor Shard cut it."""
    n = t.shape[axis]
    chunk = -(-n // p)
    start = min(n, r * chunk)
    return t.narrow(axis, start, max(0, min(chunk, n - start)))


def raises(exc: type[BaseException], fn: Any, *args: Any, match: str = "", **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except exc as e:
        msg = str(e)
        if match.lower() not in msg.lower():
            raise AssertionError(f"expected {match!r} in {msg!r}") from e
        return
    raise AssertionError(f"{fn} did not raise {exc.__name__}")
