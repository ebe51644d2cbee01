"""Gather of random rows from GPU CHUNKED / DEVICE tables against the device-to-device copy bandwidth.

Run (one GPU; the repository root or anywhere, with the packages importable)::

    python packages/wholemem/benchmarks/bench_gather_gpu.py [--json PATH] [--no-two-ranks]

Without a CUDA GPU (or with a wholemem built without nvcc) it prints ``SKIP: no CUDA GPU``
and exits 0 (``--json`` then writes ``[]``).

Goal: a wholemem gather of random rows (>= 512 B each) from a CHUNKED (``device='cuda'``)
or DEVICE table reaches >= 0.7 of the device-to-device copy bandwidth measured in the
same run; a scatter of distinct random rows >= 0.6 (issue #34; ``--no-scatter`` skips it,
torch ``index_copy_`` is its reference).

Method
------
float32 tables of ``--rows`` rows (4M) x 128 and 256 columns (512 B and 1 KiB rows: 2
and 4 GiB), rows encoding their id; ``--nidx`` (1M) random int64 indices on the GPU per
gather, into a preallocated ``out=``. Each configuration runs in its own spawned process
group (``distkit_common.testing.run_spawn``: gloo over a FileStore, as the ``gpu`` tests),
with a deadline, so a failure or hang of one cannot hold the other's results:

* 1 rank: ``dst.copy_(src)`` of 1 GiB, ``table.index_select(0, idx, out=)`` on a plain CUDA
  tensor (torch's own gather, a reference), ``wholemem.gather`` of the CHUNKED and the
  DEVICE table.
* 2 ranks sharing the GPU (``--no-two-ranks`` skips it): half of the CHUNKED rows are
  the other process's chunk and every DEVICE row is rank 0's allocation, mapped over
  CUDA IPC. The ranks take turns (a barrier between), since kernels of two processes
  only time-slice one GPU; each rank measures its own copy bandwidth and gathers.

Times are CUDA events around each call on the current stream, median of ``--reps`` (20)
calls after 3 warm-up calls. A wholemem gather includes its index check (one small kernel
and a stream synchronisation), as every call does. Every result is checked (the rows'
first and last columns hold their ids).

Formulas, GB = 1e9 bytes::

    copy_GBps   = 2 * copy_bytes / t_copy             (each byte read once and written once)
    gather_GBps = 2 * nidx * row_bytes / t_gather     (each gathered byte read once, written once;
                                                       the 8 * nidx index bytes are not counted,
                                                       gather_GBps_with_index adds them)
    ratio       = gather_GBps / copy_GBps,  met = ratio >= 0.7  (index_select: reported, no goal)

One ``BENCH {json}`` line per measurement as it is made, then a table; ``--json`` is
rewritten after each configuration, so a later failure keeps earlier results. Everything
ends within ``--budget`` seconds (52) of the start: the 1-rank run gets at most 3/4 of it,
the 2-rank run the rest; a rank still running 2 s before its deadline dumps its stacks
and exits. Exit 1 if a configuration failed or ran past its deadline (its traceback or
stack dump is in stderr); an unmet goal is a result, not a failure.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

T_START = time.monotonic()  # the budget counts from here: importing torch can be slow on a busy machine

import torch  # noqa: E402

GOAL = 0.7
SCATTER_GOAL = 0.6  # issue #34
COLS = (128, 256)  # float32: 512 B and 1 KiB rows
WARMUP = 3


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    """Median CUDA-event time of ``fn`` on the current stream, in ms."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev)


def _fill_ids(local: torch.Tensor, first: int) -> None:
    """Columns 0 and -1 of rows ``first ..`` hold the row id (exact in float32 below 2**24)."""
    ids = torch.arange(first, first + local.shape[0], device=local.device).to(local.dtype)
    local[:, 0] = ids
    local[:, -1] = ids


def _check(out: torch.Tensor, idx: torch.Tensor, what: str) -> None:
    want = idx.to(out.dtype)
    if not (torch.equal(out[:, 0], want) and torch.equal(out[:, -1], want)):
        raise AssertionError(f"{what}: the gathered rows are not the requested ones")


def _body(rank: int, size: int, store: str, out_path: str, cfg: dict[str, Any]) -> None:
    """One configuration (``size`` ranks); rank ``r`` measures while the others wait."""
    # a hung rank dumps its stacks and exits shortly before the parent's deadline kills it
    faulthandler.dump_traceback_later(max(1.0, cfg["deadline"] - time.time() - 2.0), exit=True)
    import torch.distributed as dist

    import wholemem as wg
    from distkit_common.testing import init_process_group

    T = wg.WmTensorType
    init_process_group(rank, size, store)
    wg.init_lib()
    comm = wg.communicator_from_process_group(None, device_group=dist.group.WORLD)
    dev = _device()
    rows, nidx, reps = cfg["rows"], cfg["nidx"], cfg["reps"]
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)
    idx = torch.randint(0, rows, (nidx,), device=dev, generator=gen)
    uidx = torch.randperm(rows, device=dev, generator=gen)[:nidx]  # distinct rows: a scatter is defined
    info = {"device": _device_name(dev), "torch": torch.__version__, "table_rows": rows, "gathered_rows": nidx}
    ranks = "1 rank" if size == 1 else f"{size} ranks sharing the GPU, rank {rank}"
    copy_gbps = [0.0]

    def emit(name: str, memory_type: str, row_bytes: int, ms: float, goal: bool, op: str = "gather") -> None:
        nbytes = nidx * row_bytes
        gbps = 2 * nbytes / (ms * 1e-3) / 1e9
        ratio = gbps / copy_gbps[0]
        want = GOAL if op == "gather" else SCATTER_GOAL
        row = {
            "package": "wholemem",
            "name": f"{name}, {row_bytes} B rows, {ranks}: {op} / D2D copy bandwidth",
            "op": op,
            "memory_type": memory_type,
            "row_bytes": row_bytes,
            "ranks": size,
            "rank": rank,
            "gather_GBps": round(gbps, 1),
            "gather_GBps_with_index": round((2 * nbytes + 8 * nidx) / (ms * 1e-3) / 1e9, 1),
            "copy_GBps": round(copy_gbps[0], 1),
            "ratio": round(ratio, 3),
            "goal": f">= {want:g}" if goal else "(reference)",
            "met": bool(ratio >= want) if goal else None,
            "unit": "x",
            "detail": {**info, "median_ms": round(ms, 4), "reps": reps},
        }
        sys.stdout.write("BENCH " + json.dumps(row) + "\n")
        sys.stdout.flush()
        with open(out_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def in_turn(fn: Callable[[], None]) -> None:
        """``fn`` on each rank in turn, the others waiting at a barrier."""
        for r in range(size):
            comm.barrier()
            if r == rank:
                fn()
        comm.barrier()

    def copy_bandwidth() -> None:
        n = cfg["copy_bytes"]
        src = torch.ones(n, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        ms = _median_ms(lambda: dst.copy_(src), reps)
        if not torch.equal(dst, src):
            raise AssertionError("copy_: wrong result")
        copy_gbps[0] = 2 * n / (ms * 1e-3) / 1e9
        print(f"rank {rank}/{size} on {info['device']}: D2D copy of {n >> 20} MiB: {copy_gbps[0]:.0f} GB/s", flush=True)

    in_turn(copy_bandwidth)
    torch.cuda.empty_cache()
    for cols in COLS:
        row_bytes = cols * 4
        out = torch.empty(nidx, cols, device=dev)
        if size == 1:
            plain = torch.zeros(rows, cols, device=dev)
            _fill_ids(plain, 0)
            ms = _median_ms(lambda plain=plain, out=out: torch.index_select(plain, 0, idx, out=out), reps)
            _check(out, idx, "index_select")
            emit("torch index_select on a plain CUDA tensor", "torch", row_bytes, ms, goal=False)
            vals = torch.ones(nidx, cols, device=dev)
            ms = _median_ms(lambda plain=plain, vals=vals: plain.index_copy_(0, uidx, vals), reps)
            emit("torch index_copy_ on a plain CUDA tensor", "torch", row_bytes, ms, goal=False, op="scatter")
            del vals
            del plain
            torch.cuda.empty_cache()
        for ty in (T.CHUNKED, T.DEVICE):
            kw = {"device": "cuda"} if ty is T.CHUNKED else {}  # DEVICE lives on this rank's GPU by default
            t = wg.create_wm_tensor(comm, [rows, cols], [], torch.float32, ty, **kw)
            if t.device != dev:
                raise AssertionError(f"{ty.name} tensor on {t.device}, expected {dev}")
            local, first = wg.get_local_tensor(t)
            _fill_ids(local, first)
            del local
            comm.barrier()
            out.zero_()

            def measure(t: Any = t, ty: Any = ty, out: torch.Tensor = out, row_bytes: int = row_bytes) -> None:
                ms = _median_ms(lambda: wg.gather(t, idx, out=out), reps)
                _check(out, idx, f"wholemem.gather {ty.name}")
                emit(f"wholemem.gather {ty.name}", ty.name, row_bytes, ms, goal=True)
                if cfg["scatter"]:
                    vals = out[: uidx.numel()]  # rows of ids: scattering them changes what the gather checks
                    vals.copy_(uidx.to(out.dtype)[:, None].expand(-1, out.shape[1]))
                    ms = _median_ms(lambda: wg.scatter(t, uidx, vals), reps)
                    back = wg.gather(t, uidx)
                    if not torch.equal(back[:, 0], uidx.to(out.dtype)):
                        raise AssertionError(f"wholemem.scatter {ty.name}: the rows were not written")
                    emit(f"wholemem.scatter {ty.name}", ty.name, row_bytes, ms, goal=True, op="scatter")

            in_turn(measure)
            del t, measure
            gc.collect()
            comm.barrier()
            torch.cuda.empty_cache()
        del out
    comm.destroy()
    wg.finalize_lib()
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


def _gpu_usable() -> bool:
    from wholemem import _wholemem

    return bool(_wholemem.cuda_compiled() and torch.cuda.is_available() and _wholemem.cuda_device_count() > 0)


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'ranks':>5} {'rank':>4} {'op':>8} {'memory':>8} {'row B':>6} {'GB/s':>11} {'copy GB/s':>9} {'ratio':>6}  goal"
    lines = [head]
    for r in rows:
        met = {True: "met", False: "NOT met", None: "-"}[r["met"]]
        lines.append(
            f"{r['ranks']:>5} {r['rank']:>4} {r.get('op', 'gather'):>8} {r['memory_type']:>8} {r['row_bytes']:>6} {r['gather_GBps']:>11.1f} "
            f"{r['copy_GBps']:>9.1f} {r['ratio']:>6.3f}  {r['goal']} {met}"
        )
    return "\n".join(lines)


def main() -> int:
    t0 = T_START
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="also write every BENCH row here (a JSON list)")
    ap.add_argument("--no-two-ranks", action="store_true", help="skip the 2-rank configuration")
    ap.add_argument("--rows", type=int, default=4 << 20, help="table rows (default 4M)")
    ap.add_argument("--nidx", type=int, default=1 << 20, help="rows per gather (default 1M)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--copy-mib", type=int, default=1024, help="size of the D2D copy (MiB)")
    ap.add_argument("--no-scatter", action="store_true", help="measure the gathers only")
    ap.add_argument("--budget", type=float, default=52.0, help="seconds for everything; a run past it is killed")
    opts = ap.parse_args()
    if not 0 < opts.rows < 1 << 24 or opts.nidx < 1 or opts.reps < 1 or opts.copy_mib < 1:
        ap.error("need 0 < --rows < 2**24 (row ids must be exact in float32), --nidx, --reps, --copy-mib >= 1")
    json_path = os.path.abspath(opts.json) if opts.json else None
    results: list[dict[str, Any]] = []

    def save() -> None:
        if json_path:
            with open(json_path, "w") as f:
                json.dump(results, f, indent=1)

    if not _gpu_usable():
        print("SKIP: no CUDA GPU (or wholemem was built without nvcc)", flush=True)
        save()
        return 0
    from distkit_common.testing import run_spawn_rows

    failed = []
    for ranks in (1,) if opts.no_two_ranks else (1, 2):
        left = opts.budget - (time.monotonic() - t0)
        # the 1-rank run may not take the time the 2-rank one needs (a cold start takes the longest)
        timeout = min(left, 0.75 * opts.budget) if ranks == 1 and not opts.no_two_ranks else left
        if timeout < 10:
            failed.append(f"{ranks} rank(s): skipped, {left:.0f} s of the budget left")
            print(f"ERROR: {failed[-1]}", flush=True)
            continue
        cfg = {
            "rows": opts.rows,
            "nidx": opts.nidx,
            "reps": opts.reps,
            "copy_bytes": opts.copy_mib << 20,
            "scatter": not opts.no_scatter,
            "deadline": time.time() + timeout,
        }
        rows, error = run_spawn_rows(_body, ranks, cfg, timeout)
        results += rows
        if error:
            failed.append(f"{ranks} rank(s): {error}")
            print(f"ERROR: {failed[-1]}", flush=True)
        save()
    if results:
        print(_table(results), flush=True)
    for msg in failed:
        print(f"FAILED: {msg}", flush=True)
    print(f"bench_gather_gpu: {time.monotonic() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
