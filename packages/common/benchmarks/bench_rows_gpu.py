"""distkit-common's CUDA row kernels against the device-to-device copy bandwidth and torch.

Run (one GPU)::

    python packages/common/benchmarks/bench_rows_gpu.py [--json PATH] [--rows N] [--nidx N] [--reps N]

Without a CUDA GPU (or with distkit-common built without nvcc) it prints ``SKIP`` and exits 0.

What is measured (one process, CUDA events around each call, median of ``--reps`` after 3
warm-up calls; every result checked against torch):

* ``copy``: ``dst.copy_(src)`` of ``--copy-mib`` MiB, the bandwidth reference.
* for float32 rows of 128 and 256 columns (512 B and 1 KiB) in a table of ``--rows`` rows,
  ``--nidx`` random int64 indices on the GPU (distinct for scatter / scatter-add, so the
  result is defined):
  - ``native.row_op`` gather / scatter / scatter-add on the table as one buffer (``DEVICE``
    layout) and as 8 chunks of it (``CHUNKED`` layout: the chunk lookup per row), with the
    index check (``validate=True``: one small kernel and a stream synchronisation) and
    without it (``validate=False``: indices checked once where they are made);
  - torch ``index_select(out=)`` / ``index_copy_`` / ``index_add_`` on the plain tensor.

Formulas (GB = 1e9 bytes)::

    copy_GBps = 2 * copy_bytes / t        rows_GBps = 2 * nidx * row_bytes / t  (read + write;
    ratio = rows_GBps / copy_GBps          scatter-add reads the table row too: reported as is)

Goals (issue #34): gather >= 0.7 (512 B) / >= 0.8 (1 KiB) of the copy and >= index_select;
scatter and scatter-add >= 0.6. One ``BENCH {json}`` line per measurement, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

WARMUP = 3
COLS = (128, 256)
GOALS = {("gather", 512): 0.7, ("gather", 1024): 0.8, "scatter": 0.6, "scatter_add": 0.6}


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def _goal(op: str, row_bytes: int) -> float:
    return GOALS.get((op, row_bytes), GOALS.get(op, 0.0))  # type: ignore[call-overload]


def _copy_gbps(dev: torch.device, nbytes: int, reps: int) -> float:
    """The device-to-device copy bandwidth (read + write)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), reps)
    if not torch.equal(dst, src):
        raise AssertionError("copy_: wrong result")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _emit(results: list[dict[str, Any]], what: str, layout: str, op: str, row_bytes: int, nidx: int, ms: float,
          copy_gbps: float) -> None:  # fmt: skip
    gbps = 2 * nidx * row_bytes / (ms * 1e-3) / 1e9
    goal = _goal(op, row_bytes) if what.startswith("distkit") else None
    row = {
        "package": "common",
        "name": f"{what} {op}, {layout}, {row_bytes} B rows: / D2D copy bandwidth",
        "op": op,
        "layout": layout,
        "row_bytes": row_bytes,
        "GBps": round(gbps, 1),
        "copy_GBps": round(copy_gbps, 1),
        "ratio": round(gbps / copy_gbps, 3),
        "goal": f">= {goal:g}" if goal else "(reference)",
        "met": bool(gbps / copy_gbps >= goal) if goal else None,
        "median_ms": round(ms, 4),
    }
    results.append(row)
    print("BENCH " + json.dumps(row), flush=True)


def _measure_rows(native: Any, code: int, dev: torch.device, g: torch.Generator, cols: int, opts: Any,
                  copy_gbps: float, results: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every kernel and torch reference for float32 rows of ``cols`` columns."""
    rows, nidx, reps = opts.rows, opts.nidx, opts.reps
    rb = cols * 4
    stream = torch.cuda.current_stream(dev).cuda_stream
    ids = torch.arange(rows, device=dev, dtype=torch.float32)
    table = ids[:, None].repeat(1, cols)
    idx = torch.randint(0, rows, (nidx,), device=dev, generator=g)
    uidx = torch.randperm(rows, device=dev, generator=g)[:nidx]
    out = torch.empty(nidx, cols, device=dev)
    vals = torch.ones(nidx, cols, device=dev)
    rpc = -(-rows // 8)
    layouts = {
        "DEVICE (1 buffer)": ([int(table.data_ptr())], rows),
        "CHUNKED (8 chunks)": ([int(c.data_ptr()) for c in torch.split(table, rpc)], rpc),
    }

    def run(op: str, chunks: list[int], per: int, ix: torch.Tensor, data: torch.Tensor, validate: bool,
            alpha: float = 1.0) -> None:  # fmt: skip
        native.row_op(op, chunks, per, rows, cols, cols, 1, code, int(ix.data_ptr()), True, ix.numel(),
                      int(data.data_ptr()), alpha, on_device=True, stream=stream, validate=validate)  # fmt: skip

    for layout, (chunks, per) in layouts.items():
        for validate in (True, False):
            what = f"distkit row kernel (validate={validate})"
            for op, ix, data in (("gather", idx, out), ("scatter", uidx, vals), ("scatter_add", uidx, vals)):
                ms = _median_ms(lambda op=op, ix=ix, data=data, c=chunks, p=per, v=validate: run(op, c, p, ix, data, v),
                                reps)  # fmt: skip
                _emit(results, what, layout, op, rb, nidx, ms, copy_gbps)
            # checks, on a fresh table: the gathered rows, then exact sums of one scatter-add
            table.copy_(ids[:, None].expand(-1, cols))
            run("gather", chunks, per, idx, out, validate)
            if not torch.equal(out, table[idx]):
                raise AssertionError(f"gather {layout}: wrong rows")
            run("scatter_add", chunks, per, uidx, vals, validate, 2.0)
            want = ids.clone()
            want[uidx] += 2.0
            if not (torch.equal(table[:, 0], want) and torch.equal(table[:, -1], want)):
                raise AssertionError(f"scatter_add {layout}: wrong sums")
    refs = (
        ("torch index_select", "gather", lambda: torch.index_select(table, 0, idx, out=out)),
        ("torch index_copy_", "scatter", lambda: table.index_copy_(0, uidx, vals)),
        ("torch index_add_", "scatter_add", lambda: table.index_add_(0, uidx, vals)),
    )
    for what, op, fn in refs:
        _emit(results, what, "plain tensor", op, rb, nidx, _median_ms(fn, reps), copy_gbps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--rows", type=int, default=4 << 20)
    ap.add_argument("--nidx", type=int, default=1 << 20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--copy-mib", type=int, default=1024)
    opts = ap.parse_args()
    if opts.rows < 8 or not 0 < opts.nidx <= opts.rows or opts.reps < 1 or opts.copy_mib < 1:
        ap.error("need --rows >= 8, 0 < --nidx <= --rows, --reps >= 1, --copy-mib >= 1")
    from distkit_common import _distkit_common as native
    from distkit_common.dtypes import code_of

    if not (native.cuda_compiled() and torch.cuda.is_available()):
        print("SKIP: no CUDA GPU (or distkit-common was built without nvcc)", flush=True)
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump([], f)
        return 0
    dev = torch.device("cuda", torch.cuda.current_device())
    results: list[dict[str, Any]] = []
    copy_gbps = _copy_gbps(dev, opts.copy_mib << 20, opts.reps)
    print(f"D2D copy: {copy_gbps:.0f} GB/s on {torch.cuda.get_device_name(dev)}", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    for cols in COLS:
        _measure_rows(native, code_of(torch.float32), dev, g, cols, opts, copy_gbps, results)
        torch.cuda.empty_cache()
    print(f"\n{'what':<42} {'op':<12} {'layout':<19} {'row B':>5} {'GB/s':>7} {'ratio':>6} goal")
    for r in results:
        met = {True: "met", False: "NOT met", None: ""}[r["met"]]
        what = r["name"].split(" " + r["op"])[0]
        print(f"{what:<42} {r['op']:<12} {r['layout']:<19} {r['row_bytes']:>5} {r['GBps']:>7.1f} {r['ratio']:>6.3f} "
              f"{r['goal']} {met}")  # fmt: skip
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
