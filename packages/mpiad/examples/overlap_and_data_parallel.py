"""The getting-started page's second example: a non-blocking Allreduce overlapping a matmul, and DataParallel.

mpiexec -n 2 python -m mpi4py examples/overlap_and_data_parallel.py
"""

import torch

import mpiad

comm = mpiad.COMM_WORLD
x = torch.rand(1 << 20, requires_grad=True)
handle = comm.Iallreduce(x * 2, mpiad.MPI_AVG)  # starts; the worker thread communicates
other = torch.rand(512, 512) @ torch.rand(512, 512)  # ... while this runs
y = comm.Wait(handle)  # the average over the ranks
y.sum().backward()  # the backward starts Iallreduce(grad) at the Wait node, waits at the start node

model = mpiad.DataParallel(torch.nn.Linear(64, 8))  # rank 0's initial weights everywhere
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(16, 64)).square().mean().backward()  # buckets averaged during backward
    opt.step()  # the same update on every rank

# every rank holds the same weights; x's gradient is d(sum of the average)/dx = 2
w = comm.Allgather(model.module.weight.detach().reshape(1, -1), 0)
assert torch.equal(w[0], w[-1]) and torch.equal(x.grad, torch.full_like(x, 2.0))
print(comm.rank, "same weights on every rank:", bool(torch.equal(w[0], w[-1])))
