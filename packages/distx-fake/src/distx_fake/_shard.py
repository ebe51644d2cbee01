"""Shards of deferred tensors: one block of a ``deferred_init`` tensor materialized without ever
allocating the whole tensor (:func:`materialize_shard`).

A deferred tensor is a fake tensor plus the recorded ops that would build it (the graph of
:mod:`._graph`: ``empty``, ``uniform_`` / ``normal_`` with the generator state snapshotted at record
time, ``fill_`` / ``zero_`` on views such as an embedding's padding row, ...). Here those ops are
replayed on a *window* of the tensor (a block along one dim, full along the others): each op is
mapped onto the part of its (view) argument that lies in the window, and a random op draws exactly
the values the eager op would have put there:

- ``uniform_`` consumes one 32-bit draw per element (two for float64) in element order, so the
  window's values come from the snapshot advanced to the window's first element;
- ``normal_`` on 16 or more contiguous elements fills them with uniforms and transforms blocks of
  16 (Box-Muller); when the size is not a multiple of 16 the last 16 elements are drawn again (from
  the draws after all others in float32/float64, from the incomplete block's draws in the half
  types). A window is generated as the 16-aligned blocks covering it (and that last block).

Both rules are checked against the real kernels at first use on this torch build; a combination
that does not reproduce them bit for bit raises instead of giving different values. Any op outside
the supported set raises :class:`ShardMaterializeError` naming it: materialize the whole tensor
(:func:`~distx_fake.deferred_init.materialize_tensor`) in that case.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import _distx_fake as _native
from ._deferred import materialize_tensor
from ._fake_tensor import FakeTensor
from ._graph import _Captured, _graph_of, _storage_key

__all__ = ["ShardMaterializeError", "materialize_shard"]

_aten = torch.ops.aten


class ShardMaterializeError(RuntimeError):
    """A deferred tensor whose recorded ops cannot be replayed on a shard."""


def _index(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"materialize_shard: {name} must be an int, got {type(value).__name__}")
    return value


def materialize_shard(tensor: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """Materialize only the block ``tensor.narrow(dim, start, length)`` of a deferred tensor.

    The recorded ops that build ``tensor`` are replayed on that block alone, so a rank of a
    tensor-parallel job builds its shard of a weight without the memory or time of the whole
    weight. The values are bit-identical to the same block of :func:`materialize_tensor`'s
    result (and of eager construction). ``tensor`` itself stays deferred: nothing recorded runs,
    and a later :func:`materialize_tensor` gives the whole tensor as before.

    Supported are the ops that module constructors use to initialize parameters: the factories
    ``empty`` / ``zeros`` / ``ones``, views of the tensor (``t``, ``transpose``, ``select``,
    ``slice``, ``view``, ...), elementwise in-place ops (``fill_``, ``zero_``, ``mul_``,
    ``add_``, ``clamp_``, ``erfinv_``, ``copy_`` from a real tensor, ...) and the random
    ``uniform_`` / ``normal_`` on the CPU generator (``nn.init``'s ``uniform_``, ``normal_``,
    ``xavier_*``, ``kaiming_*``). A tensor whose values were read while recording (torch's
    ``trunc_normal_`` resamples until every value is in range) was built whole then: its block
    is taken from that value.

    Parameters
    ----------
    tensor : torch.Tensor
        A parameter or buffer of a module built by :func:`deferred_init`. A tensor that awaits
        no materialization (a real tensor, one materialized already, a fake tensor of
        ``fake_mode``) gives the block of :func:`materialize_tensor`'s result.
    dim : int
        The dimension to take the block along (negative counts from the end).
    start : int
        The block's first index along ``dim``, ``0 <= start <= tensor.shape[dim]``.
    length : int
        The block's size along ``dim``, ``0 <= length <= tensor.shape[dim] - start``.

    Returns
    -------
    torch.Tensor
        A new contiguous tensor of ``tensor``'s dtype, on its device (built on the CPU and
        copied there; a ``meta`` tensor's block stays on the CPU), with the block's values. It is not an ``nn.Parameter`` and does not
        require grad.

    Raises
    ------
    TypeError
        If ``tensor`` is not a tensor, or ``dim``, ``start`` or ``length`` is not an int.
    IndexError
        If ``dim`` is out of range for ``tensor``'s dimensions.
    ValueError
        If ``start`` or ``length`` lies outside ``tensor.shape[dim]``.
    ShardMaterializeError
        If ``tensor`` is a view of another deferred tensor, is partly materialized already
        (a value of it was read while recording and ops followed), or one of its recorded ops
        cannot be replayed on a block (the message names it): materialize the whole tensor
        instead.
    CapturedTensorModifiedError
        If a real tensor used during recording was modified in place since.

    Examples
    --------
    >>> import torch
    >>> from distx_fake import deferred_init
    >>> _ = torch.manual_seed(0)
    >>> m = deferred_init.deferred_init(torch.nn.Linear, 4, 6)
    >>> top = deferred_init.materialize_shard(m.weight, 0, 0, 3)
    >>> top.shape
    torch.Size([3, 4])
    >>> deferred_init.is_deferred(m.weight)
    True
    >>> torch.equal(top, deferred_init.materialize_tensor(m.weight)[:3])
    True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"materialize_shard expects a tensor, got {type(tensor).__name__}")
    dim, start, length = _index(dim, "dim"), _index(start, "start"), _index(length, "length")
    nd = tensor.dim()
    if not -nd <= dim < nd:
        raise IndexError(f"materialize_shard: dim {dim} is out of range for a tensor of {nd} dimensions")
    dim %= nd
    size = int(tensor.shape[dim])
    if not 0 <= start <= size or not 0 <= length <= size - start:
        raise ValueError(
            f"materialize_shard: start {start} and length {length} do not lie within size {size} of dim {dim}"
        )
    if _pending(tensor):
        return _Window(tensor, dim, start, length).run()
    whole = materialize_tensor(tensor).detach()
    return whole.narrow(dim, start, length).clone(memory_format=torch.contiguous_format)


def _pending(t: torch.Tensor) -> bool:
    """Whether ``t`` is a deferred tensor whose recorded ops have not run (the shard replays them).

    Raises
    ------
    ShardMaterializeError
        If some of the ops writing ``t`` ran already and others did not.
    """
    if not isinstance(t, FakeTensor) or t.__dict__.get("_distx_mat") is not None:
        return False
    graph = _graph_of(t)
    if graph is None:
        return False
    writers = graph.writers.get(_storage_key(t), [])
    done = sum(n.done for n in writers)
    if done == 0:
        return True
    if done == len(writers) and t.__dict__.get("_distx_real") is not None:
        return False  # its value was built whole already (read while recording): the block of it
    raise ShardMaterializeError(
        f"cannot materialize a shard of the deferred tensor of shape {tuple(t.shape)}: part of its recorded ops "
        "ran already (a value of it was read while recording); materialize the whole tensor "
        "(distx_fake.deferred_init.materialize_tensor)"
    )


# --------------------------------------------------------------------------------------------
# replay on a window

_FACTORIES = {
    _aten.empty.memory_format: None,
    _aten.empty_strided.default: None,
    _aten.zeros.default: 0.0,
    _aten.ones.default: 1.0,
}
_VIEWS = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.select.int,
    _aten.slice.Tensor,
    _aten.t.default,
    _aten.transpose.int,
    _aten.permute.default,
    _aten.unsqueeze.default,
    _aten.squeeze.dim,
    _aten.as_strided.default,
    _aten.view.default,
    _aten._reshape_alias.default,
}
_ELEMENTWISE = {
    _aten.fill_.Scalar,
    _aten.fill_.Tensor,
    _aten.zero_.default,
    _aten.mul_.Scalar,
    _aten.mul_.Tensor,
    _aten.add_.Scalar,
    _aten.add_.Tensor,
    _aten.sub_.Scalar,
    _aten.sub_.Tensor,
    _aten.div_.Scalar,
    _aten.div_.Tensor,
    _aten.clamp_.default,
    _aten.clamp_min_.default,
    _aten.clamp_max_.default,
    _aten.erfinv_.default,
    _aten.copy_.default,
}
_RANDOM = {_aten.uniform_.default: "uniform", _aten.normal_.default: "normal"}


def _strides(shape: tuple[int, ...]) -> list[int]:
    out = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        out[k] = out[k + 1] * max(shape[k + 1], 1)
    return out


class _Window:
    """Replay of one deferred parameter's recorded ops on the box ``[start, start + length)``
    along ``axis`` (full along the other dims)."""

    def __init__(self, t: torch.Tensor, axis: int, start: int, length: int) -> None:
        self.t = t
        self.name = f"tensor of shape {tuple(t.shape)}"
        if t.storage_offset() != 0 or not t.is_contiguous():
            raise ShardMaterializeError(
                f"{self.name}: a deferred parameter that is a view cannot be materialized by shard"
            )
        self.key = _storage_key(t)
        self.graph = t.__dict__["_distx_graph"]
        self.shape = tuple(t.shape)
        self.bstr = _strides(self.shape)
        self.axis, self.start, self.length = axis, start, length
        self.lo = [0] * len(self.shape)
        self.hi = list(self.shape)
        self.lo[axis], self.hi[axis] = start, start + length
        wshape = list(self.shape)
        wshape[axis] = length
        self.out = torch.empty(wshape, dtype=t.dtype)
        self.ostr = _strides(tuple(wshape))

    def _unsupported(self, what: str) -> ShardMaterializeError:
        return ShardMaterializeError(
            f"cannot materialize a shard of the deferred {self.name}: {what}; materialize the module first "
            "(distx_fake.deferred_init.materialize_module) or build it eagerly"
        )

    def run(self) -> torch.Tensor:
        for node in self.graph.closure(self.t):
            func = node.func
            outs = [o for o in _leaves(node.outs) if isinstance(o, torch.Tensor)]
            for o in outs:
                if _storage_key(o) != self.key:
                    raise self._unsupported(f"{func} builds it from another deferred tensor")
            for o in outs:
                if o.dtype != self.t.dtype:  # e.g. module.double() inside deferred_init
                    raise self._unsupported(f"{func} records it as {o.dtype}, but the parameter is {self.t.dtype}")
            if func in _FACTORIES:
                if outs and outs[0].numel() != self.t.numel():
                    raise self._unsupported(f"{func} creates a tensor of another size")
                value = _FACTORIES[func]
                if value is not None:
                    self.out.fill_(value)
            elif func in _VIEWS:
                continue
            elif func in _ELEMENTWISE:
                self._elementwise(node)
            elif func in _RANDOM:
                self._random(node, _RANDOM[func])
            else:
                raise self._unsupported(f"op {func} has no shard-by-shard replay")
        if self.t.device.type not in ("cpu", "meta"):
            return self.out.to(self.t.device)
        return self.out

    # ---- views of the parameter -> the part of them inside the window -------------------------
    def _region(self, v: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, int]]] | None:
        """``(view of self.out, per-dim index ranges of v)`` of ``v``'s elements in the window,
        or None when none is."""
        if not isinstance(v, torch.Tensor) or _storage_key(v) != self.key:
            raise self._unsupported("an op writes it through a tensor that is not one of its views")
        rem = v.storage_offset()
        c = []
        for s in self.bstr:
            c.append(rem // s)
            rem %= s
        maps: list[tuple[int, int] | None] = []
        used: set[int] = set()
        for z, st in zip(v.shape, v.stride()):
            if z == 1:
                maps.append(None)
                continue
            hit = None
            for k, bs in enumerate(self.bstr):
                if k in used or st <= 0 or st % bs:
                    continue
                step = st // bs
                if c[k] + step * (z - 1) < self.shape[k]:
                    hit = (k, step)
                    break
            if hit is None:
                raise self._unsupported(f"a view of sizes {tuple(v.shape)} / strides {v.stride()} mixes dims")
            used.add(hit[0])
            maps.append(hit)
        off = 0
        for k in range(len(self.shape)):
            if k not in used:
                if not self.lo[k] <= c[k] < self.hi[k]:
                    return None
                off += (c[k] - self.lo[k]) * self.ostr[k]
        sizes, strides, ranges = [], [], []
        for z, m in zip(v.shape, maps):
            if m is None:
                sizes.append(z)
                strides.append(1)
                ranges.append((0, z))
                continue
            k, step = m
            i0 = max(0, -(-(self.lo[k] - c[k]) // step))
            i1 = min(z, -(-(self.hi[k] - c[k]) // step))
            if i1 <= i0:
                return None
            off += (c[k] + step * i0 - self.lo[k]) * self.ostr[k]
            sizes.append(i1 - i0)
            strides.append(step * self.ostr[k])
            ranges.append((i0, i1))
        return self.out.as_strided(sizes, strides, off), ranges

    def _real(self, x: Any, view: torch.Tensor, ranges: list[tuple[int, int]]) -> Any:
        """A recorded argument, restricted to the window (real tensors are indexed like the view)."""
        if isinstance(x, _Captured):
            x = x.check()
        if not isinstance(x, torch.Tensor):
            return x
        if isinstance(x, FakeTensor):
            raise self._unsupported("an op reads another deferred tensor")
        if x.dim() == 0:
            return x
        xb = x.expand(view.shape)
        return xb[tuple(slice(a, b) for a, b in ranges)]

    def _elementwise(self, node: Any) -> None:
        view = node.args[0]
        region = self._region(view)
        if region is None:
            return
        dst, ranges = region
        args = [self._real(a, view, ranges) for a in node.args[1:]]
        kwargs = {k: self._real(a, view, ranges) for k, a in node.kwargs.items()}
        with torch.no_grad():
            node.func(dst, *args, **kwargs)

    def _random(self, node: Any, kind: str) -> None:
        view = node.args[0]
        if not view.is_contiguous():
            raise self._unsupported(f"{node.func} on a non-contiguous view")
        if node.rng is None:
            raise self._unsupported(f"{node.func} was recorded without a CPU generator snapshot")
        m, dtype = view.numel(), view.dtype
        base0 = view.storage_offset()
        if kind == "normal" and m < 16:  # scalar path with cached samples: draw it whole (< 16 values)
            vals = torch.empty(m, dtype=dtype)
            _draw(node.rng.state, kind, dtype, 0, vals, node.args[1:], node.kwargs)
            self._write(base0, vals)
            return
        _check_rules(kind, dtype)
        stream = _Stream(node.rng.state, kind, dtype, m, node.args[1:], node.kwargs)
        for a, b in self._linear_runs():
            a2, b2 = max(a, base0), min(b, base0 + m)
            if a2 < b2:
                self._write_run(a2, stream.values(a2 - base0, b2 - base0))

    def _linear_runs(self) -> list[tuple[int, int]]:
        """The window as runs ``[a, b)`` of the parameter's (contiguous) element order."""
        outer = math.prod(self.shape[: self.axis])
        run = self.length * self.bstr[self.axis]
        step = self.shape[self.axis] * self.bstr[self.axis]
        first = self.start * self.bstr[self.axis]
        return [(o * step + first, o * step + first + run) for o in range(outer)]

    def _write(self, first: int, vals: torch.Tensor) -> None:
        """Write the values of parameter elements ``[first, first + len(vals))`` that lie in the window."""
        for a, b in self._linear_runs():
            a2, b2 = max(a, first), min(b, first + vals.numel())
            if a2 < b2:
                self._write_run(a2, vals[a2 - first : b2 - first])

    def _write_run(self, x: int, vals: torch.Tensor) -> None:
        """Write ``vals`` at parameter element ``x`` onwards (all inside one run of the window)."""
        step = self.shape[self.axis] * self.bstr[self.axis]
        run = self.length * self.bstr[self.axis]
        o, inner = divmod(x, step)
        at = o * run + inner - self.start * self.bstr[self.axis]
        self.out.view(-1)[at : at + vals.numel()] = vals


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _leaves(v)]
    return [x]


# --------------------------------------------------------------------------------------------
# windows of a random op's output


def _per_element(dtype: torch.dtype) -> int:
    return 2 if dtype == torch.float64 else 1


def _advanced(state: torch.Tensor, draws: int) -> torch.Generator:
    st = state.clone()
    if draws:
        _native.mt19937_advance(st.data_ptr(), st.numel(), draws)
    g = torch.Generator()
    g.set_state(st)
    return g


def _draw(
    state: torch.Tensor, kind: str, dtype: torch.dtype, draws: int, buf: torch.Tensor, args: Any, kwargs: Any
) -> None:
    g = _advanced(state, draws)
    kw = {k: v for k, v in kwargs.items() if k != "generator"}
    with torch.no_grad():
        if kind == "uniform":
            buf.uniform_(*args, **kw, generator=g)
        else:
            buf.normal_(*args, **kw, generator=g)


class _Stream:
    """Elements ``[a, b)`` of the output of one recorded ``uniform_`` / ``normal_`` of ``m`` elements."""

    def __init__(self, state: torch.Tensor, kind: str, dtype: torch.dtype, m: int, args: Any, kwargs: Any) -> None:
        self.state, self.kind, self.dtype, self.m = state, kind, dtype, m
        self.args, self.kwargs = args, kwargs
        self.d = _per_element(dtype)

    def _gen(self, first: int, n: int) -> torch.Tensor:
        buf = torch.empty(n, dtype=self.dtype)
        _draw(self.state, self.kind, self.dtype, first * self.d, buf, self.args, self.kwargs)
        return buf

    def values(self, a: int, b: int) -> torch.Tensor:
        if self.kind == "uniform":
            return self._gen(a, b - a)
        m = self.m
        out = torch.empty(b - a, dtype=self.dtype)
        tail = m % 16 != 0
        end_main = min(b, m - 16) if tail else b
        if a < end_main:
            a16, e16 = a // 16 * 16, -(-end_main // 16) * 16
            out[: end_main - a] = self._gen(a16, e16 - a16)[a - a16 : end_main - a16]
        if tail and b > m - 16:
            # the last 16 elements are drawn again: after all the others (float32/64), or from the
            # draws of the incomplete block (float16/bfloat16, which draw whole blocks of 16)
            first = m // 16 * 16 if self.dtype in (torch.float16, torch.bfloat16) else m
            last = torch.empty(16, dtype=self.dtype)
            _draw(self.state, "normal", self.dtype, first * self.d, last, self.args, self.kwargs)
            lo = max(a, m - 16)
            out[lo - a :] = last[lo - (m - 16) : b - (m - 16)]
        return out


_RULES_OK: dict[tuple[str, torch.dtype], bool] = {}


def _check_rules(kind: str, dtype: torch.dtype) -> None:
    """Verify once per (op, dtype) that windows reproduce the whole op bit for bit on this build."""
    ok = _RULES_OK.get((kind, dtype))
    if ok is None:
        ok = True
        g = torch.Generator()
        for m in (16, 17, 31, 48, 100, 1000, 37 * 53):
            g.manual_seed(m)
            state = g.get_state()
            full = torch.empty(m, dtype=dtype)
            if kind == "uniform":
                full.uniform_(-0.5, 0.25, generator=g)
            else:
                full.normal_(0.5, 2.0, generator=g)
            s = _Stream(state, kind, dtype, m, (-0.5, 0.25) if kind == "uniform" else (0.5, 2.0), {})
            for a, b in ((0, m), (0, m // 2), (m // 3, m), (m // 5, m - m // 7), (m - 1, m), (5, 6)):
                if a < b and not torch.equal(s.values(a, b), full[a:b]):
                    ok = False
        _RULES_OK[(kind, dtype)] = ok
    if not ok:
        raise ShardMaterializeError(
            f"{kind}_ on {dtype} does not follow the draw order shard-by-shard replay relies on with this torch "
            "build; materialize the module first (distx_fake.deferred_init.materialize_module)"
        )
