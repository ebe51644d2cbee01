"""shardlayers in one script: `torchrun --nproc-per-node 2 shardlayers_quickstart.py`.

A column-parallel layer, a row-parallel layer and a vocab-parallel head with its cross-entropy,
trained three steps on two tensor-parallel ranks; the full weights are collected on rank 0.
"""

import torch
import torch.distributed as dist

import shardlayers as ts

dist.init_process_group("gloo")
ts.distributed.init_process_group(group_size=2)  # tensor-parallel groups of 2 ranks

torch.manual_seed(0)  # same seed everywhere: shards are slices of the single-process init
model = torch.nn.Sequential(
    ts.nn.ParallelLinear(16, 64, dim=-1),  # column: output split, tagged -1
    torch.nn.GELU(),  # the tag survives the activation
    ts.nn.ParallelLinear(64, 16, dim=0),  # row: split input used as is, all-reduced, bias once
    ts.nn.ParallelLinear(16, 1000, dim=-1),  # vocab-parallel head
)
criterion = ts.nn.ParallelCrossEntropyLoss(label_smoothing=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

x, y = torch.randn(8, 16), torch.randint(0, 1000, (8,))
for _step in range(3):
    logits = model(x)  # [8, 500] on each rank, never gathered
    assert logits.shape == (8, 1000 // dist.get_world_size())
    loss = criterion(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()

state = ts.collect_state_dict(model, model.state_dict(), rank0_only=True)  # full tensors on CPU
if dist.get_rank() == 0:
    assert tuple(state["3.weight"].shape) == (1000, 16)
    print(f"loss {loss.item():.4f}", {k: tuple(v.shape) for k, v in state.items()})
dist.barrier()  # gloo's threads drop the last collective's tensors before exit (docs: cluster.md)
dist.destroy_process_group()
