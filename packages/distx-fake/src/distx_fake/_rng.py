"""Exact RNG for deferred init: snapshot the generator before a random op, advance it as eager would.

Recording (``snapshot_and_advance``)
    1. the generator the op would use is found (``generator=`` argument, else the default
       generator of the op's device); its state is cloned (5 KB for the CPU Mersenne Twister);
    2. the generator is advanced exactly as the eager op would advance it:

       * fast path, for the ops that dominate module init (``uniform_``, ``normal_``, ``rand``,
         ``randn`` on contiguous float32/float64/bfloat16/float16 tensors): the number of 32-bit
         Mersenne-Twister draws the CPU kernel consumes is a closed form of dtype and numel
         (``uniform``: n, 2n for float64; ``normal`` with n >= 16: n + 16*(n % 16 != 0) for
         float32, twice that for float64, 16*ceil(n/16) for the half types), and the native
         ``mt19937_advance`` skips that many draws on the serialized state (a twist every 624
         draws, no tempering, no output), an order of magnitude cheaper than generating the values. The
         formulas are verified against the real kernels at first use (``_self_check``); if
         any differs on this torch/CPU, the fast path is disabled for the process.
       * otherwise the op is run *for real* on the values its inputs have at this point of the
         recording (computed by replaying what they depend on, as ``.item()`` does), which
         advances the generator exactly as eager construction does even when the number of
         draws depends on the values (``multinomial``, ``poisson``, ``rrelu``). The target of an
         in-place op that only overwrites (``uniform_``, ``bernoulli_``...) is a scratch buffer.
Replay (``replay``)
    the snapshot is restored, the op runs on the real tensors, the previous state is put back,
    so values never depend on the generator state at materialization time nor on the order.
    For a target device other than the CPU the random values are drawn on the CPU (bit-identical
    to eager CPU construction) and copied to the device.

Ops on fake CUDA tensors use the CUDA generator; without a GPU it cannot be snapshotted, so
those ops are replayed with whatever CUDA generator state exists at materialization time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import _distx_fake as _native
from ._fake_tensor import FakeTensor
from ._tree import _leaves, _map

_aten = torch.ops.aten
_KIND = {
    _aten.uniform_.default: "uniform",
    _aten.normal_.default: "normal",
    _aten.rand.default: "uniform",
    _aten.randn.default: "normal",
}
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_fast_ok: bool | None = None


def draws(kind: str, dtype: torch.dtype, n: int) -> int | None:
    """32-bit draws a CPU ``uniform_``/``normal_`` kernel consumes for ``n`` elements, or None."""
    if dtype not in _FLOATS:
        return None
    if kind == "uniform":
        return 2 * n if dtype == torch.float64 else n
    if n < 16:  # scalar path with cached Box-Muller samples: not handled in closed form
        return None
    if dtype == torch.float32:
        return n + (16 if n % 16 else 0)
    if dtype == torch.float64:
        return 2 * (n + (16 if n % 16 else 0))
    return -(-n // 16) * 16


def _self_check() -> bool:
    """Verify the closed forms of :func:`draws` against the real kernels on this machine."""
    g = torch.Generator()
    for kind in ("uniform", "normal"):
        for dt in _FLOATS:
            for n in (16, 17, 31, 33, 1000, (1 << 16) + 7):
                g.manual_seed(n)
                torch.empty(3).uniform_(generator=g)
                s0 = g.get_state()
                t = torch.empty(n, dtype=dt)
                if kind == "uniform":
                    t.uniform_(-1.0, 1.0, generator=g)
                else:
                    t.normal_(0.0, 0.5, generator=g)
                c = draws(kind, dt, n)
                if c is None:
                    return False
                _native.mt19937_advance(s0.data_ptr(), s0.numel(), c)
                if not torch.equal(s0, g.get_state()):
                    return False
    return True


def _fast_draws(func: Any, args: Any, kwargs: Any) -> int | None:
    global _fast_ok
    kind = _KIND.get(func)
    if kind is None:
        return None
    if func in (_aten.rand.default, _aten.randn.default):
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        n = 1
        for s in args[0]:
            n *= int(s)
    else:
        t = args[0]
        if not isinstance(t, torch.Tensor) or not t.is_contiguous():
            return None
        dtype, n = t.dtype, t.numel()
    c = draws(kind, dtype, n)
    if c is None:
        return None
    if _fast_ok is None:
        with _disable_current_modes():
            _fast_ok = _self_check()
    return c if _fast_ok else None


@dataclass
class Snapshot:
    generator: torch.Generator
    state: torch.Tensor


def _op_device(args: Any, kwargs: Any) -> torch.device:
    for t in _leaves(args):
        if isinstance(t, torch.Tensor):
            return t.device
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    return torch.device("cpu")


def _inplace(func: Any) -> bool:
    schema = func._schema
    return bool(
        schema.arguments and schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write
    )


#: in-place random ops that only overwrite their target (its values are never read)
_OVERWRITE = {"aten::uniform_", "aten::normal_", "aten::bernoulli_", "aten::exponential_", "aten::geometric_"}
_OVERWRITE |= {"aten::log_normal_", "aten::cauchy_", "aten::random_"}


def snapshot_and_advance(func: Any, args: Any, kwargs: Any, realize: Callable[[Any], torch.Tensor]) -> Snapshot | None:
    """Snapshot the generator ``func`` will use and advance it as the eager op would.

    ``realize(fake)`` returns the real value a fake input has at this point of the recording;
    it is used for ops outside the fast path, whose number of draws may depend on the values
    (``multinomial``, ``poisson``, ``rrelu``...). Returns ``None`` when the op does not use a
    CPU generator (nothing can be snapshotted).
    """
    gen = kwargs.get("generator")
    if gen is None:
        if _op_device(args, kwargs).type != "cpu":
            return None
        gen = torch.default_generator
    elif gen.device.type != "cpu":
        return None
    n = _fast_draws(func, args, kwargs)
    with _disable_current_modes():
        snap = Snapshot(gen, gen.get_state())
        if n is not None:
            st = snap.state.clone()
            _native.mt19937_advance(st.data_ptr(), st.numel(), n)
            gen.set_state(st)
            return snap
    # run the op for real on the values the inputs have now: it draws exactly what eager does
    overwrite = func._schema.name in _OVERWRITE and _inplace(func)
    written = {id(t) for t in _written(func, args, kwargs)}
    target: Any = args[0] if overwrite else None

    def real(x: Any) -> Any:
        if not isinstance(x, FakeTensor):
            return x
        if x is target:  # only overwritten: any buffer of the same layout
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")
        r = realize(x)
        # the recorded value must not change: the op is replayed at materialization
        return r.clone() if id(x) in written else r

    with _disable_current_modes(), torch.no_grad():
        rargs = _map(real, args)
        rkw = _map(real, kwargs)
        if "device" in rkw:
            rkw = dict(rkw)
            rkw["device"] = torch.device("cpu")
        func(*rargs, **rkw)
    return snap


def _written(func: Any, args: Any, kwargs: Any) -> list[Any]:
    out: list[Any] = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            out.extend(_leaves(args[i] if i < len(args) else kwargs.get(a.name)))
    return out


def replay(snap: Snapshot, func: Any, args: Any, kwargs: Any) -> Any:
    """Run ``func`` with the generator set to the snapshot, then restore the generator."""
    dev = _op_device(args, kwargs)
    if dev.type == "meta":
        return func(*args, **kwargs)
    gen = snap.generator
    saved = gen.get_state()
    gen.set_state(snap.state)
    try:
        if dev.type == "cpu":
            return func(*args, **kwargs)
        # draw on the CPU (bit-identical to eager CPU construction), then copy to the device
        if _inplace(func):
            dst = args[0]
            tmp = torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype, device="cpu")
            rest = _map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, (args[1:], kwargs))
            func(tmp, *rest[0], **rest[1])
            dst.copy_(tmp)
            return dst
        cargs, ckw = _map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, (args, kwargs))
        if "device" in ckw:
            ckw = dict(ckw)
            ckw["device"] = torch.device("cpu")
        out = func(*cargs, **ckw)
        return _map(lambda x: x.to(dev) if isinstance(x, torch.Tensor) else x, out)
    finally:
        gen.set_state(saved)
