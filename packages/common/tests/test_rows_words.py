"""The GPU row functions (distkit/rows_vec.hpp) run on the CPU through the `row_op_words` hook.

They move rows as the widest aligned words, in groups of lanes; the hook runs every lane
of every group in turn on host memory, so these tests check the arithmetic the CUDA
kernels do (word width, lane split, chunk lookup, strides, windows, bad indices) against
a plain torch reference, for every dtype and every base alignment of 1-16 bytes.
"""

from __future__ import annotations

import pytest
import torch

from distkit_common import _distkit_common as native
from distkit_common.dtypes import CODES, code_of

DTYPES = [getattr(torch, name) for name in CODES]


def _small(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Values 0..3: sums of a few stay exact and in range for every dtype."""
    return (torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) % 4).to(dtype)


def _values(rows: int, cols: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    v = (torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) * 7 + salt) % 97
    return (v.to(torch.int64) % 2).bool() if dtype == torch.bool else v.to(dtype)


class Placed:
    """A tensor's bytes copied into a byte buffer at `shift` bytes past a 16-byte boundary."""

    def __init__(self, t: torch.Tensor, shift: int) -> None:
        self.like = t
        nbytes = t.numel() * t.element_size()
        self.buf = torch.zeros(nbytes + 64, dtype=torch.uint8)
        self.off = (-self.buf.data_ptr()) % 16 + shift
        self.raw()[:] = t.contiguous().view(-1).view(torch.uint8)

    def raw(self) -> torch.Tensor:
        nbytes = self.like.numel() * self.like.element_size()
        return self.buf[self.off : self.off + nbytes]

    @property
    def ptr(self) -> int:
        return int(self.buf.data_ptr()) + self.off

    def value(self) -> torch.Tensor:
        return self.raw().clone().view(self.like.dtype).reshape(self.like.shape)


def _run(op: str, chunks: list[Placed], rpc: int, nrows: int, ncols: int, rs: int, cs: int, dtype: torch.dtype,
         idx: torch.Tensor, data: Placed, alpha: float = 1.0, lanes: int = 0, row0: int = 0, col0: int = 0) -> int:  # fmt: skip
    return native.row_op_words(
        op, [c.ptr for c in chunks], rpc, nrows, row0, col0, ncols, rs, cs, code_of(dtype),
        int(idx.data_ptr()), idx.dtype == torch.int64, int(idx.numel()), data.ptr, alpha, lanes,
    )  # fmt: skip


def _expected_word(*values: int) -> int:
    bits = 0
    for v in values:
        bits |= v
    return next(w for w in (16, 8, 4, 2, 1) if bits % w == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_word_rows_match_torch_every_dtype_and_alignment(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    es = torch.empty(0, dtype=dtype).element_size()
    nrows, ncols, rpc = 37, 12, 10  # 4 chunks, the last short
    full = _values(nrows, ncols, dtype)
    idx = torch.randint(0, nrows, (23,), generator=g)
    for shift in range(16):
        # a tensor is never less aligned than its element size, but the byte mover must be
        # right for any address: every aligned shift, and 1 and 3 bytes for every dtype
        if shift % es and shift not in (1, 3):
            continue
        chunks = [Placed(full[c : c + rpc], shift) for c in range(0, nrows, rpc)]
        out = Placed(torch.zeros(23, ncols, dtype=dtype), (3 * shift) % 16)  # another alignment
        for lanes in (0, 1, 4):
            w = _run("gather", chunks, rpc, nrows, ncols, ncols, 1, dtype, idx, out, lanes=lanes)
            assert w == _expected_word(ncols * es, ncols * es, out.ptr, *[c.ptr for c in chunks])
            assert torch.equal(out.value(), full[idx]), (shift, lanes)
        # scatter of distinct rows
        uniq = torch.randperm(nrows, generator=g)[:9]
        vals = _values(9, ncols, dtype, salt=5)
        pv = Placed(vals, shift)
        _run("scatter", chunks, rpc, nrows, ncols, ncols, 1, dtype, uniq, pv)
        ref = full.clone()
        ref[uniq] = vals
        assert torch.equal(torch.cat([c.value() for c in chunks]), ref), shift
        # scatter-add with repeated rows, where the elements are aligned to their size
        if shift % es == 0 and dtype != torch.bool:
            dup = torch.tensor([3, 30, 3, 0, 36, 3])
            add = _small(6, ncols, dtype)
            _run("scatter_add", chunks, rpc, nrows, ncols, ncols, 1, dtype, dup, Placed(add, shift), alpha=1.0)
            ref.index_add_(0, dup, add)
            assert torch.equal(torch.cat([c.value() for c in chunks]), ref), shift


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.complex64])
def test_word_rows_strided_table_and_window(dtype: torch.dtype) -> None:
    """Padded rows, every 2nd column, a window of rows 3.. and columns 1..: elements as words."""
    g = torch.Generator().manual_seed(2)
    es = torch.empty(0, dtype=dtype).element_size()
    nrows, rs, cs, rpc = 29, 14, 2, 8
    full = _values(nrows, rs, dtype)
    view = full[:, ::cs][:, :6]  # ncols = 6 of the base table
    row0, col0, wrows, wcols = 3, 1, 20, 4
    window = view[row0 : row0 + wrows, col0 : col0 + wcols]
    chunks = [Placed(full[c : c + rpc], 0) for c in range(0, nrows, rpc)]
    idx = torch.randint(0, wrows, (17,), generator=g, dtype=torch.int32)
    out = Placed(torch.zeros(17, wcols, dtype=dtype), 0)
    w = _run("gather", chunks, rpc, wrows, wcols, rs, cs, dtype, idx, out, row0=row0, col0=col0)
    assert w == es  # words never span two strided elements
    assert torch.equal(out.value(), window[idx.long()])
    uniq = torch.randperm(wrows, generator=g)[:5]
    vals = _values(5, wcols, dtype, salt=9)
    _run("scatter", chunks, rpc, wrows, wcols, rs, cs, dtype, uniq, Placed(vals, 0), row0=row0, col0=col0)
    ref = full.clone()
    ref[:, ::cs][:, :6][row0 : row0 + wrows, col0 : col0 + wcols][uniq] = vals
    assert torch.equal(torch.cat([c.value() for c in chunks]), ref)
    dup = torch.tensor([2, 2, 19])
    add = _small(3, wcols, dtype)
    alpha = 1.0 if dtype == torch.int64 else 0.5  # integer tables add alpha cast to their type
    _run(
        "scatter_add", chunks, rpc, wrows, wcols, rs, cs, dtype, dup, Placed(add, 0), alpha=alpha, row0=row0, col0=col0
    )
    sub = ref[:, ::cs][:, :6][row0 : row0 + wrows, col0 : col0 + wcols]
    sub.index_add_(0, dup, add, alpha=int(alpha) if dtype == torch.int64 else alpha)  # a view: writes into ref
    assert torch.allclose(torch.cat([c.value() for c in chunks]).to(torch.complex128), ref.to(torch.complex128))


def test_word_rows_bad_index_skips_the_row_and_names_it() -> None:
    table = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    chunks = [Placed(table[:6], 0), Placed(table[6:], 0)]
    out = Placed(torch.full((4, 4), -1.0), 0)
    for bad_value in (10, -1):
        idx = torch.tensor([2, bad_value, 9, bad_value])
        cur = torch.cat([c.value() for c in chunks])
        with pytest.raises(IndexError, match=rf"index {bad_value} at position 1 is out of range for 10 rows"):
            _run("gather", chunks, 6, 10, 4, 4, 1, torch.float32, idx, out)
        # the bad rows are zero-filled, the good ones gathered
        expect = torch.stack([cur[2], torch.zeros(4), cur[9], torch.zeros(4)])
        assert torch.equal(out.value(), expect)
        for op in ("scatter", "scatter_add"):
            with pytest.raises(IndexError, match=rf"index {bad_value} at position 1"):
                _run(op, chunks, 6, 10, 4, 4, 1, torch.float32, idx, Placed(torch.ones(4, 4), 0))
    # the good rows were written, nothing else
    ref = table.clone()
    ref[2] = 2.0
    ref[9] = 2.0  # scatter of ones, then += ones
    assert torch.equal(torch.cat([c.value() for c in chunks]), ref)


def test_word_rows_bad_arguments() -> None:
    t = Placed(torch.zeros(4, 2), 0)
    idx = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="lanes must be 0 or a power of two"):
        _run("gather", [t], 4, 4, 2, 2, 1, torch.float32, idx, t, lanes=3)
    with pytest.raises(ValueError, match="cannot hold 5 rows"):
        _run("gather", [t], 4, 4, 2, 2, 1, torch.float32, idx, t, row0=1)
    with pytest.raises(ValueError, match="unknown row op"):
        _run("gather_all", [t], 4, 4, 2, 2, 1, torch.float32, idx, t)
    with pytest.raises(ValueError, match="aligned to their size"):
        _run("scatter_add", [Placed(torch.zeros(4, 2), 2)], 4, 4, 2, 2, 1, torch.float32, idx, t)


def test_word_width_closed_form() -> None:
    for bits in range(1, 200):
        assert native.word_bytes_for(bits) == _expected_word(bits)
    assert native.word_bytes_for(0) == 16
    assert native.word_bytes_for(1 << 40) == 16


@pytest.mark.parametrize("rpc", [1, 7, 1 << 20, (1 << 31) + 5, 1 << 33])
def test_row_location_beyond_two_to_the_31(rpc: int) -> None:
    """Chunk and byte offset of rows past 2^31 and 2^32 (computed, nothing allocated)."""
    stride = 1056  # bytes per row
    for row0 in (0, 3, (1 << 32) - 2):
        for r in (0, 5, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 7, (1 << 40) + 3):
            a = row0 + r
            assert native.row_locate(rpc, 1 << 20, row0, stride, r) == (a // rpc, (a % rpc) * stride)
    # one buffer: no chunk lookup, offset row x stride
    assert native.row_locate(1 << 45, 1, 0, stride, (1 << 40) + 3) == (0, ((1 << 40) + 3) * stride)
