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
from torch.overrides import TorchFunctionMode
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
#: torch's ``Tensor.data`` descriptor (FakeTensor overrides the setter)
_DATA_GETTER = torch._C.TensorBase.__dict__["data"]


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


def _real_value(t: torch.Tensor, what: str) -> torch.Tensor:
    fn = getattr(_tls, "realizer", None)
    if fn is None:
        raise FakeDataError(f"{_NO_DATA} [{what}]")
    return fn(t, what)


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

    # Reading values: while deferred_init records, the value is computed for real (a copy:
    # the tensor itself stays fake); anywhere else a fake tensor has no values to read.
    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        return _real_value(self, ".numpy()").clone().numpy(*args, **kwargs)

    def tolist(self) -> Any:
        return _real_value(self, ".tolist()").tolist()

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        return _real_value(self, "numpy conversion").detach().clone().__array__(*args, **kwargs)

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

    # ``t.data = new`` (``Module._apply``: ``.double()``, ``.half()``, ``.to(dtype)``...) swaps the
    # TensorImpl's metadata and storage in C++ without dispatching an op; the meta tensor behind
    # the wrapper, and deferred_init's record of where the value comes from, must follow.
    @property
    def data(self) -> torch.Tensor:
        return _DATA_GETTER.__get__(self, type(self))

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        if not isinstance(new, FakeTensor):
            raise TypeError(
                f"cannot assign a real {type(new).__name__} to the .data of a fake tensor "
                "(fake and real tensors do not share storage)"
            )
        then = _on_set_data(self, new)
        old = self._elem
        with torch._C.DisableTorchFunctionSubclass():
            _DATA_GETTER.__set__(self, new)
        self._elem = new._elem
        if then is not None:
            then(old)

    # Without a CUDA runtime, torch's bindings of these methods fail on a fake CUDA tensor
    # (they set a CUDA device guard before dispatching). ``__torch_function__`` reroutes them,
    # but torch runs the bodies of Python-level functions (e.g. F.multi_head_attention_forward)
    # with subclass ``__torch_function__`` disabled, so they are also overridden here.
    def contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
        if _no_cuda_fake(self):
            return _fake_cuda_call(_aten.contiguous.default, (self,), {"memory_format": memory_format})
        return super().contiguous(memory_format=memory_format)

    def __getitem__(self, index: Any) -> torch.Tensor:
        if _no_cuda_fake(self):
            return _fake_cuda_call(_getitem, (self, index), {})
        return super().__getitem__(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        if _no_cuda_fake(self):
            _fake_cuda_call(_setitem, (self, index, value), {})
            return
        super().__setitem__(index, value)

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        if _no_cuda_fake(self):
            return _fake_cuda_call(_aten.copy_.default, (self, src, non_blocking), {})
        return super().copy_(src, non_blocking)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _NO_CUDA:
            if func in _GUARDED and args and isinstance(args[0], FakeTensor):
                # these bindings set a CUDA device guard before dispatching: call the aten op
                # (or the Python equivalent) instead
                with torch._C.DisableTorchFunctionSubclass():
                    on_cuda = args[0].device.type == "cuda"
                if on_cuda:
                    func = _GUARDED[func]
            if torch.is_grad_enabled() and _cuda_autograd(args, kwargs):
                return _without_autograd(func, lambda: _plain_call(func, args, kwargs))
        return _plain_call(func, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        return run_fake(func, args, kwargs or {})


def _no_cuda_fake(t: FakeTensor) -> bool:
    """A fake CUDA tensor on a machine without CUDA."""
    if not _NO_CUDA:
        return False
    with torch._C.DisableTorchFunctionSubclass():
        return t.device.type == "cuda"


def _fake_cuda_call(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    if torch.is_grad_enabled() and _cuda_autograd(args, kwargs):
        return _without_autograd(func, lambda: _plain_call(func, args, kwargs))
    return _plain_call(func, args, kwargs)


def _plain_call(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Call ``func`` as if FakeTensor had no ``__torch_function__`` (results are not converted)."""
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


_NO_CUDA = not torch.cuda.is_available()


# Tensor methods whose Python binding sets a device guard (which needs the CUDA runtime)
# before dispatching -> the aten op (no guard; the fake tensor needs none)
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


def _cuda_autograd(args: Any, kwargs: dict[str, Any]) -> bool:
    """Would autograd record an op touching a fake CUDA tensor (or producing one)?

    Without a CUDA runtime, autograd aborts the process when it records a node for a CUDA
    tensor (it asks the missing CUDA backend for the current stream, in a ``noexcept``
    function), so such ops run without recording (see :func:`_without_autograd`).
    """
    grad = cuda = False
    with torch._C.DisableTorchFunctionSubclass():  # plain attribute reads below
        for x in _leaves(args) + (_leaves(kwargs) if kwargs else []):
            if isinstance(x, torch.Tensor):
                grad = grad or x.requires_grad
                cuda = cuda or (isinstance(x, FakeTensor) and x.device.type == "cuda")
            elif isinstance(x, torch.device):
                cuda = cuda or x.type == "cuda"
            elif isinstance(x, str):
                cuda = cuda or x == "cuda" or x.startswith("cuda:")
    return grad and cuda


# functions whose outputs never require grad, whatever their inputs
_NO_GRAD_OUT = {"detach", "detach_", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like"}
_NO_GRAD_OUT |= {"randn_like", "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"}
_NO_GRAD_OUT |= {"new_empty_strided", "requires_grad_"}


def _without_autograd(func: Any, call: Any) -> Any:
    """Run ``call()`` under ``no_grad``; new floating outputs then require grad (as they would).

    Fake tensors hold no values, so the only thing autograd would add is ``grad_fn``;
    ``requires_grad`` stays as torch would set it (``detach``, ``.data`` and the ``*_like`` /
    ``new_*`` factories excepted, as in torch).
    """
    with torch.no_grad():
        out = call()
    if getattr(func, "__name__", "") in _NO_GRAD_OUT or getattr(func, "__self__", None) is _DATA_GETTER:
        return out
    with torch._C.DisableTorchFunctionSubclass():
        for t in _leaves(out):
            if isinstance(t, FakeTensor) and not t.requires_grad and (t.is_floating_point() or t.is_complex()):
                with contextlib.suppress(RuntimeError):
                    t.requires_grad_(True)
    return out


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
    if dev.type == "cuda" and kwargs.get("device") is not None and not _fake_cuda_enabled() and _NO_CUDA:
        # creating a CUDA tensor (ops on existing fake CUDA tensors keep working anywhere)
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
    import ctypes

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
