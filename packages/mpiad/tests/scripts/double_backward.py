"""Double backward (``create_graph=True``): closed-form Hessian-vector products.

mpi4torch's backward nodes called its differentiable ops, so gradients of
gradients worked for the linear (SUM) collectives; mpiad's backward formulas go
through its autograd Functions when a graph is requested. Every rank r has
loss weight c_r = r + 1 (C = sum c_r) and differentiates its gradient again.
"""

from __future__ import annotations

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
D = torch.double
c = rank + 1.0
C = size * (size + 1) / 2


def hvp(x: torch.Tensor, loss: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    (h,) = torch.autograd.grad((g * v).sum(), x)
    return g.detach(), h


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12), (what, rank, a, b)


base = torch.tensor([0.5, -1.0, 2.0], dtype=D)
x = (base + rank).requires_grad_()
xs = [base + q for q in range(size)]
s = sum(xs)

# Allreduce(SUM): L_r = c_r sum(s^3), v_r = c_r  ->  g = 3 C s^2, h = 6 C^2 s
g, h = hvp(x, c * (comm.Allreduce(x, mpiad.MPI_SUM) ** 3).sum(), torch.full((3,), c, dtype=D))
close(g, 3 * C * s**2, "Allreduce g")
close(h, 6 * C * C * s, "Allreduce h")

# Allgather: g_r = 3 C x_r^2, h_r = 6 C v_r x_r
g, h = hvp(x, c * (comm.Allgather(x, 0) ** 3).sum(), torch.full((3,), c, dtype=D))
close(g, 3 * C * x.detach() ** 2, "Allgather g")
close(h, 6 * C * c * x.detach(), "Allgather h")

# Bcast_ from root 0: only root's input matters; h_0 = 6 C v x_0
xb = x.detach().clone().requires_grad_()
g, h = hvp(xb, c * (comm.Bcast_(xb * 1, 0) ** 3).sum(), torch.ones(3, dtype=D))
close(g, 3 * C * xs[0] ** 2 if rank == 0 else torch.zeros(3, dtype=D), "Bcast g")
close(h, 6 * C * xs[0] if rank == 0 else torch.zeros(3, dtype=D), "Bcast h")

# Reduce_(SUM) to the last rank, then Bcast_ back: the sum s everywhere
root = size - 1
g, h = hvp(x, c * (comm.Bcast_(comm.Reduce_(x * 1, mpiad.MPI_SUM, root), root) ** 3).sum(), torch.ones(3, dtype=D))
close(g, 3 * C * s**2, "Reduce g")
close(h, 6 * C * size * s, "Reduce h")

# Scatter from root 0 (row r to rank r); non-roots' zero gradient must stay in the graph
X = torch.arange(1.0, 3 * size + 1, dtype=D).view(size, 3)
xr = (X.clone() if rank == 0 else torch.zeros(1, dtype=D)).requires_grad_()
g, h = hvp(xr, c * (comm.Scatter(xr, 0, 1, 0) ** 3).sum(), torch.ones_like(xr))
weights = torch.arange(1.0, size + 1, dtype=D).view(size, 1)
close(g, 3 * weights * X**2 if rank == 0 else torch.zeros(1, dtype=D), "Scatter g")
close(h, 6 * weights * X if rank == 0 else torch.zeros(1, dtype=D), "Scatter h")

# Gather to root 0 then Scatter back: identity, so g = 3 c_r x_r^2 and h = 6 c_r v x_r
g, h = hvp(x, c * (comm.Scatter(comm.Gather(x.view(1, 3), 0, 0), 0, 1, 0) ** 3).sum(), torch.ones(1, 3, dtype=D))
close(g, 3 * c * x.detach() ** 2, "Gather g")
close(h, 6 * c * x.detach(), "Gather h")

# Alltoall there and back: identity again
xa = (torch.arange(2.0 * size, dtype=D).view(2, size) + 10 * rank).requires_grad_()
there = comm.Alltoall(xa, 0, 1, 1)
back = comm.Alltoall(there, 1, 0, 2)
g, h = hvp(xa, c * (back**3).sum(), torch.ones_like(xa))
close(g, 3 * c * xa.detach() ** 2, "Alltoall g")
close(h, 6 * c * xa.detach(), "Alltoall h")

# MAX (the owner gets it; nonlinear, but piecewise linear): h_r = 6 C y [r owns y]
y = xs[-1]  # the last rank holds the maximum
g, h = hvp(x, c * (comm.Allreduce(x, mpiad.MPI_MAX) ** 3).sum(), torch.ones(3, dtype=D))
own = 1.0 if rank == size - 1 else 0.0
close(g, 3 * C * y**2 * own, "MAX g")
close(h, 6 * C * y * own, "MAX h")

# PROD: y = prod_q x_q, g_r = 3 C y^3 / x_r, Phi = sum_r g_r  ->  h_r = 3 C y^3 / x_r (3 S - 1 / x_r)
xp = (torch.tensor([0.5, 1.5, -2.0], dtype=D) + 0.25 * rank).requires_grad_()
xps = [torch.tensor([0.5, 1.5, -2.0], dtype=D) + 0.25 * q for q in range(size)]
yp = torch.stack(xps).prod(0)
S = sum(1 / t for t in xps)
g, h = hvp(xp, c * (comm.Allreduce(xp, mpiad.MPI_PROD) ** 3).sum(), torch.ones(3, dtype=D))
xd = xp.detach()
close(g, 3 * C * yp**3 / xd, "PROD g")
close(h, 3 * C * yp**3 / xd * (3 * S - 1 / xd), "PROD h")

MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"double_backward: all checks passed on {size} ranks")
