"""Generated bad input for a one-rank kvps server (in-process: importing kvps initialises MPI).

Keys of every dtype, layout and range, value buffers of every dtype, length and layout, NaN/inf
values, clocks, and a shut-down server. Each operation either matches a plain-torch model of
the key-value table or raises the documented exception, and a refused call changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kvps

FUZZ = settings(
    max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
NUM_KEYS = 20
LENGTHS = torch.tensor([1 + k % 3 for k in range(NUM_KEYS)])  # variable value lengths 1..3
OFFSETS = torch.cat([torch.zeros(1, dtype=torch.int64), LENGTHS.cumsum(0)])


class Model:
    """The server and a flat float32 copy of what it should hold."""

    def __init__(self) -> None:
        kvps.setup(NUM_KEYS, 1, "all")
        self.server = kvps.Server(LENGTHS.numpy())
        self.worker = kvps.Worker(0, self.server)
        self.flat = torch.arange(float(int(OFFSETS[-1])))
        self.worker.set(torch.arange(NUM_KEYS), self.flat.clone())

    def rows(self, keys: torch.Tensor) -> torch.Tensor:
        """The model's values of ``keys`` (int64, in range), concatenated."""
        if keys.numel() == 0:
            return torch.zeros(0)
        return torch.cat([self.flat[int(OFFSETS[k]) : int(OFFSETS[k + 1])] for k in keys.tolist()])

    def check_all(self) -> None:
        out = torch.full_like(self.flat, -7.0)
        self.worker.pull(torch.arange(NUM_KEYS), out)
        torch.testing.assert_close(out, self.flat, rtol=0, atol=0, equal_nan=True)


@pytest.fixture(scope="module")
def model() -> Iterator[Model]:
    m = Model()
    yield m
    m.server.shutdown()


key_values = st.one_of(
    st.integers(0, NUM_KEYS - 1),
    st.integers(NUM_KEYS, NUM_KEYS + 3),
    st.sampled_from([-1, -(2**31), 2**31, 2**32 + 1, 2**63 - 1, -(2**63)]),
)
KEY_LAYOUTS = ["tensor", "numpy", "strided", "expand", "int32", "float", "bool", "2d", "meta", "list", "neg_stride"]


def make_keys(values: list[int], layout: str) -> tuple[Any, torch.Tensor]:
    """The key argument in ``layout`` and the int64 keys it holds."""
    ref = torch.tensor(values, dtype=torch.int64)
    if layout == "expand" and values:
        ref = ref[:1].expand(len(values))
    if layout == "numpy":
        return ref.numpy(), ref
    if layout == "strided":
        buf = torch.zeros(2 * len(values), dtype=torch.int64)
        buf[::2] = ref
        return buf[::2], ref
    if layout == "int32":
        return ref.to(torch.int32), ref
    if layout == "float":
        return ref.to(torch.float64), ref
    if layout == "bool":
        return ref != 0, ref
    if layout == "2d":
        return ref.reshape(1, -1), ref
    if layout == "meta":
        return ref.to("meta"), ref
    if layout == "list":
        return values, ref
    if layout == "neg_stride":
        return np.ascontiguousarray(ref.numpy()[::-1])[::-1], ref
    return ref, ref


def keys_error(keys: Any, ref: torch.Tensor, layout: str) -> tuple[type[Exception], str] | None:
    """The exception the key checks must raise for this key argument, or None."""
    if layout in ("list", "int32", "float", "bool"):
        return TypeError, "keys must be"
    if layout == "neg_stride" and keys.strides[0] < 0:
        return ValueError, "negative"  # torch.from_numpy refuses negative strides
    if layout == "meta":
        return ValueError, "must be on device 'cpu', got meta"
    if layout == "2d":
        return ValueError, "1-D"
    bad = (ref < 0) | (ref >= NUM_KEYS)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0])
        return kvps.KeyRangeError, re.escape(f"keys[{pos}] = {int(ref[pos])}")
    return None


VAL_LAYOUTS = [
    "ok",
    "numpy",
    "2d",
    "float64",
    "short",
    "long",
    "strided",
    "expand",
    "meta",
    "readonly",
    "requires_grad",
]


def make_vals(n: int, layout: str, fill: torch.Tensor) -> tuple[Any, tuple[type[Exception], str] | None]:
    """A value buffer of ``n`` elements (holding ``fill``) in ``layout`` and the error it must cause."""
    if layout == "numpy":
        return fill.clone().numpy(), None
    if layout == "2d":
        return fill.clone().reshape(1, n), None  # any shape: the buffer is used flat
    if layout == "float64":
        return fill.double(), (TypeError, "must have dtype torch.float32")
    if layout == "short":
        return fill[:-1].clone() if n else torch.zeros(1), (ValueError, "elements, but the keys' value lengths sum")
    if layout == "long":
        return torch.cat([fill, torch.zeros(1)]), (ValueError, "elements, but the keys' value lengths sum")
    if layout == "strided":
        buf = torch.zeros(2 * n)
        buf[::2] = fill
        return buf[::2], ((ValueError, "contiguous") if n > 1 else None)
    if layout == "expand":  # n elements in one (stride 0)
        if n == 0:
            return torch.zeros(0), None
        one = fill[:1].expand(n)
        return one, ((ValueError, "contiguous") if n > 1 else None)
    if layout == "meta":
        return fill.to("meta"), (ValueError, "must be on device 'cpu', got meta")
    if layout == "readonly":
        a = fill.clone().numpy()
        a.flags.writeable = False
        return a, None  # refused by pull only
    if layout == "requires_grad":
        return fill.clone().requires_grad_(True), None  # refused by pull only
    return fill.clone(), None


@FUZZ
@given(
    op=st.sampled_from(["pull", "push", "set"]),
    values=st.lists(key_values, max_size=8),
    key_layout=st.sampled_from(KEY_LAYOUTS),
    val_layout=st.sampled_from(VAL_LAYOUTS),
    special=st.sampled_from([0.0, float("nan"), float("inf"), -float("inf"), 1e38]),
    asynchronous=st.booleans(),
)
@example(op="pull", values=[20], key_layout="tensor", val_layout="ok", special=0.0, asynchronous=False)
@example(op="push", values=[-1], key_layout="numpy", val_layout="ok", special=0.0, asynchronous=True)
@example(op="set", values=[3, 3], key_layout="expand", val_layout="ok", special=float("nan"), asynchronous=False)
@example(op="pull", values=[1, 2], key_layout="tensor", val_layout="readonly", special=0.0, asynchronous=False)
def test_pull_push_set_match_the_model_or_refuse(
    model: Model, op: str, values: list[int], key_layout: str, val_layout: str, special: float, asynchronous: bool
) -> None:
    keys, ref = make_keys(values, key_layout)
    kerr = keys_error(keys, ref, key_layout)
    ok_keys = ref.clamp(0, NUM_KEYS - 1)
    n = int(LENGTHS[ok_keys].sum()) if ref.numel() else 0
    # values derived from the key (so that duplicate keys in a set agree), one of them special
    fill = torch.cat([torch.full((int(LENGTHS[k]),), float(k % 5 + 1)) for k in ok_keys.tolist()] or [torch.zeros(0)])
    if n and val_layout == "ok":
        fill[fill == 1.0] = special
    vals, verr = make_vals(n, val_layout, fill)
    if op == "pull" and val_layout in ("readonly", "requires_grad"):
        verr = (ValueError, "read-only" if val_layout == "readonly" else "requires grad")
    before = model.flat.clone()
    expect = kerr or verr
    fn = getattr(model.worker, op)
    if expect is not None:
        with pytest.raises(expect[0], match=expect[1]):
            fn(keys, vals, asynchronous)
        model.check_all()  # a refused call changed nothing
        torch.testing.assert_close(model.flat, before, rtol=0, atol=0, equal_nan=True)
        return
    ts = fn(keys, vals, asynchronous)
    model.worker.wait(ts)
    if op == "pull":
        got = torch.as_tensor(np.asarray(vals.detach() if isinstance(vals, torch.Tensor) else vals)).reshape(-1)
        torch.testing.assert_close(got, model.rows(ref), rtol=0, atol=0, equal_nan=True)
    else:
        flat_vals = torch.as_tensor(np.asarray(vals.detach() if isinstance(vals, torch.Tensor) else vals)).reshape(-1)
        pos = 0
        for k in ref.tolist():
            a, b = int(OFFSETS[k]), int(OFFSETS[k + 1])
            v = flat_vals[pos : pos + b - a]
            model.flat[a:b] = model.flat[a:b] + v if op == "push" else v
            pos += b - a
    model.check_all()
    # keep the table finite so that later sums stay exact
    model.worker.set(torch.arange(NUM_KEYS), torch.arange(float(int(OFFSETS[-1]))))
    model.flat = torch.arange(float(int(OFFSETS[-1])))


@FUZZ
@given(
    values=st.lists(key_values, max_size=8),
    key_layout=st.sampled_from(KEY_LAYOUTS),
    start=st.one_of(st.integers(-2, 6), st.just(2**62)),
    end=st.integers(-1, 8),
    asynchronous=st.sampled_from([True, False, 1, "yes"]),
)
@example(values=[1], key_layout="tensor", start=3, end=2, asynchronous=False)
@example(values=[1], key_layout="tensor", start=-1, end=0, asynchronous=False)
def test_intent_and_localize_refuse_bad_input_and_keep_values(
    model: Model, values: list[int], key_layout: str, start: int, end: int, asynchronous: Any
) -> None:
    keys, ref = make_keys(values, key_layout)
    kerr = keys_error(keys, ref, key_layout)
    # localize: asynchronous is checked first, then the keys
    if not isinstance(asynchronous, bool):
        with pytest.raises(TypeError, match="asynchronous must be a bool"):
            model.worker.localize(keys, asynchronous)
    elif kerr is not None:
        with pytest.raises(kerr[0], match=kerr[1]):
            model.worker.localize(keys, asynchronous)
    else:
        model.worker.wait(model.worker.localize(keys, asynchronous))
    # intent: the clocks are checked first, then the keys
    e = start + 1 if end == 0 else end
    if start < 0 or end < 0:
        with pytest.raises(ValueError, match="must be >= 0"):
            model.worker.intent(keys, start, end)
    elif e <= start:
        with pytest.raises(ValueError, match="is empty"):
            model.worker.intent(keys, start, end)
    elif kerr is not None:
        with pytest.raises(kerr[0], match=kerr[1]):
            model.worker.intent(keys, start, end)
    else:
        assert model.worker.intent(keys, start, end) == -1
    model.check_all()


@FUZZ
@given(key=st.one_of(st.integers(-(2**65), 2**65), st.integers(-2, NUM_KEYS + 2), st.booleans(), st.floats()))
@example(key=NUM_KEYS)
@example(key=True)
def test_get_key_size(model: Model, key: Any) -> None:
    if isinstance(key, bool) or not isinstance(key, int):
        with pytest.raises(TypeError, match="key must be an int"):
            model.worker.get_key_size(key)
    elif not 0 <= key < NUM_KEYS:
        with pytest.raises(kvps.KeyRangeError, match=f"key {key} is out of range"):
            model.worker.get_key_size(key)
    else:
        assert model.worker.get_key_size(key) == int(LENGTHS[key])


@pytest.fixture(scope="module")
def closed(model: Model) -> tuple[kvps.Server, kvps.Worker]:
    """A second server, shut down (the first one keeps running)."""
    s = kvps.Server(2)
    w = kvps.Worker(0, s)
    w.set(torch.tensor([0]), torch.ones(2))
    s.shutdown()
    return s, w


@FUZZ
@given(
    op=st.sampled_from(["pull", "push", "set", "localize", "intent", "advance_clock", "barrier", "wait_sync"]),
    values=st.lists(key_values, max_size=4),
    key_layout=st.sampled_from(["tensor", "numpy", "meta", "float"]),
)
def test_a_shut_down_server_refuses_every_operation(
    closed: tuple[kvps.Server, kvps.Worker], op: str, values: list[int], key_layout: str
) -> None:
    s, w = closed
    keys, _ref = make_keys(values, key_layout)
    calls = {
        "pull": lambda: w.pull(keys, torch.zeros(2 * len(values))),
        "push": lambda: w.push(keys, torch.zeros(2 * len(values))),
        "set": lambda: w.set(keys, torch.zeros(2 * len(values))),
        "localize": lambda: w.localize(keys),
        "intent": lambda: w.intent(keys, 0),
        "advance_clock": w.advance_clock,
        "barrier": s.barrier,
        "wait_sync": w.wait_sync,
    }
    with pytest.raises(RuntimeError, match="shut down"):
        calls[op]()
    s.shutdown()  # a second shutdown does nothing
