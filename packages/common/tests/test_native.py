"""The shared native code: thread pool, fp16/bf16 conversion, row ops, shared memory."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from distkit_common import _distkit_common as native
from distkit_common.dtypes import CODES, code_of


def test_parallel_sum_is_exact_for_any_grain() -> None:
    n = 1_000_003
    for grain in (1, 7, 1000, 10**7):
        assert native.parallel_sum(n, grain) == n * (n - 1) // 2


def test_parallel_for_propagates_the_first_exception() -> None:
    with pytest.raises(ValueError, match="body failed at 777"):
        native.parallel_sum(100_000, 10, 777)
    # the pool keeps working afterwards
    assert native.parallel_sum(1000, 1) == 499500


def test_set_num_threads() -> None:
    before = native.get_num_threads()
    try:
        native.set_num_threads(3)
        assert native.get_num_threads() == 3
        assert native.parallel_sum(10_000, 1) == 49_995_000
        with pytest.raises(ValueError, match="number of threads must be >= 1"):
            native.set_num_threads(0)
    finally:
        native.set_num_threads(before)


def test_parallel_for_calls_back_to_back_of_different_sizes() -> None:
    # A worker still looping over a finished call took a part number of the next
    # call and compared it with that call's part count: the part ran twice and run()
    # returned early or never (the old pool hung within seconds of this loop). In a
    # process of its own, so that a hang fails the test instead of the suite.
    code = "from distkit_common import _distkit_common as n; n.set_num_threads(8); print(n.parallel_stress(100_000))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0", out.stdout


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_conversion_matches_torch_bit_for_bit(dtype: torch.dtype) -> None:
    # every 16-bit pattern round-trips, and float32 -> 16 bit rounds like torch (RNE)
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    as16 = bits.view(dtype)
    f32 = torch.empty(1 << 16, dtype=torch.float32)
    native.convert_to_f32(as16.data_ptr(), f32.data_ptr(), f32.numel(), code_of(dtype))
    assert torch.equal(f32, as16.float()) or torch.allclose(f32, as16.float(), equal_nan=True)
    nan = torch.isnan(f32)
    assert torch.equal(f32[~nan], as16.float()[~nan]) and torch.equal(nan, torch.isnan(as16.float()))

    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(200_000, generator=gen) * 10.0 ** torch.randint(-9, 6, (200_000,), generator=gen),
            torch.tensor(
                [
                    0.0,
                    -0.0,
                    65504.0,
                    65520.0,
                    65519.99,
                    1e-8,
                    2.0**-24,
                    2.0**-25,
                    3 * 2.0**-26,
                    float("inf"),
                    -float("inf"),
                    1e38,
                    -1e-45,
                ]
            ),
        ]
    )
    out = torch.empty(x.numel(), dtype=torch.int16)
    native.convert_f32(x.data_ptr(), out.data_ptr(), x.numel(), code_of(dtype))
    assert torch.equal(out.view(dtype), x.to(dtype))


def test_half_conversion_rejects_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float16/bfloat16"):
        native.convert_f32(0, 0, 0, CODES["float32"])
    with pytest.raises(TypeError, match="unknown dtype code 99"):
        native.convert_f32(0, 0, 0, 99)


ROW_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.complex64,
    torch.complex128,
]


def _table(dtype: torch.dtype, rows: int, cols: int) -> torch.Tensor:
    t = torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) % 97
    return t.to(dtype)


def _chunks(t: torch.Tensor, rows_per_chunk: int) -> list[torch.Tensor]:
    return [c.contiguous() for c in torch.split(t, rows_per_chunk)]


@pytest.mark.parametrize("dtype", ROW_DTYPES)
@pytest.mark.parametrize("rows_per_chunk", [1000, 7])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_row_ops_match_torch(dtype: torch.dtype, rows_per_chunk: int, idx_dtype: torch.dtype) -> None:
    rows, cols = 100, 5
    ref = _table(dtype, rows, cols)
    chunks = _chunks(ref.clone(), rows_per_chunk)
    ptrs = [c.data_ptr() for c in chunks]
    idx = torch.tensor([3, 99, 0, 3, 50, 7, 7], dtype=idx_dtype)
    out = torch.empty(len(idx), cols, dtype=dtype)
    args = (
        ptrs,
        rows_per_chunk,
        rows,
        cols,
        cols,
        1,
        code_of(dtype),
        idx.data_ptr(),
        idx_dtype == torch.int64,
        len(idx),
    )
    native.row_op("gather", *args, out.data_ptr())
    assert torch.equal(out, ref[idx.long()])

    uniq = torch.tensor([5, 98, 12], dtype=idx_dtype)
    vals = (torch.arange(3 * cols, dtype=torch.float64).reshape(3, cols) + 1).to(dtype)
    native.row_op(
        "scatter",
        ptrs,
        rows_per_chunk,
        rows,
        cols,
        cols,
        1,
        code_of(dtype),
        uniq.data_ptr(),
        idx_dtype == torch.int64,
        3,
        vals.data_ptr(),
    )
    expect = ref.clone()
    expect[uniq.long()] = vals
    assert torch.equal(torch.cat(chunks), expect)

    if dtype not in (torch.complex64, torch.complex128):
        dup = torch.tensor([4, 4, 4, 60], dtype=idx_dtype)
        v = torch.ones(4, cols, dtype=dtype)
        native.row_op(
            "scatter_add",
            ptrs,
            rows_per_chunk,
            rows,
            cols,
            cols,
            1,
            code_of(dtype),
            dup.data_ptr(),
            idx_dtype == torch.int64,
            4,
            v.data_ptr(),
            2.0,
        )
        expect.index_add_(0, dup.long(), v, alpha=2)
        assert torch.equal(torch.cat(chunks), expect)


def test_row_ops_honour_strides() -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(10, 6)
    view = base[:, ::2]  # row stride 6, column stride 2
    idx = torch.tensor([9, 0, 4])
    out = torch.empty(3, 3)
    native.row_op(
        "gather", [view.data_ptr()], 10, 10, 3, 6, 2, code_of(torch.float32), idx.data_ptr(), True, 3, out.data_ptr()
    )
    assert torch.equal(out, view[idx])


def test_row_ops_reject_bad_indices_before_touching_memory() -> None:
    t = torch.zeros(10, 2)
    for bad, pos in (([1, 10, 2], 1), ([0, 1, -3], 2)):
        idx = torch.tensor(bad)
        vals = torch.ones(3, 2)
        with pytest.raises(IndexError, match=rf"index {bad[pos]} at position {pos} is out of range for 10 rows"):
            native.row_op(
                "scatter",
                [t.data_ptr()],
                10,
                10,
                2,
                2,
                1,
                code_of(torch.float32),
                idx.data_ptr(),
                True,
                3,
                vals.data_ptr(),
            )
        assert torch.count_nonzero(t) == 0


def test_row_ops_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown row op 'gthr'"):
        native.row_op("gthr", [0], 1, 1, 1, 1, 1, 2, 0, True, 0, 0)
    with pytest.raises(ValueError, match="cannot hold 100 rows"):
        native.row_op("gather", [0], 10, 100, 1, 1, 1, 2, 0, True, 0, 0)
    with pytest.raises(TypeError, match="unknown dtype code"):
        native.row_op("gather", [0], 10, 10, 1, 1, 1, 42, 0, True, 0, 0)
    if not native.cuda_compiled():
        with pytest.raises(RuntimeError, match="no CUDA support"):
            native.row_op("gather", [0], 10, 10, 1, 1, 1, 2, 0, True, 0, 0, on_device=True)
    elif not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            native.row_op("gather", [0], 10, 10, 1, 1, 1, 2, 0, True, 0, 0, on_device=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_row_ops_match_cpu() -> None:  # pragma: no cover - no GPU in CI
    ref = _table(torch.float32, 100, 8).cuda()
    idx = torch.randint(0, 100, (50,), device="cuda")
    out = torch.empty(50, 8, device="cuda")
    native.row_op(
        "gather",
        [ref.data_ptr()],
        100,
        100,
        8,
        8,
        1,
        2,
        idx.data_ptr(),
        True,
        50,
        out.data_ptr(),
        on_device=True,
        stream=torch.cuda.current_stream().cuda_stream,
    )
    torch.cuda.synchronize()
    assert torch.equal(out, ref[idx])


def test_shm_segment_is_owner_only_and_shared() -> None:
    seg = native.ShmSegment.create(1 << 16)
    path = "/dev/shm" + seg.name
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert len(seg.name) >= len("/distkit-") + 32  # 128 random bits
        a = np.frombuffer(seg, dtype=np.float32)
        assert a.shape == (1 << 14,) and not a.any()  # zero-filled
        other = native.ShmSegment.open(seg.name, 1 << 16)
        a[:] = 7
        assert (np.frombuffer(other, dtype=np.float32) == 7).all()
        seg.unlink()
        assert not os.path.exists(path) and not seg.linked
        a[0] = 1  # the mapping outlives the name
        assert np.frombuffer(other, dtype=np.float32)[0] == 1
        del a
    finally:
        seg.unlink()


def test_shm_segment_errors() -> None:
    with pytest.raises(FileNotFoundError):
        native.ShmSegment.open("/distkit-does-not-exist-" + native.random_token(), 8)
    seg = native.ShmSegment.create(64)
    try:
        with pytest.raises(ValueError, match="has 64 bytes, expected 128"):
            native.ShmSegment.open(seg.name, 128)
        with pytest.raises(FileExistsError):
            native.ShmSegment.create(64, seg.name)
        with pytest.raises(ValueError, match="shared-memory name"):
            native.ShmSegment.create(64, "no-slash")
    finally:
        seg.unlink()


def test_segment_is_unlinked_when_the_creator_dies() -> None:
    seg = native.ShmSegment.create(64)
    path = "/dev/shm" + seg.name
    assert os.path.exists(path)
    del seg
    assert not os.path.exists(path)


def test_random_tokens_are_unique_and_long() -> None:
    tokens = {native.random_token() for _ in range(1000)}
    assert len(tokens) == 1000 and all(len(t) == 32 for t in tokens)
    assert len(native.random_token(32)) == 64
