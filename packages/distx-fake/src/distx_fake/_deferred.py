"""Deferred module initialization: record every op run on fake tensors, replay it exactly.

How it works
------------
``deferred_init`` runs ``module_fn`` under the package's fake mode with a recording
``TorchDispatchMode`` on top.  Every aten op that reaches the fake mode is appended to a
:class:`_Graph` as a node ``(func, args, kwargs, outputs)``; real tensors found in the
arguments are captured together with their ``_version``.  Each node is indexed by the
storages it writes (its outputs, views included, and the arguments its schema mutates).

Materializing a fake tensor runs the *closure* of its storage: every pending node that
writes it, and recursively every node writing a storage one of those reads, in recording
order.  Executed nodes drop their arguments and store the real result on the output fake
(``_distx_real``), so temporaries die as soon as nothing pending refers to them.

Exact RNG: before a random op (``torch.Tag.nondeterministic_seeded``) is recorded, the
generator state is snapshotted; replay restores that snapshot around the op and puts the
generator back afterwards, so values do not depend on when or in which order tensors are
materialized.  At record time the real generator is advanced exactly as eager construction
would advance it (see :mod:`._rng`), so code after ``deferred_init`` sees the same stream.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import _rng
from ._fake import FakeTensor, _fake_ctx, _leaves, _map, is_real_op

__all__ = [
    "CapturedTensorModifiedError",
    "deferred_init",
    "is_deferred",
    "materialize_module",
    "materialize_tensor",
]

M = TypeVar("M", bound=torch.nn.Module)
_tls = threading.local()
_aten = torch.ops.aten
_SCALAR_READS = {_aten._local_scalar_dense.default}


class CapturedTensorModifiedError(RuntimeError):
    """A real tensor used while recording was modified in place before materialization."""


class _ArgumentError(TypeError, ValueError):
    """Wrong kind of argument: torchdistX raised ``ValueError`` here, Python style is ``TypeError``."""


@dataclass
class _Captured:
    """A real tensor found in a recorded op, with its version at record time."""

    tensor: torch.Tensor
    version: int
    where: str
    op: Any

    def check(self) -> torch.Tensor:
        now = self.tensor._version
        if now != self.version:
            t = self.tensor
            raise CapturedTensorModifiedError(
                f"real tensor of shape {tuple(t.shape)} and dtype {t.dtype} captured by deferred_init "
                f"(used by {self.op} at {self.where}) was modified in place after recording "
                f"(version {self.version} -> {now}); materializing would not reproduce eager "
                "construction. Do not modify tensors captured by module_fn before materializing."
            )
        return self.tensor


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _where() -> str:
    for fr in reversed(traceback.extract_stack(limit=40)[:-3]):
        if "/torch/" not in fr.filename and "distx_fake" not in fr.filename:
            return f"{fr.filename}:{fr.lineno} in {fr.name}"
    return "<unknown>"


class _Node:
    __slots__ = ("args", "done", "func", "in_keys", "index", "kwargs", "outs", "rng")

    def __init__(
        self,
        index: int,
        func: Any,
        args: Any,
        kwargs: Any,
        outs: Any,
        rng: _rng.Snapshot | None,
        in_keys: tuple[int, ...],
    ) -> None:
        self.index = index
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.outs = outs
        self.rng = rng
        self.in_keys = in_keys
        self.done = False


class _Graph:
    """The recorded ops of one ``deferred_init`` call."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.writers: dict[int, list[_Node]] = {}

    # --- recording -------------------------------------------------------------------------
    def record(self, func: Any, args: Any, kwargs: Any, out: Any, rng: _rng.Snapshot | None) -> None:
        in_keys: list[int] = []
        op = func

        def capture(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                in_keys.append(_storage_key(x))
                return x
            if isinstance(x, torch.Tensor):
                return _Captured(x, x._version, _where(), op)
            return x

        cargs = _map(capture, args)
        ckwargs = _map(capture, kwargs)
        node = _Node(len(self.nodes), func, cargs, ckwargs, out, rng, tuple(dict.fromkeys(in_keys)))
        self.nodes.append(node)
        written: dict[int, None] = {}
        for o in _leaves(out):
            if isinstance(o, FakeTensor):
                written[_storage_key(o)] = None
                # strong: the graph lives as long as any tensor it can materialize (done nodes
                # drop their tensors, so no cycle keeps real data alive)
                o._distx_graph = self  # type: ignore[attr-defined]
        schema = getattr(func, "_schema", None)
        if schema is not None:
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    v = args[i] if i < len(args) else kwargs.get(a.name)
                    for t in _leaves(v):
                        if isinstance(t, FakeTensor):
                            written[_storage_key(t)] = None
        for k in written:
            self.writers.setdefault(k, []).append(node)

    # --- replay ----------------------------------------------------------------------------
    def closure(self, t: torch.Tensor) -> list[_Node]:
        key = _storage_key(t)
        seen = {key}
        stack = [key]
        chosen: dict[int, _Node] = {}
        while stack:
            k = stack.pop()
            for n in self.writers.get(k, ()):
                if n.done or n.index in chosen:
                    continue
                chosen[n.index] = n
                for k2 in n.in_keys:
                    if k2 not in seen:
                        seen.add(k2)
                        stack.append(k2)
        return [chosen[i] for i in sorted(chosen)]

    def materialize(self, t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
        # pending writers must run even if this tensor already has a value (e.g. read by .item())
        for node in self.closure(t):
            self._run(node, device)
        real = t.__dict__.get("_distx_real")
        if real is None:
            raise ValueError(
                f"fake tensor of size {tuple(t.shape)} was not produced by an op recorded by deferred_init; "
                "it cannot be materialized"
            )
        return real

    def _run(self, node: _Node, device: torch.device | None) -> None:
        def real_of(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                r = x.__dict__.get("_distx_real")
                if r is None:
                    raise ValueError(f"{node.func}: an input fake tensor has no recorded producer")
                return r
            if isinstance(x, _Captured):
                v = x.check()
                if device is not None and v.device != device:
                    v = v.to(device)
                return v
            return x

        args = _map(real_of, node.args)
        kwargs = _map(real_of, node.kwargs)
        func = node.func
        if func is _aten.lift_fresh.default:
            func, args = _aten.clone.default, (args[0],)
        if device is not None and "device" in kwargs:
            kwargs = dict(kwargs)
            kwargs["device"] = device
        with _disable_current_modes(), torch.no_grad():
            out = _rng.replay(node.rng, func, args, kwargs) if node.rng is not None else func(*args, **kwargs)
        fakes = _leaves(node.outs)
        reals = _leaves(out)
        for f, r in zip(fakes, reals):
            if isinstance(f, FakeTensor):
                f._distx_real = r  # type: ignore[attr-defined]
        node.done = True
        node.args = node.kwargs = node.outs = None


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
            return func(*args, **kwargs)
        if func in _SCALAR_READS:
            # `.item()` inside __init__: answer it for real by replaying the dependency chain.
            real = self.graph.materialize(args[0], None)
            with _disable_current_modes():
                return func(real)
        snap = None
        if torch.Tag.nondeterministic_seeded in func.tags:
            snap = _rng.snapshot_and_advance(func, args, kwargs)
        out = func(*args, **kwargs)
        self.graph.record(func, args, kwargs, out, snap)
        return out


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
    """
    if not callable(module_fn):
        raise TypeError(f"module_fn must be callable, got {type(module_fn).__name__}")
    if getattr(_tls, "recording", False):
        # nested (as torchdistX's level counter): the outer recorder already records everything;
        # a second recorder would snapshot and advance the generator twice
        return module_fn(*args, **kwargs)
    graph = _Graph()
    _tls.recording = True
    try:
        with _fake_ctx(True), _Recorder(graph):
            module = module_fn(*args, **kwargs)
    finally:
        _tls.recording = False
    return module


def _tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for m in module.modules():
        out.extend(p for p in m._parameters.values() if p is not None)
        out.extend(b for b in m._buffers.values() if b is not None)
    return out


def _graph_of(t: torch.Tensor) -> _Graph | None:
    return t.__dict__.get("_distx_graph")


def is_deferred(obj: torch.Tensor | torch.nn.Module) -> bool:
    """Return ``True`` if a tensor (or any parameter/buffer of a module) awaits materialization.

    Parameters
    ----------
    obj : torch.Tensor or torch.nn.Module

    Returns
    -------
    bool

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
