# nprocs: 2
"""GraphSAGE with wholemem + PyG on 2 ranks: the package's GNN example, and its benchmark.

    mpiexec -n 2 python bench_gnn.py                 # 200k nodes: train, evaluate, benchmark
    mpiexec -n 2 python bench_gnn.py --nodes 20000 --epochs 3 --no-bench --check   # the CI test

The graph is a stochastic block model: every node belongs to one of ``--classes``
blocks, has ``--intra`` random neighbours in its block and ``--inter`` outside it (both
directions), and carries features drawn around its block's mean with so much noise
that the features alone predict the block poorly. Neighbourhoods fix that, which is
what the GNN learns.

- graph (CSR), features and labels live in HOST wholemem tensors: one shared copy on
  the node, built collectively (each rank generates and contributes its part);
- a trainable node embedding lives in a wholemem ``Embedding`` (HOST) with a sparse
  LazyAdam step; the GraphSAGE weights are data parallel (``DistributedDataParallel``);
- ``wholemem.pyg.NeighborLoader`` samples [10, 5] neighbourhoods natively on a worker
  thread while the model trains.

It reports test accuracy against a features-only MLP trained on the same nodes
(``--check`` asserts a margin). The benchmark then times one epoch with the features
in the shared tensor against the same epoch with the features (and graph) in private
tensors, the two alternating batch by batch, and measures what the data costs in memory
(PSS, summed over both ranks) in both set-ups.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wholemem as wg
from distkit_common.testing import destroy_process_group
from wholemem.pyg import NeighborLoader

# isort: split
from torch_geometric.nn import SAGEConv  # after wholemem.pyg, which keeps PyG's import quiet

T = wg.WmTensorType
BLOCK = 4096  # rows generated per seed: the data is the same for any number of ranks


# -- data ------------------------------------------------------------------------------


def block_rows(first: int, count: int, seed: int, fn: Any) -> torch.Tensor:
    """Rows [first, first + count) of a table generated in blocks of BLOCK rows, block b by
    ``fn(generator seeded with (seed, b), rows)``."""
    parts = []
    for b in range(first // BLOCK, (first + count + BLOCK - 1) // BLOCK):
        g = torch.Generator().manual_seed(seed * 1_000_003 + b)
        rows = fn(g, BLOCK)
        lo, hi = max(first, b * BLOCK), min(first + count, (b + 1) * BLOCK)
        parts.append(rows[lo - b * BLOCK : hi - b * BLOCK])
    return torch.cat(parts) if parts else fn(torch.Generator(), 0)


def labels_of(nodes: torch.Tensor, classes: int) -> torch.Tensor:
    """The block of every node (a fixed pseudo-random assignment)."""
    return (nodes * 2654435761 % (1 << 32)) % classes


def make_data(comm: wg.WholeMemoryCommunicator, args: argparse.Namespace) -> tuple[wg.GraphStructure, Any, Any]:
    """Collective: the graph, features and labels in HOST wholemem tensors."""
    n, c = args.nodes, args.classes
    first, count, _, _ = wg.get_partition_plan(comm, n)
    mine = torch.arange(first, first + count)
    y_mine = labels_of(mine, c)
    # edges of this rank's nodes: `intra` partners in the node's block, `inter` outside it
    g = torch.Generator().manual_seed(args.seed * 7919 + comm.rank)
    members = torch.argsort(labels_of(torch.arange(n), c), stable=True)
    sizes = torch.bincount(labels_of(torch.arange(n), c), minlength=c)
    starts = torch.cumsum(sizes, 0) - sizes
    pick = torch.randint(0, 1 << 62, (count, args.intra), generator=g)
    intra = members[starts[y_mine][:, None] + pick % sizes[y_mine][:, None]]
    inter = torch.randint(0, n, (count, args.inter), generator=g)
    src = torch.cat([mine.repeat_interleave(args.intra), mine.repeat_interleave(args.inter)])
    dst = torch.cat([intra.flatten(), inter.flatten()])
    graph = wg.GraphStructure.from_edge_list(
        comm, src, dst, n, add_reverse_edges=True, remove_self_loops=True, remove_duplicates=True, tensor_type=T.HOST
    )
    # features: the block's mean plus noise; labels
    means = torch.randn(c, args.features, generator=torch.Generator().manual_seed(args.seed)) * args.signal
    x = wg.create_wm_tensor(comm, [n, args.features], [], torch.float32, T.HOST)
    y = wg.create_wm_tensor(comm, [n], [], torch.int64, T.HOST)
    noise = block_rows(first, count, args.seed + 1, lambda gen, k: torch.randn(k, args.features, generator=gen))
    x_local, _ = wg.get_local_tensor(x)
    x_local.copy_(means[y_mine] + noise)
    wg.get_local_tensor(y)[0].copy_(y_mine)
    comm.barrier()
    return graph, x, y


def split(n: int, rank: int, size: int) -> dict[str, torch.Tensor]:
    """Train (20 %) and test (20 %) nodes; each rank gets an equal share of both."""
    nodes = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    parts = {"train": nodes[: n // 5], "test": nodes[n // 5 : 2 * n // 5]}
    out = {}
    for k, v in parts.items():
        per = v.numel() // size
        out[k] = v[rank * per : (rank + 1) * per]  # equal shares: every rank runs the same number of steps
    return out


# -- models -----------------------------------------------------------------------------


class SAGE(nn.Module):
    """Two GraphSAGE layers over [features, node embedding]."""

    def __init__(self, in_dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_dim, hidden)
        self.conv2 = SAGEConv(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x, edge_index))
        h = F.dropout(h, 0.2, self.training)
        out: torch.Tensor = self.conv2(h, edge_index)
        return out


def mlp_accuracy(x: Any, y: Any, parts: dict[str, torch.Tensor], args: argparse.Namespace) -> float:
    """A features-only MLP on the same training nodes (all of them, on every rank)."""
    torch.manual_seed(args.seed)
    tr = torch.cat(MPI.COMM_WORLD.allgather(parts["train"]))
    te = torch.cat(MPI.COMM_WORLD.allgather(parts["test"]))
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    xt, yt = x[tr], y[tr]
    for _ in range(200):
        opt.zero_grad()
        F.cross_entropy(model(xt), yt).backward()
        opt.step()
    with torch.no_grad():
        return float((model(x[te]).argmax(1) == y[te]).float().mean())


def train_step(model: nn.Module, emb: wg.Embedding, opt: torch.optim.Optimizer, b: Any) -> float:
    out = model(torch.cat([b.x, b.emb], 1), b.edge_index)[: b.batch_size]
    loss = F.cross_entropy(out, b.y[: b.batch_size])
    opt.zero_grad()
    emb.zero_grad()
    loss.backward()
    opt.step()
    emb.step()  # collective: sparse LazyAdam on the embedding rows this batch touched
    return float(loss.detach())


def run_epoch(model: nn.Module, emb: wg.Embedding, opt: torch.optim.Optimizer, loader: NeighborLoader) -> float:
    model.train()
    losses = [train_step(model, emb, opt, b) for b in loader]
    return sum(losses) / max(len(losses), 1)


@torch.no_grad()
def gnn_accuracy(model: nn.Module, loader: NeighborLoader) -> float:
    model.eval()
    correct = torch.zeros(2, dtype=torch.int64)
    for b in loader:
        out = model(torch.cat([b.x, b.emb], 1), b.edge_index)[: b.batch_size]
        correct += torch.tensor([int((out.argmax(1) == b.y[: b.batch_size]).sum()), b.batch_size])
    dist.all_reduce(correct)
    return float(correct[0]) / float(correct[1])


# -- benchmark --------------------------------------------------------------------------


def memory_kib() -> tuple[int, int]:
    """(PSS, RSS) of this process in KiB: PSS splits shared pages between their users.
    Freed heap memory is handed back to the system first, so only live data counts."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    vals = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("Pss", "Rss"):
                vals[key] = int(line.split()[1])
    return vals["Pss"], vals["Rss"]


def emit(rank: int, name: str, ratio: float, goal: str, met: bool | None, unit: str = "x", **detail: Any) -> None:
    if rank == 0:
        row = {"package": "wholemem", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": met, "unit": unit}
        row["detail"] = detail
        print("BENCH " + json.dumps(row), flush=True)


def private_copy(graph: wg.GraphStructure, x: Any, y: Any) -> tuple[wg.GraphStructure, torch.Tensor, torch.Tensor]:
    """What every rank would hold without wholemem: its own graph, features and labels."""
    g = wg.GraphStructure()
    g.set_csr_graph(graph.csr_row_ptr.clone(), graph.csr_col_ind.clone(), validate=False)
    return g, x.clone(), y.clone()


def benchmark(
    args: argparse.Namespace,
    graph: wg.GraphStructure,
    x: Any,
    y: Any,
    emb: wg.Embedding,
    parts: dict[str, torch.Tensor],
    mem_before: tuple[int, int],
    mem_shared: tuple[int, int],
) -> None:
    mpi = MPI.COMM_WORLD
    rank = mpi.Get_rank()
    mem_pre_private = memory_kib()
    pgraph, px, py = private_copy(graph, x, y)
    mem_private = memory_kib()
    pss = [sum(mpi.allgather(m[0])) for m in (mem_before, mem_shared, mem_pre_private, mem_private)]
    rss = [sum(mpi.allgather(m[1])) for m in (mem_before, mem_shared, mem_pre_private, mem_private)]
    shared_cost, private_cost = pss[1] - pss[0], pss[3] - pss[2]
    data_mib = sum(t.numel() * t.element_size() for t in (x, y, graph.csr_col_ind, graph.csr_row_ptr)) / 2**20
    ratio = shared_cost / private_cost
    emit(
        rank,
        "GNN data memory, HOST wholemem / 2 private copies (PSS of both ranks)",
        ratio,
        "<= 0.55",
        ratio <= 0.55,
        shared_mib=round(shared_cost / 1024, 1),
        private_mib=round(private_cost / 1024, 1),
        rss_shared_mib=round((rss[1] - rss[0]) / 1024, 1),
        rss_private_mib=round((rss[3] - rss[2]) / 1024, 1),
        data_mib=round(data_mib, 1),
    )
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(SAGE(args.features + args.emb_dim, args.hidden, args.classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loaders = {
        "shared": NeighborLoader(
            graph, {"x": x, "y": y, "emb": emb}, [10, 5], 1024, parts["train"], shuffle=True, random_seed=3
        ),
        "private": NeighborLoader(
            pgraph, {"x": px, "y": py, "emb": emb}, [10, 5], 1024, parts["train"], shuffle=True, random_seed=3
        ),
    }
    # The two set-ups alternate batch by batch (same seeds, so the same samples): the load
    # of a shared machine drifts within an epoch, and both sides then see the same drift.
    times: dict[str, list[float]] = {"shared": [], "private": []}
    for _ in range(args.bench_reps):
        spent = dict.fromkeys(loaders, 0.0)
        for loader in loaders.values():
            loader.set_epoch(0)
        iters = {name: iter(loader) for name, loader in loaders.items()}
        first = {name: next(it) for name, it in iters.items()}  # both workers up and running
        for i in range(len(loaders["shared"])):
            order = ["shared", "private"] if i % 2 == 0 else ["private", "shared"]
            for name in order:
                mpi.Barrier()
                t0 = time.perf_counter()
                train_step(model, emb, opt, first.pop(name) if name in first else next(iters[name]))
                spent[name] += max(mpi.allgather(time.perf_counter() - t0))
        for name in loaders:
            times[name].append(spent[name])
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["shared"] / med["private"]
    emit(
        rank,
        "GNN epoch time, features in HOST wholemem / in a private tensor",
        ratio,
        "<= 1.1",
        ratio <= 1.1,
        shared_s=round(med["shared"], 3),
        private_s=round(med["private"], 3),
        reps=args.bench_reps,
        batches=len(loaders["shared"]),
    )


# -- main -------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--signal", type=float, default=0.13, help="scale of the block means (the noise is 1)")
    p.add_argument("--intra", type=int, default=6)
    p.add_argument("--inter", type=int, default=3)
    p.add_argument("--emb-dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bench-reps", type=int, default=2)
    p.add_argument("--no-bench", action="store_true", help="train and evaluate only")
    p.add_argument("--check", type=float, nargs="?", const=0.15, default=None, help="assert GNN >= MLP + margin")
    args = p.parse_args()

    mpi = MPI.COMM_WORLD
    rank, size = mpi.Get_rank(), mpi.Get_size()
    tmp = mpi.bcast(tempfile.mkdtemp(prefix="wholemem-gnn-") if rank == 0 else None)
    store = os.path.join(tmp, "store")  # torch.distributed's rendezvous file
    dist.init_process_group("gloo", store=dist.FileStore(store, size), rank=rank, world_size=size)
    wg.init_lib()
    comm = wg.communicator_from_process_group()
    t0 = time.perf_counter()

    # one-time costs (thread pools, allocator arenas, collective buffers) before measuring the data
    make_data(comm, argparse.Namespace(**{**vars(args), "nodes": 1000}))
    mem_before = memory_kib()
    graph, x, y = make_data(comm, args)
    mem_shared = memory_kib()
    parts = split(args.nodes, rank, size)
    emb = wg.Embedding(comm, args.nodes, args.emb_dim, optimizer=wg.LazyAdam(lr=0.01), tensor_type=T.HOST, seed=1)
    t_data = time.perf_counter() - t0

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = DistributedDataParallel(SAGE(args.features + args.emb_dim, args.hidden, args.classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    feats = {"x": x, "y": y, "emb": emb}
    train = NeighborLoader(graph, feats, [10, 5], 1024, parts["train"], shuffle=True, random_seed=args.seed)
    test = NeighborLoader(graph, feats, [10, 5], 1024, parts["test"], random_seed=args.seed + 1)
    losses = []
    t1 = time.perf_counter()
    for _ in range(args.epochs):
        losses.append(run_epoch(model, emb, opt, train))
    t_train = time.perf_counter() - t1
    acc = gnn_accuracy(model, test)
    mlp = mlp_accuracy(x, y, parts, args)
    result = {
        "nodes": args.nodes,
        "edges": graph.edge_count,
        "gnn_test_accuracy": round(acc, 4),
        "mlp_test_accuracy": round(mlp, 4),
        "losses": [round(v, 4) for v in losses],
        "data_s": round(t_data, 2),
        "train_s": round(t_train, 2),
    }
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    if args.check is not None and acc < mlp + args.check:
        raise SystemExit(f"GNN accuracy {acc:.3f} is not {args.check} above the MLP's {mlp:.3f}")
    if not args.no_bench:
        emit(
            rank,
            "GNN test accuracy - features-only MLP accuracy",
            acc - mlp,
            ">= 0.15",
            acc - mlp >= 0.15,
            unit="",
            gnn=round(acc, 4),
            mlp=round(mlp, 4),
            nodes=args.nodes,
        )
        benchmark(args, graph, x, y, emb, parts, mem_before, mem_shared)
    del model, opt  # DDP holds the process group: destroy_process_group frees it first
    comm.destroy()
    wg.finalize_lib()
    destroy_process_group()
    mpi.Barrier()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"bench_gnn OK {size}", flush=True)


if __name__ == "__main__":
    main()
