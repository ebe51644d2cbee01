# nprocs: 2
"""Gather of 200k random rows x 128 float32 from a 1M-row table on 2 ranks.

- HOST / CHUNKED gather vs ``torch.index_select(out=)`` on a private tensor (the
  memory-bandwidth limit of this machine); per-rank throughput ratio, goals >= 0.9 / >= 0.8.
- NCCL (DISTRIBUTED) gather vs a plain ``torch.distributed.all_to_all_single`` gather
  (bucket by owner, exchange indices, index_select, exchange rows back); goal >= 1.
- PSS of two ranks sharing a HOST table vs the table size (private copies would cost 2x).
  The table is 1 GiB instead of 2 GB to keep memory use modest on this shared machine.

Across hosts (issues #14, #33): ``--across-hosts`` is the NCCL-type gather vs the
``all_to_all`` gather on every rank of a job spread over several hosts (any launcher
that sets ``MASTER_ADDR`` / ``MASTER_PORT``: mpiexec, srun, torchrun; the wholemem
communicator is ``get_global_communicator()``); ``--cluster`` runs that on the
simulated cluster (root, ci/cluster/README.md) and prints its ``BENCH`` lines;
``--quick`` makes it small (the cluster test). ``--hosts H --ranks-per-host R``
(default 2 x 2) and ``--rate R`` (tc's syntax, e.g. ``1gbit``; default unshaped)
choose the cluster. On a shaped cluster the same run first measures the link (one TCP
stream dkh1 -> dkh2 and ``MPI_Sendrecv`` of 16 MiB each way) and reports the gather
as bytes through the busiest host link per second, as a fraction of that TCP stream's
goodput (the bound: no gather can move more through one host's link)::

    python packages/wholemem/benchmarks/bench_gather.py --cluster --hosts 2 --rate 1gbit
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

import wholemem as wg

ROWS, COLS, NIDX, REPS = 1_000_000, 128, 200_000, 7
PSS_ROWS = (1 << 30) // (COLS * 4)  # a 1 GiB table


def bench_pair(ref, fn, mpi) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median per-rank times of ``ref`` and ``fn``, interleaved (the machine's load drifts)."""
    ref(), fn()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(REPS):
        for k, f in enumerate((ref, fn)):
            mpi.Barrier()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    # per-rank time of the slower rank (both ranks run at once)
    return max(mpi.allgather(statistics.median(times[0]))), max(mpi.allgather(statistics.median(times[1])))


def pss_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError("no Pss line in /proc/self/smaps_rollup")


def emit(rank: int, name: str, ratio: float, goal: str, met: bool | None, unit: str = "x", **detail: object) -> None:
    if rank == 0:
        row = {"package": "wholemem", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": met, "unit": unit}
        row["detail"] = detail
        print("BENCH " + json.dumps(row), flush=True)


def a2a_gather(local: torch.Tensor, idx: torch.Tensor, rpr: int, size: int) -> torch.Tensor:
    """The baseline: a distributed gather written with plain torch.distributed."""
    owner = torch.div(idx, rpr, rounding_mode="floor")
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sc, rc = send_counts.tolist(), recv_counts.tolist()
    ridx = torch.empty(sum(rc), dtype=torch.int64)
    dist.all_to_all_single(ridx, idx[order], rc, sc)
    rows = local.index_select(0, ridx - dist.get_rank() * rpr)
    back = torch.empty((idx.numel(), local.shape[1]), dtype=local.dtype)
    dist.all_to_all_single(back, rows, sc, rc)
    out = torch.empty_like(back)
    out[order] = back
    return out


def link_bytes(idx: torch.Tensor, rpr: int, rank_host: list[int], me: int) -> tuple[list[int], list[int]]:
    """Bytes this rank's gather of ``idx`` sends out of and receives into every host over the network:
    its int64 indices to each remote owner and the rows (``COLS`` float32) coming back."""
    n = max(rank_host) + 1
    owners = torch.bincount(torch.div(idx, rpr, rounding_mode="floor"), minlength=len(rank_host)).tolist()
    out, inn = [0] * n, [0] * n
    mine = rank_host[me]
    for owner, count in enumerate(owners):
        h = rank_host[owner]
        if h != mine:
            out[mine] += 8 * count  # indices to the owner ...
            inn[h] += 8 * count
            out[h] += COLS * 4 * count  # ... and its rows back
            inn[mine] += COLS * 4 * count
    return out, inn


def across_hosts(quick: bool, link_bps: float | None, rate: str | None) -> None:
    """NCCL-type gather vs the all_to_all gather on every rank of a multi-host job; with ``link_bps``
    (bytes/s of one TCP stream between two hosts) also the gather's share of the busiest host link."""
    from distkit_common import launch

    rows, nidx, reps = (100_000, 20_000, 3) if quick else (ROWS, NIDX // 2, REPS)
    info = launch.launch_info()
    rank, size = info.rank, info.world_size
    timeout = datetime.timedelta(seconds=float(os.environ.get("DISTKIT_COLLECTIVE_TIMEOUT_S", "300")))
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size, timeout=timeout)
    wg.init_lib()
    comm = wg.get_global_communicator()
    nt = wg.create_wm_tensor(comm, [rows, COLS], [], torch.float32, wg.WmTensorType.NCCL)
    local, _ = wg.get_local_tensor(nt)
    local.fill_(1.0 + rank)
    rpr = wg.get_partition_plan(nt)[2]
    idx = torch.randint(0, rows, (nidx,), generator=torch.Generator().manual_seed(rank))
    out = torch.empty(nidx, COLS)
    check = wg.gather(nt, idx)
    assert torch.equal(check[:, 0], (torch.div(idx, rpr, rounding_mode="floor") + 1).float())
    assert torch.equal(a2a_gather(local, idx, rpr, size), check)
    # the transports alone: the gather's row exchange (same counts, same bytes) as one all-to-all of
    # ready rows, by gloo (what both gathers use) and by MPI_Alltoallv (Open MPI's TCP BTL)
    sc = torch.bincount(torch.div(idx, rpr, rounding_mode="floor"), minlength=size)
    rc = torch.empty_like(sc)
    dist.all_to_all_single(rc, sc)
    rows_send, rows_recv = torch.ones(nidx, COLS), torch.empty(int(rc.sum()), COLS)
    counts_s, counts_r = [c * COLS for c in sc.tolist()], [c * COLS for c in rc.tolist()]
    displ = lambda c: [sum(c[:i]) for i in range(len(c))]  # noqa: E731

    def mpi_rows() -> None:
        from mpi4py import MPI

        MPI.COMM_WORLD.Alltoallv(
            [rows_send.numpy(), counts_s, displ(counts_s), MPI.FLOAT],
            [rows_recv.numpy(), counts_r, displ(counts_r), MPI.FLOAT],
        )

    funcs = (
        lambda: a2a_gather(local, idx, rpr, size),
        lambda: wg.gather(nt, idx, out=out),
        lambda: dist.all_to_all_single(rows_recv, rows_send, rc.tolist(), sc.tolist()),
        mpi_rows,
    )
    if link_bps is None:  # (unshaped: the two gathers only)
        funcs = funcs[:2]
    times: tuple[list[float], ...] = tuple([] for _ in funcs)
    for f in funcs:  # warm-up: gloo's and MPI's connections
        f()
    for _ in range(reps):
        for k, f in enumerate(funcs):
            dist.barrier()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    # the slower rank's median (every rank gathers at once)
    med = torch.tensor([statistics.median(t) for t in times], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    t_a2a, t_nccl = med.tolist()[:2]
    t_gloo_rows, t_mpi_rows = (med.tolist()[2:] + [float("nan")] * 2)[:2]
    gbytes = nidx * COLS * 4 / 1e9
    ratio = t_a2a / t_nccl
    emit(
        rank,
        f"gather across {comm.num_nodes} hosts x {comm.local_size} ranks{f' at {rate}' if rate else ''}: NCCL type / "
        "torch.distributed all_to_all gather",
        ratio,
        ">= 1",
        ratio >= 1.0,
        hosts=comm.num_nodes,
        ranks=size,
        rows=rows,
        gathered_rows_per_rank=nidx,
        row_bytes=COLS * 4,
        gbps_wholemem=round(gbytes / t_nccl, 3),
        gbps_torch=round(gbytes / t_a2a, 3),
        link=rate or "unshaped",
        load_avg_1min=round(os.getloadavg()[0], 2),
    )
    # every host's traffic in and out over its link, summed over every rank's gather
    hosts: list[str | None] = [None] * size
    dist.all_gather_object(hosts, socket.gethostname())
    names = sorted(set(hosts), key=hosts.index)
    rank_host = [names.index(h) for h in hosts]
    out_b, in_b = link_bytes(idx, rpr, rank_host, rank)
    traffic = torch.tensor([out_b, in_b], dtype=torch.float64)
    dist.all_reduce(traffic)
    busiest = float(traffic.max())  # bytes through the busiest direction of the busiest host link
    if link_bps:
        share = busiest / t_nccl / link_bps
        emit(
            rank,
            f"gather across {comm.num_nodes} hosts x {comm.local_size} ranks at {rate}: NCCL type, bytes through the "
            "busiest host link per second / one TCP stream's goodput measured in the same run",
            share,
            ">= 0.8",
            share >= 0.8,
            unit="of the link",
            busiest_link_MB=round(busiest / 1e6, 2),
            link_MBps_tcp=round(link_bps / 1e6, 2),
            MBps_wholemem=round(busiest / t_nccl / 1e6, 2),
            MBps_torch=round(busiest / t_a2a / 1e6, 2),
            share_torch=round(busiest / t_a2a / link_bps, 3),
            ms_wholemem=round(t_nccl * 1e3, 1),
            ms_torch=round(t_a2a * 1e3, 1),
            ms_link_bound=round(busiest / link_bps * 1e3, 1),
            ms_gloo_rows_alone=round(t_gloo_rows * 1e3, 1),
            ms_mpi_rows_alone=round(t_mpi_rows * 1e3, 1),
            load_avg_1min=round(os.getloadavg()[0], 2),
        )
        for what, t in (("gloo all_to_all_single", t_gloo_rows), ("MPI_Alltoallv", t_mpi_rows)):
            emit(
                rank,
                f"gather across {comm.num_nodes} hosts x {comm.local_size} ranks at {rate}: the row exchange alone "
                f"({what} of the same rows, ready), bytes through the busiest host link per second / TCP goodput",
                busiest / t / link_bps,
                "info (the transport's bound)",
                None,
                unit="of the link",
                ms=round(t * 1e3, 1),
            )
    wg.finalize_lib()
    dist.barrier()
    dist.destroy_process_group()


def on_cluster(quick: bool, hosts: int, per_host: int, rate: str | None) -> None:
    """Run ``--across-hosts`` on the simulated cluster (``hosts`` x ``per_host`` ranks, links shaped to
    ``rate``) and print its result; on shaped links measure the link first, in the same cluster."""
    from distkit_common.testing import cluster, measure_mpi_sendrecv, run_cluster

    def info(name: str, value: float, unit: str, **detail: object) -> None:
        row = {"package": "wholemem", "name": name, "ratio": round(value, 3), "goal": "info (the bound)"}
        print("BENCH " + json.dumps(row | {"met": None, "unit": unit, "detail": detail}), flush=True)

    args = ["--across-hosts", *(["--quick"] if quick else [])]
    with cluster.session(hosts, rate):
        if rate is not None:
            tcp = cluster.measure_tcp(1, 2)
            info(f"link at {rate}: one TCP stream dkh1 -> dkh2, payload", 8 * tcp / 1e6, "Mbit/s")
            mpi = measure_mpi_sendrecv((1, 2), 16 << 20, 5)
            info(
                f"link at {rate}: MPI_Sendrecv of 16 MiB between dkh1 and dkh2, each way",
                8 * mpi["bytes_per_s"] / 1e6,
                "Mbit/s",
                median_s=mpi["median_s"],
                best_s=mpi["best_s"],
            )
            args += ["--link-bps", repr(tcp), "--rate", rate]
        res = run_cluster(hosts, per_host, os.path.abspath(__file__), 600, args=args)
    for line in res.stdout.splitlines():
        if line.startswith("BENCH "):
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--across-hosts", action="store_true", help="one rank of a multi-host job (see above)")
    parser.add_argument("--cluster", action="store_true", help="run --across-hosts on the simulated cluster")
    parser.add_argument("--quick", action="store_true", help="a small table, few repetitions")
    parser.add_argument("--hosts", type=int, default=2, help="--cluster: simulated hosts (default 2)")
    parser.add_argument("--ranks-per-host", type=int, default=2, help="--cluster: ranks on each host (default 2)")
    parser.add_argument("--rate", help="--cluster: every host link's rate, tc's syntax (1gbit); default unshaped")
    parser.add_argument("--link-bps", type=float, help=argparse.SUPPRESS)  # set by --cluster for its ranks
    opts = parser.parse_args()
    if opts.hosts < 2 or opts.ranks_per_host < 1:
        parser.error(f"--hosts must be >= 2 and --ranks-per-host >= 1, got {opts.hosts}, {opts.ranks_per_host}")
    if opts.rate is not None:
        from distkit_common.rates import parse_rate

        try:
            parse_rate(opts.rate)
        except ValueError as e:
            parser.error(str(e))
    if opts.cluster:
        on_cluster(opts.quick, opts.hosts, opts.ranks_per_host, opts.rate)
    elif opts.across_hosts:
        across_hosts(opts.quick, opts.link_bps, opts.rate)
    else:
        one_host()


def one_host() -> None:
    from mpi4py import MPI

    mpi = MPI.COMM_WORLD
    rank, size = mpi.Get_rank(), mpi.Get_size()
    wg.init_lib()
    comm = wg.communicator_from_mpi4py(mpi)
    g = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, ROWS, (NIDX,), generator=g)
    out = torch.empty(NIDX, COLS)
    gbytes = NIDX * COLS * 4 / 1e9
    results: dict[str, float] = {}

    private = torch.empty(ROWS, COLS).fill_(1.0 + rank)
    out2 = torch.empty(NIDX, COLS)

    for ty, goal in ((wg.WmTensorType.HOST, 0.9), (wg.WmTensorType.CHUNKED, 0.8)):
        t = wg.create_wm_tensor(comm, [ROWS, COLS], [], torch.float32, ty)
        wg.get_local_tensor(t)[0].fill_(1.0 + rank)
        comm.barrier()
        t_ref, t_wm = bench_pair(
            lambda: torch.index_select(private, 0, idx, out=out2), lambda t=t: wg.gather(t, idx, out=out), mpi
        )
        assert torch.equal(out[:, 0], (torch.div(idx, wg.get_partition_plan(t)[2], rounding_mode="floor") + 1).float())
        results[f"index_select (private) vs {ty.name}"] = gbytes / t_ref
        results[ty.name] = gbytes / t_wm
        ratio = t_ref / t_wm
        emit(
            rank,
            f"gather 200k x 128 f32 from 1M rows, 2 ranks: {ty.name} / index_select(out=) private",
            ratio,
            f">= {goal}",
            ratio >= goal,
            gbps_wholemem=round(gbytes / t_wm, 2),
            gbps_torch=round(gbytes / t_ref, 2),
        )
        del t
    private = torch.empty(0)

    # NCCL (distributed) type vs a plain torch.distributed all_to_all gather
    store = None
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, size, True, wait_for_workers=False)
    port = mpi.bcast(store.port if store is not None else None, root=0)
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, size, False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=300))
    nt = wg.create_wm_tensor(comm, [ROWS, COLS], [], torch.float32, wg.WmTensorType.NCCL)
    local, _ = wg.get_local_tensor(nt)
    local.fill_(1.0 + rank)
    rpr = wg.get_partition_plan(nt)[2]
    t_a2a, t_nccl = bench_pair(lambda: a2a_gather(local, idx, rpr, size), lambda: wg.gather(nt, idx, out=out), mpi)
    check = wg.gather(nt, idx)
    assert torch.equal(check[:, 0], (torch.div(idx, rpr, rounding_mode="floor") + 1).float())
    assert torch.equal(a2a_gather(local, idx, rpr, size), check)
    results["NCCL (DISTRIBUTED)"] = gbytes / t_nccl
    results["torch all_to_all gather"] = gbytes / t_a2a
    ratio = t_a2a / t_nccl
    emit(
        rank,
        "gather 200k x 128 f32 from 1M rows, 2 ranks: NCCL type / torch.distributed all_to_all gather",
        ratio,
        ">= 1",
        ratio >= 1.0,
        gbps_wholemem=round(gbytes / t_nccl, 2),
        gbps_torch=round(gbytes / t_a2a, 2),
    )
    nt = local = None
    dist.destroy_process_group()

    # PSS of two ranks sharing one HOST table
    before = pss_kib()
    h = wg.create_wm_tensor(comm, [PSS_ROWS, COLS], [], torch.float32, wg.WmTensorType.HOST)
    wg.get_local_tensor(h)[0].fill_(1.0)
    comm.barrier()
    assert float(h[:, 0].sum()) == PSS_ROWS  # every rank touches every page
    comm.barrier()
    grown = (pss_kib() - before) * 1024
    total = sum(mpi.allgather(grown))
    table = PSS_ROWS * COLS * 4
    ratio = total / table
    emit(
        rank,
        "PSS of 2 ranks sharing a 1 GiB HOST table / table size (private copies: 2.0)",
        ratio,
        "<= 1.1",
        ratio <= 1.1,
        pss_total_mib=round(total / 2**20),
        table_mib=table // 2**20,
    )

    if rank == 0:
        out_dir = os.environ.get("DISTKIT_BENCH_OUT", ".")
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 3.5))
            names = list(results)
            ax.barh(names, [results[n] for n in names], color=["gray", "C0", "gray", "C1", "C2", "gray"])
            ax.set_xlabel("per-rank gather throughput (GB/s)")
            ax.set_title("200k random rows x 128 f32 from 1M rows, 2 ranks")
            ax.invert_yaxis()
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, "wholemem_gather.png"), dpi=110)
        except ImportError:
            pass
        print("throughput GB/s:", {k: round(v, 2) for k, v in results.items()}, flush=True)
    comm.destroy()
    wg.finalize_lib()


if __name__ == "__main__":
    main()
