# nprocs: 2
"""A Llama-style decoder stack (RMSNorm, rotary attention, SwiGLU MLP; issue #18: hidden 1024,
4 layers, seq 512) forward + backward at TP=2: ``shardlayers.parallelize_module`` with the
string plan vs ``torch.distributed.tensor.parallel.parallelize_module`` with the equivalent
``ColwiseParallel`` / ``RowwiseParallel`` plan, on the same model code and the same weights.

Both sides are timed in the same run, alternating (ours, DTensor, floor, ours, ...), and the
ratio of the medians is reported, for wall time (the goal) and for each process's CPU time (less
sensitive to other jobs on a shared machine). The floor is one rank's arithmetic alone: the same
model with every planned linear replaced by one of its shard's size and no communication at all.
Peak memory is the allocator-tracked peak of live CPU tensor bytes during one step
(``torch.profiler`` memory events: every allocation and free of the c10 CPU allocator, DTensor's
internal tensors and autograd's saved tensors included), the median of three paired steps per
rank, the larger rank reported. Override the shape with
SHARDLAYERS_BENCH_{HIDDEN,LAYERS,SEQ,BATCH,REPS}.

Tensor x data parallel (issue #33): ``--dp N`` splits the ranks into N data-parallel replicas of
TP = world / N (shardlayers' groups: consecutive ranks; DTensor: a ``(dp, tp)`` mesh, the same
groups); after backward both sides average their local gradients over the data-parallel group with
the same flat ``all_reduce``, so the ratio compares the tensor parallelism in the same layout.
``--interleave-hosts`` deals the torch ranks round-robin over the hosts, so each tensor-parallel
group spans the hosts and each data-parallel group stays on one. ``--cluster --rate 1gbit`` runs
both layouts on the simulated cluster (2 hosts x 2 ranks, root, ci/cluster/README.md): TP=2 across
hosts x DP=2, and TP=2 within each host x DP=2 across. It first measures the link in the same
cluster (one TCP stream and ``MPI_Sendrecv`` of 16 MiB each way); each row then also gives the
step's bytes through one host's link (the all-reduces of the groups that span hosts, a ring of
2(n-1)/n of each buffer per rank) over that TCP goodput, the time no implementation can beat::

    python packages/shardlayers/benchmarks/bench_llama_block.py --cluster --rate 1gbit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import bench_line, finish, init, interleave, peak_tracked_bytes

import shardlayers as ts


def _env(name: str, default: int) -> int:
    return int(os.environ.get(f"SHARDLAYERS_BENCH_{name}", default))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: the local number of heads under tensor parallelism (as torchtitan's Llama)
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(hidden, eps=1e-5)
        self.self_attn = Attention(hidden, heads)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=1e-5)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Stack(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, layers: int, seq: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden, eps=1e-5)
        head_dim = hidden // heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.norm(x)


#: the same plan in both vocabularies: shardlayers' style names and DTensor's style objects
PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


def local_shards(model: Stack, size: int) -> Stack:
    """``model`` with every planned linear replaced by one of its shard's size, unconnected: one
    rank's arithmetic of the tensor-parallel step without any communication."""
    for name, style in PLAN.items():
        for layer in model.layers:
            parent = layer.get_submodule(name.split(".", 2)[2].rpartition(".")[0])
            child = name.rpartition(".")[2]
            old = getattr(parent, child)
            if style == "colwise":
                new = nn.Linear(old.in_features, old.out_features // size, bias=False)
            else:
                new = nn.Linear(old.in_features // size, old.out_features, bias=False)
            setattr(parent, child, new)
    return model


def dtensor_plan() -> dict[str, object]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {k: ColwiseParallel() if v == "colwise" else RowwiseParallel() for k, v in PLAN.items()}


def sync_grads(m: nn.Module, group: object, n: int) -> None:
    """Average the local gradients of ``m`` over the data-parallel ``group`` of ``n`` ranks: one
    ``all_reduce`` of all of them, flattened (a DTensor's gradient: its local shard)."""
    with torch.no_grad():
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in m.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads if g is not None])
        torch.distributed.all_reduce(flat, group=group)
        flat /= n
        offset = 0
        for g in grads:
            if g is not None:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()


def crossing(group_ranks: list[int], hosts: list[str]) -> bool:
    """Whether the torch ranks ``group_ranks`` sit on more than one host."""
    return len({hosts[r] for r in group_ranks}) > 1


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dp", type=int, default=1, help="data-parallel replicas (default 1: TP over every rank)")
    ap.add_argument("--interleave-hosts", action="store_true", help="tensor-parallel groups span the hosts")
    ap.add_argument("--link-bps", type=float, help="bytes/s of one TCP stream between two hosts (the bound)")
    ap.add_argument("--rate", help="the link's rate as asked (tc's syntax), for the row's name")
    opts = ap.parse_args(argv)
    rank, size = init(interleave_hosts=opts.interleave_hosts)
    if opts.dp < 1 or size % opts.dp:
        raise ValueError(f"--dp must divide the world size {size}, got {opts.dp}")
    dp, tp = opts.dp, size // opts.dp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module as dtensor_parallelize

    hidden, layers, seq = _env("HIDDEN", 1024), _env("LAYERS", 4), _env("SEQ", 512)
    batch, reps = _env("BATCH", 1), _env("REPS", 9)
    heads = hidden // 64
    ffn = -(-(hidden * 8 // 3) // 128) * 128  # Llama's ~8/3 x hidden, rounded up to 128
    ts.distributed.init_process_group(tp)
    # shardlayers' documented layout: consecutive ranks per tensor-parallel group, strided data-parallel ones
    tp_ranks = list(range(rank // tp * tp, rank // tp * tp + tp))
    dp_ranks = list(range(rank % tp, size, tp))
    if dp > 1:
        mesh2 = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        mesh, their_dp = mesh2["tp"], mesh2["dp"].get_group()
        assert torch.distributed.get_process_group_ranks(mesh.get_group()) == tp_ranks
        our_dp = ts.distributed.get_data_parallel_group()
    else:
        mesh, their_dp, our_dp = init_device_mesh("cpu", (size,)), None, None

    torch.manual_seed(0)
    ours = ts.parallelize_module(Stack(hidden, heads, ffn, layers, seq), PLAN)
    torch.manual_seed(0)
    theirs = dtensor_parallelize(Stack(hidden, heads, ffn, layers, seq), mesh, dtensor_plan())
    # each data-parallel replica its own batch; the ranks of one tensor-parallel group the same
    dp_rank = ts.distributed.get_data_parallel_rank() if dp > 1 else 0
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1 + dp_rank))

    def step(m: nn.Module, group: object = None) -> None:
        xi = x.detach().requires_grad_(True)
        m(xi).square().mean().backward()
        if group is not None:
            sync_grads(m, group, dp)
        m.zero_grad(set_to_none=True)

    with torch.no_grad():  # same weights, same outputs
        a, b = ours(x), theirs(x)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (a - b).abs().max()
    for m, g in ((ours, our_dp), (theirs, their_dp)) * 2:  # warm-up (DTensor's sharding-propagation caches too)
        step(m, g)
    # the floor: the same local shards with no communication at all (one rank's share of the work)
    local = local_shards(Stack(hidden, heads, ffn, layers, seq), tp)
    step(local)
    fns = [lambda: step(ours, our_dp), lambda: step(theirs, their_dp), lambda: step(local)]
    if dp > 1:
        # the data-parallel all-reduce alone: both sides run it after backward, unhidden, on the same
        # bytes (a rank's local gradients; the local shards' are the same size)
        held = local_shards(Stack(hidden, heads, ffn, layers, seq), tp)
        held(x).square().mean().backward()
        fns.append(lambda: sync_grads(held, our_dp, dp))
    t_ours, t_theirs, t_local, *t_sync = interleave(fns, reps)
    peaks: tuple[list[int], list[int]] = ([], [])
    # paired too: the tracked total drifts by a few MiB between profiling sessions (the data-parallel
    # layouts time the step only)
    for _ in range(3 if dp == 1 else 0):
        peaks[0].append(peak_tracked_bytes(lambda: step(ours)))
        peaks[1].append(peak_tracked_bytes(lambda: step(theirs)))
    mems = torch.tensor([statistics.median(p) if p else 0.0 for p in peaks], dtype=torch.float64)
    torch.distributed.all_reduce(mems, op=torch.distributed.ReduceOp.MAX)
    mo, mt = t_ours.wall, t_theirs.wall
    # CPU seconds of each process per step: insensitive to other jobs' load (the larger rank's);
    # against the no-communication floor: what each side adds to the arithmetic itself
    cpu = torch.tensor(
        [t_ours.cpu / t_theirs.cpu, t_ours.cpu / t_local.cpu, t_theirs.cpu / t_local.cpu], dtype=torch.float64
    )
    torch.distributed.all_reduce(cpu, op=torch.distributed.ReduceOp.MAX)
    cpu_ratio = float(cpu[0])
    # the bound where a link binds: the bytes every step sends through one host's link (its ranks'
    # all-reduces in the groups that span hosts; a ring sends 2(n-1)/n of the buffer per rank)
    hosts: list[object] = [None] * size
    torch.distributed.all_gather_object(hosts, os.uname().nodename)
    host_ranks = [r for r in range(size) if hosts[r] == hosts[rank]]
    act = batch * seq * hidden * 4  # one all-reduce of the block's activations (or their gradient)
    grad_bytes = 4 * sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in theirs.parameters()
    )  # this rank's local parameters: what the data-parallel all-reduce moves
    tp_bytes = 4 * layers * act * 2 * (tp - 1) / tp if crossing(tp_ranks, hosts) else 0.0
    dp_bytes = grad_bytes * 2 * (dp - 1) / dp if dp > 1 and crossing(dp_ranks, hosts) else 0.0
    link_bytes = len(host_ranks) * (tp_bytes + dp_bytes)
    if rank == 0:
        tag = f"hidden {hidden}, {layers} layers, seq {seq}, batch {batch}, ffn {ffn}, TP={size}"
        if dp > 1:
            n_hosts = len(set(hosts))
            where = "across hosts" if crossing(tp_ranks, hosts) else "within hosts"
            tag = (
                f"hidden {hidden}, {layers} layers, seq {seq}, batch {batch}, ffn {ffn}, TP={tp} {where} x DP={dp}, "
                f"{n_hosts} hosts x {len(host_ranks)} ranks, {opts.rate or 'unshaped'}"
            )
        print(
            f"# shardlayers {mo * 1e3:.0f} ms (runs {[round(t * 1e3) for t in t_ours.walls]}), DTensor {mt * 1e3:.0f} ms "
            f"(runs {[round(t * 1e3) for t in t_theirs.walls]}); CPU time ratio {cpu_ratio:.3f}; CPU time vs no communication: shardlayers {float(cpu[1]):.3f}, DTensor {float(cpu[2]):.3f}; peak tracked {mems[0] / 2**20:.1f} MiB vs {mems[1] / 2**20:.1f} MiB"
        )
        print(
            bench_line(
                f"Llama-style block stack fwd+bwd time ({tag}): shardlayers plan / DTensor parallelize_module",
                mo / mt,
                "<= 0.9",
                0.9,
                ms=round(mo * 1e3, 1),
                ms_anchor=round(mt * 1e3, 1),
                reps=reps,
                cpu_time_ratio=round(cpu_ratio, 3),
                cpu_time_vs_no_comm=round(float(cpu[1]), 3),
                cpu_time_vs_no_comm_anchor=round(float(cpu[2]), 3),
                ms_no_comm=round(t_local.wall * 1e3, 1),
                **(
                    {
                        "link_MB_per_step": round(link_bytes / 1e6, 2),
                        "ms_link_bound": round(link_bytes / opts.link_bps * 1e3, 1),
                        "link_MBps_tcp": round(opts.link_bps / 1e6, 2),
                        "load_avg_1min": round(os.getloadavg()[0], 2),
                    }
                    if opts.link_bps
                    else {}
                ),
            )
        )
        if opts.link_bps:
            # no implementation's step is shorter than its arithmetic or its bytes through the link
            floor = max(t_local.wall, link_bytes / opts.link_bps)
            print(
                bench_line(
                    f"Llama-style block stack ({tag}): the bound, max(no-communication step, step's bytes through "
                    "one host link / TCP goodput measured in the same run) / DTensor step",
                    floor / mt,
                    "info (the best reachable ratio)",
                    None,
                    ms_bound=round(floor * 1e3, 1),
                    ms_anchor=round(mt * 1e3, 1),
                )
            )
        if t_sync:
            # with the data-parallel all-reduce after backward, as both sides run it here: free tensor
            # parallelism would still take the arithmetic plus that all-reduce
            serial = t_local.wall + t_sync[0].wall
            print(
                bench_line(
                    f"Llama-style block stack ({tag}): the bound with the data-parallel all-reduce unhidden, "
                    "(no-communication step + the all-reduce alone) / DTensor step",
                    serial / mt,
                    "info (the best reachable ratio in this layout)",
                    None,
                    ms_bound=round(serial * 1e3, 1),
                    ms_dp_allreduce=round(t_sync[0].wall * 1e3, 1),
                    ms_anchor=round(mt * 1e3, 1),
                )
            )
    if rank == 0 and dp == 1:
        print(
            bench_line(
                f"Llama-style block stack fwd+bwd peak tracked CPU allocation per rank ({tag}): shardlayers / DTensor",
                float(mems[0] / mems[1]),
                "<= 1.0",
                1.0,
                mib=round(float(mems[0]) / 2**20, 1),
                mib_anchor=round(float(mems[1]) / 2**20, 1),
            )
        )
    finish()


def on_cluster(rate: str | None) -> None:
    """Both layouts on the simulated cluster (2 hosts x 2 ranks, links shaped to ``rate``): the link
    first, measured in the same cluster, then each layout's BENCH lines."""
    from distkit_common.testing import cluster, measure_mpi_sendrecv, run_cluster

    def info(name: str, value: float, **detail: object) -> None:
        row = {"package": "shardlayers", "name": name, "ratio": round(value, 1), "goal": "info (the bound)"}
        print("BENCH " + json.dumps(row | {"met": None, "unit": "Mbit/s", "detail": detail}), flush=True)

    with cluster.session(2, rate):
        tcp = cluster.measure_tcp(1, 2)
        info(f"link at {rate or 'unshaped'}: one TCP stream dkh1 -> dkh2, payload", 8 * tcp / 1e6)
        mpi = measure_mpi_sendrecv((1, 2), 16 << 20, 5)
        info(
            f"link at {rate or 'unshaped'}: MPI_Sendrecv of 16 MiB between dkh1 and dkh2, each way",
            8 * mpi["bytes_per_s"] / 1e6,
            median_s=mpi["median_s"],
            best_s=mpi["best_s"],
        )
        for extra in (["--interleave-hosts"], []):
            args = ["--dp", "2", "--link-bps", repr(tcp), *extra, *(["--rate", rate] if rate else [])]
            env = {"SHARDLAYERS_BENCH_REPS": os.environ.get("SHARDLAYERS_BENCH_REPS", "5")}
            res = run_cluster(2, 2, os.path.abspath(__file__), 1200, args=args, env=env)
            for line in res.stdout.splitlines():
                if line.startswith(("BENCH ", "# ")):
                    print(line, flush=True)


if __name__ == "__main__":
    if "--cluster" in sys.argv:
        cp = argparse.ArgumentParser(description="bench_llama_block.py on the simulated cluster (see its docstring)")
        cp.add_argument("--cluster", action="store_true")
        cp.add_argument("--rate", help="every host link's rate, tc's syntax (1gbit); default unshaped")
        on_cluster(cp.parse_args().rate)
    else:
        main(sys.argv[1:])
