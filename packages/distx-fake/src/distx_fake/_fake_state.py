"""What the fake-tensor modules share: per-thread state, the hooks deferred_init installs, the data error.

Below every other module of the fake-tensor machinery (``_fake_tensor``, ``_fake_cuda``, ``_fake``)
and of deferred_init, so that none of them imports another to reach this state.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_NO_DATA = (
    "cannot read the values of a fake tensor: fake tensors have no storage "
    "(materialize it first, e.g. with distx_fake.deferred_init.materialize_tensor)"
)
_META = torch.device("meta")
_CPU = torch.device("cpu")
#: no CUDA runtime in this process: fake CUDA tensors need the workarounds of ``_guarded`` / ``_fake_cuda``
_NO_CUDA = not torch.cuda.is_available()

#: per thread: ``depth`` (nesting of fake blocks), ``cuda`` (stack of their fake_cuda flags),
#: ``realizer`` (deferred_init's value reader while it records)
_tls = threading.local()


class FakeDataError(RuntimeError):
    """Raised when the data of a fake tensor is read (``.item()``, ``.tolist()``, ``.numpy()``)."""


def set_realizer(fn: Any) -> Any:
    """Install ``fn(fake) -> real tensor`` (deferred_init while it records); return the previous one."""
    prev = getattr(_tls, "realizer", None)
    _tls.realizer = fn
    return prev


def set_data_listener(fn: Any) -> None:
    """Install ``fn(fake, new)``, asked before ``fake.data = new`` (deferred_init's graph).

    It may raise to refuse the assignment; it returns ``None`` or a callable run with the old
    meta tensor once the assignment is done.
    """
    global _on_set_data
    _on_set_data = fn


def _no_listener(t: torch.Tensor, new: torch.Tensor) -> None:
    return None


_on_set_data: Any = _no_listener


def notify_set_data(t: torch.Tensor, new: torch.Tensor) -> Any:
    """Ask the installed listener (:func:`set_data_listener`) about ``t.data = new``; its answer."""
    return _on_set_data(t, new)


def _real_value(t: torch.Tensor, what: str) -> torch.Tensor:
    fn = getattr(_tls, "realizer", None)
    if fn is None:
        raise FakeDataError(f"{_NO_DATA} [{what}]")
    return fn(t, what)


def _fake_cuda_enabled() -> bool:
    stack: list[bool] | None = getattr(_tls, "cuda", None)
    return bool(stack and stack[-1])
