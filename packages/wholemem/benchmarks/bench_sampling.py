"""Neighbour sampling throughput: wholemem's native sampler against a vectorised pure-torch one.

One process, a 1M-node graph in a HOST wholemem tensor (degrees 1..29, about 15M
edges), mini-batches of 1024 seeds sampled 2 hops deep with fan-outs [10, 5], as PyG's
NeighborLoader would (uniform without replacement, the new nodes of each hop relabelled
in order of first appearance). Both samplers do the same work on the same batches,
interleaved; the ratio of sampled edges per second is the goal (>= 5x).

The sampler's speed is also put against the machine's memory, measured in the same
run: the bytes it must read are the 64-byte cache lines holding each center's row
pointers and its sampled column entries, compared with the streaming bandwidth (a large
``copy_``) and with the rate of random 8-byte reads from a 1 GiB array (the limit that
applies to reading scattered neighbour lists: memory and TLB latency, not bandwidth).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch

import wholemem as wg
from wholemem import _graph_sample

NODES, MAX_DEGREE, BATCH, FANOUTS, BATCHES, REPS = 1_000_000, 30, 1024, (10, 5), 20, 5
LINE = 64


def emit(name: str, ratio: float, goal: str, met: bool | None, unit: str = "x", **detail: Any) -> None:
    row = {"package": "wholemem", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": met, "unit": unit}
    row["detail"] = detail
    print("BENCH " + json.dumps(row), flush=True)


def make_graph(comm: wg.WholeMemoryCommunicator) -> wg.GraphStructure:
    gen = torch.Generator().manual_seed(0)
    deg = torch.randint(1, MAX_DEGREE, (NODES,), generator=gen)
    row_ptr = wg.create_wm_tensor(comm, [NODES + 1], [], torch.int64, wg.WmTensorType.HOST)
    row_ptr[1:] = torch.cumsum(deg, 0)
    edges = int(row_ptr[-1])
    col = wg.create_wm_tensor(comm, [edges], [], torch.int64, wg.WmTensorType.HOST)
    col.copy_(torch.randint(0, NODES, (edges,), generator=gen))
    g = wg.GraphStructure()
    g.set_csr_graph(row_ptr, col)
    return g


# -- the baseline: the same sampling with vectorised torch ops ----------------------------


def torch_hop(
    row_ptr: torch.Tensor, col: torch.Tensor, centers: torch.Tensor, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Up to k distinct uniform neighbours per center: a random key per candidate edge,
    sorted within each center's list, the first k kept. Returns (dest, center index, edge id)."""
    start = row_ptr[centers]
    deg = row_ptr[centers + 1] - start
    total = int(deg.sum())
    seg = torch.repeat_interleave(torch.arange(centers.numel()), deg, output_size=total)
    seg_start = torch.cumsum(deg, 0) - deg
    keys = seg.to(torch.float64) + torch.rand(total, generator=gen, dtype=torch.float64)
    order = torch.argsort(keys)  # by center, random within a center
    rank = torch.arange(total) - seg_start[seg]  # position after sorting (segments stay in place)
    keep = rank < k
    picked = order[keep]
    eid = start[seg[picked]] + (picked - seg_start[seg[picked]])
    return col[eid], seg[picked], eid


def torch_sample(row_ptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor, gen: torch.Generator) -> int:
    nodes, frontier_start, edges = seeds, 0, 0
    for k in FANOUTS:
        frontier = nodes[frontier_start:]
        dest, _, _ = torch_hop(row_ptr, col, frontier, k, gen)
        before = nodes.numel()
        nodes, _ = _graph_sample.append_unique_torch(nodes, dest)
        frontier_start = before
        edges += dest.numel()
    return edges


def wholemem_sample(g: wg.GraphStructure, seeds: torch.Tensor, seed: int) -> int:
    from wholemem.pyg import sample_subgraph

    return int(sample_subgraph(g, seeds, FANOUTS, seed).e_id.numel())


def touched_bytes(g: wg.GraphStructure, seeds: torch.Tensor, seed: int) -> tuple[int, int]:
    """(bytes of the cache lines the sampler must read, sampled edges) for one batch."""
    from wholemem.pyg import sample_subgraph

    sub = sample_subgraph(g, seeds, FANOUTS, seed)
    lines = 0
    # row pointers: entries c and c + 1 of every center of every hop
    hop_centers = [sub.n_id[: sub.num_sampled_nodes[0]]]
    hop_centers.append(sub.n_id[sub.num_sampled_nodes[0] : sub.num_sampled_nodes[0] + sub.num_sampled_nodes[1]])
    for c in hop_centers:
        lines += int(torch.cat([(c * 8) // LINE, ((c + 1) * 8) // LINE]).unique().numel())
    # sampled columns: distinct lines of the edge ids, per center (each center's list is read once)
    centers = sub.n_id[sub.edge_index[1]]
    line_of = (sub.e_id * 8) // LINE
    lines += int(torch.stack([centers, line_of]).unique(dim=1).shape[1])
    return lines * LINE, int(sub.e_id.numel())


def copy_bandwidth() -> float:
    """Bytes per second of a large memory copy (read + write), the machine's streaming limit."""
    src = torch.ones(1 << 27, dtype=torch.float64)  # 1 GiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 8 / statistics.median(times)


def random_line_rate() -> float:
    """Cache lines per second that random 8-byte reads from a 1 GiB array deliver: the
    latency-bound limit for reading neighbour lists scattered over memory."""
    src = torch.ones(1 << 27, dtype=torch.int64)
    idx = torch.randint(0, src.numel(), (1 << 21,), generator=torch.Generator().manual_seed(7))
    out = torch.empty(idx.numel(), dtype=torch.int64)
    torch.index_select(src, 0, idx, out=out)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.index_select(src, 0, idx, out=out)
        times.append(time.perf_counter() - t0)
    return idx.numel() / statistics.median(times)


def main() -> None:
    wg.init_lib()
    comm = wg.create_communicator(1, wg.get_unique_id(), 0)
    t0 = time.perf_counter()
    g = make_graph(comm)
    print(f"graph: {g.node_count} nodes, {g.edge_count} edges ({time.perf_counter() - t0:.1f} s)", flush=True)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, NODES, (BATCH,), generator=gen) for _ in range(BATCHES)]
    row_ptr, col = g.csr_row_ptr, g.csr_col_ind
    wholemem_sample(g, batches[0], 0)
    torch_sample(row_ptr, col, batches[0], torch.Generator().manual_seed(0))
    rounds: dict[str, list[float]] = {"wholemem": [], "torch": []}
    edges: dict[str, int] = {}
    for r in range(REPS):  # interleaved rounds: the machine's load drifts
        t = time.perf_counter()
        edges["wholemem"] = sum(wholemem_sample(g, b, 1000 * r + i) for i, b in enumerate(batches))
        rounds["wholemem"].append(time.perf_counter() - t)
        tg = torch.Generator().manual_seed(r)
        t = time.perf_counter()
        edges["torch"] = sum(torch_sample(row_ptr, col, b, tg) for b in batches)
        rounds["torch"].append(time.perf_counter() - t)
    rate = {k: edges[k] / statistics.median(v) for k, v in rounds.items()}
    ratio = rate["wholemem"] / rate["torch"]
    emit(
        "2-hop [10, 5] sampling, 1M nodes, batch 1024: wholemem / vectorised torch (sampled edges/s)",
        ratio,
        ">= 5",
        ratio >= 5,
        wholemem_edges_per_s=round(rate["wholemem"]),
        torch_edges_per_s=round(rate["torch"]),
        edges_per_batch=edges["wholemem"] // BATCHES,
        threads=wg._wholemem.get_num_threads(),
    )
    bw, lines_limit = copy_bandwidth(), random_line_rate()
    need = [touched_bytes(g, b, i) for i, b in enumerate(batches)]
    bytes_per_edge = sum(b for b, _ in need) / sum(e for _, e in need)
    sampler_bytes = rate["wholemem"] * bytes_per_edge
    emit(
        "2-hop sampling: bytes of the cache lines it reads per second / memory copy bandwidth",
        sampler_bytes / bw,
        "",
        None,
        unit="of bandwidth",
        copy_gb_per_s=round(bw / 1e9, 2),
        bytes_per_sampled_edge=round(bytes_per_edge, 1),
        sampler_gb_per_s=round(sampler_bytes / 1e9, 3),
    )
    emit(
        "2-hop sampling: cache lines it reads per second / random 8-byte reads per second (1 GiB array)",
        sampler_bytes / LINE / lines_limit,
        "",
        None,
        unit="of the random-read limit",
        random_reads_per_s=round(lines_limit),
        sampler_lines_per_s=round(sampler_bytes / LINE),
    )
    comm.destroy()
    wg.finalize_lib()


if __name__ == "__main__":
    main()
