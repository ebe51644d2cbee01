"""torch.compile(fullgraph=True) of a function using the collectives: same values and grads as eager."""

from __future__ import annotations

import sys

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
backend = sys.argv[1] if len(sys.argv) > 1 else "aot_eager"
D = torch.double


def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = comm.Allreduce(x * w, mpiad.MPI_SUM) / comm.size
    m = comm.Allreduce(x.sin(), mpiad.MPI_MAX)
    p = comm.Allreduce(x.cos(), mpiad.MPI_PROD)
    z = comm.Allgather(y.view(1, -1) * (rank + 1), 0)  # rank-dependent upstream for Allgather
    s = comm.Scatter(z * 2, 0, 1, 0)  # root holds size rows
    g = comm.Gather(x.view(1, -1) ** 2, 0, size - 1)
    a = comm.Alltoall(x.view(1, -1).repeat(1, size), 0, 1, x.numel())
    b = comm.Bcast_(y * 3, 0)
    r = comm.Reduce_(x * 5, mpiad.MPI_SUM, 0)
    q = comm.Reduce_scatter(x.repeat(size), mpiad.MPI_SUM)
    j = mpiad.JoinDummies(b, [r])
    # non-blocking ops trace as their blocking custom ops (same values and gradients)
    h1 = comm.Iallreduce(x * w, mpiad.MPI_AVG)
    h2 = comm.Iallgather(x.view(1, -1) * (rank + 1), 0)
    h3 = comm.Ireduce_scatter(w.repeat(size), mpiad.MPI_SUM)
    h4 = comm.Ibcast_(y * 5, size - 1)
    h5 = comm.Ireduce_(x * x, mpiad.MPI_SUM, 0)
    h6 = comm.Igather(x.view(1, -1) * w.view(1, -1), 0, 0)
    h7 = comm.Iscatter(z * 3, 0, 1, 0)
    h8 = comm.Ialltoall(w.view(1, -1).repeat(1, size), 0, 1, w.numel())
    k = mpiad.JoinDummies(x * 3, [h1.dummy])
    i1, i2, i3 = comm.Wait(h1), comm.Wait(h2), comm.Wait(h3)
    i4, i5, i6, i7, i8 = (comm.Wait(h) for h in (h4, h5, h6, h7, h8))
    return (
        (i1 * i1).sum()
        + (i2 * (rank + 1)).sum()
        + (i3 * x).sum()
        + (i4 * (rank + 1)).sum()
        + i5.sum() * (rank + 3)
        + (i6 * i6).sum()
        + (i7 * x.view(1, -1)).sum()
        + (i8 * torch.arange(i8.numel(), dtype=D).view_as(i8)).sum()
        + k.sum()
        + z.sum() * (rank + 1)
        + (s * s).sum()
        + g.sum()
        + (a * torch.arange(a.numel(), dtype=D).view_as(a)).sum()
        + (j * (rank + 2)).sum()
        + r.sum() * (rank + 1)
        + m.sum()
        + p.sum()
        + (q * q).sum()
    )


def f_small(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # fewer kernels (inductor compiles each to C++), still rank-dependent shapes (Gather's
    # root) and independent collectives that a scheduler could reorder per rank
    a = comm.Allreduce(x * w, mpiad.MPI_SUM)
    g = comm.Gather(x.view(1, -1), 0, 0)
    b = comm.Allgather(w.view(1, -1), 0)
    s = comm.Bcast_(x * 2, 0)
    r = comm.Reduce_scatter(x.repeat(size), mpiad.MPI_SUM)
    i = comm.Wait(comm.Iallreduce(x * (rank + 1), mpiad.MPI_SUM))
    return (i * i).sum() + a.sum() + (g * (rank + 1)).sum() + (b * b).sum() + s.sum() * (rank + 2) + (r * w).sum()


if len(sys.argv) > 2 and sys.argv[2] == "small":
    f = f_small

torch.manual_seed(3 + rank)
x0 = torch.rand(4, dtype=D)
w0 = torch.rand(4, dtype=D)
x1, w1 = x0.clone().requires_grad_(), w0.clone().requires_grad_()
eager = f(x1, w1)
eager.backward()
x2, w2 = x0.clone().requires_grad_(), w0.clone().requires_grad_()
cf = torch.compile(f, fullgraph=True, backend=backend)
comp = cf(x2, w2)
comp.backward()
assert torch.allclose(eager, comp), (eager, comp)
assert torch.allclose(x1.grad, x2.grad), (x1.grad, x2.grad)
assert torch.allclose(w1.grad, w2.grad), (w1.grad, w2.grad)
# a second call with new values reuses the compiled graph
x3 = (x0 + 1).requires_grad_()
out = cf(x3, w0)
out.backward()
x4 = (x0 + 1).requires_grad_()
ref = f(x4, w0)
ref.backward()
assert torch.allclose(out, ref) and torch.allclose(x3.grad, x4.grad)
MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"compiled ({backend}): values and gradients match eager on {size} ranks")
