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
(``_distx_real``, in the attribute dict the fake had when the op was recorded), so temporaries
die as soon as nothing pending refers to them.  ``t.data = x`` (what ``module.double()``,
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
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import _distx_fake as _native
from . import _rng
from ._fake import (
    _DATA_READS,
    FakeDataError,
    FakeTensor,
    _fake_ctx,
    _leaves,
    _map,
    is_real_op,
    set_data_listener,
    set_realizer,
)

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


class CapturedTensorModifiedError(RuntimeError):
    """A real tensor used while recording was modified in place before materialization."""


class _ArgumentError(TypeError, ValueError):
    """Wrong kind of argument: torchdistX raised ``ValueError`` here, Python style is ``TypeError``."""


def _crc(t: torch.Tensor) -> int | None:
    """crc32c of a CPU tensor's values (``None`` elsewhere: only the version counter is checked)."""
    if t.device.type != "cpu" or t.is_sparse or t.layout != torch.strided:
        return None
    with _disable_current_modes(), torch.no_grad():
        c = t.detach().contiguous()
        return _native.crc32c_ptr(c.data_ptr(), c.numel() * c.element_size(), 0) if c.numel() else 0


class _Captured:
    """A real tensor found in a recorded op, with its version and a checksum of its values.

    The version counter sees every in-place op; the checksum also sees writes that bypass it
    (``.data``, numpy views).
    """

    __slots__ = ("crc", "op", "private", "tensor", "version", "where")

    def __init__(self, tensor: torch.Tensor, op: Any) -> None:
        self.tensor = tensor
        self.version = tensor._version
        self.crc = _crc(tensor)
        self.where = _where()
        self.op = op
        self.private = False  # True once replaced by a snapshot (see _Graph.snapshot_captures)

    def check(self, deep: bool = False) -> torch.Tensor:
        t = self.tensor
        now = t._version
        if now != self.version:
            how = f"version {self.version} -> {now}"
        elif deep and self.crc is not None and _crc(t) != self.crc:
            how = "its values changed without a version bump, e.g. through .data or a numpy view"
        else:
            return t
        raise CapturedTensorModifiedError(
            f"real tensor of shape {tuple(t.shape)} and dtype {t.dtype} captured by deferred_init "
            f"(used by {self.op} at {self.where}) was modified in place after recording "
            f"({how}); materializing would not reproduce eager construction. Do not modify "
            "tensors captured by module_fn before materializing."
        )


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _where() -> str:
    for fr in reversed(traceback.extract_stack(limit=40)[:-3]):
        if "/torch/" not in fr.filename and "distx_fake" not in fr.filename:
            return f"{fr.filename}:{fr.lineno} in {fr.name}"
    return "<unknown>"


_WRITTEN: dict[Any, tuple[int, ...]] = {}


def _written_positions(func: Any) -> tuple[int, ...]:
    """Indices of the schema arguments ``func`` writes in place."""
    got = _WRITTEN.get(func)
    if got is None:
        schema = getattr(func, "_schema", None)
        got = ()
        if schema is not None:
            got = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
        _WRITTEN[func] = got
    return got


def _written_args(func: Any, args: Any, kwargs: Any) -> list[Any]:
    out: list[Any] = []
    pos = _written_positions(func)
    if pos:
        schema = func._schema
        for i in pos:
            v = args[i] if i < len(args) else kwargs.get(schema.arguments[i].name)
            out.extend(_leaves(v))
    return out


class _Node:
    """One recorded op.

    ``args`` / ``kwargs`` / ``outs`` name fake tensors as objects; their values live in the
    attribute dicts the objects had when the op was recorded (``states``, by ``id``). A tensor
    object can change its value without an op (``t.data = x``: :meth:`_Graph.set_data` gives it
    a new dict) or trade its whole state with another (``torch.utils.swap_tensors``, which swaps
    the dicts); the dicts stay with the values.
    """

    __slots__ = ("args", "done", "func", "in_keys", "index", "kwargs", "out_keys", "outs", "rng", "states")

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
        self.out_keys: tuple[int, ...] = ()
        self.states: dict[int, dict[str, Any]] = {}
        self.done = False


class _Graph:
    """The recorded ops of one ``deferred_init`` call."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.writers: dict[int, list[_Node]] = {}
        self.readers: dict[int, list[_Node]] = {}
        self.captures: list[_Captured] = []
        self._capture_of: dict[tuple[int, int], _Captured] = {}  # (id, version) -> capture
        self._captured_storages: dict[int, list[_Captured]] = {}

    # --- recording -------------------------------------------------------------------------
    def capture(self, t: torch.Tensor, op: Any) -> _Captured:
        k = (id(t), t._version)
        cap = self._capture_of.get(k)
        if cap is None or cap.tensor is not t:
            cap = _Captured(t, op)
            self._capture_of[k] = cap
            self.captures.append(cap)
            self._captured_storages.setdefault(_storage_key(t), []).append(cap)
        return cap

    def snapshot_captures(self, func: Any, args: Any, kwargs: Any) -> None:
        """Before a real op inside ``module_fn`` writes a captured tensor, give the recorded ops a copy.

        Eager construction read the values as they were; the recording must replay them so.
        """
        if not self._captured_storages:
            return
        for t in _written_args(func, args, kwargs):
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
                for cap in self._captured_storages.pop(_storage_key(t), ()):
                    if not cap.private:
                        with _disable_current_modes(), torch.no_grad():
                            cap.tensor = cap.tensor.detach().clone()
                        cap.version, cap.private = cap.tensor._version, True

    def check_captures(self) -> None:
        """Raise if any tensor captured by this recording was modified in place since."""
        for cap in self.captures:
            cap.check()

    def record(self, func: Any, args: Any, kwargs: Any, out: Any, rng: _rng.Snapshot | None) -> None:
        in_keys: list[int] = []
        states: dict[int, dict[str, Any]] = {}
        op = func

        def capture(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                in_keys.append(_storage_key(x))
                states[id(x)] = x.__dict__
                return x
            if isinstance(x, torch.Tensor):
                return self.capture(x, op)
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
                states[id(o)] = o.__dict__
        node.states = states
        for t in _written_args(func, args, kwargs):
            if isinstance(t, FakeTensor):
                written[_storage_key(t)] = None
        node.out_keys = tuple(written)
        for k in written:
            self.writers.setdefault(k, []).append(node)
        for k in node.in_keys:
            self.readers.setdefault(k, []).append(node)

    def set_data(self, t: FakeTensor, new: FakeTensor) -> None:
        """``t.data = new`` is recorded: from now on ``t`` holds ``new``'s value (and storage).

        The ops recorded so far that name ``t`` keep the attribute dict ``t`` had (see
        :class:`_Node`), so they still mean its old value; ``t`` gets a fresh dict and an
        identity node that gives it ``new``'s value.
        """
        state = dict(t.__dict__)
        state.pop("_distx_real", None)
        state.pop("_distx_mat", None)
        t.__dict__ = state

    def after_set_data(self, t: FakeTensor, new: FakeTensor) -> None:
        self.record(_same_value, (new,), {}, t, None)

    # --- replay ----------------------------------------------------------------------------
    def closure(self, t: torch.Tensor) -> list[_Node]:
        """The pending nodes to run, in recording order, to give ``t`` its final value.

        Every pending writer of ``t``'s storage, and for each chosen node: the earlier writers
        of what it reads (its inputs' values), the earlier readers of what it writes (they must
        read the values from before this write) and the earlier writers of what it writes.
        """
        chosen: dict[int, _Node] = {}
        stack = [n for n in self.writers.get(_storage_key(t), ()) if not n.done]
        while stack:
            n = stack.pop()
            if n.index in chosen:
                continue
            chosen[n.index] = n
            for table, keys in ((self.writers, n.in_keys), (self.readers, n.out_keys), (self.writers, n.out_keys)):
                for k in keys:
                    for m in table.get(k, ()):
                        if m.index >= n.index:
                            break  # lists are in recording order
                        if not m.done and m.index not in chosen:
                            stack.append(m)
        return [chosen[i] for i in sorted(chosen)]

    def materialize(self, t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
        self.check_captures()
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
        states = node.states

        def real_of(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                r = states[id(x)].get("_distx_real")
                if r is None:
                    raise ValueError(f"{node.func}: an input fake tensor has no recorded producer")
                return r
            if isinstance(x, _Captured):
                v = x.check(deep=True)
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
                states[id(f)]["_distx_real"] = r
        node.done = True
        node.args = node.kwargs = node.outs = None
        node.states = {}


def _same_value(x: torch.Tensor) -> torch.Tensor:
    """The op recorded for ``t.data = x``: ``t`` takes ``x``'s value (the same tensor, as in eager)."""
    return x


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
