"""Generated bad input for distx-fake: checkpoints of odd tensors (every dtype, zero-size and
scalar shapes, strided, overlapping, conjugate and negative views, NaN/inf) loaded into
destinations of every layout, fake tensors against meta tensors, and deferred init against
eager construction.

The only allowed outcomes: the values saved come back bit for bit (NaN payloads included), or the
documented exception, with nothing written into a refused destination.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from distkit_common.dtypes import CODES
from distx_fake import checkpoint as cp
from distx_fake import deferred_init, fake

FUZZ = settings(max_examples=50, deadline=None, derandomize=True)
CKPT = settings(max_examples=30, deadline=None, derandomize=True)  # each example writes a checkpoint

#: every dtype distkit codes
DTYPES = [getattr(torch, name) for name in CODES]
SOURCE_VIEWS = ["plain", "transpose", "step", "expand", "as_strided", "conj", "neg", "offset"]
DEST_VIEWS = ["plain", "transpose", "step", "expand", "as_strided", "conj", "wrong_shape", "wrong_dtype", "meta"]


def _values(shape: tuple[int, ...], dtype: torch.dtype, special: float) -> torch.Tensor:
    n = math.prod(shape)
    base = torch.arange(n, dtype=torch.float64).reshape(shape) * 1.5 - 7
    if dtype.is_floating_point or dtype.is_complex:
        if n:
            base.view(-1)[0] = special
        out = base.to(dtype)
        return out + 1j * out.real.flip(-1) if dtype.is_complex and out.dim() else out
    if dtype is torch.bool:
        return base > 0
    return base.to(torch.int64).to(dtype)


def view_of(t: torch.Tensor, view: str) -> torch.Tensor:
    """``t``'s values (as far as the view allows) in another layout."""
    if view == "transpose" and t.dim() >= 2:
        return t.t().contiguous().t()
    if view == "step" and t.dim() >= 1:
        buf = torch.zeros(t.shape[0] * 2, *t.shape[1:], dtype=t.dtype)
        buf[::2] = t
        return buf[::2]
    if view == "expand" and t.dim() >= 1 and t.shape[0] >= 1:
        return t[:1].expand(t.shape)  # every row is the first: shared memory
    if view == "as_strided" and t.dim() == 2 and min(t.shape) >= 2:
        a, b = t.shape  # overlapping windows: element (i, j) is buf[i + j]
        return t.reshape(-1)[: a + b - 1].clone().as_strided((a, b), (1, 1))
    if view == "conj" and t.dtype.is_complex:
        return t.conj().resolve_conj().conj()  # the same values, as a lazy conjugate
    if view == "neg" and t.dtype.is_complex:
        return t.conj().imag  # a lazily negated float view (the source's dtype changes)
    if view == "offset" and t.numel():
        buf = torch.zeros(t.numel() + 1, dtype=t.dtype)
        buf[1:] = t.reshape(-1)
        return buf[1:].view(t.shape)
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal values (NaN payloads included) of two tensors of one shape and dtype."""
    a, b = a.resolve_conj().resolve_neg().contiguous(), b.resolve_conj().resolve_neg().contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype is torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True


def overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (the exact test for these layouts)."""
    if t.numel() <= 1:
        return False
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    span = 1
    for s, n in dims:
        if s < span:
            return True
        span = s * n
    return False


@CKPT
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=3),
    src_view=st.sampled_from(SOURCE_VIEWS),
    dst_view=st.sampled_from(DEST_VIEWS),
    special=st.sampled_from([1.0, float("nan"), float("inf"), -float("inf"), -0.0]),
)
@example(dtype=torch.float32, shape=[3, 2], src_view="plain", dst_view="expand", special=1.0)
@example(dtype=torch.float32, shape=[3, 2], src_view="plain", dst_view="as_strided", special=1.0)
@example(dtype=torch.float64, shape=[], src_view="plain", dst_view="plain", special=float("nan"))
def test_checkpoint_round_trip_of_odd_tensors(
    dtype: torch.dtype, shape: list[int], src_view: str, dst_view: str, special: float
) -> None:
    src = view_of(_values(tuple(shape), dtype, special), src_view)
    ref = src.resolve_conj().resolve_neg().clone()
    with tempfile.TemporaryDirectory() as d:
        cp.save_state_dict({"m": {"x": src, "step": 3}}, cp.FileSystemWriter(Path(d) / "ck"))
        assert _same(src, ref)  # saving did not touch the source
        dest_dtype, dest_shape = ref.dtype, tuple(ref.shape)
        expect: tuple[type[Exception], str] | None = None
        if dst_view == "wrong_shape":
            dest_shape = (*dest_shape, 2)
            expect = (ValueError, "checkpoint shape")
        elif dst_view == "wrong_dtype":
            dest_dtype = torch.int32 if dest_dtype is not torch.int32 else torch.int64
            expect = (ValueError, "checkpoint dtype")
        if dst_view == "meta":
            dest = torch.empty(dest_shape, dtype=dest_dtype, device="meta")
            expect = (TypeError, "is a fake/meta tensor")
        else:
            fill = torch.zeros(dest_shape, dtype=dest_dtype)
            dest = view_of(fill, dst_view)
        if expect is None and overlapping(dest):
            expect = (ValueError, "overlap")
        snapshot = dest.clone() if dest.device.type == "cpu" else None
        sd: dict[str, Any] = {"m": {"x": dest, "step": 0}}
        reader = cp.FileSystemReader(Path(d) / "ck")
        if expect is not None:
            with pytest.raises(expect[0], match=expect[1]):
                cp.load_state_dict(sd, reader)
            if snapshot is not None:
                assert _same(dest, snapshot)  # nothing written into a refused destination
            return
        cp.load_state_dict(sd, reader)
        assert sd["m"]["step"] == 3
        got = sd["m"]["x"]
        assert got is dest  # loaded in place
        assert _same(got, ref)


@CKPT
@given(
    key=st.one_of(st.text(max_size=4), st.integers(-3, 3), st.tuples(st.integers()), st.none(), st.floats()),
    value=st.sampled_from(["tensor", "uint16", "meta", "fake", "object", "nested_list"]),
)
@example(key="a.b", value="tensor")
@example(key="", value="tensor")
def test_save_refuses_what_it_cannot_store(key: Any, value: str) -> None:
    v: Any
    if value == "tensor":
        v = torch.ones(2)
    elif value == "uint16":
        v = torch.ones(2, dtype=torch.uint16)
    elif value == "meta":
        v = torch.empty(2, device="meta")
    elif value == "fake":
        with fake.fake_mode():
            v = torch.ones(2)
    elif value == "object":
        v = object()
    else:
        v = [[torch.arange(3)], {"k": 1.5}]
    with tempfile.TemporaryDirectory() as d:
        w = cp.FileSystemWriter(Path(d) / "ck")
        sd = {key: v}
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            with pytest.raises(TypeError, match="keys must be str or int"):
                cp.save_state_dict(sd, w)
            return
        if value == "uint16":
            with pytest.raises(TypeError, match="uint16|dtype"):
                cp.save_state_dict(sd, w)
            return
        if value in ("meta", "fake"):
            with pytest.raises(TypeError, match="fake/meta tensor"):
                cp.save_state_dict(sd, w)
            return
        if value == "object":
            with pytest.raises(TypeError, match="has type object"):
                cp.save_state_dict(sd, w)
            return
        cp.save_state_dict(sd, w)
        back: dict[Any, Any] = {key: torch.zeros(2) if value == "tensor" else [[torch.zeros(3, dtype=torch.int64)], {}]}
        if value != "tensor":
            back[key][1]["k"] = None
        cp.load_state_dict(back, cp.FileSystemReader(Path(d) / "ck"))
        if value == "tensor":
            assert torch.equal(back[key], torch.ones(2))
        else:
            assert torch.equal(back[key][0][0], torch.arange(3)) and back[key][1]["k"] == 1.5


OPS = {
    "add": lambda x: x + 1,
    "matmul_t": lambda x: x @ x.transpose(-1, -2) if x.dim() >= 2 else x * x,
    "sum": lambda x: x.sum(-1) if x.dim() else x.sum(),
    "expand": lambda x: x.unsqueeze(0).expand(2, *x.shape),
    "as_strided": lambda x: x.as_strided((max(x.numel() - 1, 0),), (1,)),
    "cat": lambda x: torch.cat([x.reshape(-1), x.reshape(-1)]),
    "index": lambda x: x.reshape(-1)[torch.tensor([0, -1])] if x.numel() else x.reshape(-1)[:0],
    "to_f64": lambda x: x.to(torch.float64),
    "t_contig": lambda x: x.t().contiguous() if x.dim() == 2 else x.contiguous(),
    "softmax": lambda x: torch.softmax(x, -1) if x.dim() else x,
}


@FUZZ
@given(
    shape=st.lists(st.integers(0, 4), max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    op=st.sampled_from(sorted(OPS)),
)
@example(shape=[0], dtype=torch.float32, op="index")
def test_fake_tensors_agree_with_meta_tensors(shape: list[int], dtype: torch.dtype, op: str) -> None:
    meta = torch.empty(shape, dtype=dtype, device="meta")
    try:
        want: torch.Tensor | None = OPS[op](meta)
        want_err: Exception | None = None
    except (RuntimeError, IndexError, ValueError) as e:
        want, want_err = None, e
    with fake.fake_mode():
        x = torch.empty(shape, dtype=dtype)
        assert fake.is_fake(x) and x.device.type == "cpu"
        if want_err is not None:
            with pytest.raises(type(want_err)):
                OPS[op](x)
            return
        got = OPS[op](x)
    assert want is not None and fake.is_fake(got)
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    assert fake.meta_like(got).shape == want.shape
    with pytest.raises(fake.FakeDataError):
        got.tolist()


@FUZZ
@given(
    in_f=st.integers(0, 5),
    out_f=st.integers(0, 5),
    seed=st.integers(0, 2**32 - 1),
    device=st.sampled_from([None, "cpu", "meta", "nonsense", 3.5]),
    bias=st.booleans(),
)
@example(in_f=0, out_f=3, seed=0, device=None, bias=True)
def test_deferred_init_materializes_the_eager_module(in_f: int, out_f: int, seed: int, device: Any, bias: bool) -> None:
    with warnings.catch_warnings():  # (torch: "Initializing zero-element tensors is a no-op")
        warnings.simplefilter("ignore", UserWarning)
        torch.manual_seed(seed)
        eager = torch.nn.Linear(in_f, out_f, bias=bias)
        torch.manual_seed(seed)
        m = deferred_init.deferred_init(torch.nn.Linear, in_f, out_f, bias=bias)
    assert deferred_init.is_deferred(m)
    if device in ("nonsense", 3.5):
        with pytest.raises(ValueError, match="invalid device"):
            deferred_init.materialize_module(m, device=device)
        return
    deferred_init.materialize_module(m, device=device)
    assert not deferred_init.is_deferred(m)
    for name, p in eager.named_parameters():
        got = getattr(m, name)
        assert isinstance(got, torch.nn.Parameter) and got.shape == p.shape
        if device == "meta":
            assert got.device.type == "meta"
        else:
            assert torch.equal(got, p), name
