"""Fake tensors: torch's ``FakeTensorMode`` with torchdistX's API, printing and CUDA faking.

One process-wide :class:`_DistxFakeMode` (a ``FakeTensorMode`` subclass) backs every fake tensor
this package creates, so tensors made in different ``fake_mode()`` blocks (or by
``deferred_init``) can be mixed freely, and nesting costs nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    FakeTensor,
    FakeTensorMode,
)

__all__ = ["fake_mode", "is_fake", "meta_like"]

_NO_DATA = (
    "cannot read the values of a fake tensor: fake tensors have no storage "
    "(materialize it first, e.g. with distx_fake.deferred_init.materialize_tensor)"
)


class FakeDataError(RuntimeError):
    """Raised when the data of a fake tensor is read (``.item()``, ``.tolist()``, ``.numpy()``)."""


class _DistxFakeMode(FakeTensorMode):
    """``FakeTensorMode`` that honours the ``fake_cuda`` flag and reports data reads clearly."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self._local = threading.local()

    @property
    def fake_cuda(self) -> bool:
        stack: list[bool] = getattr(self._local, "cuda_stack", [])
        return bool(stack and stack[-1])

    def push_cuda(self, flag: bool) -> None:
        stack: list[bool] = getattr(self._local, "cuda_stack", None) or []
        stack.append(flag)
        self._local.cuda_stack = stack

    def pop_cuda(self) -> None:
        self._local.cuda_stack.pop()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Any = (),
        kwargs: Any = None,
    ) -> Any:
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and not self.fake_cuda and _is_cuda(dev) and not torch.cuda.is_available():
            raise RuntimeError(
                f"{func}: cannot create a tensor on device {str(dev)!r}: CUDA is not available; "
                "use fake_mode(fake_cuda=True) to fake CUDA tensors on this machine"
            )
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        except DataDependentOutputException as e:
            raise FakeDataError(f"{_NO_DATA} [{func}]") from e


def _is_cuda(dev: Any) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    return isinstance(dev, str) and dev.startswith("cuda")


_MODE: _DistxFakeMode | None = None
_MODE_LOCK = threading.Lock()


def _mode() -> _DistxFakeMode:
    global _MODE
    if _MODE is None:
        with _MODE_LOCK:
            if _MODE is None:
                _MODE = _DistxFakeMode()
                _install_patches()
    return _MODE


@contextlib.contextmanager
def _fake_ctx(fake_cuda: bool) -> Iterator[_DistxFakeMode]:
    mode = _mode()
    mode.push_cuda(fake_cuda)
    try:
        with mode:
            yield mode
    finally:
        mode.pop_cuda()


@contextlib.contextmanager
def fake_mode(*, fake_cuda: bool = False) -> Iterator[None]:
    """Construct every tensor inside the block as a fake tensor (no storage is allocated).

    Parameters
    ----------
    fake_cuda : bool, optional
        Allow CUDA tensors to be faked even when no GPU (or no CUDA build) is present.
        The flag is restored on exit; nested blocks each set their own value.

    Raises
    ------
    TypeError
        If ``fake_cuda`` is not a bool.

    Examples
    --------
    >>> with fake_mode():
    ...     a = torch.ones(10)
    >>> a
    tensor(..., size=(10,), fake=True)
    """
    if not isinstance(fake_cuda, bool):
        raise TypeError(f"fake_cuda must be a bool, got {type(fake_cuda).__name__}")
    with _fake_ctx(fake_cuda):
        yield


def is_fake(tensor: Any) -> bool:
    """Return ``True`` if ``tensor`` is a fake tensor.

    Parameters
    ----------
    tensor : object
        Anything; non-tensors are simply not fake.

    Returns
    -------
    bool

    Raises
    ------
    None
    """
    return isinstance(tensor, FakeTensor)


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """Return a meta tensor with the same size, stride, dtype and ``requires_grad`` as ``fake``.

    Parameters
    ----------
    fake : torch.Tensor
        A fake tensor.

    Returns
    -------
    torch.Tensor
        A tensor on the ``meta`` device.

    Raises
    ------
    ValueError
        If ``fake`` is not a fake tensor.
    """
    if not is_fake(fake):
        raise ValueError(f"meta_like expects a fake tensor, got a real {type(fake).__name__}")
    out = torch.empty_strided(fake.size(), fake.stride(), dtype=fake.dtype, device="meta")
    if fake.requires_grad:
        out.requires_grad_(True)
    return out


def _fake_repr(t: torch.Tensor) -> str:
    parts = [f"size={tuple(t.shape)}"]
    if t.dtype != torch.get_default_dtype():
        parts.append(f"dtype={t.dtype}")
    if t.device.type != "cpu":
        dev = t.device
        parts.append(f"device={dev.type}" if dev.index in (None, 0) else f"device={dev}")
    if t.requires_grad:
        parts.append("requires_grad=True")
    parts.append("fake=True")
    text = "tensor(..., " + ", ".join(parts) + ")"
    if getattr(t, "_is_param", False):
        text = "Parameter containing:\n" + text
    return text


def _ours(t: Any) -> bool:
    return isinstance(t, FakeTensor) and isinstance(getattr(t, "fake_mode", None), _DistxFakeMode)


def _install_patches() -> None:
    """Give *our* fake tensors torchdistX's repr and clear errors for data reads.

    The patches leave torch's own FakeTensors (made by other FakeTensorMode instances) untouched.
    """
    orig_repr = FakeTensor.__repr__
    orig_numpy = FakeTensor.numpy

    def __repr__(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        if _ours(self):
            return _fake_repr(self)
        return orig_repr(self, *args, **kwargs)

    def numpy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _ours(self):
            raise FakeDataError(f"{_NO_DATA} [.numpy()]")
        return orig_numpy(self, *args, **kwargs)

    FakeTensor.__repr__ = __repr__  # type: ignore[method-assign]
    FakeTensor.numpy = numpy  # type: ignore[method-assign]
