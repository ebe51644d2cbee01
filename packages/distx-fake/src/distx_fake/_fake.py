"""Fake tensors: a light wrapper subclass over meta tensors with torchdistX's API.

A :class:`FakeTensor` reports the device it pretends to live on (``cpu``, ``cuda``...) and
carries a ``meta`` tensor (``_elem``) with the same size, strides and dtype, so every op is
computed by torch's own meta kernels: shapes, dtypes, views and aliasing are exact and no
storage is ever allocated.  Factory functions are redirected by :class:`_FakeMode` (a
``TorchDispatchMode``); ops on fake tensors outside the mode go through
``FakeTensor.__torch_dispatch__``.  Unlike ``torch._subclasses.FakeTensorMode`` this does not
import ``torch._dynamo`` (about 70 MB of RSS and 1.5-3 s of import time).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FakeDataError", "FakeTensor", "fake_mode", "is_fake", "meta_like"]

_NO_DATA = (
    "cannot read the values of a fake tensor: fake tensors have no storage "
    "(materialize it first, e.g. with distx_fake.deferred_init.materialize_tensor)"
)
_META = torch.device("meta")
_CPU = torch.device("cpu")
_aten = torch.ops.aten
_DATA_READS = {_aten._local_scalar_dense.default, _aten.equal.default}

_tls = threading.local()


class FakeDataError(RuntimeError):
    """Raised when the data of a fake tensor is read (``.item()``, ``.tolist()``, ``.numpy()``)."""


def _fake_cuda_enabled() -> bool:
    stack: list[bool] | None = getattr(_tls, "cuda", None)
    return bool(stack and stack[-1])


class FakeTensor(torch.Tensor):
    """A tensor without storage: metadata of a real tensor on ``device``, backed by a meta tensor."""

    _elem: torch.Tensor
    __slots__ = ()

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=device,
            requires_grad=elem.requires_grad,
        )
        r._elem = elem
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        parts = [f"size={tuple(self.shape)}"]
        if self.dtype != torch.get_default_dtype():
            parts.append(f"dtype={self.dtype}")
        dev = self.device
        if dev.type != "cpu":
            parts.append(f"device={dev.type}" if dev.index in (None, 0) else f"device={dev}")
        if self.requires_grad:
            parts.append("requires_grad=True")
        parts.append("fake=True")
        text = "tensor(..., " + ", ".join(parts) + ")"
        if getattr(self, "_is_param", False):
            text = "Parameter containing:\n" + text
        return text

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise FakeDataError(f"{_NO_DATA} [.numpy()]")

    def tolist(self) -> Any:
        raise FakeDataError(f"{_NO_DATA} [.tolist()]")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise FakeDataError(f"{_NO_DATA} [numpy conversion]")

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        # a clone through the dispatcher (so deferred_init records it), keeping Parameter-ness
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone(memory_format=torch.preserve_format)
        if getattr(self, "_is_param", False):
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        elif self.requires_grad:
            new.requires_grad_(True)
        memo[id(self)] = new
        return new

    def untyped_storage(self) -> torch.UntypedStorage:
        return self._elem.untyped_storage()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        return run_fake(func, args, kwargs or {})


def _to_meta(x: Any) -> Any:
    if isinstance(x, FakeTensor):
        return x._elem
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return x
        # a real tensor mixed into a fake computation: only its metadata matters
        m = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=_META)
        return m.requires_grad_(x.requires_grad) if x.requires_grad and x.is_floating_point() else m
    if isinstance(x, torch.device):
        return _META
    return x


def _map(fn: Any, x: Any) -> Any:
    """A light tree_map over the tuples/lists/dicts found in aten arguments and results."""
    t = type(x)
    if t is tuple or t is list:
        return t(_map(fn, v) for v in x)
    if t is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def _leaves(x: Any, out: list[Any] | None = None) -> list[Any]:
    """The leaves of nested tuples/lists/dicts, in :func:`_map` order."""
    if out is None:
        out = []
    t = type(x)
    if t is tuple or t is list:
        for v in x:
            _leaves(v, out)
    elif t is dict:
        for v in x.values():
            _leaves(v, out)
    else:
        out.append(x)
    return out


def _target_device(args: Any, kwargs: dict[str, Any]) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None:
        dev = torch.device(dev)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", 0)
        return dev
    for a in args:
        if isinstance(a, FakeTensor):
            return a.device
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, FakeTensor):
                    return b.device
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return _CPU


_HAS_DEVICE_ARG: dict[Any, bool] = {}


def _has_device_arg(func: Any) -> bool:
    got = _HAS_DEVICE_ARG.get(func)
    if got is None:
        schema = getattr(func, "_schema", None)
        got = _HAS_DEVICE_ARG[func] = schema is not None and any(a.name == "device" for a in schema.arguments)
    return got


def is_real_op(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """``True`` if torchdistX's fake handler would run ``func`` on the real backend.

    That is the case when the op has tensor arguments, none of them fake, and no ``device``
    argument: e.g. ``real.add_(1)`` inside ``fake_mode`` really updates ``real``.
    """
    if _has_device_arg(func):
        return False
    leaves = _leaves(args) + (_leaves(kwargs) if kwargs else [])
    has_tensor = False
    for x in leaves:
        if isinstance(x, FakeTensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.device.type == "meta":
                return False
            has_tensor = True
    return has_tensor


def run_fake(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on the meta tensors behind ``args`` and wrap the results as fake tensors.

    As in torchdistX, an op whose tensor arguments are all real and which has no ``device``
    argument runs for real (only factories and ops touching a fake tensor are faked).
    """
    if is_real_op(func, args, kwargs):
        return func(*args, **kwargs)
    if func in _DATA_READS:
        raise FakeDataError(f"{_NO_DATA} [{func}]")
    dev = _target_device(args, kwargs)
    if dev.type == "cuda" and not _fake_cuda_enabled() and not torch.cuda.is_available():
        raise RuntimeError(
            f"{func}: cannot create a tensor on device {str(dev)!r}: CUDA is not available; "
            "use fake_mode(fake_cuda=True) to fake CUDA tensors on this machine"
        )
    if func in _INPLACE_RANDOM or _is_inplace_random(func):
        # metadata is unchanged: skip the meta kernel (several live in torch._refs, whose
        # wrappers import torch._dynamo on first use)
        return args[0]
    if func in _SAME_META:
        # shape-preserving ops whose meta kernel lives in torch._refs (see above)
        src = args[0]
        elem = torch.empty_like(_to_meta(src), memory_format=torch.contiguous_format)
        return FakeTensor(elem, dev)
    by_elem: dict[int, FakeTensor] = {}
    for a in args:
        if isinstance(a, FakeTensor):
            by_elem[id(a._elem)] = a
    margs = _map(_to_meta, args)
    mkwargs = _map(_to_meta, kwargs) if kwargs else kwargs
    # our own modes are popped while their handler runs, so this reaches the meta kernels
    out = func(*margs, **mkwargs)

    def wrap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            same = by_elem.get(id(x))
            return same if same is not None else FakeTensor(x, dev)
        return x

    return _map(wrap, out)


_SAME_META = {_aten.tril.default, _aten.triu.default}
_INPLACE_RANDOM: set[Any] = {_aten.tril_.default, _aten.triu_.default}
_NOT_INPLACE_RANDOM: set[Any] = set()


def _is_inplace_random(func: Any) -> bool:
    if func in _NOT_INPLACE_RANDOM:
        return False
    schema = func._schema
    ok = (
        torch.Tag.nondeterministic_seeded in func.tags
        and bool(schema.arguments)
        and schema.arguments[0].alias_info is not None
        and schema.arguments[0].alias_info.is_write
        and len(schema.returns) == 1
    )
    (_INPLACE_RANDOM if ok else _NOT_INPLACE_RANDOM).add(func)
    return ok


class _FakeMode(TorchDispatchMode):
    """Redirects every op (factories included) to meta and returns fake tensors."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # do not wrap __torch_dispatch__ in torch._dynamo.disable: that imports torch._dynamo
        # (~70 MB, 1.5-3 s) on first use, and this mode is never traced
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return run_fake(func, args, kwargs or {})


_orig_lazy_init = torch.cuda._lazy_init


def _no_lazy_init() -> None:
    if not _fake_cuda_enabled():
        _orig_lazy_init()


@contextlib.contextmanager
def _fake_ctx(fake_cuda: bool) -> Iterator[None]:
    stack: list[bool] | None = getattr(_tls, "cuda", None)
    if stack is None:
        stack = _tls.cuda = []
    stack.append(fake_cuda)
    patched = fake_cuda and not torch.cuda.is_available()
    if patched:
        # torch initializes CUDA before dispatching a factory call with device="cuda";
        # faking CUDA on a machine without it means skipping that (restored on exit)
        torch.cuda._lazy_init = _no_lazy_init
    depth = getattr(_tls, "depth", 0)
    _tls.depth = depth + 1
    try:
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
        if patched and not any(stack):
            torch.cuda._lazy_init = _orig_lazy_init


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
    """Return ``True`` if ``tensor`` is a fake tensor (ours or torch's ``FakeTensor``).

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
