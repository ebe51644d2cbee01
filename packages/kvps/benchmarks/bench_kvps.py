# nprocs: 2
"""kvps on 2 ranks: local throughput vs a private tensor, remote keys/s, Zipf with vs without intent, MF.

Measurements (rank 0 prints one BENCH line each):
  * pull / push of 100k local keys x 64 float32 from a 1M-key server, against
    ``index_select`` / ``index_add_`` on a private (500k x 64) tensor (goal >= 0.5x);
  * pull / push of the other rank's keys, in keys/s: in place in its shard
    (shared memory, the default on one node) and through messages
    (``shared_memory=False``, what ranks on different nodes do);
  * a Zipf(1.1)-skewed pull/compute/push loop over 200k keys x 64, with intent
    signalled 16 batches ahead ("all" techniques, the engine's cost model
    deciding which keys move) vs the same loop without intent ("none", the
    classic parameter server); ratio = time without / time with (goal: never
    below 1x on one host); once with the same hot keys on both ranks, once with
    a different popularity order per rank (data locality, the case intent is
    made for); 9 alternating rounds, the median of the per-round ratios.
    Both variants exchange messages only (shared memory off, as ranks on
    different hosts do); a second row compares kvps on one node (intent +
    shared memory) with the classic server;
  * a small matrix factorisation with kvps.torch.PSEmbedding and the prefetching
    iterator: ratings/s and the loss of the last vs the first epoch (must fall).
"""

from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np
import torch
from mpi4py import MPI
from workloads import (
    DIM,
    comm,
    emit,
    oracle_placement,
    rank,
    run_steps,
    size,
    uses_per_stay,
    zipf_batches,
    zipf_warm,
)

import kvps
from kvps.torch import PSEmbedding


def best(fn, repeat: int = 5) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def local_and_remote() -> None:
    nk, batch = 1_000_000, 100_000
    kvps.setup(nk, 1, "none")
    server = kvps.Server(DIM)
    w = kvps.Worker(0, server)
    rng = np.random.default_rng(rank)
    # keys homed here (k % size == rank) are local; the private tensor holds the same rows
    local_rows = rng.integers(0, nk // size, size=batch)
    keys = torch.from_numpy(local_rows * size + rank)
    vals = torch.ones(batch * DIM)
    w.set(torch.arange(rank, nk, size, dtype=torch.int64), torch.zeros((nk // size) * DIM))
    table = torch.zeros(nk // size, DIM)
    idx = torch.from_numpy(local_rows)
    out = torch.empty(batch, DIM)

    t_pull = best(lambda: w.pull(keys, vals))
    t_sel = best(lambda: torch.index_select(table, 0, idx, out=out))
    r = t_sel / t_pull
    emit("local pull 100k x 64 f32: index_select / kvps time", r, ">= 0.5", r >= 0.5, kvps_Mkeys_s=batch / t_pull / 1e6)
    t_push = best(lambda: w.push(keys, vals))
    t_add = best(lambda: table.index_add_(0, idx, out))
    r = t_add / t_push
    emit("local push 100k x 64 f32: index_add_ / kvps time", r, ">= 0.5", r >= 0.5, kvps_Mkeys_s=batch / t_push / 1e6)

    other = (rank + 1) % size
    rkeys = torch.from_numpy(rng.integers(0, nk // size, size=batch) * size + other)
    t_rpull = best(lambda: w.pull(rkeys, vals), repeat=3)
    t_rpush = best(lambda: w.push(rkeys, vals), repeat=3)
    assert server.shares_memory
    emit("co-located peer's keys (shared memory): pull 100k x 64 f32 (keys/s)", batch / t_rpull, "info", None, "keys/s")
    emit("co-located peer's keys (shared memory): push 100k x 64 f32 (keys/s)", batch / t_rpush, "info", None, "keys/s")
    server.barrier()
    server.shutdown()

    # the same keys through messages, as between ranks on different nodes
    kvps.setup(nk, 1, "none")
    server = kvps.Server(DIM, shared_memory=False)
    w = kvps.Worker(0, server)
    t_rpull = best(lambda: w.wait(w.pull(rkeys, vals)), repeat=3)
    t_rpush = best(lambda: w.wait(w.push(rkeys, vals)), repeat=3)
    emit("remote keys (messages): pull 100k x 64 f32 (keys/s)", batch / t_rpull, "info", None, unit="keys/s")
    emit("remote keys (messages): push 100k x 64 f32 (keys/s)", batch / t_rpush, "info", None, unit="keys/s")
    server.barrier()
    server.shutdown()


#: rounds of the one-host Zipf rows (each: classic, intent, intent + shared memory, ~1 s apiece)
ZIPF_ROUNDS = 9


def zipf_run(
    technique: str,
    nk: int,
    steps: int,
    batch: int,
    ahead: int,
    per_rank: bool,
    shm: bool = False,
    relabel: tuple[np.ndarray, int] | None = None,
) -> tuple[float, dict[str, float]]:
    """The Zipf loop of rank ``rank`` (:func:`workloads.run_steps` over :func:`workloads.zipf_batches`)."""
    batches = zipf_batches(rank, nk, steps + ahead, batch, per_rank)
    return run_steps(technique, nk, batches, steps, ahead, shm, relabel)


def matrix_factorisation() -> None:
    users, items, d, nnz = 4000, 2000, 16, 200_000
    g = torch.Generator().manual_seed(0)
    pu, qi = torch.randn(users, 4, generator=g), torch.randn(items, 4, generator=g)
    u = torch.randint(0, users, (nnz,), generator=g)
    it = torch.randint(0, items, (nnz,), generator=g)
    r = (pu[u] * qi[it]).sum(1) * 0.5
    mine = u % size == rank  # users partitioned by rank; items shared
    u, it, r = u[mine], it[mine], r[mine]
    kvps.setup(users + items, 1, "all")
    server = kvps.Server(2 * d)
    w = kvps.Worker(0, server)
    U = PSEmbedding(users, d, w, key_offset=0, lr=0.1, init_std=0.1, seed=1)
    V = PSEmbedding(items, d, w, key_offset=users, lr=0.1, init_std=0.1, seed=2)
    bs = 2000
    losses = []
    t0 = time.perf_counter()
    n = 0
    for _epoch in range(3):
        order = torch.randperm(u.numel(), generator=g)
        batches = [order[i : i + bs] for i in range(0, order.numel(), bs)]
        tot, cnt = 0.0, 0
        for b in U.prefetch(batches, ahead=2, keys_fn=lambda b: u[b]):
            pred = (U(u[b]) * V(it[b])).sum(1)
            loss = ((pred - r[b]) ** 2).mean()
            loss.backward()
            V.flush()
            tot += float(loss.detach()) * b.numel()
            cnt += b.numel()
            n += b.numel()
        losses.append(comm.allreduce(tot) / comm.allreduce(cnt))
    dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    total = comm.allreduce(n)
    emit(
        "matrix factorisation 4000x2000 d=16, 2 ranks: loss last / first epoch",
        losses[-1] / losses[0],
        "< 1 (falling)",
        losses[-1] < losses[0],
        ratings_per_s=total / dt,
        loss_first=losses[0],
        loss_last=losses[-1],
    )
    server.shutdown()


def zipf_across_hosts(rounds: int) -> None:
    """Ranks on 2 hosts x 2 (``bench_kvps_cluster.py`` launches this): Zipf with vs without intent.

    Both variants run as kvps runs by default: co-located ranks share their
    shards in memory, ranks on the other host are reached by messages over TCP.
    Without intent every key homed on the other host costs a round trip per
    pull and a message per push; with intent the keys worth moving are here
    before the step needs them.
    """
    hosts = comm.allgather(socket.gethostname())
    assert size == 4 and hosts[0] == hosts[1] != hosts[2] == hosts[3], f"needs 2 hosts x 2 ranks, got {hosts}"
    nk = int(os.environ.get("KVPS_BENCH_ZIPF_KEYS", "200000"))
    steps, batch, ahead = 600, 4096, 16
    measured = steps - zipf_warm(steps)
    for per_rank, what in ((False, "hot keys shared by all ranks"), (True, "each rank its own hot keys")):

        def batches_of(r: int, per_rank: bool = per_rank) -> list[np.ndarray]:
            return zipf_batches(r, nk, steps, batch, per_rank)

        oracle = oracle_placement(batches_of, nk, hosts)
        # alternate the variants and keep the medians (a noisy shared machine)
        t_none, t_all, t_orc, c_none, c_all = [], [], [], [], []
        st: dict[str, float] = {}
        for _ in range(rounds):
            t, st_none = zipf_run("none", nk, steps, batch, ahead, per_rank, shm=True)
            t_none.append(t)
            c_none.append(st_none["cpu_ms_per_step"])
            t, st = zipf_run("all", nk, steps, batch, ahead, per_rank, shm=True)
            t_all.append(t)
            c_all.append(st["cpu_ms_per_step"])
            t, st_orc = zipf_run("none", nk, steps, batch, ahead, per_rank, shm=True, relabel=oracle)
            t_orc.append(t)
        tn, ta, to = float(np.median(t_none)), float(np.median(t_all)), float(np.median(t_orc))
        moved = st["intent_moved"] / max(1, st["intent_moved"] + st["intent_classic"])
        r = float(np.median([a / b for a, b in zip(t_none, t_all)]))  # (per round: measured seconds apart)
        emit(
            f"Zipf(1.1) {nk // 1000}k keys x 64, batch 4096, {what}, 2 hosts x 2 ranks (TCP between hosts,"
            " shared memory within): time without / with intent",
            r,
            ">= 2",
            r >= 2,
            steps_per_s_intent=measured / ta,
            steps_per_s_classic=measured / tn,
            cpu_ms_per_step_intent=float(np.median(c_all)),
            cpu_ms_per_step_classic=float(np.median(c_none)),
            share_of_intents_moved=moved,
            intent_all_keys_at_end=st["intent_all_keys"],
            ledger_switches=st["intent_switches"],
            ratio_min=float(min(a / b for a, b in zip(t_none, t_all))),
            ratio_max=float(max(a / b for a, b in zip(t_none, t_all))),
        )
        # What no placement of the keys can beat here: the classic server with every key
        # already on the host (and rank) that uses it most over the whole run, moved for free.
        # (Moving keys back and forth instead costs a move per 1.6 uses at this lookahead, and
        # a replica refreshed every step ships as many rows as the accesses it serves: each
        # key is used at most once per step. README, Benchmarks.)
        msgs = {
            k: v["remote"] / max(1, v["local"] + v["shared"] + v["remote"])
            for k, v in (("hash", st_none), ("oracle", st_orc))
        }
        ro = float(np.median([a / b for a, b in zip(t_none, t_orc)]))
        emit(
            f"Zipf(1.1) {nk // 1000}k keys x 64, batch 4096, {what}, 2 hosts x 2 ranks: classic server time with"
            " keys homed by hash / with every key homed where it is used most (perfect foresight, free moves):"
            " the most any placement of the keys gains on this workload",
            ro,
            "info (bounds the >= 2 row)",
            None,
            steps_per_s_oracle=measured / to,
            uses_per_stay=uses_per_stay(batches_of, nk, ahead) if rank == 0 else 0.0,
            share_of_accesses_by_message_hash=msgs["hash"],
            share_of_accesses_by_message_oracle=msgs["oracle"],
        )


def main() -> None:
    if "--zipf-across-hosts" in sys.argv:
        zipf_across_hosts(int(os.environ.get("KVPS_BENCH_ROUNDS", "5")))
        return
    local_and_remote()
    nk = int(os.environ.get("KVPS_BENCH_ZIPF_KEYS", "200000"))
    # intent is signalled 16 batches ahead (AdaPM's own apps signal it ~1000
    # data points ahead) and the server acts on it 16 clocks ahead; 1800 steps: on a
    # fast machine the last 1200 take about a second (400 took 0.35 s, and single
    # rounds spread 0.8-1.2x)
    steps, batch, ahead = 1800, 4096, 16
    measured = steps - zipf_warm(steps)
    for per_rank, what in ((False, "hot keys shared by both ranks"), (True, "each rank its own hot keys")):
        # alternate the variants and keep the median of the per-round ratios (a noisy shared
        # machine whose speed drifts: single pairs of runs spread 0.86-1.11x with the same build)
        t_none, t_all, t_shm, c_none, c_all = [], [], [], [], []
        st: dict[str, float] = {}
        for _ in range(ZIPF_ROUNDS):
            t, st = zipf_run("none", nk, steps, batch, ahead, per_rank)
            t_none.append(t)
            c_none.append(st["cpu_ms_per_step"])
            t, st = zipf_run("all", nk, steps, batch, ahead, per_rank)
            t_all.append(t)
            c_all.append(st["cpu_ms_per_step"])
            t_shm.append(zipf_run("all", nk, steps, batch, ahead, per_rank, shm=True)[0])
        tn, ta, ts = (float(np.median(x)) for x in (t_none, t_all, t_shm))
        moved = st["intent_moved"] / max(1, st["intent_moved"] + st["intent_classic"])
        # intent's own effect: both variants exchange messages only (as ranks on different hosts)
        ratios = [a / b for a, b in zip(t_none, t_all)]
        r = float(np.median(ratios))
        emit(
            f"Zipf(1.1) {nk // 1000}k keys x 64, batch 4096, {what}, messages only, one host: time without / with"
            " intent",
            r,
            ">= 1",
            r >= 1,
            steps_per_s_intent=measured / ta,
            steps_per_s_classic=measured / tn,
            cpu_ms_per_step_intent=float(np.median(c_all)),
            cpu_ms_per_step_classic=float(np.median(c_none)),
            share_of_intents_moved=moved,
            intent_all_keys_at_end=st["intent_all_keys"],
            ledger_switches=st["intent_switches"],
            ratio_q1=float(np.percentile(ratios, 25)),
            ratio_q3=float(np.percentile(ratios, 75)),
        )
        # what a user on one node gets: kvps (intent + shared memory) vs a classic parameter server
        r = tn / ts
        emit(
            f"Zipf(1.1) {nk // 1000}k keys x 64, batch 4096, {what}, one node: classic PS / kvps (intent + shared"
            " memory) time",
            r,
            "info",
            None,
            steps_per_s_kvps=measured / ts,
            steps_per_s_classic=measured / tn,
        )
    matrix_factorisation()


if __name__ == "__main__":
    main()
