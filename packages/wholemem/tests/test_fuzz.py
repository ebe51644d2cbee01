"""Generated bad input for wholemem on a one-rank communicator: gather / scatter on every memory
type and on plain CPU tensors of any layout (strided, transposed, expanded, ``as_strided``),
sub-tensor views, embeddings, and a finalized library.

The reference is plain torch (``index_select`` / ``index_copy_`` with "last duplicate wins");
the other allowed outcome is the documented exception, with nothing written by a refused call.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import wholemem as wg

FUZZ = settings(
    max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
T = wg.WmTensorType
TYPES = [T.HOST, T.CHUNKED, T.NCCL]
DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


@pytest.fixture(scope="module")
def comm() -> Iterator[wg.Communicator]:
    """A one-rank communicator for the whole module (hypothesis runs many examples per test)."""
    wg.init_lib()
    c = wg.create_communicator(1, wg.get_unique_id(), 0)
    yield c
    wg.finalize_lib()


index_values = st.one_of(st.integers(-2, 9), st.sampled_from([-(2**31), 2**31 - 1, 2**31, 2**32, -(2**63), 2**63 - 1]))
INDEX_KINDS = ["int64", "int32", "numpy", "strided", "expand", "float", "int16", "2d", "meta", "list"]


def make_indices(values: list[int], kind: str) -> tuple[Any, torch.Tensor]:
    """The index argument and the int64 indices it holds."""
    ref = torch.tensor(values, dtype=torch.int64)
    if kind == "int32":
        ref = ref.clamp(-(2**31), 2**31 - 1)
        return ref.to(torch.int32), ref
    if kind == "numpy":
        return ref.numpy(), ref
    if kind == "strided":
        return torch.stack([ref, ref], 1)[:, 0], ref
    if kind == "expand" and values:
        ref = ref[:1].expand(len(values))
        return ref, ref
    if kind == "float":
        return ref.double(), ref
    if kind == "int16":
        return ref.to(torch.int16), ref
    if kind == "2d":
        return ref.reshape(1, -1), ref
    if kind == "meta":
        return ref.to("meta"), ref
    if kind == "list":
        return values, ref
    return ref, ref


def index_error(kind: str, ref: torch.Tensor, rows: int) -> tuple[type[Exception], str] | None:
    if kind in ("float", "int16"):
        return TypeError, "int64 or int32"
    if kind == "list":
        return TypeError, "torch.Tensor or numpy"
    if kind == "meta":
        return ValueError, "indices must be on the CPU, got meta"
    if kind == "2d":
        return ValueError, "1-D"
    bad = (ref < 0) | (ref >= rows)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0])
        return IndexError, f"index {int(ref[pos])} at position {pos}"
    return None


def _rows(n: int, row_shape: tuple[int, ...], dtype: torch.dtype, start: int) -> torch.Tensor:
    v = (torch.arange(n * math.prod(row_shape), dtype=torch.float64) + start).reshape(n, *row_shape) % 100
    if dtype is torch.bool:
        return v.remainder(2) > 0
    return v.to(dtype)


def _last_wins(table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    out = table.clone()
    for k in range(idx.numel()):
        out[int(idx[k])] = vals[k]
    return out


@FUZZ
@given(
    ty=st.sampled_from(TYPES),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 9),
    row_shape=st.sampled_from([(), (1,), (3,), (2, 2)]),
    values=st.lists(index_values, max_size=8),
    kind=st.sampled_from(INDEX_KINDS),
    sub=st.booleans(),
)
@example(ty=T.HOST, dtype=torch.float32, rows=4, row_shape=(3,), values=[4], kind="int64", sub=False)
@example(ty=T.NCCL, dtype=torch.int8, rows=4, row_shape=(), values=[2**32], kind="numpy", sub=True)
def test_gather_and_scatter_match_torch(
    comm: wg.Communicator,
    ty: wg.WmTensorType,
    dtype: torch.dtype,
    rows: int,
    row_shape: tuple[int, ...],
    values: list[int],
    kind: str,
    sub: bool,
) -> None:
    t = wg.create_wm_tensor(comm, [rows, *row_shape], [], dtype, ty)
    init = _rows(rows, row_shape, dtype, 0)
    wg.scatter(t, torch.arange(rows), init)
    model = init.clone()
    lo = 0
    if sub and rows > 1:  # a view of rows [1, rows): indices are checked against the view
        lo = 1
        t = wg.get_sub_tensor(t, [1], [rows])  # (starts, ends)
    view_rows = rows - lo
    idx, ref = make_indices(values, kind)
    err = index_error(kind, ref, view_rows)
    if err is not None:
        vals = _rows(ref.numel(), row_shape, dtype, 50)
        with pytest.raises(err[0], match=err[1]):
            wg.gather(t, idx)
        with pytest.raises(err[0], match=err[1]):
            wg.scatter(t, idx, vals)
    else:
        got = wg.gather(t, idx)
        assert torch.equal(got, model[lo:][ref])
        out = torch.full((ref.numel(), *row_shape), 1, dtype=dtype)
        assert wg.gather(t, idx, out=out) is out and torch.equal(out, model[lo:][ref])
        vals = _rows(ref.numel(), row_shape, dtype, 50)
        wg.scatter(t, idx, vals)
        model[lo:] = _last_wins(model[lo:], ref, vals)
    full = wg.gather(t, torch.arange(view_rows))
    assert torch.equal(full, model[lo:])  # a refused call wrote nothing


@FUZZ
@given(
    ty=st.sampled_from(TYPES),
    rows=st.integers(1, 5),
    n=st.integers(0, 4),
    vkind=st.sampled_from(["ok", "numpy", "dtype", "short", "wide", "meta", "strided", "expand", "list"]),
    okind=st.sampled_from(["none", "ok", "dtype", "shape", "strided", "meta", "list"]),
)
def test_values_and_out_are_checked(
    comm: wg.Communicator, ty: wg.WmTensorType, rows: int, n: int, vkind: str, okind: str
) -> None:
    t = wg.create_wm_tensor(comm, [rows, 3], [], torch.float32, ty)
    wg.scatter(t, torch.arange(rows), torch.arange(rows * 3.0).reshape(rows, 3))
    idx = torch.arange(n) % rows
    good = torch.arange(n * 3.0).reshape(n, 3) + 100
    v: Any = {
        "ok": good,
        "numpy": good.numpy(),
        "dtype": good.double(),
        "short": good[:, :2],
        "wide": torch.zeros(n, 4),
        "meta": good.to("meta"),
        "strided": torch.stack([good, good], 2)[..., 0],  # non-contiguous, same values
        "expand": good[:1].expand(n, 3) if n else good,
        "list": good.tolist(),
    }[vkind]
    verr = {
        "dtype": (TypeError, "float32"),
        "short": (ValueError, rf"\({n}, 3\)"),
        "wide": (ValueError, rf"\({n}, 3\)"),
        "meta": (ValueError, "got meta"),
        "list": (TypeError, "torch.Tensor or numpy"),
    }.get(vkind)
    before = wg.gather(t, torch.arange(rows))
    if verr is not None:
        with pytest.raises(verr[0], match=verr[1]):
            wg.scatter(t, idx, v)
        assert torch.equal(wg.gather(t, torch.arange(rows)), before)
    else:
        wg.scatter(t, idx, v)
        vals = torch.as_tensor(np.asarray(v)) if isinstance(v, np.ndarray) else v
        assert torch.equal(wg.gather(t, torch.arange(rows)), _last_wins(before, idx, vals))
    o: Any = {
        "none": None,
        "ok": torch.empty(n, 3),
        "dtype": torch.empty(n, 3, dtype=torch.int32),
        "shape": torch.empty(n, 4),
        "strided": torch.empty(n, 6)[:, ::2],
        "meta": torch.empty(n, 3, device="meta"),
        "list": [[0.0] * 3] * n,
    }[okind]
    oerr = {
        "dtype": (TypeError, "float32"),
        "shape": (ValueError, rf"\({n}, 3\)"),
        "strided": (ValueError, "contiguous") if n > 0 else None,
        "meta": (ValueError, "got meta"),
        "list": (TypeError, "out must be a torch.Tensor"),
    }.get(okind)
    now = wg.gather(t, torch.arange(rows))
    if oerr is not None:
        with pytest.raises(oerr[0], match=oerr[1]):
            wg.gather(t, idx, out=o)
        return
    got = wg.gather(t, idx, out=o)
    assert torch.equal(got, now[idx]) and (o is None or got is o)


def _plain(view: str, dtype: torch.dtype) -> torch.Tensor:
    """A plain CPU tensor of 6 rows in the layout ``view``."""
    base = _rows(6, (4,), dtype, 0)
    if view == "cols":
        return base[:, 1:3]
    if view == "step":
        return base[:, ::2]
    if view == "transpose":
        return base.t().contiguous().t()
    if view == "rows_expand":
        return base[:1].expand(6, 4)  # every row is the same memory
    if view == "cols_expand":
        return base[:, :1].expand(6, 4)  # every element of a row is the same memory
    if view == "as_strided":
        return base.reshape(-1)[:9].clone().as_strided((6, 4), (1, 1))  # overlapping windows
    if view == "3d":
        return base.reshape(6, 2, 2)
    if view == "3d_perm":
        return base.reshape(6, 2, 2).transpose(1, 2)
    if view == "1d":
        return base[:, 0]
    return base


def _overlaps(t: torch.Tensor) -> bool:
    if t.numel() <= 1:
        return False
    span = 1
    for s, n in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if s < span:
            return True
        span = s * n
    return False


#: dtypes without a distkit code: gather / scatter copy their elements' bytes
UNCODED = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn]


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s elements as signed integers of the same size (torch has few ops for uint16/32/64 and float8)."""
    if x.dtype in UNCODED:
        return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    return x


@FUZZ
@given(
    view=st.sampled_from(
        ["plain", "cols", "step", "transpose", "rows_expand", "cols_expand", "as_strided", "3d", "3d_perm", "1d"]
    ),
    dtype=st.sampled_from([*DTYPES, torch.complex64, *UNCODED]),
    values=st.lists(st.integers(-1, 6), max_size=6),
)
@example(view="rows_expand", dtype=torch.float32, values=[0, 1])
@example(view="as_strided", dtype=torch.float32, values=[0])
@example(view="plain", dtype=torch.uint16, values=[1, 1, 4])
@example(view="3d_perm", dtype=torch.uint16, values=[5, 0])
@example(view="step", dtype=torch.uint64, values=[2, 3])
def test_plain_cpu_tensors_of_any_layout(view: str, dtype: torch.dtype, values: list[int]) -> None:
    t = _plain(view, dtype)
    idx = torch.tensor(values, dtype=torch.int64)
    if bool(((idx < 0) | (idx >= 6)).any()):
        with pytest.raises(IndexError, match="out of range for 6 rows"):
            wg.gather(t, idx)
        return
    got = wg.gather(t, idx)
    assert got.dtype == dtype
    assert torch.equal(_bits(got), _bits(t)[idx])
    vals = _rows(idx.numel(), tuple(t.shape[1:]), dtype, 30)
    before = _bits(t).clone()
    if _overlaps(t):
        # rows that share memory cannot all take new values: refused, as torch's index_copy_ does
        with pytest.raises(ValueError, match="share memory"):
            wg.scatter(t, idx, vals)
        assert torch.equal(_bits(t), before)
        return
    wg.scatter(t, idx, vals)
    assert torch.equal(_bits(t), _last_wins(before, idx, _bits(vals)))


def test_uint16_rows_move_bit_for_bit() -> None:
    # values above int16's range: a reinterpreting copy keeps them, a converting one would not
    t = torch.tensor([[65535, 1], [40000, 2], [3, 65534]], dtype=torch.int32).to(torch.uint16)
    got = wg.gather(t, torch.tensor([2, 0, 2]))
    assert got.dtype == torch.uint16
    assert got.to(torch.int32).tolist() == [[3, 65534], [65535, 1], [3, 65534]]
    wg.scatter(t, torch.tensor([1]), torch.tensor([[50000, 65533]], dtype=torch.int32).to(torch.uint16))
    assert t.to(torch.int32).tolist() == [[65535, 1], [50000, 65533], [3, 65534]]
    with pytest.raises(TypeError, match="dtype torch.uint16"):
        wg.scatter(t, torch.tensor([0]), torch.zeros(1, 2, dtype=torch.int16))


@FUZZ
@given(
    num=st.integers(1, 6),
    dim=st.integers(1, 4),
    values=st.lists(index_values, max_size=6),
    kind=st.sampled_from(["int64", "int32", "numpy", "strided", "float", "2d", "meta"]),
)
@example(num=4, dim=2, values=[4], kind="int64")
def test_embedding_lookup_matches_its_weight(
    comm: wg.Communicator, num: int, dim: int, values: list[int], kind: str
) -> None:
    emb = wg.Embedding(comm, num, dim)
    idx, ref = make_indices(values, kind)
    err = index_error(kind, ref, num)
    if err is not None:
        with pytest.raises(err[0], match=err[1]):
            emb(idx)
        return
    got = emb(idx)
    assert torch.equal(got, emb.weight[ref])


@pytest.fixture(scope="module")
def finalized(comm: wg.Communicator) -> list[Any]:
    """Tensors of a library instance that was finalized (the module's comm is made again after)."""
    wg.finalize_lib()
    wg.init_lib()
    c = wg.create_communicator(1, wg.get_unique_id(), 0)
    ts = [wg.create_wm_tensor(c, [4, 2], [], torch.float32, ty) for ty in TYPES]
    emb = wg.Embedding(c, 5, 2)
    wg.finalize_lib()
    wg.init_lib()
    return [*ts, emb]


@FUZZ
@given(which=st.integers(0, 3), values=st.lists(index_values, max_size=3), kind=st.sampled_from(INDEX_KINDS))
def test_a_finalized_library_refuses_every_call(finalized: list[Any], which: int, values: list[int], kind: str) -> None:
    idx, _ = make_indices(values, kind)
    obj = finalized[which]
    with pytest.raises(RuntimeError, match="finalize|communicator was destroyed"):
        obj(idx) if which == 3 else wg.gather(obj, idx)
    if which < 3:
        with pytest.raises(RuntimeError, match="finalize|communicator was destroyed"):
            wg.scatter(obj, idx, torch.zeros(len(values), 2))
