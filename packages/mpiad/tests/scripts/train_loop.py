"""mpiad's typical loop: a DataParallel training loop, for the fault tests across hosts.

``train_loop.py STEPS`` trains an MLP for STEPS SGD steps (buckets averaged by the
non-blocking engine during backward, a blocking Allreduce of the loss each step),
printing ``STEP k`` on rank 0 after each step, then checks that every rank holds
the same weights. The cluster fault tests kill a host or cut its link while it runs;
the job must then end everywhere, with an error naming the lost host or rank.
"""

from __future__ import annotations

import sys
import time

import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU())
net.append(torch.nn.Linear(512, 1))
model = mpiad.DataParallel(net, bucket_cap_mb=0.5)  # several buckets in flight per step
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(100 + rank)
for step in range(1, steps + 1):
    x = torch.randn(32, 256, generator=gen)
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    mean_loss = comm.Allreduce(loss.detach(), mpiad.MPI_AVG)
    if rank == 0:
        print(f"STEP {step} loss {mean_loss.item():.6f}", flush=True)
    time.sleep(0.05)  # a loop that lasts a while: the fault lands mid-run, not after it

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = torch.equal(comm.Allreduce(flat, mpiad.MPI_MAX), comm.Allreduce(flat, mpiad.MPI_MIN))
assert same, "ranks hold different weights"
if rank == 0:
    print(f"train_loop: {steps} steps, {model.bucket_count} buckets, same weights on {size} ranks", flush=True)
