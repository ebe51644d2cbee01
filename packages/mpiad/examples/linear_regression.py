"""Data-parallel least-squares fit with LBFGS: two Allreduce calls parallelise the loss.

Run:  mpiexec -n 2 python -m mpi4py examples/linear_regression.py
Every rank holds a slice of the data; the fitted parameters must recover the
generating ones (0.1, 1.0, -2.0) whatever the number of ranks.
"""

from __future__ import annotations

import torch

import mpiad

comm = mpiad.COMM_WORLD
torch.manual_seed(42)

num_points = 10000
chunk = num_points // comm.size + (1 if comm.rank < num_points % comm.size else 0)
offset = sum(num_points // comm.size + (1 if r < num_points % comm.size else 0) for r in range(comm.rank))
xinput = 2.0 * torch.rand([num_points], dtype=torch.double)[offset : offset + chunk]


def model(inp: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    return (params[2] * inp + params[1]) * inp + params[0]


gen_params = torch.tensor([0.1, 1.0, -2.0], dtype=torch.double)
youtput = model(xinput, gen_params)


def lossfunction(params: torch.Tensor) -> torch.Tensor:
    # average the parameters so every rank starts from the same point
    params = comm.Allreduce(params, mpiad.MPI_SUM) / comm.size
    localloss = torch.sum(torch.square(youtput - model(xinput, params)))
    # the global loss: its gradient is summed over the ranks by Allreduce's backward
    return comm.Allreduce(localloss, mpiad.MPI_SUM)


params = torch.arange(3, dtype=torch.double).requires_grad_()
optimizer = torch.optim.LBFGS([params], lr=1, max_iter=50, tolerance_grad=1e-12, tolerance_change=1e-14)


def closure() -> torch.Tensor:
    optimizer.zero_grad()
    loss = lossfunction(params)
    loss.backward()
    return loss


optimizer.step(closure)
final = lossfunction(params).item()
if comm.rank == 0:
    print("Final parameters:", [round(v, 6) for v in params.tolist()], "loss:", final)
assert torch.allclose(params.detach(), gen_params, atol=1e-6), params
