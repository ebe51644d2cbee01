"""Shared setup of the 2-rank benchmarks: gloo over a FileStore found through mpi4py."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def init() -> tuple[int, int]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    path = comm.bcast(os.path.join(tempfile.mkdtemp(prefix="shardlayers-bench-"), "store") if rank == 0 else None)
    dist.init_process_group("gloo", store=dist.FileStore(path, size), rank=rank, world_size=size)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // size))
    return rank, size


def timeit(fn: Callable[[], Any], reps: int) -> float:
    """Median wall time of ``fn`` over ``reps`` runs (ranks synchronised by a barrier)."""
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(fa: Callable[[], Any], fb: Callable[[], Any], reps: int) -> tuple[float, float]:
    """Best wall times of ``fa`` and ``fb``, measured interleaved (a, b, a, b, ...) so that load
    changes on a shared machine hit both alike (the minimum is the least noisy estimate there)."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(reps):
        ta.append(timeit(fa, 1))
        tb.append(timeit(fb, 1))
    return min(ta), min(tb)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_extra_bytes(fn: Callable[[], Any]) -> int:
    """Peak resident memory above the current one while running ``fn`` (Linux: VmHWM reset)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def bench_line(name: str, ratio: float, goal: str, limit: float, unit: str = "x", **extra: Any) -> str:
    row = {
        "package": "shardlayers",
        "name": name,
        "ratio": round(ratio, 3),
        "goal": goal,
        "met": bool(ratio <= limit),
        "unit": unit,
        **extra,
    }
    return "BENCH " + json.dumps(row)


def finish() -> None:
    dist.barrier()
    dist.destroy_process_group()
