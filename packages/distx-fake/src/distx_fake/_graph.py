"""The recorded graph of deferred_init: nodes by the storages they write, replayed exactly.

Every aten op that reaches the fake mode while ``deferred_init`` records is appended to a
:class:`_Graph` as a node ``(func, args, kwargs, outputs)``; real tensors found in the arguments
are captured together with their ``_version`` (and a CRC, see :class:`_Captured`). Each node is
indexed by the storages it writes (its outputs, views included, and the arguments its schema
mutates).

Materializing a fake tensor runs the *closure* of its storage: every pending node that writes
it, and recursively every node writing a storage one of those reads, in recording order.
Executed nodes drop their arguments and store the real result on the output fake
(``_distx_real``, in the attribute dict the fake had when the op was recorded), so temporaries
die as soon as nothing pending refers to them. Random ops replay under the generator state
snapshotted when they were recorded (:mod:`._rng`).
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import _distx_fake as _native
from . import _rng
from ._fake_tensor import FakeTensor
from ._tree import _leaves, _map

_aten = torch.ops.aten


class CapturedTensorModifiedError(RuntimeError):
    """A real tensor used while recording was modified in place before materialization."""


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


def _graph_of(t: torch.Tensor) -> _Graph | None:
    return t.__dict__.get("_distx_graph")
