"""mpiad in one script: `mpiexec -n 2 python -m mpi4py mpiad_quickstart.py`.

Two differentiable collectives in one loss; the gradient that comes back through them is checked
against its closed form on every rank.
"""

import torch

import mpiad

comm = mpiad.COMM_WORLD
x = torch.full((3,), float(comm.rank + 1), dtype=torch.float64, requires_grad=True)
y = comm.Allreduce(x, mpiad.MPI_SUM)  # sum over ranks: size*(size+1)/2 everywhere
z = comm.Allgather(x.view(1, 3), 0)  # (size, 3) on every rank
loss = (y * (comm.rank + 1)).sum() + z.square().sum()
loss.backward()  # gradients flow through both collectives
print(comm.rank, x.grad)

# d/dx_r of sum_q (q+1) * sum(y) is sum_q (q+1); of sum_q |z|^2 it is 2 * size * x_r
n = comm.size
expected = n * (n + 1) / 2 + 2 * n * (comm.rank + 1)
assert torch.equal(x.grad, torch.full((3,), expected, dtype=torch.float64)), (x.grad, expected)
