"""Tensor methods whose Python binding sets a CUDA device guard before dispatching, as aten ops.

Without a CUDA runtime those guards fail on a fake CUDA tensor (which needs none), so
:class:`~distx_fake.fake.FakeTensor` reroutes these methods (``_GUARDED``) to the aten ops or
Python equivalents here. ``_cuda0`` / ``_tensor_cuda`` do the same for the device arguments of
``Tensor.to`` / ``Tensor.cuda`` (used by ``_fake_cuda``).
"""

from __future__ import annotations

from typing import Any

import torch

from ._fake_state import _CPU

_aten = torch.ops.aten


def _basic_index(x: torch.Tensor, index: Any) -> tuple[torch.Tensor, list[Any]]:
    """Apply the basic part of a Python index with aten view ops; return the advanced part.

    Returns ``(view, indices)`` where ``indices`` is ``[]`` if the index was basic only, else
    the ``aten.index`` list (``None`` for the dims not indexed by a tensor).
    """
    items = list(index) if isinstance(index, tuple) else [index]
    n_used = sum(1 for i in items if i is not None and i is not Ellipsis and not isinstance(i, bool))
    out, dim, adv = x, 0, {}
    for it in items:
        if it is Ellipsis:
            dim += x.dim() - n_used
        elif it is None:
            out = _aten.unsqueeze.default(out, dim)
            dim += 1
        elif isinstance(it, bool):
            raise IndexError("indexing a fake CUDA tensor with a Python bool is not supported")
        elif isinstance(it, int):
            out = _aten.select.int(out, dim, it)
        elif isinstance(it, slice):
            step = 1 if it.step is None else it.step
            out = _aten.slice.Tensor(out, dim, it.start, it.stop, step)
            dim += 1
        else:  # tensor or sequence: advanced indexing
            t = it if isinstance(it, torch.Tensor) else torch.tensor(it, device=_CPU)
            adv[dim] = t
            dim += 1
    if not adv:
        return out, []
    return out, [adv.get(d) for d in range(max(adv) + 1)]


def _getitem(x: torch.Tensor, index: Any) -> torch.Tensor:
    out, indices = _basic_index(x, index)
    return _aten.index.Tensor(out, indices) if indices else out


def _setitem(x: torch.Tensor, index: Any, value: Any) -> None:
    out, indices = _basic_index(x, index)
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=x.dtype, device=_CPU)
    if indices:
        _aten.index_put_.default(out, indices, value)
    else:
        _aten.copy_.default(out, value)


def _new_tensor(
    self: torch.Tensor, data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> Any:
    t = torch.tensor(data, dtype=dtype or self.dtype, device=_CPU).to(_cuda0(device) or self.device)
    return t.requires_grad_(True) if requires_grad else t


_GUARDED: dict[Any, Any] = {
    torch.Tensor.contiguous: _aten.contiguous.default,
    torch.Tensor.copy_: _aten.copy_.default,
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem,
    torch.Tensor.new_tensor: _new_tensor,
}


def _cuda0(x: Any) -> Any:
    """``"cuda"`` / ``torch.device("cuda")`` -> ``cuda:0`` (other values unchanged)."""
    if isinstance(x, (str, torch.device)):
        try:
            dev = torch.device(x)
        except (RuntimeError, ValueError):
            return x
        if dev.type == "cuda" and dev.index is None:
            return torch.device("cuda", 0)
    return x


def _tensor_cuda(
    self: torch.Tensor,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: torch.memory_format = torch.preserve_format,
) -> torch.Tensor:
    """``Tensor.cuda`` as a ``Tensor.to`` (whose binding does not need a CUDA runtime)."""
    if device is None:
        dev = torch.device("cuda", 0)
    elif isinstance(device, int) and not isinstance(device, bool):
        dev = torch.device("cuda", device)
    else:
        dev = _cuda0(device)
        if not isinstance(dev, torch.device) or dev.type != "cuda":
            raise ValueError(f"Tensor.cuda: invalid device {device!r} (expected a CUDA device or index)")
    return self.to(dev, non_blocking=non_blocking, memory_format=memory_format)
