"""The fake tensor and how ops on it run.

A :class:`FakeTensor` reports the device it pretends to live on (``cpu``, ``cuda``...) and
carries a ``meta`` tensor (``_elem``) with the same size, strides and dtype, so every op is
computed by torch's own meta kernels (:func:`run_fake`): shapes, dtypes, views and aliasing are
exact and no storage is ever allocated. Factory functions are redirected by :class:`_FakeMode`
(a ``TorchDispatchMode``); ops on fake tensors outside the mode go through
``FakeTensor.__torch_dispatch__``. Without a CUDA runtime, ops touching a fake CUDA tensor run
without autograd recording (:func:`_without_autograd`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._fake_state import (
    _CPU,
    _META,
    _NO_CUDA,
    _NO_DATA,
    FakeDataError,
    _fake_cuda_enabled,
    _real_value,
    notify_set_data,
)
from ._guarded import _GUARDED, _getitem, _setitem
from ._tree import _leaves, _map

_aten = torch.ops.aten
#: ops that read a tensor's values (refused on fake tensors)
_DATA_READS = {_aten._local_scalar_dense.default, _aten.equal.default}
#: torch's ``Tensor.data`` descriptor (FakeTensor overrides the setter)
_DATA_GETTER = torch._C.TensorBase.__dict__["data"]


class FakeTensor(torch.Tensor):
    """A tensor without storage: metadata of a real tensor on ``device``, backed by a meta tensor.

    Parameters
    ----------
    elem : torch.Tensor
        The meta tensor that holds the shape, strides and dtype.
    device : torch.device
        The device the fake tensor reports.
    """

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
        """The values as a NumPy array: only while deferred_init records (a real copy).

        Parameters
        ----------
        *args, **kwargs
            As for ``torch.Tensor.numpy``.

        Returns
        -------
        numpy.ndarray
            The values recorded so far.

        Raises
        ------
        FakeDataError
            Outside deferred_init's recording (a fake tensor has no values).
        """
        return _real_value(self, ".numpy()").clone().numpy(*args, **kwargs)

    def tolist(self) -> Any:
        """The values as nested lists: only while deferred_init records.

        Returns
        -------
        list or number
            The values recorded so far.

        Raises
        ------
        FakeDataError
            Outside deferred_init's recording.
        """
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
        """The storage of the meta tensor behind this one (no memory).

        Returns
        -------
        torch.UntypedStorage
            A meta storage of the right size.
        """
        return self._elem.untyped_storage()

    # ``t.data = new`` (``Module._apply``: ``.double()``, ``.half()``, ``.to(dtype)``...) swaps the
    # TensorImpl's metadata and storage in C++ without dispatching an op; the meta tensor behind
    # the wrapper, and deferred_init's record of where the value comes from, must follow.
    @property
    def data(self) -> torch.Tensor:
        """The tensor without autograd history; assigning another fake tensor swaps the metadata."""
        return _DATA_GETTER.__get__(self, type(self))

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        if not isinstance(new, FakeTensor):
            raise TypeError(
                f"cannot assign a real {type(new).__name__} to the .data of a fake tensor "
                "(fake and real tensors do not share storage)"
            )
        then = notify_set_data(self, new)
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
        """``torch.Tensor.contiguous``, also for a fake CUDA tensor without a CUDA runtime.

        Parameters
        ----------
        memory_format : torch.memory_format, optional
            As for ``torch.Tensor.contiguous``.

        Returns
        -------
        torch.Tensor
            A fake tensor in that memory format (``self`` when already in it).
        """
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
        """``torch.Tensor.copy_``, also for a fake CUDA tensor without a CUDA runtime.

        Parameters
        ----------
        src : torch.Tensor
            The tensor whose values (recorded by deferred_init, if it records) are copied.
        non_blocking : bool, optional
            As for ``torch.Tensor.copy_``.

        Returns
        -------
        torch.Tensor
            ``self``.
        """
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
