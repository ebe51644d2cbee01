"""Pooled embedding tables on kvps, trained by a server-side optimizer: `mpiexec -n 2 python example_recsys.py`."""

import torch
from mpi4py import MPI

import kvps
from kvps.optim import RowWiseAdagrad
from kvps.torch import EmbeddingBagConfig, PSEmbeddingBagCollection, table_lengths

tables = [
    EmbeddingBagConfig("user", 10_000, 16, feature_names=["user", "friend"]),  # two features, one table
    EmbeddingBagConfig("item", 5_000, 16, mode="mean"),
]
lengths = table_lengths(tables)  # one value length per key, tables one after another
kvps.setup(len(lengths), num_threads=1)
server = kvps.Server(lengths, optimizer=RowWiseAdagrad(lr=0.1))  # pushes carry gradients
ebc = PSEmbeddingBagCollection(tables, kvps.Worker(0, server), init_std=0.1)
head = torch.nn.Linear(3 * 16, 1)
opt = torch.optim.SGD(head.parameters(), lr=0.1)  # the dense part stays with torch

g = torch.Generator().manual_seed(MPI.COMM_WORLD.Get_rank())


def batch():
    """Bags of 2 ids per sample (values + offsets), or lengths per sample."""
    ids = {f: torch.randint(0, 100, (64,), generator=g) for f in ("user", "friend", "item")}
    feats = {f: (v, torch.arange(0, 64, 2)) for f, v in ids.items() if f != "friend"}
    feats["friend"] = {"values": ids["friend"], "lengths": torch.full((32,), 2)}
    label = (ids["user"].view(32, 2) < 50).all(1).float()  # both users of the bag among the first 50
    return feats, label


batches = [batch() for _ in range(60)]
losses = []
for feats, label in ebc.prefetch(batches, ahead=2, keys_fn=lambda b: b[0]):  # intent for every table
    pooled = ebc(feats)  # one pull of every distinct key of the batch
    x = torch.cat([pooled["user"], pooled["friend"], pooled["item"]], 1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x).squeeze(1), label)
    opt.zero_grad()
    loss.backward()  # one summed gradient per distinct key, applied where the row lives
    opt.step()
    losses.append(loss.item())
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
print(f"rank {server.my_rank()}: loss {first:.3f} -> {last:.3f}")
server.shutdown()
