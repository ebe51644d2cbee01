"""The CUDA row kernels (csrc/rows_cuda.cu) against the CPU ones, on a machine with a GPU.

Each test runs in a fresh spawned process: a fault in a kernel is sticky for the
process that hit it and must not leak into the next test.
"""

from __future__ import annotations

import pytest
import torch

from distkit_common import _distkit_common as native
from distkit_common.dtypes import CODES, code_of
from distkit_common.testing import run_spawn

GPU = bool(native.cuda_compiled() and torch.cuda.is_available())
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and a distkit-common build with nvcc (nox -s gpu)"),
]

# every dtype the native row ops know, in code order
DTYPES = [getattr(torch, name) for name in CODES]


def _values(rows: int, cols: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    v = (torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) * 7 + salt) % 97
    return (v.to(torch.int64) % 2).bool() if dtype == torch.bool else v.to(dtype)


def _op(op: str, chunks: list[torch.Tensor], rpc: int, nrows: int, ncols: int, rs: int, cs: int, dtype: torch.dtype,
        idx: torch.Tensor, data: torch.Tensor, alpha: float = 1.0) -> None:  # fmt: skip
    on = idx.is_cuda
    native.row_op(
        op,
        [int(c.data_ptr()) for c in chunks],
        rpc,
        nrows,
        ncols,
        rs,
        cs,
        code_of(dtype),
        int(idx.data_ptr()),
        idx.dtype == torch.int64,
        int(idx.numel()),
        int(data.data_ptr()),
        alpha,
        on_device=on,
        stream=torch.cuda.current_stream().cuda_stream if on else 0,
    )


def _kernels_body(rank: int, size: int, store: str) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        # chunked (3 chunks of 13 rows, the last short) and strided (padded rows, every 2nd column)
        for rpc, (rs, cs) in ((13, (10, 2)), (40, (5, 1))):
            nrows, ncols = 33, 5
            full = _values(nrows, rs, dtype)
            host = [full[c : c + rpc].contiguous() for c in range(0, nrows, rpc)]
            gpu = [h.to(dev) for h in host]
            for idx_dtype in (torch.int64, torch.int32):
                idx = torch.randint(0, nrows, (77,), generator=g, dtype=idx_dtype)
                o_cpu = torch.empty(77, ncols, dtype=dtype)
                o_gpu = torch.empty(77, ncols, dtype=dtype, device=dev)
                _op("gather", host, rpc, nrows, ncols, rs, cs, dtype, idx, o_cpu)
                _op("gather", gpu, rpc, nrows, ncols, rs, cs, dtype, idx.to(dev), o_gpu)
                assert torch.equal(o_gpu.cpu(), o_cpu), (dtype, rpc)
            uniq = torch.randperm(nrows, generator=g)[:9]
            vals = _values(9, ncols, dtype, salt=3)
            _op("scatter", host, rpc, nrows, ncols, rs, cs, dtype, uniq, vals)
            _op("scatter", gpu, rpc, nrows, ncols, rs, cs, dtype, uniq.to(dev), vals.to(dev))
            torch.cuda.synchronize()
            assert all(torch.equal(a.cpu(), b) for a, b in zip(gpu, host)), (dtype, rpc)
            # a bad index: IndexError naming it, nothing written, the context still usable
            bad = torch.tensor([1, nrows, 2], device=dev)
            with pytest.raises(IndexError, match=f"index {nrows} at position 1 is out of range for {nrows} rows"):
                _op("scatter", gpu, rpc, nrows, ncols, rs, cs, dtype, bad, vals.to(dev))
            torch.cuda.synchronize()
            assert all(torch.equal(a.cpu(), b) for a, b in zip(gpu, host)), (dtype, rpc)
    # scatter-add with duplicates (float32 / float64 on the GPU)
    for dtype in (torch.float32, torch.float64):
        a, b = torch.zeros(9, 4, dtype=dtype), torch.zeros(9, 4, dtype=dtype, device=dev)
        dup = torch.tensor([3, 3, 8, 3])
        v = _values(4, 4, dtype)
        _op("scatter_add", [a], 9, 9, 4, 4, 1, dtype, dup, v, 0.5)
        _op("scatter_add", [b], 9, 9, 4, 4, 1, dtype, dup.to(dev), v.to(dev), 0.5)
        assert torch.allclose(b.cpu(), a)
    # the 16-bit scatter-add error is raised before any device memory is taken: no leak
    h = torch.zeros(4, 2, dtype=torch.float16, device=dev)
    one = torch.zeros(1, dtype=torch.int64, device=dev)
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info(dev)[0]
    for _ in range(2000):
        with pytest.raises(TypeError, match="float32 and float64 only"):
            _op("scatter_add", [h], 4, 4, 2, 2, 1, torch.float16, one, h)
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info(dev)[0] >= free - (8 << 20)
    # validate=False: no index check; a bad row is skipped (zeros in a gather), nothing raised
    x = torch.arange(40, dtype=torch.float32, device=dev).reshape(10, 4)
    out = torch.full((3, 4), -1.0, device=dev)
    with_bad = torch.tensor([9, 10, 0], device=dev)
    native.row_op("gather", [int(x.data_ptr())], 10, 10, 4, 4, 1, code_of(torch.float32),
                  int(with_bad.data_ptr()), True, 3, int(out.data_ptr()),
                  on_device=True, stream=torch.cuda.current_stream().cuda_stream, validate=False)  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.stack([x[9].cpu(), torch.zeros(4), x[0].cpu()]))
    # every base alignment of a byte table and its output (the word width follows it)
    raw = torch.arange(4096, device=dev).remainder(251).to(torch.uint8)
    ix = torch.randint(0, 60, (50,), generator=g).to(dev)
    for shift in range(16):
        tab = raw[shift : shift + 60 * 48].view(60, 48)
        dst = torch.zeros(4096, dtype=torch.uint8, device=dev)
        o = dst[(3 * shift) % 16 :][: 50 * 48].view(50, 48)
        _op("gather", [tab], 60, 60, 48, 48, 1, torch.uint8, ix, o)
        assert torch.equal(o, tab[ix]), shift
    # a non-default stream of the device: the kernels run there
    s = torch.cuda.Stream(dev)
    with torch.cuda.stream(s):
        x = torch.arange(40, dtype=torch.float32, device=dev).reshape(10, 4)
        out = torch.empty(2, 4, device=dev)
        _op("gather", [x], 10, 10, 4, 4, 1, torch.float32, torch.tensor([9, 0], device=dev), out)
    s.synchronize()
    assert torch.equal(out.cpu(), torch.arange(40.0).reshape(10, 4)[[9, 0]])


def test_cuda_row_kernels_match_the_cpu() -> None:
    run_spawn(_kernels_body, 1, timeout=300)


def _large_body(rank: int, size: int, store: str) -> None:
    """More than 2^31 elements: 64-bit offsets in the table and in the output."""
    dev = torch.device("cuda", torch.cuda.current_device())
    nrows = (1 << 31) + 64  # uint8 rows of one element: row offsets above 2^31
    table = torch.zeros(nrows, dtype=torch.uint8, device=dev)
    tail = torch.arange(64, dtype=torch.uint8, device=dev) + 1
    table[-64:] = tail
    idx = torch.tensor([nrows - 1, 0, nrows - 64, (1 << 31) + 3], device=dev)
    out = torch.empty(4, 1, dtype=torch.uint8, device=dev)
    _op("gather", [table], nrows, nrows, 1, 1, 1, torch.uint8, idx, out)
    assert out.flatten().tolist() == [64, 0, 1, 4]
    del table
    # an output of more than 2^31 elements: 2^21 rows x 1056 columns gathered from 64 rows
    src = torch.arange(64 * 1056, dtype=torch.int64, device=dev).remainder(251).to(torch.uint8).reshape(64, 1056)
    many = torch.randint(0, 64, (1 << 21,), device=dev)
    big = torch.empty(1 << 21, 1056, dtype=torch.uint8, device=dev)
    assert big.numel() > 1 << 31
    _op("gather", [src], 64, 64, 1056, 1056, 1, torch.uint8, many, big)
    assert torch.equal(big, src[many])


def test_cuda_row_kernels_beyond_two_to_the_31_elements() -> None:
    run_spawn(_large_body, 1, timeout=300)
