"""Deferred module initialization: record every op run on fake tensors, replay it exactly.

How it works
------------
``deferred_init`` runs ``module_fn`` under the package's fake mode with a recording
``TorchDispatchMode`` (:class:`_Recorder`) on top; every aten op that reaches the fake mode is
recorded in a graph (:class:`~distx_fake._graph._Graph`: nodes by the storages they write, and
how materializing replays the closure of a storage).  ``t.data = x`` (what ``module.double()``,
``.half()``, ``.to(dtype)`` do to parameters) is recorded as an identity op writing ``x``'s value
to ``t``; ``torch.utils.swap_tensors`` needs nothing, the values travel with the dicts.

Exact RNG: before a random op (``torch.Tag.nondeterministic_seeded``) is recorded, the
generator state is snapshotted; replay restores that snapshot around the op and puts the
generator back afterwards, so values do not depend on when or in which order tensors are
materialized.  At record time the real generator is advanced exactly as eager construction
would advance it (see :mod:`._rng`), so code after ``deferred_init`` sees the same stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import _rng
from ._fake import _fake_ctx
from ._fake_state import FakeDataError, set_data_listener, set_realizer
from ._fake_tensor import _DATA_READS, FakeTensor, is_real_op
from ._graph import _Graph, _graph_of, _written_args
from ._tree import _leaves, _map

__all__ = [
    "deferred_init",
    "is_deferred",
    "materialize_module",
    "materialize_tensor",
]

M = TypeVar("M", bound=torch.nn.Module)
_tls = threading.local()


class _ArgumentError(TypeError, ValueError):
    """Wrong kind of argument: torchdistX raised ``ValueError`` here, Python style is ``TypeError``."""


def _on_set_data(t: FakeTensor, new: FakeTensor) -> Callable[[torch.Tensor], None] | None:
    if new is t:  # e.g. the second visit of a tied parameter by module.double()
        return None
    graph: _Graph | None = getattr(_tls, "graph", None)
    if graph is not None and _graph_of(new) is not None:
        graph.set_data(t, new)
        return lambda old_elem: graph.after_set_data(t, new)
    if _graph_of(t) is not None:
        # outside deferred_init nothing is recorded: materializing would silently give the old value
        raise RuntimeError(
            f"cannot replace the .data of a deferred tensor of size {tuple(t.shape)} outside deferred_init "
            "(e.g. module.to(dtype) or .double() after deferred_init returned): ops on deferred tensors are "
            "recorded only while module_fn runs; convert inside module_fn, or after materialization"
        )
    return None


set_data_listener(_on_set_data)


def _realize(t: torch.Tensor, what: str = "a value") -> torch.Tensor:
    """The real value of a fake tensor recorded so far (read while recording: ``.item()`` & co)."""
    graph = _graph_of(t) if isinstance(t, FakeTensor) else None
    if graph is None:
        if isinstance(t, FakeTensor):
            raise FakeDataError(
                f"cannot read {what} of a fake tensor that deferred_init did not record (e.g. one made by fake_mode)"
            )
        return t
    return graph.materialize(t, None)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # do not wrap __torch_dispatch__ in torch._dynamo.disable: that imports torch._dynamo
        # (~70 MB, 1.5-3 s) on first use, and this mode is never traced
        return False

    def __init__(self, graph: _Graph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if is_real_op(func, args, kwargs):
            # only real tensors involved: runs for real and is not recorded (as in torchdistX)
            self.graph.snapshot_captures(func, args, kwargs)
            return func(*args, **kwargs)
        if func in _DATA_READS:
            # `.item()`, `torch.equal` inside __init__: answered for real (the values recorded so far)
            rargs, rkwargs = _map(_realize, args), _map(_realize, kwargs)
            with _disable_current_modes():
                return func(*rargs, **rkwargs)
        snap = None
        if torch.Tag.nondeterministic_seeded in func.tags:
            snap = _rng.snapshot_and_advance(func, args, kwargs, _realize)
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as e:
            # no fake answer: the output depends on values (nonzero, masked_select, unique,
            # boolean indexing). Its shape comes from running it for real on the recorded values.
            out = self._shape_from_real(func, args, kwargs, e)
        self.graph.record(func, args, kwargs, out, snap)
        return out

    def _shape_from_real(self, func: Any, args: Any, kwargs: Any, err: BaseException) -> Any:
        fakes = [x for x in _leaves(args) + _leaves(kwargs) if isinstance(x, FakeTensor)]
        if not fakes or any(_graph_of(x) is None or x.device.type != "cpu" for x in fakes):
            raise err
        written = {id(t) for t in _written_args(func, args, kwargs)}
        by_real: dict[int, FakeTensor] = {}

        def real(x: Any) -> Any:
            if not isinstance(x, FakeTensor):
                return x
            r = _realize(x)
            if id(x) in written:
                with _disable_current_modes(), torch.no_grad():
                    r = r.clone()  # the recorded value must not change: the op is replayed later
            by_real[id(r)] = x
            return r

        rargs, rkwargs = _map(real, args), _map(real, kwargs)
        with _disable_current_modes(), torch.no_grad():
            try:
                rout = func(*rargs, **rkwargs)
            except Exception as e2:
                raise e2 from err

        def fake(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            same = by_real.get(id(r))
            if same is not None:
                return same
            with _disable_current_modes():
                elem = torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device="meta")
            return FakeTensor(elem, r.device)

        return _map(fake, rout)


def deferred_init(module_fn: Callable[..., M], *args: Any, **kwargs: Any) -> M:
    """Construct a module with fake tensors, recording every op for a later exact replay.

    Parameters
    ----------
    module_fn : callable
        Returns the module (typically the module class).
    *args, **kwargs
        Passed to ``module_fn``.

    Returns
    -------
    torch.nn.Module
        The module; its parameters and buffers are fake until materialized.

    Raises
    ------
    TypeError
        If ``module_fn`` is not callable.

    Examples
    --------
    >>> import torch
    >>> from distx_fake import deferred_init, fake
    >>> m = deferred_init.deferred_init(torch.nn.Linear, 4, 2)
    >>> fake.is_fake(m.weight)
    True
    >>> deferred_init.materialize_module(m)
    >>> fake.is_fake(m.weight)
    False
    """
    if not callable(module_fn):
        raise TypeError(f"module_fn must be callable, got {type(module_fn).__name__}")
    if getattr(_tls, "recording", False):
        # nested (as torchdistX's level counter): the outer recorder already records everything;
        # a second recorder would snapshot and advance the generator twice
        return module_fn(*args, **kwargs)
    graph = _Graph()
    _tls.recording = True
    _tls.graph = graph
    prev = set_realizer(_realize)
    try:
        with _fake_ctx(True), _Recorder(graph):
            module = module_fn(*args, **kwargs)
    finally:
        set_realizer(prev)
        _tls.recording = False
        _tls.graph = None
    return module


def _tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for m in module.modules():
        out.extend(p for p in m._parameters.values() if p is not None)
        out.extend(b for b in m._buffers.values() if b is not None)
    return out


def is_deferred(obj: torch.Tensor | torch.nn.Module) -> bool:
    """Return ``True`` if a tensor (or any parameter/buffer of a module) awaits materialization.

    Parameters
    ----------
    obj : torch.Tensor or torch.nn.Module
        The tensor or module to ask about.

    Returns
    -------
    bool
        Whether ``obj`` (a tensor) or one of its parameters or buffers (a module) is a fake
        tensor recorded by :func:`deferred_init` and not yet materialized.

    Raises
    ------
    ValueError
        If ``obj`` is neither a tensor nor a module (also a ``TypeError``).
    """
    if isinstance(obj, torch.nn.Module):
        return any(is_deferred(t) for t in _tensors_of(obj))
    if isinstance(obj, torch.Tensor):
        return isinstance(obj, FakeTensor) and _graph_of(obj) is not None
    raise _ArgumentError(f"`obj` must be of type `Tensor` or `Module`; is_deferred got {type(obj).__name__}")


def _check_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"invalid device {device!r}") from e


def materialize_tensor(tensor: torch.Tensor, *, device: Any = None) -> torch.Tensor:
    """Materialize a deferred tensor by replaying the ops it depends on.

    Parameters
    ----------
    tensor : torch.Tensor
        A tensor of a module built by :func:`deferred_init`. A real tensor, or a fake tensor
        not built by :func:`deferred_init` (``fake_mode``), is returned unchanged.
    device : torch.device or str, optional
        Build the tensor directly on this device instead of the recorded one.

    Returns
    -------
    torch.Tensor
        The real tensor; the same object for repeated calls and for tied weights. A parameter
        stays an ``nn.Parameter`` with its ``requires_grad``.

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor.
    ValueError
        If ``device`` is not a valid device.
    CapturedTensorModifiedError
        If a real tensor used during recording was modified in place since.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"materialize_tensor expects a tensor, got {type(tensor).__name__}")
    if not isinstance(tensor, FakeTensor):
        return tensor
    dev = _check_device(device)
    cached = tensor.__dict__.get("_distx_mat")
    if cached is not None:
        return cached
    graph = _graph_of(tensor)
    if graph is None:
        # a fake tensor from fake_mode has nothing to replay: returned as is, like torchdistX
        return tensor
    real = graph.materialize(tensor, dev)
    out: torch.Tensor
    if getattr(tensor, "_is_param", False):
        out = torch.nn.Parameter(real, requires_grad=tensor.requires_grad)
    else:
        out = real
        if tensor.requires_grad and real.is_leaf and real.is_floating_point():
            out.requires_grad_(True)
    tensor._distx_mat = out  # type: ignore[attr-defined]
    return out


def materialize_module(
    module: torch.nn.Module,
    buffers_only: bool = False,
    check_fn: Callable[[torch.nn.Module], bool] | None = None,
    device: Any = None,
) -> None:
    """Materialize the parameters and buffers of a deferred module in place.

    Parameters
    ----------
    module : torch.nn.Module
        The module returned by :func:`deferred_init` (or any of its submodules).
    buffers_only : bool, optional
        Materialize only the buffers.
    check_fn : callable, optional
        Called with each submodule; only modules for which it returns ``True`` are
        materialized (their children are visited regardless).
    device : torch.device or str, optional
        Materialize straight onto this device.

    Returns
    -------
    None
        As in torchdistX; ``module`` is materialized in place.

    Raises
    ------
    TypeError
        If ``module`` is not a module or ``check_fn`` is not callable.
    CapturedTensorModifiedError
        If a real tensor used during recording was modified in place since.

    Examples
    --------
    >>> import torch
    >>> from distx_fake import deferred_init
    >>> m = deferred_init.deferred_init(torch.nn.Linear, 4, 2)
    >>> deferred_init.materialize_module(m)
    >>> m.weight.shape
    torch.Size([2, 4])
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"materialize_module expects an nn.Module, got {type(module).__name__}")
    if check_fn is not None and not callable(check_fn):
        raise TypeError(f"check_fn must be callable, got {type(check_fn).__name__}")
    dev = _check_device(device)
    for child in module.children():
        materialize_module(child, buffers_only, check_fn, dev)
    if check_fn is not None and not check_fn(module):
        return
    if not buffers_only:
        for name, p in module._parameters.items():
            if p is not None and isinstance(p, FakeTensor):
                module._parameters[name] = materialize_tensor(p, device=dev)  # type: ignore[assignment]
    for name, b in module._buffers.items():
        if b is not None and isinstance(b, FakeTensor):
            module._buffers[name] = materialize_tensor(b, device=dev)
