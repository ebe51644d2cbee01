"""Fake tensors (torchdistX's ``fake`` API): ``fake_mode``, ``is_fake``, ``meta_like``.

The machinery lives below: the tensor and its dispatch in ``_fake_tensor``, the shared state
and hooks in ``_fake_state``, CUDA without a CUDA runtime in ``_guarded`` and ``_fake_cuda``.
Unlike ``torch._subclasses.FakeTensorMode`` none of it imports ``torch._dynamo`` (about 70 MB
of RSS and 1.5-3 s of import time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ._fake_cuda import _FakeCudaFunctionMode, _patch_lazy_init, _restore_requires_cuda_init, _state
from ._fake_state import FakeDataError, _fake_cuda_enabled, _tls
from ._fake_tensor import FakeTensor, _FakeMode

__all__ = ["FakeDataError", "FakeTensor", "fake_mode", "is_fake", "meta_like"]


@contextlib.contextmanager
def _fake_ctx(fake_cuda: bool) -> Iterator[None]:
    stack: list[bool] | None = getattr(_tls, "cuda", None)
    if stack is None:
        stack = _tls.cuda = []
    stack.append(fake_cuda)
    depth = getattr(_tls, "depth", 0)
    no_cuda = not torch.cuda.is_available()
    if no_cuda and not depth:
        # torch initializes CUDA before dispatching a factory call with device="cuda": skipped
        # under fake_cuda, refused with a hint otherwise (restored on exit)
        _patch_lazy_init(True)
    patched = fake_cuda and no_cuda
    _tls.depth = depth + 1
    try:
        with _FakeCudaFunctionMode() if patched else contextlib.nullcontext():
            if depth:
                # already inside one of our fake modes (maybe under deferred_init's recorder):
                # pushing another would put it above the recorder and hide ops from it
                yield
            else:
                with _FakeMode():
                    yield
    finally:
        _tls.depth = depth
        stack.pop()
        if patched and not _fake_cuda_enabled() and _state.swallowed_init:
            _state.swallowed_init = False
            _restore_requires_cuda_init()
        if no_cuda and not depth:
            _patch_lazy_init(False)


@contextlib.contextmanager
def fake_mode(*, fake_cuda: bool = False) -> Iterator[None]:
    """Construct every tensor inside the block as a fake tensor (no storage is allocated).

    Parameters
    ----------
    fake_cuda : bool, optional
        Allow CUDA tensors to be faked even when no GPU (or no CUDA build) is present.
        The flag is restored on exit; nested blocks each set their own value.

    Yields
    ------
    None
        Control to the block, with fake construction active.

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
    """Return ``True`` if ``tensor`` is a fake tensor (ours or torch's ``FakeTensor``).

    Parameters
    ----------
    tensor : object
        Anything; non-tensors are simply not fake.

    Returns
    -------
    bool
        Whether ``tensor`` is a fake tensor; never raises.
    """
    if isinstance(tensor, FakeTensor):
        return True
    if not isinstance(tensor, torch.Tensor) or type(tensor) is torch.Tensor:
        return False
    return type(tensor).__name__ == "FakeTensor" and type(tensor).__module__.startswith("torch._subclasses")


def meta_like(fake: torch.Tensor) -> torch.Tensor:
    """Return a meta tensor with the same size, stride and dtype as ``fake``.

    As in torchdistX it behaves like ``detach()``: the result does not require grad.

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
        what = f"a real {type(fake).__name__}" if isinstance(fake, torch.Tensor) else type(fake).__name__
        raise ValueError(f"`fake` was expected to be a fake tensor; meta_like got {what}")
    # like detach(): the result is not part of the autograd graph (requires_grad=False)
    return torch.empty_strided(fake.size(), fake.stride(), dtype=fake.dtype, device="meta")
