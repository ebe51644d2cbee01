# nprocs: 2
"""Overlap: mpiad.DataParallel vs torch DDP (gloo), and Iallreduce + computation.

Run: mpiexec -n 2 python -m mpi4py benchmarks/bench_overlap.py
Prints one ``BENCH {json}`` line per measurement on rank 0.

* DataParallel step (forward, backward with bucketed non-blocking averaging,
  SGD step) vs torch's DistributedDataParallel over gloo on the same model,
  data and bucket size: goal <= 0.8.
* Hidden fraction of the all-reduce time: T_comm (the buckets' all-reduces
  alone), T_bwd (backward without communication, under no_sync) and T_dp (the
  synchronised backward): hidden = (T_bwd + T_comm - T_dp) / T_comm, goal >= 0.5
  with >= 4 buckets.
* Iallreduce of 16 MiB, a matmul, Wait, vs the Allreduce alone plus the matmul
  alone: goal <= 0.75.

Timing as in bench_allreduce.py: the methods interleaved in rounds, a ratio is
the median of the per-round ratios (interquartile range in brackets), a time
is the slower rank's.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import mpi4py.MPI as MPI
import torch
import torch.distributed as dist

import mpiad
from distkit_common.testing import destroy_process_group

W = MPI.COMM_WORLD
rank, size = W.rank, W.size
comm = mpiad.COMM_WORLD
ROUNDS = 7


def emit(name: str, ratio: float, goal: str, met: bool, **detail: object) -> None:
    if rank == 0:
        row = {"package": "mpiad", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": bool(met), "unit": "x"}
        if detail:
            row["detail"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in detail.items()}
        print("BENCH " + json.dumps(row), flush=True)


def bench(fns: dict[str, Callable[[], object]], iters: int, rounds: int = ROUNDS) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            W.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out[k].append(W.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))
    return out


def ratio(t: dict[str, list[float]], a: str, b: str) -> tuple[float, float, float]:
    r = sorted(x / y for x, y in zip(t[a], t[b]))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
    return statistics.median(r), q[0], q[2]


def med(v: list[float]) -> float:
    return statistics.median(v)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(768, 768), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(768, 10))


def data_parallel(cap_mb: float) -> None:
    torch.manual_seed(1 + rank)
    # a small batch: the step is communication-bound, where the implementations differ
    x = torch.randn(16, 768)
    y = torch.randint(0, 10, (16,))
    loss_fn = torch.nn.CrossEntropyLoss()
    mp = mpiad.DataParallel(model(), bucket_cap_mb=cap_mb)
    ddp = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=cap_mb)
    opt_m = torch.optim.SGD(mp.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def step(net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()

    def backward_only() -> None:  # the same backward, no communication
        mp.zero_grad()
        with mp.no_sync():
            loss_fn(mp(x), y).backward()

    def backward_dp() -> None:
        mp.zero_grad()
        loss_fn(mp(x), y).backward()

    bufs = [torch.zeros_like(b) for b in mp.buckets]

    def comm_only() -> None:  # the buckets' averaging alone, in the same order
        for buf in bufs:
            comm.Wait(comm.Iallreduce(buf, mpiad.MPI_AVG))

    t = bench(
        {
            "mpiad": lambda: step(mp, opt_m),
            "ddp": lambda: step(ddp, opt_d),
            "bwd": backward_only,
            "dp": backward_dp,
            "comm": comm_only,
        },
        iters=5,
    )
    r, lo, hi = ratio(t, "mpiad", "ddp")
    emit(
        f"DataParallel step ({mp.bucket_count} buckets of {cap_mb} MB): mpiad / torch DDP (gloo)",
        r,
        "<= 0.8",
        r <= 0.8,
        lo=lo,
        hi=hi,
        mpiad_ms=med(t["mpiad"]) * 1e3,
        ddp_ms=med(t["ddp"]) * 1e3,
    )
    hidden = sorted(max(0.0, min(1.0, (b + c - d) / c)) for b, c, d in zip(t["bwd"], t["comm"], t["dp"]))
    h = statistics.median(hidden)
    emit(
        f"DataParallel: fraction of the all-reduce time hidden behind backward ({mp.bucket_count} buckets)",
        h,
        ">= 0.5",
        h >= 0.5 and mp.bucket_count >= 4,
        backward_ms=med(t["bwd"]) * 1e3,
        allreduce_ms=med(t["comm"]) * 1e3,
        backward_with_sync_ms=med(t["dp"]) * 1e3,
    )


def overlap() -> None:
    x = torch.rand(4 << 20)  # 16 MiB
    # a matmul about as long as the all-reduce, measured here
    t_ar = bench({"ar": lambda: comm.Allreduce(x, mpiad.MPI_SUM)}, iters=5, rounds=3)
    n = 256
    while n < 4096:
        a = torch.rand(n, n)
        t0 = time.perf_counter()
        a @ a
        if time.perf_counter() - t0 >= med(t_ar["ar"]):
            break
        n = int(n * 1.25)
    n = W.bcast(n, root=0)
    a = torch.rand(n, n)

    def both() -> None:
        h = comm.Iallreduce(x, mpiad.MPI_SUM)
        a @ a
        comm.Wait(h)

    t = bench(
        {"both": both, "ar": lambda: comm.Allreduce(x, mpiad.MPI_SUM), "mm": lambda: a @ a},
        iters=5,
    )
    r = sorted(b / (c + d) for b, c, d in zip(t["both"], t["ar"], t["mm"]))
    q = statistics.quantiles(r, n=4)
    m = statistics.median(r)
    emit(
        f"Iallreduce 16 MiB + matmul ({n}x{n}) + Wait / (Allreduce + matmul)",
        m,
        "<= 0.75",
        m <= 0.75,
        lo=q[0],
        hi=q[2],
        overlapped_ms=med(t["both"]) * 1e3,
        allreduce_ms=med(t["ar"]) * 1e3,
        matmul_ms=med(t["mm"]) * 1e3,
    )


def overlap_idle() -> None:
    """The same with a caller that waits without using the CPU (as for GPU kernels or I/O):
    shows that the worker moves the collective on its own; informational."""
    x = torch.rand(4 << 20)
    t_ar = bench({"ar": lambda: comm.Allreduce(x, mpiad.MPI_SUM)}, iters=5, rounds=3)
    pause = W.bcast(med(t_ar["ar"]), root=0)

    def both() -> None:
        h = comm.Iallreduce(x, mpiad.MPI_SUM)
        time.sleep(pause)
        comm.Wait(h)

    t = bench({"both": both, "ar": lambda: comm.Allreduce(x, mpiad.MPI_SUM), "idle": lambda: time.sleep(pause)}, 5)
    r = sorted(b / (c + d) for b, c, d in zip(t["both"], t["ar"], t["idle"]))
    q = statistics.quantiles(r, n=4)
    m = statistics.median(r)
    emit(
        f"Iallreduce 16 MiB + {pause * 1e3:.0f} ms of waiting off the CPU + Wait / (Allreduce + wait)",
        m,
        "informational (< 1: the worker progresses alone)",
        True,
        lo=q[0],
        hi=q[2],
        overlapped_ms=med(t["both"]) * 1e3,
        allreduce_ms=med(t["ar"]) * 1e3,
    )


def main() -> None:
    torch.set_num_threads(1)  # one core per rank: the ranks share the machine
    tmp = tempfile.mkdtemp(prefix="mpiad-bench-") if rank == 0 else None
    tmp = W.bcast(tmp, root=0)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), size), rank=rank, world_size=size)
    try:
        data_parallel(cap_mb=4.0)
        overlap()
        overlap_idle()
    finally:
        destroy_process_group()  # frees data_parallel's DDP first
        W.Barrier()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
