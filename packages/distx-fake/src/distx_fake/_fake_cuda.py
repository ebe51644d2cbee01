"""Faking CUDA tensors on a machine without CUDA (``fake_mode(fake_cuda=True)``).

Two things stand between torch and a fake CUDA tensor there: Python bindings that query the
CUDA runtime before any op is dispatched (rerouted by :class:`_FakeCudaFunctionMode`), and
torch's lazy CUDA initialisation (``torch.cuda._lazy_init``, patched while fake blocks run and
reset afterwards through ``ctypes``, see :func:`_restore_requires_cuda_init`).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ._fake_state import _CPU, _fake_cuda_enabled, _tls
from ._fake_tensor import _cuda_autograd, _without_autograd
from ._guarded import _cuda0, _tensor_cuda

_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}


class _FakeCudaFunctionMode(TorchFunctionMode):
    """Lets the Python bindings that need a CUDA runtime fake CUDA tensors without one.

    Active only inside ``fake_mode(fake_cuda=True)`` on a machine without CUDA. torch's
    bindings of ``Tensor.to("cuda")`` (a device without index), ``Tensor.cuda()`` and
    ``torch.tensor(..., device="cuda")`` query or copy to the CUDA runtime before any op is
    dispatched, so they fail before the fake mode sees them; here the device becomes
    ``cuda:0``, ``.cuda()`` becomes ``.to``, and data-taking factories build the tensor on the
    CPU first and then move it, which the fake mode answers with a fake CUDA tensor.
    """

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not _fake_cuda_enabled():
            return func(*args, **kwargs)
        if torch.is_grad_enabled() and _cuda_autograd(args, kwargs):
            return _without_autograd(func, lambda: self._call(func, args, kwargs))
        return self._call(func, args, kwargs)

    @staticmethod
    def _call(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if func is torch.Tensor.to:
            args = (args[0], *(_cuda0(a) for a in args[1:]))
            if "device" in kwargs:
                kwargs = {**kwargs, "device": _cuda0(kwargs["device"])}
        elif func is torch.Tensor.cuda:
            return _tensor_cuda(*args, **kwargs)
        elif func in _FROM_DATA and kwargs.get("device") is not None:
            dev = _cuda0(kwargs["device"])
            if isinstance(dev, torch.device) and dev.type == "cuda":
                requires_grad = bool(kwargs.get("requires_grad", False))
                cpu_kwargs = {**kwargs, "device": _CPU}
                cpu_kwargs.pop("requires_grad", None)
                out = func(*args, **cpu_kwargs).to(dev)
                return out.requires_grad_(True) if requires_grad else out
        return func(*args, **kwargs)


_orig_lazy_init = torch.cuda._lazy_init
#: the C++ side of torch's lazy CUDA initialisation, by symbol (torch exposes no Python setter)
_REQUIRES_INIT_SYMBOLS = (
    "_ZN5torch5utils24set_requires_device_initEN3c1010DeviceTypeEb",  # (DeviceType, bool), torch >= 2.1
    "_ZN5torch5utils22set_requires_cuda_initEb",  # (bool), older releases
)
_CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA


def _no_lazy_init() -> None:
    """``torch.cuda._lazy_init`` while a fake block runs on a machine without CUDA."""
    if _fake_cuda_enabled():
        # torch's C++ caller now marks CUDA initialised for the rest of the process: undone
        # when the fake_cuda block ends
        _state.swallowed_init = True
        return
    if getattr(_tls, "depth", 0):
        raise RuntimeError(
            "cannot create a tensor on device 'cuda': CUDA is not available; "
            "use fake_mode(fake_cuda=True) to fake CUDA tensors on this machine"
        )
    _orig_lazy_init()


class _LazyInitState:
    """torch's lazy CUDA initialisation while fake blocks run (shared by all threads)."""

    #: a fake_cuda block let torch's C++ lazy initialisation succeed without CUDA
    swallowed_init = False
    #: fake blocks (all threads) running with ``torch.cuda._lazy_init`` patched
    users = 0


_state = _LazyInitState()
_state_lock = threading.Lock()


def _patch_lazy_init(on: bool) -> None:
    with _state_lock:
        _state.users += 1 if on else -1
        if _state.users == (1 if on else 0):
            torch.cuda._lazy_init = _no_lazy_init if on else _orig_lazy_init


def _restore_requires_cuda_init() -> None:
    """Make torch initialise CUDA again on the next CUDA call, as before the fake block.

    torch's C++ ``device_lazy_init`` calls ``torch.cuda._lazy_init`` once and then remembers
    CUDA as initialised; inside ``fake_mode(fake_cuda=True)`` that call was a no-op, so without
    this a later ``torch.ones(1, device="cuda")`` reached the dispatcher (``NotImplementedError``
    for the CUDA backend) instead of raising torch's own "Torch not compiled with CUDA" error.
    torchdistX called ``torch::utils::set_requires_cuda_init(true)`` on exit; the same function
    is called here through ``ctypes`` (the extension does not link libtorch).

    Raises
    ------
    RuntimeError
        If torch's ``libtorch_python`` exports neither setter.
    """
    lib = ctypes.CDLL(torch._C.__file__)  # already loaded: its libtorch_python symbols resolve
    for i, name in enumerate(_REQUIRES_INIT_SYMBOLS):
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue
        fn.restype = None
        if i == 0:
            fn.argtypes = [ctypes.c_int8, ctypes.c_bool]
            fn(_CUDA_DEVICE_TYPE, True)
        else:
            fn.argtypes = [ctypes.c_bool]
            fn(True)
        return
    raise RuntimeError(
        "distx_fake: cannot reset torch's lazy CUDA initialisation after fake_mode(fake_cuda=True) "
        f"(torch {torch.__version__} exports none of {_REQUIRES_INIT_SYMBOLS})"
    )
