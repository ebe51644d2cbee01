"""Exact RNG for deferred init: snapshot the generator before a random op, advance it as eager would.

Recording (``snapshot_and_advance``)
    1. the generator the op would use is found (``generator=`` argument, else the default
       generator of the op's device); its state is cloned (5 KB for the CPU Mersenne Twister);
    2. the op is run *for real* on scratch CPU tensors of the same sizes, strides and dtypes,
       which advances the generator exactly as eager construction does (the number of draws of
       a torch random kernel depends only on the op, the dtype, the size and the CPU features,
       never on the values, and running the very same kernel guarantees it).  The scratch
       buffer of an in-place op is uninitialized (``empty``), other tensor inputs are zeros.
Replay (``replay``)
    the snapshot is restored, the op runs on the real tensors, the previous state is put back,
    so values never depend on the generator state at materialization time nor on the order.
    For a target device other than the CPU the random values are drawn on the CPU (bit-identical
    to eager CPU construction) and copied to the device.

Ops on fake CUDA tensors use the CUDA generator; without a GPU it cannot be snapshotted, so
those ops are replayed with whatever CUDA generator state exists at materialization time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map


@dataclass
class Snapshot:
    generator: torch.Generator
    state: torch.Tensor


def _op_device(args: Any, kwargs: Any) -> torch.device:
    for t in tree_flatten(args)[0]:
        if isinstance(t, torch.Tensor):
            return t.device
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    return torch.device("cpu")


def _inplace(func: Any) -> bool:
    schema = func._schema
    return bool(
        schema.arguments
        and schema.arguments[0].alias_info is not None
        and schema.arguments[0].alias_info.is_write
    )


def snapshot_and_advance(func: Any, args: Any, kwargs: Any) -> Snapshot | None:
    """Snapshot the generator ``func`` will use and advance it as the eager op would.

    Returns ``None`` when the op does not use a CPU generator (nothing can be snapshotted).
    """
    gen = kwargs.get("generator")
    if gen is None:
        if _op_device(args, kwargs).type != "cpu":
            return None
        gen = torch.default_generator
    elif gen.device.type != "cpu":
        return None
    snap = Snapshot(gen, gen.get_state())
    inplace = _inplace(func)
    first = [True]

    def scratch(x: Any) -> Any:
        if isinstance(x, FakeTensor):
            if inplace and first[0]:
                first[0] = False
                return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")
            return torch.zeros_like(x, device="cpu")
        return x

    with _disable_current_modes(), torch.no_grad():
        sargs = tree_map(scratch, args)
        skw = tree_map(scratch, kwargs)
        if "device" in skw:
            skw = dict(skw)
            skw["device"] = torch.device("cpu")
        func(*sargs, **skw)
    return snap


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
            rest = tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, (args[1:], kwargs))
            func(tmp, *rest[0], **rest[1])
            dst.copy_(tmp)
            return dst
        cargs, ckw = tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, (args, kwargs))
        if "device" in ckw:
            ckw = dict(ckw)
            ckw["device"] = torch.device("cpu")
        out = func(*cargs, **ckw)
        return tree_map(lambda x: x.to(dev) if isinstance(x, torch.Tensor) else x, out)
    finally:
        gen.set_state(saved)
