"""Row gather / scatter-add of distkit-common's native code vs torch on the same tensors.

Gather of 200k random rows x 128 float32 from a 1M-row table (the wholemem
benchmark's shape) and scatter-add of the same rows back, against
``torch.index_select(out=)`` / ``index_add_`` (the memory-bandwidth limit a
private tensor reaches). Prints BENCH lines (see tools/bench_all.py).
"""

from __future__ import annotations

import json
import time

import torch

from distkit_common import _distkit_common as native
from distkit_common.dtypes import code_of

ROWS, COLS, N = 1_000_000, 128, 200_000


def best(fn, repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    table = torch.randn(ROWS, COLS)
    idx = torch.randint(0, ROWS, (N,))
    out = torch.empty(N, COLS)
    code = code_of(torch.float32)

    def ours() -> None:
        native.row_op(
            "gather", [table.data_ptr()], ROWS, ROWS, COLS, COLS, 1, code, idx.data_ptr(), True, N, out.data_ptr()
        )

    def theirs() -> None:
        torch.index_select(table, 0, idx, out=out)

    t_ours, t_torch = best(ours), best(theirs)
    gbps = N * COLS * 4 / t_ours / 1e9
    print(
        "BENCH "
        + json.dumps(
            {
                "package": "common",
                "name": "row gather 200k x 128 f32: torch / native time",
                "ratio": t_torch / t_ours,
                "goal": ">= 0.9",
                "met": t_torch / t_ours >= 0.9,
                "unit": "x",
                "detail": {"native_GBps": gbps},
            }
        )
    )
    vals = torch.randn(N, COLS)

    def ours_add() -> None:
        native.row_op(
            "scatter_add", [table.data_ptr()], ROWS, ROWS, COLS, COLS, 1, code, idx.data_ptr(), True, N, vals.data_ptr()
        )

    def theirs_add() -> None:
        table.index_add_(0, idx, vals)

    t_ours, t_torch = best(ours_add, 3), best(theirs_add, 3)
    print(
        "BENCH "
        + json.dumps(
            {
                "package": "common",
                "name": "row scatter-add 200k x 128 f32: torch / native time",
                "ratio": t_torch / t_ours,
                "goal": ">= 0.9",
                "met": t_torch / t_ours >= 0.9,
                "unit": "x",
            }
        )
    )


if __name__ == "__main__":
    main()
