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
"""

from __future__ import annotations

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


def main() -> None:
    rank, size = init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module as dtensor_parallelize

    hidden, layers, seq = _env("HIDDEN", 1024), _env("LAYERS", 4), _env("SEQ", 512)
    batch, reps = _env("BATCH", 1), _env("REPS", 9)
    heads = hidden // 64
    ffn = -(-(hidden * 8 // 3) // 128) * 128  # Llama's ~8/3 x hidden, rounded up to 128
    ts.distributed.init_process_group(size)

    torch.manual_seed(0)
    ours = ts.parallelize_module(Stack(hidden, heads, ffn, layers, seq), PLAN)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (size,))
    theirs = dtensor_parallelize(Stack(hidden, heads, ffn, layers, seq), mesh, dtensor_plan())
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))

    def step(m: nn.Module) -> None:
        xi = x.detach().requires_grad_(True)
        m(xi).square().mean().backward()
        m.zero_grad(set_to_none=True)

    with torch.no_grad():  # same weights, same outputs
        a, b = ours(x), theirs(x)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (a - b).abs().max()
    for m in (ours, theirs, ours, theirs):  # warm-up (DTensor's sharding-propagation caches too)
        step(m)
    # the floor: the same local shards with no communication at all (one rank's share of the work)
    local = local_shards(Stack(hidden, heads, ffn, layers, seq), size)
    step(local)
    t_ours, t_theirs, t_local = interleave([lambda: step(ours), lambda: step(theirs), lambda: step(local)], reps)
    peaks: tuple[list[int], list[int]] = ([], [])
    for _ in range(3):  # paired too: the tracked total drifts by a few MiB between profiling sessions
        peaks[0].append(peak_tracked_bytes(lambda: step(ours)))
        peaks[1].append(peak_tracked_bytes(lambda: step(theirs)))
    mems = torch.tensor([statistics.median(p) for p in peaks], dtype=torch.float64)
    torch.distributed.all_reduce(mems, op=torch.distributed.ReduceOp.MAX)
    mo, mt = t_ours.wall, t_theirs.wall
    # CPU seconds of each process per step: insensitive to other jobs' load (the larger rank's);
    # against the no-communication floor: what each side adds to the arithmetic itself
    cpu = torch.tensor(
        [t_ours.cpu / t_theirs.cpu, t_ours.cpu / t_local.cpu, t_theirs.cpu / t_local.cpu], dtype=torch.float64
    )
    torch.distributed.all_reduce(cpu, op=torch.distributed.ReduceOp.MAX)
    cpu_ratio = float(cpu[0])
    if rank == 0:
        tag = f"hidden {hidden}, {layers} layers, seq {seq}, batch {batch}, ffn {ffn}, TP={size}"
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
            )
        )
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


if __name__ == "__main__":
    main()
