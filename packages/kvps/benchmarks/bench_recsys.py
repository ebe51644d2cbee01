# nprocs: 2
"""kvps for recommender models on 2 ranks: a DLRM-style model, and optimizers applied where the rows live.

Measurements (rank 0 prints one BENCH line each):
  * a DLRM-style model: 8 sparse features, one table of 1M rows x 16 each,
    pooled bags of 4 ids (Zipf-distributed), a dense MLP; kvps
    (PSEmbeddingBagCollection + server-side Adagrad, MLP gradients
    all-reduced) vs the data-parallel baseline (the same model with
    torch.nn.EmbeddingBag tables on every rank, every gradient all-reduced,
    torch.optim.Adagrad): training throughput (goal >= 1x), memory of both
    ranks together (proportional set size; goal <= 0.6x), and the loss of
    the last vs the first steps (must fall);
  * server-side row-wise Adagrad (PSEmbeddingBag, one id per bag: a plain
    lookup) vs client-side Adagrad (PSEmbedding: pull rows and accumulators,
    compute the step, push deltas) on a 1M x 64 table, batches of 8192
    Zipf-distributed ids: steps/s (goal >= 1.5x).
"""

from __future__ import annotations

import gc
import json
import os
import time

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

import kvps
from kvps import optim
from kvps.torch import EmbeddingBagConfig, PSEmbedding, PSEmbeddingBag, PSEmbeddingBagCollection, table_lengths

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
torch.set_num_threads(1)  # two ranks share the machine's cores

ROWS = int(os.environ.get("KVPS_BENCH_DLRM_ROWS", "1000000"))
TABLES, DIM, BAG, BATCH, DENSE = 8, 16, 4, 2048, 13
LR = 0.05


def emit(name: str, ratio: float, goal: str, met: bool | None, unit: str = "x", **detail: float) -> None:
    if rank == 0:
        rec = {"package": "kvps", "name": name, "ratio": ratio, "goal": goal, "met": met, "unit": unit}
        if detail:
            rec["detail"] = detail
        print("BENCH " + json.dumps(rec), flush=True)


def pss_bytes() -> int:
    """This process's proportional set size (shared pages split among their users)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def zipf_ids(rng: np.random.Generator, n: int, rows: int) -> torch.Tensor:
    return torch.from_numpy(((rng.zipf(1.05, size=n) - 1) % rows).astype(np.int64))


def make_data(steps: int) -> list[tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]]:
    """Per step: dense features, per-table ids (BATCH bags of BAG), labels from a hidden model."""
    rng = np.random.default_rng(10 + rank)
    hidden = [
        torch.from_numpy(np.random.default_rng(99 + t).standard_normal(ROWS).astype(np.float32)) for t in range(TABLES)
    ]
    wd = torch.from_numpy(np.random.default_rng(98).standard_normal(DENSE).astype(np.float32))
    out = []
    for _ in range(steps):
        dense = torch.from_numpy(rng.standard_normal((BATCH, DENSE)).astype(np.float32))
        ids = [zipf_ids(rng, BATCH * BAG, ROWS) for _ in range(TABLES)]
        score = dense @ wd * 0.3 + sum(h[i].view(BATCH, BAG).mean(1) for h, i in zip(hidden, ids))
        out.append((dense, ids, (score > 0).float()))
    return out


class Dense(nn.Module):
    """The dense part: bottom MLP on dense features, top MLP on [bottom, pooled embeddings]."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(DIM * (TABLES + 1), 64), nn.ReLU(), nn.Linear(64, 1))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        return self.top(torch.cat([self.bottom(dense), *pooled], 1)).squeeze(1)


def allreduce_grads(params: list[torch.Tensor]) -> None:
    for p in params:
        if p.grad is not None:
            comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
            p.grad /= size


def run_baseline(data: list, steps: int) -> tuple[float, int, list[float]]:
    base = comm.allreduce(pss_bytes())
    peak = base
    dense = Dense()
    tables = nn.ModuleList(nn.EmbeddingBag(ROWS, DIM, mode="sum") for _ in range(TABLES))
    with torch.no_grad():
        for t, e in enumerate(tables):
            e.weight.copy_(torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(t)) * 0.05)
    params = [*dense.parameters(), *tables.parameters()]
    opt = torch.optim.Adagrad(params, lr=LR)
    losses = []
    t0 = 0.0
    for i in range(steps + 1):
        if i == 1:
            comm.Barrier()
            t0 = time.perf_counter()
        x, ids, y = data[i]
        pooled = [e(ids[t].view(BATCH, BAG)) for t, e in enumerate(tables)]
        loss = nn.functional.binary_cross_entropy_with_logits(dense(x, pooled), y)
        opt.zero_grad()
        loss.backward()
        allreduce_grads(params)
        opt.step()
        losses.append(float(loss.detach()))
        peak = max(peak, comm.allreduce(pss_bytes()))
    dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return dt / steps, peak - base, losses


def run_kvps(data: list, steps: int, warm: int) -> tuple[float, int, list[float]]:
    base = comm.allreduce(pss_bytes())
    peak = base
    tables = [EmbeddingBagConfig(f"t{t}", ROWS, DIM, mode="sum") for t in range(TABLES)]
    lengths = table_lengths(tables)
    kvps.setup(len(lengths), 1, "all")
    server = kvps.Server(lengths, optimizer=optim.Adagrad(lr=LR))
    w = kvps.Worker(0, server)
    col = PSEmbeddingBagCollection(tables, w, init_std=0.05)
    dense = Dense()
    mlp = list(dense.parameters())
    opt = torch.optim.Adagrad(mlp, lr=LR)
    names = [t.name for t in tables]
    offsets = torch.arange(0, BATCH * BAG, BAG, dtype=torch.int64)

    def feats(b: tuple) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {n: (b[1][t], offsets) for t, n in enumerate(names)}

    losses = []
    t0 = 0.0
    for i, b in enumerate(col.prefetch(data[: steps + warm], ahead=2, keys_fn=feats)):
        if i == warm:
            comm.Barrier()
            t0 = time.perf_counter()
        pooled = col(feats(b))
        loss = nn.functional.binary_cross_entropy_with_logits(dense(b[0], [pooled[n] for n in names]), b[2])
        opt.zero_grad()
        loss.backward()  # the embedding gradients are pushed to the server here
        allreduce_grads(mlp)
        opt.step()
        losses.append(float(loss.detach()))
        if i % 10 == 0:
            peak = max(peak, comm.allreduce(pss_bytes()))
    dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    peak = max(peak, comm.allreduce(pss_bytes()))
    server.shutdown()
    return dt / steps, peak - base, losses


def dlrm() -> None:
    base_steps, kv_steps, warm = 4, 100, 5
    data = make_data(kv_steps + warm)
    t_base, m_base, _ = run_baseline(data, base_steps)
    gc.collect()
    t_kv, m_kv, losses = run_kvps(data, kv_steps, warm)
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    r = t_base / t_kv
    emit(
        f"DLRM-style, {TABLES} tables x {ROWS // 1000}k rows x {DIM}, bags of {BAG}, batch {BATCH}/rank: "
        "throughput kvps / data-parallel nn.EmbeddingBag",
        r,
        ">= 1",
        r >= 1,
        samples_per_s_kvps=size * BATCH / t_kv,
        samples_per_s_baseline=size * BATCH / t_base,
    )
    r = m_kv / m_base
    emit(
        "DLRM-style, same: memory of both ranks (PSS) kvps / data-parallel",
        r,
        "<= 0.6",
        r <= 0.6,
        kvps_mib=m_kv / 2**20,
        baseline_mib=m_base / 2**20,
    )
    emit(
        "DLRM-style, kvps: training loss, last 10 / first 10 steps",
        last / first,
        "< 1 (falling)",
        last < first,
        loss_first=first,
        loss_last=last,
    )


def optimizer_push(shm: bool) -> None:
    rows, dim, batch, steps = 1_000_000, 64, 8192, 40
    rng = np.random.default_rng(rank)
    batches = [zipf_ids(rng, batch, rows) for _ in range(steps + 5)]

    def timed(step: callable, flush: callable) -> float:
        for b in batches[:5]:
            step(b)
        flush()
        comm.Barrier()
        t0 = time.perf_counter()
        for b in batches[5:]:
            step(b)
        flush()
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    def client() -> float:
        kvps.setup(rows, 1, "none")
        s = kvps.Server(2 * dim, shared_memory=shm)
        emb = PSEmbedding(rows, dim, kvps.Worker(0, s), lr=0.1)

        def step(ids: torch.Tensor) -> None:
            emb(ids).pow(2).sum().backward()

        t = timed(step, emb.flush)
        s.shutdown()
        return t

    def server_side() -> float:
        kvps.setup(rows, 1, "none")
        s = kvps.Server(dim, optimizer=optim.RowWiseAdagrad(lr=0.1), shared_memory=shm)
        bag = PSEmbeddingBag(rows, dim, kvps.Worker(0, s), "sum", init_std=0.1)

        def step(ids: torch.Tensor) -> None:
            bag(ids.view(-1, 1)).pow(2).sum().backward()

        t = timed(step, bag.flush)
        s.shutdown()
        return t

    t_client, t_server = [], []
    for _ in range(7):  # alternate; the median of the per-round ratios (a shared machine whose speed drifts)
        t_client.append(client())
        t_server.append(server_side())
    tc, ts = float(np.median(t_client)), float(np.median(t_server))
    ratios = [c / v for c, v in zip(t_client, t_server)]
    r = float(np.median(ratios))
    where = "one host (shared memory)" if shm else "messages (as across hosts)"
    emit(
        f"embedding {rows // 1000}k x {dim}, batch {batch} Zipf ids/rank, {where}: server-side row-wise Adagrad "
        "(PSEmbeddingBag) / client-side Adagrad (PSEmbedding) throughput",
        r,
        ">= 1.5",
        r >= 1.5,
        steps_per_s_server_side=steps / ts,
        steps_per_s_client_side=steps / tc,
        ratio_q1=float(np.percentile(ratios, 25)),
        ratio_q3=float(np.percentile(ratios, 75)),
    )


if __name__ == "__main__":
    optimizer_push(shm=False)
    optimizer_push(shm=True)
    dlrm()
