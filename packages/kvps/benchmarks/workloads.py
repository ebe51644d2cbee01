"""Rank-side pieces the kvps benchmarks share: the BENCH line, the workloads' batches, the timed loop, the oracle.

``bench_kvps.py`` (one host) and ``bench_kvps_cluster.py`` (across the simulated
hosts) import this module on every MPI rank. A workload is a function of the
rank that returns that rank's de-duplicated, sorted key batches, one per step;
every rank can draw every rank's batches (seeded by the rank), which is what the
oracle placement needs.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from mpi4py import MPI

import kvps

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
DIM = 64

#: the batches of one rank, ``batches_of(r)`` (the same list on every rank that asks)
BatchesOf = Callable[[int], Sequence[np.ndarray]]


def emit(name: str, ratio: float | None, goal: str, met: bool | None, unit: str = "x", **detail: float | None) -> None:
    """Print one ``BENCH {json}`` line on rank 0 (``tools/bench_all.py`` collects them into results/REPORT.md)."""
    if rank == 0:
        rec = {"package": "kvps", "name": name, "ratio": ratio, "goal": goal, "met": met, "unit": unit}
        if detail:
            rec["detail"] = detail
        print("BENCH " + json.dumps(rec), flush=True)


@functools.lru_cache(maxsize=8)
def zipf_batches(r: int, nk: int, count: int, batch: int, per_rank: bool) -> list[np.ndarray]:
    """Rank ``r``'s de-duplicated Zipf(1.1) batches (every rank can draw every rank's; cached:
    every round of a row uses the same batches). Callers must not modify them."""
    rng = np.random.default_rng(100 + r)
    # shared: the same popularity order on every rank; per_rank: each rank has its own hot keys
    perm = np.random.default_rng(7 + (r if per_rank else 0)).permutation(nk)
    return [np.unique(perm[(rng.zipf(1.1, size=batch) - 1) % nk]).astype(np.int64) for _ in range(count)]


@functools.lru_cache(maxsize=8)
def mf_batches(
    r: int, ranks: int, rows: int, cols: int, count: int, row_batch: int, col_batch: int
) -> list[np.ndarray]:
    """Partitioned matrix factorisation: rank ``r``'s rows (``rows`` of its own) and the shared columns.

    Keys ``0 .. cols-1`` are the column factors, used by every rank; then each
    rank's ``rows`` row factors, interleaved over the key space so that kvps's
    hash placement (key ``k`` on rank ``k % ranks``) homes every row of rank
    ``r`` on rank ``(r + 1) % ranks``: without relocation every row access
    crosses the network. Each step takes ``row_batch`` of the rank's rows and
    ``col_batch`` columns, uniformly without repetition.
    """
    rng = np.random.default_rng(300 + r)
    home = (r + 1) % ranks if ranks > 1 else 0
    base = cols + (-cols) % ranks  # the first row key is homed on rank 0
    out = []
    for _ in range(count):
        mine = rng.choice(rows, size=row_batch, replace=False)
        c = rng.choice(cols, size=col_batch, replace=False)
        out.append(np.unique(np.concatenate([c, base + mine * ranks + home])).astype(np.int64))
    return out


def mf_keys(ranks: int, rows: int, cols: int) -> int:
    """The key count of :func:`mf_batches`' workload."""
    return cols + (-cols) % ranks + rows * ranks


@functools.lru_cache(maxsize=8)
def kge_batches(r: int, entities: int, relations: int, count: int, triples: int) -> list[np.ndarray]:
    """Knowledge-graph embeddings: a batch of ``triples`` per step, heads and tails Zipf(1.1) over the entities
    (one popularity order for every rank: the ranks' triples are a random split of one graph), plus every one
    of the ``relations`` relation keys (keys ``entities ..``), which every rank uses every step."""
    rng = np.random.default_rng(500 + r)
    perm = np.random.default_rng(11).permutation(entities)
    rel = np.arange(entities, entities + relations, dtype=np.int64)
    out = []
    for _ in range(count):
        ent = perm[(rng.zipf(1.1, size=2 * triples) - 1) % entities]
        out.append(np.unique(np.concatenate([ent, rel])).astype(np.int64))
    return out


@functools.lru_cache(maxsize=8)
def w2v_batches(r: int, vocab: int, count: int, words: int, negatives: int) -> list[np.ndarray]:
    """word2vec-like: ``words`` Zipf(1.1) words per step (their input vectors, keys ``0 .. vocab-1``; one
    popularity order for every rank, as one corpus split between them) and ``negatives`` uniformly drawn
    negative samples (output vectors, keys ``vocab ..``)."""
    rng = np.random.default_rng(700 + r)
    perm = np.random.default_rng(13).permutation(vocab)
    out = []
    for _ in range(count):
        w = perm[(rng.zipf(1.1, size=words) - 1) % vocab]
        neg = vocab + rng.integers(0, vocab, size=negatives)
        out.append(np.unique(np.concatenate([w, neg])).astype(np.int64))
    return out


def uses_per_stay(batches_of: BatchesOf, nk: int, ahead: int) -> float:
    """Accesses per stay of a key on a rank: a stay ends when the key is not used for `ahead` clocks.

    A server that moves every key in before its use and out when its intent ends
    pays one move per stay; this is how many accesses each move saves.
    """
    accesses = stays = 0
    for r in range(size):
        last = np.full(nk, -(ahead + 1), dtype=np.int64)
        for t, b in enumerate(batches_of(r)):
            stays += int(np.count_nonzero(t - last[b] > ahead))
            accesses += b.size
            last[b] = t
    return accesses / max(1, stays)


def wire_model(batches_of: BatchesOf, nk: int, steps: int, home: np.ndarray | None = None) -> tuple[float, float]:
    """Rows crossing between hosts over ``steps`` steps, one rank per host: the classic server and the
    paid-move oracle.

    The model counts what binds where the link does: an access of a key homed on
    another rank sends its row twice (the pull's answer and the push), a move sends
    it once. Classic: every use away from the key's home (``home``, default the hash
    home k % size) costs 2. The paid-move oracle knows every rank's batches in
    advance and, per key, chooses where the key is before each use (a shortest path
    over the ranks, step by step): a use where the key is costs nothing, a use
    elsewhere 2, a move 1. Unlike :func:`oracle_placement`'s placement (free moves,
    kept for the run), it pays every move, as any relocation must: it bounds what
    intent can reach where the link binds. Returns (classic rows, oracle rows).
    """
    home = np.arange(nk) % size if home is None else home
    cost = np.full((nk, size), np.inf, dtype=np.float64)
    cost[np.arange(nk), home] = 0.0
    classic = 0.0
    per_rank = [batches_of(r) for r in range(size)]
    for t in range(steps):
        for r in range(size):
            b = per_rank[r][t]
            classic += 2.0 * float(np.count_nonzero(home[b] != r))
            sub = cost[b]
            sub = np.minimum(sub, sub.min(axis=1, keepdims=True) + 1.0)  # a move before the use
            sub += 2.0
            sub[:, r] -= 2.0  # (here: no transfer)
            cost[b] = sub
    return classic, float(cost.min(axis=1).sum())


def oracle_placement(batches_of: BatchesOf, nk: int, hosts: list[str]) -> tuple[np.ndarray, int]:
    """New key ids that home every key where the whole run's accesses to it are cheapest.

    kvps homes key k on rank k % size, so relabelling the keys moves them: each
    key goes to the host whose ranks use it most, there to the rank that uses
    it most (ties: the lower rank). It is the placement a relocating server
    would reach with perfect foresight and free moves, kept for the whole run;
    the classic server's time with it bounds what relocation can gain on this
    workload. Returns the new id of every key and the new key count.
    """
    uses = np.zeros((size, nk), dtype=np.int64)
    for r in range(size):
        for b in batches_of(r):
            uses[r, b] += 1
    names = sorted(set(hosts))
    host_of = np.array([names.index(h) for h in hosts])
    by_host = np.stack([uses[host_of == i].sum(0) for i in range(len(names))])
    best_host = by_host.argmax(0)
    # the ranks of other hosts may not win a key: mask them out
    masked = np.where(host_of[:, None] == best_host[None, :], uses, -1)
    # keys no rank uses keep their hash home (argmax would put them all on rank 0 and inflate its shard)
    home = np.where(uses.any(0), masked.argmax(0), np.arange(nk) % size)
    new = np.empty(nk, dtype=np.int64)
    per_home = np.bincount(home, minlength=size)
    for h in range(size):
        ks = np.flatnonzero(home == h)
        new[ks] = h + size * np.arange(ks.size)
    return new, int(size * per_home.max())


def zipf_warm(steps: int, ahead: int = 16) -> int:
    """Steps before the timed part of a run: the steady state of a long run is measured,
    after the first touches of the arenas and after intent's ledger has first judged whether
    intent pays (clock ``kvps._kvps.ledger_first_judgement(ahead)``: 84 at a lookahead of 16)
    and a few more clocks; at least a third of the run, at most half."""
    judged = kvps._kvps.ledger_first_judgement(ahead) + 16
    return min(max(steps // 3, judged), steps // 2)


def wire_bytes() -> int:
    """Bytes this host has sent on its cluster interface (``dk0``, ``/proc/net/dev`` of this
    network namespace); 0 where there is none (one host, a real cluster's other names)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "dk0":
                    return int(rest.split()[8])  # the 9th field is the transmitted bytes
    except OSError:
        pass
    return 0


def run_steps(
    technique: str,
    nk: int,
    batches: Sequence[np.ndarray],
    steps: int,
    ahead: int,
    shm: bool = False,
    relabel: tuple[np.ndarray, int] | None = None,
) -> tuple[float, dict[str, float]]:
    """Time the pull / compute / asynchronous push / ``advance_clock`` loop over ``batches``.

    With a technique other than ``"none"`` each step signals intent for the
    keys of the step ``ahead`` clocks later. ``relabel`` (from
    :func:`oracle_placement`) runs it on the relabelled keys. Returns the
    slowest rank's wall time of the last ``steps - zipf_warm(steps)`` steps and
    ``server.stats()`` plus ``cpu_ms_per_step`` (every thread of every rank),
    ``wire_bytes_per_step`` (bytes every host sent, per step) and the counters
    ``local`` / ``shared`` / ``remote`` of the timed steps only (``*_timed``).
    """
    if len(batches) < steps + ahead:
        raise ValueError(f"need {steps + ahead} batches, got {len(batches)}")
    kvps.setup(nk if relabel is None else relabel[1], 1, technique)
    # both variants commit their arenas up front: the measured steps are the
    # steady state of a long run, not first-touch page faults
    server = kvps.Server(DIM, intent_lookahead=ahead, prefault=True, shared_memory=shm)
    w = kvps.Worker(0, server)
    ks = [torch.from_numpy(b if relabel is None else relabel[0][b]) for b in batches[: steps + ahead]]
    use_intent = technique != "none"
    if use_intent:
        for i in range(ahead):
            w.intent(ks[i], i)
    server.barrier()
    t0 = c0 = 0.0
    n0 = 0
    s0: dict[str, int] = {}
    warm = zipf_warm(steps, ahead)
    for i in range(steps):
        if i == warm:
            # kvps's barrier sleeps while it waits; mpi4py's Barrier spins in Open MPI's
            # progress loop (epoll and sched_yield: most of the waiting ranks' CPU in a perf
            # profile), which took the CPU from the ranks still working
            server.barrier()
            t0 = time.perf_counter()
            c0 = time.process_time()
            n0 = wire_bytes()
            s0 = server.stats()
        if use_intent:
            w.intent(ks[i + ahead], w.current_clock() + ahead)
        k = ks[i]
        v = torch.empty(k.numel() * DIM)
        w.pull(k, v)
        g = v.mul_(-1e-3).add_(1e-4)
        w.push(k, g, True)
        w.advance_clock()
    w.waitall()
    server.barrier()
    dt = time.perf_counter() - t0
    # CPU time of every thread of every rank per step: what the variants cost the machine,
    # steadier than wall time where the ranks share the cores
    cpu = comm.allreduce(time.process_time() - c0)
    sent = comm.allreduce(wire_bytes() - n0)
    st: dict[str, float] = dict(server.stats())
    for name in ("local", "shared", "remote", "forwarded", "given_back", "announced"):
        st[f"{name}_timed"] = comm.allreduce(st.get(name, 0) - s0.get(name, 0))
    st["cpu_ms_per_step"] = 1000 * cpu / (steps - warm)
    st["wire_bytes_per_step"] = sent / (steps - warm)
    server.shutdown()
    return comm.allreduce(dt, op=MPI.MAX), st
