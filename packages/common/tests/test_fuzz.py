"""Generated bad input for distkit-common's checks, dtype codes and native row / conversion code.

Every example either gives the plain-torch result or the documented exception (type and message
fragment); derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from distkit_common import _distkit_common as native
from distkit_common.dtypes import CODES, code_of, dtype_name, torch_dtype
from distkit_common.validate import Checks

FUZZ = settings(max_examples=50, deadline=None, derandomize=True)
CHECKS = Checks()

#: every dtype distkit codes, and some it refuses
ALL_DTYPES = [
    *(getattr(torch, name) for name in CODES),
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
INFO = {d: torch.iinfo(d) for d in INT_DTYPES}

# indices with the interesting values: 0, the edges of the range, huge, negative, the int32 limits
index_values = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([-(2**63), -(2**31), -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1]),
)


def _as_dtype(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    """``values`` clamped into ``dtype``'s range (so the reference knows what the tensor holds)."""
    info = INFO[dtype]
    return torch.tensor([min(max(v, info.min), info.max) for v in values], dtype=torch.int64).to(dtype)


def _layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as ``t`` (1-D) in another memory layout."""
    if kind == "strided":  # every other element of a twice-as-long buffer
        buf = torch.zeros(2 * t.numel(), dtype=t.dtype)
        buf[::2] = t
        return buf[::2]
    if kind == "expand" and t.numel():  # every element is the same memory (stride 0)
        return t[:1].expand(t.numel())
    return t


@FUZZ
@given(
    values=st.lists(index_values, max_size=12),
    dtype=st.sampled_from([*INT_DTYPES, torch.float32, torch.bool, torch.uint32]),
    upper=st.one_of(st.none(), st.integers(0, 50)),
    layout=st.sampled_from(["contiguous", "strided", "expand", "numpy", "2d", "meta", "list"]),
)
@example(values=[-1], dtype=torch.int64, upper=10, layout="contiguous")
@example(values=[2**32], dtype=torch.int32, upper=10, layout="numpy")
@example(values=[], dtype=torch.int64, upper=0, layout="strided")
def test_index_gives_the_indices_or_the_documented_error(
    values: list[int], dtype: torch.dtype, upper: int | None, layout: str
) -> None:
    if dtype in INFO:
        ref = _as_dtype(values, dtype)
    else:
        ref = torch.tensor(values[:1] and [1] * len(values), dtype=torch.int64).to(dtype)
    x: Any
    if layout == "numpy":
        x = ref.numpy() if dtype is not torch.uint32 else np.zeros(len(values), dtype=np.uint32)
        ref = torch.from_numpy(np.asarray(x))
    elif layout == "2d":
        x = ref.reshape(1, -1)
    elif layout == "meta":
        x = ref.to("meta")
    elif layout == "list":
        x = values  # a sequence is refused unless allow_sequence
    else:
        x = _layout(ref, layout)
        ref = x.clone()
    expect: tuple[type[Exception], str] | None = None
    wide = ref.to(torch.int64)
    bad = (wide < 0) | (wide >= (upper if upper is not None else 2**63 - 1))
    if layout == "list" or ref.dtype not in (torch.int64, torch.int32):
        expect = (TypeError, "keys must be")
    elif layout == "meta":
        expect = (ValueError, "must be on device 'cpu', got meta")
    elif layout == "2d":
        expect = (ValueError, "1-D")
    elif bool(bad.any()):
        pos = int(bad.nonzero()[0])
        expect = (IndexError, re.escape(f"keys[{pos}] = {int(wide[pos])}"))
    if expect is not None:
        with pytest.raises(expect[0], match=expect[1]):
            CHECKS.index(x, "keys", upper=upper, dtypes=("int64", "int32"))
        return
    got = CHECKS.index(x, "keys", upper=upper, dtypes=("int64", "int32"))
    assert got.is_contiguous() and got.dtype is ref.dtype and torch.equal(got, ref)


@FUZZ
@given(
    dtype=st.sampled_from(ALL_DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=4),
    want_dtype=st.sampled_from([None, torch.float32, (torch.float32, torch.int64)]),
    want_ndim=st.sampled_from([None, 1, 2, (1, 3)]),
    want_shape=st.sampled_from([None, (None,), (2, None), (0, 3)]),
    transpose=st.booleans(),
    expand=st.booleans(),
    contiguous=st.booleans(),
    device=st.sampled_from(["cpu", "meta"]),
    want_device=st.sampled_from([None, "cpu", torch.device("cpu"), ("cpu", "cuda")]),
)
def test_tensor_check_agrees_with_the_tensor(
    dtype: torch.dtype,
    shape: list[int],
    want_dtype: Any,
    want_ndim: Any,
    want_shape: Any,
    transpose: bool,
    expand: bool,
    contiguous: bool,
    device: str,
    want_device: Any,
) -> None:
    t = torch.empty(shape, dtype=dtype, device=device)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, 1)
    if expand and t.dim() >= 1 and t.shape[0] == 1:
        t = t.expand(3, *t.shape[1:])  # overlapping rows (stride 0)
    dtypes = () if want_dtype is None else (want_dtype,) if isinstance(want_dtype, torch.dtype) else want_dtype
    dims = () if want_ndim is None else (want_ndim,) if isinstance(want_ndim, int) else want_ndim
    expect: type[Exception] | None = None
    if want_dtype is not None and t.dtype not in dtypes:
        expect = TypeError
    elif (
        (want_device is not None and t.device.type != "cpu")
        or (want_ndim is not None and t.dim() not in dims)
        or (
            want_shape is not None
            and (len(want_shape) != t.dim() or any(w is not None and w != g for w, g in zip(want_shape, t.shape)))
        )
        or (contiguous and not t.is_contiguous())
    ):
        expect = ValueError
    kwargs = dict(dtype=want_dtype, device=want_device, ndim=want_ndim, shape=want_shape, contiguous=contiguous)
    if expect is None:
        assert CHECKS.tensor(t, "x", **kwargs) is t
    else:
        with pytest.raises(expect, match="x must "):
            CHECKS.tensor(t, "x", **kwargs)


@FUZZ
@given(
    value=st.one_of(
        st.integers(-(2**70), 2**70),
        st.booleans(),
        st.floats(allow_nan=True),
        st.just(np.int64(3)),
        st.just(np.uint8(200)),
        st.text(max_size=2),
        st.none(),
    ),
    size=st.integers(1, 9),
)
@example(value=True, size=2)
@example(value=float("nan"), size=2)
@example(value=-1, size=1)
def test_scalar_checks(value: Any, size: int) -> None:
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    for check in (
        lambda: CHECKS.int(value, "n", lo=0, hi=size),
        lambda: CHECKS.rank(value, "root", size),
        lambda: CHECKS.axis(value, "dim", size),
    ):
        if not is_int:
            with pytest.raises(TypeError, match="must be an int"):
                check()
    if not is_int:
        return
    v = int(value)
    if 0 <= v < size:
        assert CHECKS.int(value, "n", lo=0, hi=size) == v and CHECKS.rank(value, "root", size) == v
    else:
        with pytest.raises(ValueError, match="n must be"):
            CHECKS.int(value, "n", lo=0, hi=size)
        with pytest.raises(ValueError, match="out of range for a communicator of size"):
            CHECKS.rank(value, "root", size)
    if -size <= v < size:
        assert CHECKS.axis(value, "dim", size) == v % size
    else:
        with pytest.raises(ValueError, match="out of range for a tensor with"):
            CHECKS.axis(value, "dim", size)
    choices = set(range(size))
    if v in choices:
        assert CHECKS.choice(v, "mode", choices) == v
    else:
        with pytest.raises(ValueError, match="mode must be one of"):
            CHECKS.choice(v, "mode", choices)
    with pytest.raises(ValueError, match="mode must be one of"):
        CHECKS.choice([v], "mode", choices)  # unhashable


@FUZZ
@given(dtype=st.sampled_from(ALL_DTYPES), spelling=st.sampled_from(["torch", "str", "numpy"]))
def test_dtype_codes_round_trip_or_refuse(dtype: torch.dtype, spelling: str) -> None:
    name = str(dtype).removeprefix("torch.")
    arg: Any = {"torch": dtype, "str": name}.get(spelling)
    if spelling == "numpy":
        try:
            arg = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:  # bfloat16, float8: numpy has none
            arg = name
    if name in CODES:
        assert dtype_name(arg) == name and torch_dtype(code_of(arg)) is dtype and torch_dtype(name) is dtype
    else:
        with pytest.raises(TypeError, match="unsupported dtype"):
            code_of(arg)


@FUZZ
@given(
    values=st.lists(
        st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True), st.floats(-1e-40, 1e-40)),
        max_size=40,
    ),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    step=st.integers(1, 3),
)
@example(values=[float("nan"), float("inf"), -float("inf"), 65520.0, -0.0], dtype=torch.float16, step=1)
def test_half_conversion_matches_torch(values: list[float], dtype: torch.dtype, step: int) -> None:
    # the native code reads contiguous memory: the caller passes a contiguous copy of a strided view
    x = torch.tensor(values * step, dtype=torch.float32)[::step].contiguous()
    out = torch.empty(x.numel(), dtype=dtype)
    native.convert_f32(x.data_ptr(), out.data_ptr(), x.numel(), code_of(dtype))
    ref = x.to(dtype)
    assert torch.equal(out.view(torch.int16)[~ref.isnan()], ref.view(torch.int16)[~ref.isnan()])
    assert torch.equal(out.isnan(), ref.isnan())
    back = torch.empty(x.numel(), dtype=torch.float32)
    native.convert_to_f32(out.data_ptr(), back.data_ptr(), x.numel(), code_of(dtype))
    assert torch.equal(back.isnan(), ref.isnan())
    assert torch.equal(back[~ref.isnan()], ref.float()[~ref.isnan()])


@FUZZ
@given(code=st.one_of(st.integers(-5, 40), st.sampled_from([2**31 - 1, -(2**31)])))
def test_half_conversion_refuses_other_codes(code: int) -> None:
    if code in (CODES["float16"], CODES["bfloat16"]):
        return
    with pytest.raises(TypeError, match="float16/bfloat16|unknown dtype code"):
        native.convert_f32(0, 0, 0, code)
    with pytest.raises(TypeError, match="float16/bfloat16|unknown dtype code"):
        native.convert_to_f32(0, 0, 0, code)


@FUZZ
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int8, torch.bfloat16, torch.complex64]),
    rows=st.integers(1, 12),
    cols=st.integers(1, 5),
    col_step=st.integers(1, 3),
    rows_per_chunk=st.integers(1, 13),
    idx=st.lists(index_values, max_size=10),
    idx64=st.booleans(),
    op=st.sampled_from(["gather", "scatter", "scatter_add"]),
)
@example(dtype=torch.float32, rows=3, cols=2, col_step=1, rows_per_chunk=1, idx=[3], idx64=True, op="gather")
@example(dtype=torch.int8, rows=3, cols=2, col_step=2, rows_per_chunk=2, idx=[2**31], idx64=True, op="scatter")
def test_row_op_matches_torch_or_refuses_before_writing(
    dtype: torch.dtype,
    rows: int,
    cols: int,
    col_step: int,
    rows_per_chunk: int,
    idx: list[int],
    idx64: bool,
    op: str,
) -> None:
    if op == "scatter_add" and dtype not in (torch.float32, torch.float64):
        op = "scatter"  # sums of small integers are exact in these two; others round or wrap
    # the table: chunks of `rows_per_chunk` rows, each a strided view (column stride `col_step`)
    full = (torch.arange(rows * cols * col_step, dtype=torch.float64).reshape(rows, cols * col_step) % 23).to(dtype)
    chunks = [c.contiguous() for c in torch.split(full, rows_per_chunk)]
    if len(chunks) and chunks[-1].shape[0] < rows_per_chunk:  # every chunk holds rows_per_chunk rows
        pad = torch.zeros(rows_per_chunk - chunks[-1].shape[0], cols * col_step, dtype=dtype)
        chunks[-1] = torch.cat([chunks[-1], pad])
    view = full[:, ::col_step]
    i = _as_dtype(idx, torch.int64 if idx64 else torch.int32)
    n = i.numel()
    data = (torch.arange(n * cols, dtype=torch.float64).reshape(n, cols) + 1).to(dtype)
    out = torch.full((n, cols), 7, dtype=dtype)
    before = [c.clone() for c in chunks]
    args = ([c.data_ptr() for c in chunks], rows_per_chunk, rows, cols, cols * col_step, col_step, code_of(dtype))
    target = out if op == "gather" else data
    wide = i.to(torch.int64)
    bad = (wide < 0) | (wide >= rows)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0])
        with pytest.raises(IndexError, match=rf"index {int(wide[pos])} at position {pos} is out of range"):
            native.row_op(op, *args, i.data_ptr(), idx64, n, target.data_ptr())
        assert all(torch.equal(a, b) for a, b in zip(chunks, before)) and bool((out == 7).all())
        return
    native.row_op(op, *args, i.data_ptr(), idx64, n, target.data_ptr())
    got = torch.cat(chunks)[:rows, ::col_step]
    if op == "gather":
        assert torch.equal(out, view[wide])
        return
    expect = view.clone()
    if op == "scatter_add":
        expect = expect.to(torch.float64).index_add_(0, wide, data.to(torch.float64)).to(dtype)
    else:
        # duplicates: the last write wins
        for k in range(n):
            expect[int(wide[k])] = data[k]
    assert torch.equal(got, expect)
