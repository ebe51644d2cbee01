# nprocs: 2
# cluster: 2x1 --across-hosts
# ruff: noqa: B023  (the timed closures run inside the loop that binds them)
"""mpiad Allreduce against raw mpi4py and torch.distributed (gloo), 8 B .. 64 MiB, float32.

Run: mpiexec -n 2 python -m mpi4py benchmarks/bench_allreduce.py
Prints one ``BENCH {json}`` line per measurement on rank 0 and writes
``mpiad_allreduce.png`` into $DISTKIT_BENCH_OUT (default: the current folder).

``--across-hosts``: the Allreduce rows only, for ranks on different hosts (TCP):
mpiad (new output and ``out=``; from 256 KiB its pipelined ring) against mpi4py
on the same buffers and against gloo, one ratio row per size; from 1 MiB also
against a plain exchange of the buffers between the 2 ranks (the bytes any
2-rank Allreduce moves: its time bounds large sizes). On the simulated cluster (root; ci/cluster/README.md)
``nox -s bench`` runs it on 2 hosts x 1 rank (the ``# cluster:`` line above), or by hand::

    python -c "from distkit_common.testing import run_cluster; \
      print(run_cluster(2, 1, 'benchmarks/bench_allreduce.py', 900, args=['--across-hosts']).stdout)"

On a real cluster: ``mpiexec --host a,b -n 2 python -m mpi4py bench_allreduce.py --across-hosts``.

Timing (the machine is shared, so single numbers mislead): per size, the methods
are interleaved in ``ROUNDS`` rounds; a method's time in a round is the slower
rank's mean over its iterations. A ratio is the median over rounds of the
per-round ratio (both sides measured seconds apart), reported with its
interquartile range ``lo``..``hi``. Absolute times are medians over rounds.
The goal rows (mpiad vs mpi4py) are timed in a rotation of their own, without
gloo and the allocating variants, whose blocks slowed the block after them.

What is compared (same input buffers everywhere):

* ``mpi4py``: ``Comm.Allreduce(x.numpy(), res.numpy())``: the same input and output
  buffers as ``mpiad out=`` (a separately allocated numpy output is in ``detail`` as
  ``vs_mpi4py_numpy_output``: where a buffer lands in memory moves 8-16 MiB copies by
  up to 25 % here, in either direction);
* ``mpi4py (new output)``: the same, allocating ``out`` per call (the work of
  mpiad's functional API, which returns a new tensor);
* ``mpiad``: ``comm.Allreduce(x, MPI_SUM)`` (new output; no input requires grad:
  the native fast path), ``mpiad out=`` (preallocated output, same buffers as
  mpi4py), ``mpiad (autograd)`` (input requires grad).

The goal lines compare mpiad's new-output call against mpi4py's *preallocated*
call (the stricter reading); the allocation-matched ratio is in ``detail``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import mpi4py.MPI as MPI
import numpy as np
import torch
import torch.distributed as dist

import mpiad
from distkit_common.collective import bcast_json
from distkit_common.dtypes import CODES
from mpiad import _algo, _mpiad

W = MPI.COMM_WORLD
rank, size = W.rank, W.size
comm = mpiad.COMM_WORLD
OUTDIR = os.environ.get("DISTKIT_BENCH_OUT", ".")
SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20, 8 << 20, 64 << 20]
ROUNDS = 9


def emit(name: str, ratio: float, goal: str, met: bool, **detail: object) -> None:
    if rank == 0:
        row = {"package": "mpiad", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": bool(met), "unit": "x"}
        if detail:
            row["detail"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in detail.items()}
        print("BENCH " + json.dumps(row), flush=True)


def goal_row(name: str, r: tuple[float, float, float], limit: float, **detail: object) -> None:
    """A row with a goal `<= limit` from ratio()'s (median, lower quartile, upper quartile)."""
    emit(name, r[0], f"<= {limit:g}", r[0] <= limit, lo=r[1], hi=r[2], **detail)


def iters_for(nbytes: int) -> int:
    return max(6, min(2000, (16 << 20) // max(nbytes, 1)))


Times = dict[str, list[float]]


def bench(fns: dict[str, Callable[[], object]], nbytes: int, rounds: int = ROUNDS) -> Times:
    """Per-round seconds per call of each fn (the slower rank's mean), methods interleaved."""
    n = iters_for(nbytes)
    out: Times = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        for _ in range(min(n, 50)):
            fn()
    items = list(fns.items())
    for r in range(rounds):
        # each round starts with another method: whatever the previous method leaves
        # running (gloo's threads, TCP state) does not always land on the same one
        for k, fn in items[r % len(items) :] + items[: r % len(items)]:
            W.Barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = (time.perf_counter() - t0) / n
            out[k].append(W.allreduce(dt, op=MPI.MAX))
    return out


def med(v: list[float]) -> float:
    return statistics.median(v)


def ratio(t: Times, a: str, b: str) -> tuple[float, float, float]:
    """Median and interquartile range of the per-round ratios a / b."""
    r = sorted(x / y for x, y in zip(t[a], t[b]))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
    return statistics.median(r), q[0], q[2]


def init_gloo() -> str:
    tmp = bcast_json(tempfile.mkdtemp(prefix="mpiad-bench-") if rank == 0 else None, W)
    store = dist.FileStore(os.path.join(tmp, "store"), size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    return tmp


def size_label(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    return f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"


def across_hosts() -> None:
    """The Allreduce rows for ranks on different hosts: every byte crosses TCP."""
    hosts = W.allgather(MPI.Get_processor_name())
    if rank == 0:
        print(f"Allreduce across hosts: {size} ranks on {len(set(hosts))} hosts ({', '.join(hosts)})", flush=True)
    tmp = init_gloo()
    S = mpiad.MPI_SUM
    where = f"across {len(set(hosts))} hosts (TCP, {size} ranks)"
    try:
        for nbytes in SIZES:
            numel = max(1, nbytes // 4)
            x = torch.rand(numel, dtype=torch.float32)
            res = torch.zeros_like(x)
            xn, resn = x.numpy(), res.numpy()
            gl = x.clone()
            fns: dict[str, Callable[[], object]] = {
                "mpiad": lambda: comm.Allreduce(x, S),
                "mpiad out=": lambda: comm.Allreduce(x, S, out=res),
                "mpi4py": lambda: W.Allreduce(xn, resn, op=MPI.SUM),
                "gloo": lambda: dist.all_reduce(gl),
            }
            if size == 2 and nbytes >= 1 << 20:
                # what any 2-rank Allreduce must move at least: each rank receives the
                # equivalent of the other's whole buffer (a bandwidth bound for large sizes)
                peer = 1 - rank
                xch = torch.empty_like(x).numpy()
                fns["exchange"] = lambda: W.Sendrecv(xn, peer, 0, xch, peer, 0)
            # the goal rows on their own, as on one host (see main)
            goal = bench({k: fns[k] for k in ("mpiad", "mpiad out=", "mpi4py")}, nbytes, rounds=7)
            t = bench(fns, nbytes, rounds=7)
            label = size_label(nbytes)
            us = {k: med(v) * 1e6 for k, v in goal.items()}
            us["gloo"] = med(t["gloo"]) * 1e6
            r, lo, hi = ratio(goal, "mpiad", "mpi4py")
            ro, _, _ = ratio(goal, "mpiad out=", "mpi4py")
            limit = 2.0 if nbytes < 1 << 20 else 1.05
            if nbytes == 8 or nbytes >= 1 << 20:
                emit(
                    f"Allreduce {label} {where}, new output: mpiad / mpi4py (same input and output buffers)",
                    r,
                    f"<= {limit:g}",
                    r <= limit,
                    lo=lo,
                    hi=hi,
                    out_eq=ro,
                    mpiad_us=us["mpiad"],
                    mpiad_out_us=us["mpiad out="],
                    mpi4py_us=us["mpi4py"],
                )
            else:
                emit(f"Allreduce {label} {where}: mpiad / mpi4py", r, "informational", True, lo=lo, hi=hi)
            if "exchange" in t:
                rx, xlo, xhi = ratio(t, "mpiad", "exchange")
                emit(
                    f"Allreduce {label} {where}: mpiad / MPI_Sendrecv of the whole buffer both ways (the bytes"
                    " any 2-rank Allreduce moves)",
                    rx,
                    "informational",
                    True,
                    lo=xlo,
                    hi=xhi,
                    exchange_us=med(t["exchange"]) * 1e6,
                )
            rg, glo, ghi = ratio(t, "mpiad", "gloo")
            emit(
                f"Allreduce {label} {where}: mpiad / gloo all_reduce",
                rg,
                "< 1",
                rg < 1,
                lo=glo,
                hi=ghi,
                mpiad_us=us["mpiad"],
                gloo_us=us["gloo"],
            )
    finally:
        dist.destroy_process_group()
        W.Barrier()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    tmp = init_gloo()
    keys = ["mpiad", "mpiad out=", "mpiad (autograd)", "mpi4py", "mpi4py (new output)", "gloo"]
    results: dict[str, list[float]] = {k: [] for k in keys}
    S = mpiad.MPI_SUM
    try:
        for nbytes in SIZES:
            numel = max(1, nbytes // 4)
            x = torch.rand(numel, dtype=torch.float32)
            xg = x.clone().requires_grad_()
            out = np.empty(numel, dtype=np.float32)
            xn = x.numpy()
            gl = x.clone()
            res = torch.zeros_like(x)
            resn = res.numpy()
            fns: dict[str, Callable[[], object]] = {
                "mpiad": lambda: comm.Allreduce(x, S),
                "mpiad out=": lambda: comm.Allreduce(x, S, out=res),
                "mpiad (autograd)": lambda: comm.Allreduce(xg, S),
                "mpi4py": lambda: W.Allreduce(xn, resn, op=MPI.SUM),
                "mpi4py (numpy output)": lambda: W.Allreduce(xn, out, op=MPI.SUM),
                "mpi4py (new output)": lambda: W.Allreduce(xn, np.empty_like(xn), op=MPI.SUM),
                "gloo": lambda: dist.all_reduce(gl),
            }
            if nbytes >= 32768:
                # the two large-message algorithms of the native call, same buffers as `out=`
                # (the algorithm is a process-wide setting: set it per call, restored below)
                h, code, ps, pr, nb = comm.handle, CODES["float32"], x.data_ptr(), res.data_ptr(), x.nbytes
                cfg, fast = _mpiad.configure_allreduce, _mpiad.allreduce_fast
                fns["MPI_Allreduce"] = lambda: (cfg(_mpiad.ALGO_MPI, 0), fast(h, ps, pr, nb, code, S))
                fns["Reduce+Bcast"] = lambda: (cfg(_mpiad.ALGO_REDUCE_BCAST, 0), fast(h, ps, pr, nb, code, S))
            # The goal rows (mpiad vs mpi4py) are timed on their own: interleaved with gloo's
            # blocks and the allocating variants, the block after them ran up to 10 % slower
            # (1 MiB out=: 1.05x alone, 1.11x with gloo in the rotation), which is not mpiad's cost.
            goal = bench({k: fns[k] for k in ("mpiad", "mpiad out=", "mpi4py")}, nbytes)
            t = bench(fns, nbytes)
            _algo.configure()
            for k in results:
                results[k].append(med(t[k]))
            label = size_label(nbytes)
            us = {k: med(v) * 1e6 for k, v in t.items()}
            us.update({k: med(v) * 1e6 for k, v in goal.items()})  # the goal rows' times, as their ratios
            r, lo, hi = ratio(goal, "mpiad", "mpi4py")
            ra, _, _ = ratio(t, "mpiad", "mpi4py (new output)")
            if nbytes >= 1 << 20 or nbytes == 8:
                # the goal rows: mpiad's new output and its out= against mpi4py on preallocated buffers
                small = nbytes == 8
                limit = 2.0 if small else 1.05
                new_kind, out_kind = (
                    ("no grad, fast path, new output", "no grad, same output buffer, out=")
                    if small
                    else ("new output tensor", "same output buffer, out=")
                )
                goal_row(
                    f"Allreduce {label} ({new_kind}): mpiad / mpi4py (preallocated output)",
                    ratio(goal, "mpiad", "mpi4py"),
                    limit,
                    vs_mpi4py_new_output=ra,
                    mpiad_us=us["mpiad"],
                    mpi4py_us=us["mpi4py"],
                )
                numpy_out = (
                    {} if small else {"vs_mpi4py_numpy_output": ratio(t, "mpiad out=", "mpi4py (numpy output)")[0]}
                )
                goal_row(
                    f"Allreduce {label} ({out_kind}): mpiad / mpi4py",
                    ratio(goal, "mpiad out=", "mpi4py"),
                    limit,
                    mpiad_us=us["mpiad out="],
                    **numpy_out,
                )
                if small:
                    goal_row(
                        f"Allreduce {label} (through autograd): mpiad / mpi4py",
                        ratio(t, "mpiad (autograd)", "mpi4py"),
                        6.0,
                        mpiad_us=us["mpiad (autograd)"],
                    )
            else:
                emit(f"Allreduce {label}: mpiad / mpi4py", r, "informational", True, lo=lo, hi=hi)
            if nbytes >= 32768:
                rb, blo, bhi = ratio(t, "Reduce+Bcast", "MPI_Allreduce")
                emit(
                    f"Allreduce {label}: native Reduce+Bcast / MPI_Allreduce (mpiad uses Reduce+Bcast from "
                    f"MPIAD_LARGE_BYTES = {_algo.large_bytes() >> 10} KiB on one node)",
                    rb,
                    "informational",
                    True,
                    lo=blo,
                    hi=bhi,
                )
            rg, glo, ghi = ratio(t, "mpiad", "gloo")
            emit(
                f"Allreduce {label}: mpiad / gloo all_reduce",
                rg,
                "< 1",
                rg < 1,
                lo=glo,
                hi=ghi,
                mpiad_us=us["mpiad"],
                gloo_us=us["gloo"],
            )

        # forward+backward / forward through autograd: the gradient w.r.t. the input
        # (torch.autograd.grad; .backward() would add the accumulation into .grad)
        for nbytes in (8, 1 << 20):
            numel = max(1, nbytes // 4)
            xg = torch.rand(numel, requires_grad=True)
            g = torch.ones(numel)
            xl = torch.rand(numel, requires_grad=True)

            def fwd() -> None:
                comm.Allreduce(xg, S)

            def fwdbwd() -> None:
                torch.autograd.grad(comm.Allreduce(xg, S), xg, g)

            def tfwd() -> None:  # the same for a local torch op, for scale
                xl * 1.0

            def tfwdbwd() -> None:
                torch.autograd.grad(xl * 1.0, xl, g)

            t = bench({"fwd": fwd, "fwdbwd": fwdbwd, "tfwd": tfwd, "tfwdbwd": tfwdbwd}, nbytes)
            rr, lo, hi = ratio(t, "fwdbwd", "fwd")
            tr, _, _ = ratio(t, "tfwdbwd", "tfwd")
            label = "8 B" if nbytes == 8 else "1 MiB"
            emit(
                f"Allreduce {label}: forward+backward / forward (autograd)",
                rr,
                "<= 2.5 (backward = one Allreduce)",
                rr <= 2.5,
                lo=lo,
                hi=hi,
                fwd_us=med(t["fwd"]) * 1e6,
                fwdbwd_us=med(t["fwdbwd"]) * 1e6,
                local_mul_same_ratio=tr,
            )

        # Alltoall (one MPI_Alltoallv) vs mpi4torch's loop of `size` Scatters
        for nbytes in (4096, 1 << 20, 16 << 20):
            cols = max(size, nbytes // 4 // 16 // size * size)
            xa = torch.rand(16, cols)
            per = cols // size

            def a2a() -> None:
                comm.Alltoall(xa, 0, 1, per)

            def loop() -> None:
                torch.cat([comm.Scatter(xa, 1, per, root) for root in range(size)], 0)

            assert torch.equal(
                comm.Alltoall(xa, 0, 1, per), torch.cat([comm.Scatter(xa, 1, per, r) for r in range(size)], 0)
            )
            t = bench({"a2a": a2a, "loop": loop}, nbytes, rounds=5)
            label = f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
            rt, lo, hi = ratio(t, "a2a", "loop")
            emit(f"Alltoall {label}: one Alltoallv / scatter loop", rt, "< 1", rt < 1, lo=lo, hi=hi)
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
            ax.set_ylabel("time per Allreduce (us, median of rounds)")
            ax.set_title(f"Allreduce on {size} ranks")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            os.makedirs(OUTDIR, exist_ok=True)
            fig.savefig(os.path.join(OUTDIR, "mpiad_allreduce.png"), dpi=120, bbox_inches="tight")
        except ImportError:
            print("matplotlib not installed: no plot")
        print("sizes (B):", SIZES)
        for k, v in results.items():
            print(f"{k:>20}: " + " ".join(f"{s * 1e6:9.1f}" for s in v) + "  us")


if __name__ == "__main__":
    if sys.argv[1:] == ["--across-hosts"]:
        across_hosts()
    elif sys.argv[1:]:
        raise SystemExit(f"usage: {sys.argv[0]} [--across-hosts]")
    else:
        main()
