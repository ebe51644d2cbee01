"""kvps.torch.PSEmbedding on N ranks: closed-form Adagrad updates, prefetching intent, bad ids."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from mpi4py import MPI

import kvps
from kvps.torch import PSEmbedding

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N, D, LR = 40, 4, 0.5
kvps.setup(N + 3, 1, "all")
lengths = np.full(N + 3, 2 * D, dtype=np.int64)
lengths[:3] = 1  # keys 0..2 are something else; the table starts at key 3
server = kvps.Server(lengths)
w = kvps.Worker(0, server)
emb = PSEmbedding(N, D, w, key_offset=3, lr=LR, init_std=0.1, seed=5)

# initial rows: N(0, 0.1^2) from the seed, identical on every rank count
ref = torch.randn(N, D, generator=torch.Generator().manual_seed(5 * 1_000_003)) * 0.1
rows, acc = emb.pull_rows(torch.arange(N))
assert torch.equal(rows, ref) and torch.equal(acc, torch.zeros(N, D))

# forward = the pulled rows; backward: one Adagrad step per rank, in rank order
ids = torch.tensor([[1, 2, 2], [7, 1, 2]])
counts = {1: 2.0, 2: 3.0, 7: 1.0}
out = emb(ids)
assert out.shape == (2, 3, D) and torch.equal(out, ref[ids])
server.barrier()  # every rank read the initial rows before the first update
for r in range(size):
    if r == rank:
        emb(ids).sum().backward()
        emb.flush()
    server.barrier()
rows, acc = emb.pull_rows(torch.tensor([1, 2, 7, 0]))
for i, k in enumerate([1, 2, 7]):
    c = counts[k]
    # step j (1-based) from accumulator (j-1)c^2: delta = -lr * c / sqrt(j c^2) = -lr / sqrt(j)
    want = ref[k] - LR * sum(1.0 / math.sqrt(j) for j in range(1, size + 1))
    assert torch.allclose(rows[i], want, atol=1e-5), (k, rows[i], want)
    assert torch.allclose(acc[i], torch.full((D,), size * c * c)), acc[i]
assert torch.equal(rows[3], ref[0]) and torch.equal(acc[3], torch.zeros(D))

# prefetch: intent ahead of use makes each batch local by the time it is used
mine = [torch.tensor([10 + rank + size * j for j in range(3)]) for _ in range(4)]
seen = 0
for b in emb.prefetch(mine, ahead=1):
    w.wait_sync()
    buf = torch.zeros(b.numel() * 2 * D)
    assert w.pull(b + 3, buf) == -1, "prefetched batch not local"
    seen += 1
assert seen == 4

# bad ids
for bad, exc in ((torch.tensor([N]), IndexError), (torch.tensor([-1]), IndexError), (torch.tensor([1.0]), TypeError)):
    with pytest.raises(exc):
        emb(bad)
with pytest.raises(ValueError, match=r"2 \* embedding_dim"):
    PSEmbedding(10, D + 1, w, key_offset=3)
server.barrier()
server.shutdown()
if rank == 0:
    print(f"torch ok on {size} ranks")
