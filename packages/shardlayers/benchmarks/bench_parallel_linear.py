# nprocs: 2
"""ParallelLinear forward + backward over 2 ranks against DTensor's ColwiseParallel / RowwiseParallel
on the same shapes: an MLP block (column-parallel fc1 -> GELU -> row-parallel fc2) on T tokens,
hidden H, ffn 4H (defaults T = 2048, H = 1024; SHARDLAYERS_BENCH_T / SHARDLAYERS_BENCH_H).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import bench_line, compare, finish, init

import shardlayers as ts


class MLP(nn.Module):
    def __init__(self, h: int, col: nn.Module | None = None, row: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = col if col is not None else nn.Linear(h, 4 * h)
        self.fc2 = row if row is not None else nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def main() -> None:
    rank, size = init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    ts.distributed.init_process_group(size)
    t = int(os.environ.get("SHARDLAYERS_BENCH_T", 2048))
    h = int(os.environ.get("SHARDLAYERS_BENCH_H", 1024))
    torch.manual_seed(0)
    ours = MLP(h, ts.nn.ParallelLinear(h, 4 * h, dim=-1), ts.nn.ParallelLinear(4 * h, h, dim=0))
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (size,))
    theirs = parallelize_module(MLP(h), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(1))

    def run(m: nn.Module) -> None:
        xi = x.detach().requires_grad_(True)
        m(xi).sum().backward()
        m.zero_grad(set_to_none=True)

    with torch.no_grad():  # same weights and outputs
        a = ours(x)
        b = theirs(x)
        b = b.full_tensor() if hasattr(b, "full_tensor") else b
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (a - b).abs().max()
    run(ours)
    run(theirs)
    res = compare(lambda: run(ours), lambda: run(theirs), 15)
    t_ours, t_theirs = res.wall_a, res.wall_b
    if rank == 0:
        print(f"# shardlayers {t_ours * 1e3:.1f} ms, DTensor {t_theirs * 1e3:.1f} ms")
        print(
            bench_line(
                f"ParallelLinear MLP fwd+bwd (T={t}, H={h}, ffn={4 * h}, 2 ranks): shardlayers / DTensor Colwise+Rowwise",
                t_ours / t_theirs,
                "<= 1.0",
                1.0,
                ms=round(t_ours * 1e3, 2),
                ms_anchor=round(t_theirs * 1e3, 2),
                cpu_time_ratio=round(res.cpu_ratio, 3),
            )
        )
    finish()


if __name__ == "__main__":
    main()
