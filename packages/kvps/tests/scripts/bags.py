"""PSEmbeddingBagCollection on N ranks (run under mpiexec).

Checks:
  * every rank's forward equals torch.nn.EmbeddingBag over the same weights,
    and after the ranks' backward passes (one rank at a time) every table
    equals nn.EmbeddingBag + torch.optim.Adagrad stepping the same gradients in
    the same order (bit for bit with a correctly rounded sqrt on torch's side);
  * the prefetching iterator signals intent for every table: after wait_sync
    each batch's keys are served here (pull returns -1);
  * keys every rank intends are replicated; pushing gradients of
    0.5 * |p - target|^2 through the replicas (refreshed every clock, at most
    4 clocks stale) converges to the target on every rank, and after two sync rounds all ranks hold the same rows;
"""

from __future__ import annotations

import faulthandler
import os

import numpy as np
import torch
from mpi4py import MPI

import kvps
from kvps import optim
from kvps.torch import EmbeddingBagConfig, PSEmbeddingBagCollection, table_lengths

faulthandler.dump_traceback_later(150)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SHM = os.environ.get("KVPS_SHARED_MEMORY", "1") != "0"
FUSED = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")

TABLES = [
    EmbeddingBagConfig("user", 40, 8, ["user", "friend"], mode="sum"),
    EmbeddingBagConfig("item", 30, 8, mode="mean", padding_idx=0),
    EmbeddingBagConfig("tag", 20, 8, mode="max"),
]


def rounded_sqrt_step(o: torch.optim.Optimizer) -> None:
    orig = torch.Tensor.sqrt
    torch.Tensor.sqrt = lambda t: torch.from_numpy(np.sqrt(t.detach().numpy()))  # type: ignore[method-assign]
    try:
        o.step()
    finally:
        torch.Tensor.sqrt = orig  # type: ignore[method-assign]


def batch(r: int, i: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 * r + i)
    out = {}
    for t in TABLES:
        for f in t.feature_names:
            n = int(torch.randint(4, 12, (1,), generator=g))
            vals = torch.randint(0, t.num_embeddings, (n,), generator=g)
            offs = torch.sort(torch.randint(0, n, (3,), generator=g)).values
            offs[0] = 0
            out[f] = (vals, offs)
    return out


def dense_forward(dense: dict[str, torch.nn.EmbeddingBag], feats: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    return {f: dense[t.name](*feats[f]) for t in TABLES for f in t.feature_names}


lengths = table_lengths(TABLES)
kvps.setup(len(lengths), 1, "all")
server = kvps.Server(lengths, optimizer=optim.Adagrad(lr=0.1))
w = kvps.Worker(0, server)
col = PSEmbeddingBagCollection(TABLES, w, seed=4)
base = np.concatenate([[0], np.cumsum([t.num_embeddings for t in TABLES])])


def pull_table(i: int) -> torch.Tensor:
    t = TABLES[i]
    buf = torch.empty(t.num_embeddings * t.embedding_dim)
    w.pull(torch.arange(t.num_embeddings) + int(base[i]), buf)
    return buf.view(t.num_embeddings, -1)


dense = {}
for i, t in enumerate(TABLES):
    dense[t.name] = torch.nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode=t.mode, padding_idx=t.padding_idx)
    with torch.no_grad():
        dense[t.name].weight.copy_(pull_table(i))
ref_opt = torch.optim.Adagrad([d.weight for d in dense.values()], lr=0.1)
server.barrier()

# ------------------------------------------------------------ exactness, rank by rank
for step in range(2):
    for r in range(size):
        feats = batch(r, step)
        ref = dense_forward(dense, feats)
        (sum((v * (j + 1)).sum() for j, v in enumerate(ref.values()))).backward()
        rounded_sqrt_step(ref_opt)
        ref_opt.zero_grad()
        if r == rank:
            out = col(feats)
            for f in out:
                assert torch.equal(out[f], ref[f]), (rank, f)
            (sum((v * (j + 1)).sum() for j, v in enumerate(out.values()))).backward()
            col.flush()
        server.barrier()
for i, t in enumerate(TABLES):
    got = pull_table(i)
    want = dense[t.name].weight.detach()
    if FUSED:
        assert torch.equal(got, want), (rank, t.name, (got - want).abs().max())
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
server.barrier()

# ------------------------------------------------------------ intent for every table
batches = [batch(rank, 10 + i) for i in range(5)]
seen = 0
for feats in col.prefetch(batches, ahead=1):
    w.wait_sync()
    keys = col.keys(feats)
    assert w.pull(keys, torch.empty(keys.numel() * 8)) == -1, "a prefetched batch's keys are not served here"
    out = col(feats)
    sum(v.sum() for v in out.values()).backward()
    seen += 1
assert seen == len(batches)
col.flush()
for _ in range(3):
    w.advance_clock()
w.wait_sync()
server.barrier()
server.shutdown()

# ------------------------------------------------------------ replicated keys converge
# (every rule: a replica steps at once, the owner again with the round's summed gradients;
# adaptive rules then follow a data-parallel trajectory, slower than torch.optim's, but converge)
RULES = ((optim.SGD(lr=0.2), 120, 1e-4), (optim.RowWiseAdagrad(lr=0.5), 300, 1e-2), (optim.Adam(lr=0.05), 400, 4e-2))
for rule, steps, tol in RULES:
    kvps.setup(50, 1, "all")
    server = kvps.Server(8, optimizer=rule)
    w = kvps.Worker(0, server)
    hot = torch.arange(10, 20)
    target = torch.arange(80, dtype=torch.float32).view(10, 8) / 10
    if rank == 0:
        w.set(hot, torch.zeros(80))
    server.barrier()
    c = w.current_clock()
    w.intent(hot, c, c + steps + 80)
    w.wait_sync()
    server.barrier()
    if size > 1 and not SHM:
        nrep = comm.allreduce(server._engine.num_replicas())
        assert nrep == hot.numel() * (size - 1), f"{nrep} replicas: keys every rank intends are not replicated"
    buf = torch.empty(80)
    err0 = float(target.abs().max())
    for i in range(steps):
        assert w.pull(hot, buf) == -1  # a replica (or the owner) answers here
        w.push(hot, (buf.view(10, 8) - target).reshape(-1).contiguous() / size)
        w.advance_clock()
        if i % 4 == 3:
            w.wait_sync()  # staleness bounded by a few clocks
    for _ in range(2):
        w.wait_sync()
        server.barrier()
    w.pull(hot, buf)
    err = float((buf.view(10, 8) - target).abs().max())
    assert err < tol * err0, f"rank {rank}, {rule}: replicated rows did not converge: max error {err} (from {err0})"
    rows = comm.allgather(buf.clone())
    assert all(torch.equal(x, rows[0]) for x in rows), f"{rule}: ranks disagree after two sync rounds"
    server.barrier()
    server.shutdown()

if rank == 0:
    print(f"bags ok on {size} ranks (shared memory {SHM})", flush=True)
