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


def init(interleave_hosts: bool = False) -> tuple[int, int]:
    """torch.distributed (gloo) on the MPI job's ranks; returns (rank, world size).

    ``interleave_hosts``: torch ranks dealt round-robin over the hosts (MPI ranks fill the hosts in
    order), so that consecutive torch ranks, which shardlayers puts in one tensor-parallel group,
    sit on different hosts.
    """
    import socket

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    path = comm.bcast(os.path.join(tempfile.mkdtemp(prefix="shardlayers-bench-"), "store") if rank == 0 else None)
    if interleave_hosts:
        hosts = comm.allgather(socket.gethostname())
        names = sorted(set(hosts), key=hosts.index)
        per_host = [hosts.count(h) for h in names]
        if len(set(per_host)) != 1:
            raise ValueError(f"interleave_hosts needs the same number of ranks on every host, got {per_host}")
        h, local = names.index(hosts[rank]), hosts[: rank + 1].count(hosts[rank]) - 1
        rank = local * len(names) + h
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
class Timing:
    """One side of paired runs: wall seconds and this process's CPU seconds (all its threads:
    compute and gloo's) per run."""

    walls: list[float]
    cpus: list[float]

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)


def interleave(fns: list[Callable[[], Any]], reps: int) -> list[Timing]:
    """Time every function of ``fns`` in turn, ``reps`` rounds (a, b, a, b, ...), so that load
    changes on a shared machine hit all alike; quote the medians."""
    out = [Timing([], []) for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, out):
            c0 = time.process_time()
            t.walls.append(timeit(fn, 1))
            t.cpus.append(time.process_time() - c0)
    return out


@dataclass
class Paired:
    """Medians of paired runs of A and B (wall and CPU seconds)."""

    a: Timing
    b: Timing

    @property
    def wall_a(self) -> float:
        return self.a.wall

    @property
    def wall_b(self) -> float:
        return self.b.wall

    @property
    def cpu_ratio(self) -> float:
        return self.a.cpu / self.b.cpu


def compare(fa: Callable[[], Any], fb: Callable[[], Any], reps: int) -> Paired:
    """:func:`interleave` of two functions."""
    a, b = interleave([fa, fb], reps)
    return Paired(a, b)


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


def bench_line(name: str, ratio: float, goal: str, limit: float | None, unit: str = "x", **extra: Any) -> str:
    """A BENCH line; ``limit`` None for a line of information (``met`` null)."""
    row = {
        "package": "shardlayers",
        "name": name,
        "ratio": round(ratio, 3),
        "goal": goal,
        "met": None if limit is None else bool(ratio <= limit),
        "unit": unit,
        **extra,
    }
    return "BENCH " + json.dumps(row)


def finish() -> None:
    dist.barrier()
    dist.destroy_process_group()
