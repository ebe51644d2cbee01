# nprocs: 2
# ruff: noqa: B023  (the timed closures run inside the loop that binds them)
"""mpiad Allreduce against raw mpi4py and torch.distributed (gloo), 8 B .. 64 MiB, float32.

Run: mpiexec -n 2 python -m mpi4py benchmarks/bench_allreduce.py
Prints one ``BENCH {json}`` line per measurement on rank 0 and writes
``mpiad_allreduce.png`` into $DISTKIT_BENCH_OUT (default: the current folder).

Timing: per size, methods are interleaved in rounds; a round's time is the
slower rank's mean over its iterations, and the best round is kept (the
machine is shared, so the minimum is the least disturbed estimate).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import mpi4py.MPI as MPI
import numpy as np
import torch
import torch.distributed as dist

import mpiad

W = MPI.COMM_WORLD
rank, size = W.rank, W.size
comm = mpiad.COMM_WORLD
OUTDIR = os.environ.get("DISTKIT_BENCH_OUT", ".")
SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20, 8 << 20, 64 << 20]


def emit(name: str, ratio: float, goal: str, met: bool, **detail: object) -> None:
    if rank == 0:
        row = {"package": "mpiad", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": bool(met), "unit": "x"}
        if detail:
            row["detail"] = detail
        print("BENCH " + json.dumps(row), flush=True)


def iters_for(nbytes: int) -> int:
    return max(3, min(2000, (4 << 20) // max(nbytes, 1)))


def bench(fns: dict[str, Callable[[], object]], nbytes: int, rounds: int = 5) -> dict[str, float]:
    """Seconds per call of each fn (best round of the slower rank)."""
    n = iters_for(nbytes)
    best = {k: float("inf") for k in fns}
    for fn in fns.values():  # warm-up
        for _ in range(min(n, 20)):
            fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            W.Barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = (time.perf_counter() - t0) / n
            dt = W.allreduce(dt, op=MPI.MAX)
            best[k] = min(best[k], dt)
    return best


def init_gloo() -> str:
    tmp = tempfile.mkdtemp(prefix="mpiad-bench-") if rank == 0 else None
    tmp = W.bcast(tmp, root=0)
    store = dist.FileStore(os.path.join(tmp, "store"), size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    return tmp


def main() -> None:
    tmp = init_gloo()
    results: dict[str, list[float]] = {
        "mpiad": [],
        "mpiad out=": [],
        "mpiad (autograd)": [],
        "mpi4py": [],
        "gloo": [],
    }
    try:
        for nbytes in SIZES:
            numel = max(1, nbytes // 4)
            x = torch.rand(numel, dtype=torch.float32)
            xg = x.clone().requires_grad_()
            out = np.empty(numel, dtype=np.float32)
            xn = x.numpy()
            gl = x.clone()
            res = torch.empty_like(x)
            fns: dict[str, Callable[[], object]] = {
                "mpiad": lambda: comm.Allreduce(x, mpiad.MPI_SUM),
                "mpiad out=": lambda: comm.Allreduce(x, mpiad.MPI_SUM, out=res),
                "mpiad (autograd)": lambda: comm.Allreduce(xg, mpiad.MPI_SUM),
                "mpi4py": lambda: W.Allreduce(xn, out, op=MPI.SUM),
                "gloo": lambda: dist.all_reduce(gl),
            }
            t = bench(fns, nbytes)
            for k in results:
                results[k].append(t[k])
            label = (
                f"{nbytes} B"
                if nbytes < 1024
                else (f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB")
            )
            r = t["mpiad"] / t["mpi4py"]
            if nbytes >= 1 << 20:
                emit(
                    f"Allreduce {label} (new output tensor): mpiad / mpi4py",
                    r,
                    "<= 1.05",
                    r <= 1.05,
                    mpiad_us=t["mpiad"] * 1e6,
                    mpi4py_us=t["mpi4py"] * 1e6,
                )
                ro = t["mpiad out="] / t["mpi4py"]
                emit(
                    f"Allreduce {label} (same output buffer, out=): mpiad / mpi4py",
                    ro,
                    "<= 1.05",
                    ro <= 1.05,
                    mpiad_us=t["mpiad out="] * 1e6,
                )
            elif nbytes == 8:
                emit(
                    f"Allreduce {label} (no grad, fast path): mpiad / mpi4py",
                    r,
                    "<= 2",
                    r <= 2,
                    mpiad_us=t["mpiad"] * 1e6,
                    mpi4py_us=t["mpi4py"] * 1e6,
                )
                ra = t["mpiad (autograd)"] / t["mpi4py"]
                emit(
                    f"Allreduce {label} (through autograd): mpiad / mpi4py",
                    ra,
                    "<= 6",
                    ra <= 6,
                    mpiad_us=t["mpiad (autograd)"] * 1e6,
                )
            else:
                emit(f"Allreduce {label}: mpiad / mpi4py", r, "informational", True)
            rg = t["mpiad"] / t["gloo"]
            emit(
                f"Allreduce {label}: mpiad / gloo all_reduce",
                rg,
                "< 1",
                rg < 1,
                mpiad_us=t["mpiad"] * 1e6,
                gloo_us=t["gloo"] * 1e6,
            )

        # forward + backward / forward through autograd
        for nbytes in (8, 1 << 20):
            numel = max(1, nbytes // 4)
            xg = torch.rand(numel, requires_grad=True)
            g = torch.ones(numel)

            def fwd() -> None:
                comm.Allreduce(xg, mpiad.MPI_SUM)

            def fwdbwd() -> None:
                comm.Allreduce(xg, mpiad.MPI_SUM).backward(g)

            t = bench({"fwd": fwd, "fwdbwd": fwdbwd}, nbytes)
            rr = t["fwdbwd"] / t["fwd"]
            label = "8 B" if nbytes == 8 else "1 MiB"
            emit(f"Allreduce {label}: forward+backward / forward", rr, "<= 2.5 (backward = one Allreduce)", rr <= 2.5)

        # Alltoall (one MPI_Alltoallv) vs mpi4torch's loop of `size` Scatters
        for nbytes in (4096, 1 << 20, 16 << 20):
            cols = max(size, nbytes // 4 // 16 // size * size)
            x = torch.rand(16, cols)
            per = cols // size

            def a2a() -> None:
                comm.Alltoall(x, 0, 1, per)

            def loop() -> None:
                torch.cat([comm.Scatter(x, 1, per, root) for root in range(size)], 0)

            assert torch.equal(
                comm.Alltoall(x, 0, 1, per), torch.cat([comm.Scatter(x, 1, per, r) for r in range(size)], 0)
            )
            t = bench({"a2a": a2a, "loop": loop}, nbytes, rounds=3)
            label = f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
            ra = t["a2a"] / t["loop"]
            emit(f"Alltoall {label}: one Alltoallv / scatter loop", ra, "< 1", ra < 1)
    finally:
        dist.destroy_process_group()
        W.Barrier()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    if rank == 0:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 4.5))
            for k, v in results.items():
                ax.loglog(SIZES, [s * 1e6 for s in v], marker="o", label=k)
            ax.set_xlabel("message size (bytes, float32)")
            ax.set_ylabel("time per Allreduce (us)")
            ax.set_title(f"Allreduce on {size} ranks")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            os.makedirs(OUTDIR, exist_ok=True)
            fig.savefig(os.path.join(OUTDIR, "mpiad_allreduce.png"), dpi=120, bbox_inches="tight")
        except ImportError:
            print("matplotlib not installed: no plot")
        print("sizes (B):", SIZES)
        for k, v in results.items():
            print(f"{k:>18}: " + " ".join(f"{s * 1e6:9.1f}" for s in v) + "  us")


if __name__ == "__main__":
    main()
