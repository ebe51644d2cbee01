"""distkit_common.rows: the public row gather / scatter / scatter-add on raw addresses (a chunked,
strided table against torch's indexing) and its argument checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distkit_common import rows
from distkit_common.dtypes import code_of


def _table() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """7 rows of 3 elements in two chunks of 4 rows, each row every other element of a chunk's row."""
    chunks = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)
    view = chunks[:, :, ::2].reshape(8, 3)[:7]  # a copy: the reference values
    return chunks, view, [int(chunks[0].data_ptr()), int(chunks[1].data_ptr())]


def test_row_ops_on_a_chunked_strided_table() -> None:
    chunks, ref, addrs = _table()
    idx = torch.tensor([6, 0, 4, 6], dtype=torch.int32)
    out = torch.full((4, 3), -1.0)
    rows.row_op("gather", addrs, 4, 7, 3, 6, 2, torch.float32, idx.data_ptr(), False, 4, out.data_ptr())
    assert torch.equal(out, ref[idx.long()])

    vals = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    idx64 = torch.tensor([5, 1])
    rows.row_op("scatter", addrs, 4, 7, 3, 6, 2, code_of("float32"), idx64.data_ptr(), True, 2, vals.data_ptr())
    ref[idx64] = vals
    rows.row_op("scatter_add", addrs, 4, 7, 3, 6, 2, "float32", idx64.data_ptr(), True, 2, vals.data_ptr(), alpha=0.5)
    ref[idx64] += 0.5 * vals
    assert torch.equal(chunks[:, :, ::2].reshape(8, 3)[:7], ref)
    assert torch.equal(chunks[:, :, 1::2].reshape(-1), torch.arange(1, 48, 2, dtype=torch.float32))  # untouched
    assert rows.cuda_compiled() in (True, False)


_GOOD: dict[str, Any] = {
    "op": "gather",
    "chunks": [4096],
    "rows_per_chunk": 4,
    "nrows": 4,
    "ncols": 2,
    "row_stride": 2,
    "col_stride": 1,
    "dtype": 2,
    "idx": 8192,
    "idx64": True,
    "n": 0,
    "data": 12288,
}


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"op": "gathr"}, ValueError, "unknown op 'gathr'; one of gather, scatter, scatter_add"),
        ({"chunks": []}, ValueError, "chunks is empty"),
        ({"chunks": "4096"}, TypeError, "chunks must be a sequence of addresses, got str"),
        ({"chunks": 4096}, TypeError, "chunks must be a sequence of addresses, got int"),
        ({"chunks": [4096, 1.5]}, TypeError, r"chunks\[1\] must be an int, got float"),
        ({"chunks": [-8]}, ValueError, r"chunks\[0\] must be >= 0, got -8"),
        ({"rows_per_chunk": 0}, ValueError, "rows_per_chunk must be >= 1, got 0"),
        ({"nrows": 5}, ValueError, "1 chunks of 4 rows cannot hold nrows=5 rows"),
        ({"ncols": -1}, ValueError, "ncols must be >= 0, got -1"),
        ({"n": True}, TypeError, "n must be an int, got bool"),
        ({"row_stride": 2.0}, TypeError, "row_stride must be an int, got float"),
        ({"dtype": 99}, TypeError, "unknown dtype code 99"),
        ({"dtype": "float128"}, TypeError, "unsupported dtype 'float128'"),
        ({"idx64": 1}, TypeError, "idx64 must be a bool, got int"),
        ({"data": None}, TypeError, "data must be an int, got NoneType"),
        ({"alpha": "2"}, TypeError, "alpha must be a float, got str"),
        ({"stream": 7}, ValueError, r"stream=7 is given for a CPU call"),
        ({"stream": -1, "on_device": True}, ValueError, "stream must be >= 0, got -1"),
        ({"validate": None}, TypeError, "validate must be a bool, got NoneType"),
    ],
)
def test_row_op_bad_arguments(change: dict[str, Any], exc: type[Exception], match: str) -> None:
    """Every check fires before any memory is touched (the addresses here point at nothing)."""
    args = {**_GOOD, **change}
    keyword = {k: args.pop(k) for k in ("alpha", "on_device", "stream", "validate") if k in args}
    with pytest.raises(exc, match=match):
        rows.row_op(*args.values(), **keyword)


def test_row_op_index_out_of_range_and_device_without_cuda() -> None:
    _, ref, addrs = _table()
    before = ref.clone()
    idx = torch.tensor([1, 7])
    out = torch.zeros(2, 3)
    with pytest.raises(IndexError, match="index 7 at position 1 is out of range for 7 rows"):
        rows.row_op("gather", addrs, 4, 7, 3, 6, 2, torch.float32, idx.data_ptr(), True, 2, out.data_ptr())
    assert torch.equal(ref, before)
    if not rows.cuda_compiled():
        with pytest.raises(RuntimeError, match="no CUDA row kernels"):
            rows.row_op(
                "gather", addrs, 4, 7, 3, 6, 2, torch.float32, idx.data_ptr(), True, 2, out.data_ptr(), on_device=True
            )
