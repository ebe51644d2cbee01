"""Shared setup of the 2-rank benchmarks: gloo over a FileStore found through mpi4py."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class Paired:
    """Medians of paired runs: wall seconds and this process's CPU seconds (all its threads:
    compute, gloo's) of A and of B."""

    wall_a: float
    wall_b: float
    cpu_a: float
    cpu_b: float
    walls_a: list[float]
    walls_b: list[float]

    @property
    def ratio(self) -> float:
        return self.wall_a / self.wall_b

    @property
    def cpu_ratio(self) -> float:
        return self.cpu_a / self.cpu_b


def compare(fa: Callable[[], Any], fb: Callable[[], Any], reps: int) -> Paired:
    """Time ``fa`` and ``fb`` paired (a, b, a, b, ...) so that load changes on a shared machine hit
    both alike, and return the medians."""
    wa: list[float] = []
    wb: list[float] = []
    ca: list[float] = []
    cb: list[float] = []
    for _ in range(reps):
        for fn, wall, cpu in ((fa, wa, ca), (fb, wb, cb)):
            c0 = time.process_time()
            wall.append(timeit(fn, 1))
            cpu.append(time.process_time() - c0)
    med = statistics.median
    return Paired(med(wa), med(wb), med(ca), med(cb), wa, wb)


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


def peak_tracked_bytes(fn: Callable[[], Any]) -> int:
    """Peak of live CPU tensor bytes allocated while running ``fn``, above what was live before.

    Every allocation and free of c10's CPU allocator is reported to ``torch.profiler`` with the
    running total of the bytes allocated since profiling started (``total_allocated``): the peak
    of that total counts every tensor of the step, autograd's saved tensors and library-internal
    temporaries (DTensor's) included, independent of how the C library's heap caches memory.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak = 0
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        extra = node.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation" and extra.device.type == "cpu":
            peak = max(peak, int(extra.total_allocated))
        stack.extend(node.children)
    return peak


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
