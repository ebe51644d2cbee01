# ruff: noqa: B023
"""Non-blocking collectives: values, gradients (rank-dependent upstream), double
backward and gradcheck equal to the blocking ops (themselves tested against
single-process references); several operations in flight at once; MPI_AVG;
debug mode catching mismatched non-blocking calls."""

from __future__ import annotations

from collections.abc import Callable

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
D = torch.double
S = mpiad
gen = torch.Generator().manual_seed(50 + rank)
Fn = Callable[[torch.Tensor], torch.Tensor]


def rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, dtype=D, generator=gen) + 0.5


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12), (what, rank, a, b)


def compare(name: str, x0: torch.Tensor, blocking: Fn, nonblocking: Fn) -> None:
    """Forward, gradient and Hessian-vector product of both versions on the same input."""
    outs = []
    for fn in (blocking, nonblocking):
        x = x0.clone().requires_grad_()
        y = fn(x * 1.0)
        w = torch.arange(1.0, y.numel() + 1, dtype=D).view_as(y) * (rank + 1)
        loss = (y * y * w).sum()  # nonlinear: the double backward sees the collective twice
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        (h,) = torch.autograd.grad((g * (x.detach() + 1)).sum(), x)
        outs.append((y.detach(), g.detach(), h))
    for (a, b), what in zip(zip(outs[0], outs[1]), ("value", "grad", "hvp")):
        same(a, b, f"{name} {what}")


def raises(exc: type[BaseException], fn: Callable[[], object], *words: str) -> None:
    try:
        fn()
    except exc as e:
        msg = str(e)
        assert all(w in msg for w in words), (msg, words)
    else:
        raise AssertionError(f"no {exc.__name__} raised (expected words {words})")


def nb(start: Callable[[torch.Tensor], mpiad.WaitHandle]) -> Fn:
    return lambda x: comm.Wait(start(x))


ns = [r + 1 for r in range(size)]
total = sum(ns)
root = size - 1
for op in (S.MPI_SUM, S.MPI_AVG, S.MPI_PROD, S.MPI_MAX):
    compare(f"Iallreduce {op}", rand(3, 2), lambda x: comm.Allreduce(x, op), nb(lambda x: comm.Iallreduce(x, op)))
    compare(
        f"Ireduce_ {op}",
        rand(4),
        lambda x: comm.Reduce_(x, op, root),
        nb(lambda x: comm.Ireduce_(x, op, root)),
    )
compare("Ibcast_", rand(2, 3), lambda x: comm.Bcast_(x, root), nb(lambda x: comm.Ibcast_(x, root)))
compare("Igather", rand(2, rank + 1), lambda x: comm.Gather(x, 1, 0), nb(lambda x: comm.Igather(x, 1, 0)))
compare("Iallgather", rand(rank + 1, 2), lambda x: comm.Allgather(x, 0), nb(lambda x: comm.Iallgather(x, 0)))
compare(
    "Iscatter",
    rand(total, 2),
    lambda x: comm.Scatter(x, 0, rank + 1, root),
    nb(lambda x: comm.Iscatter(x, 0, rank + 1, root)),
)
compare(
    "Ialltoall",
    rand(rank + 2, total),
    lambda x: comm.Alltoall(x, 0, 1, rank + 1),
    nb(lambda x: comm.Ialltoall(x, 0, 1, rank + 1)),
)
for op in (S.MPI_SUM, S.MPI_AVG):
    compare(
        f"Ireduce_scatter {op}",
        rand(2, total),
        lambda x: comm.Reduce_scatter(x, op, 1, rank + 1),
        nb(lambda x: comm.Ireduce_scatter(x, op, 1, rank + 1)),
    )

# MPI_AVG in closed form: y = mean over ranks, dL_r/dx_r = mean of the upstream weights
x = torch.full((3,), float(rank), dtype=D, requires_grad=True)
y = comm.Wait(comm.Iallreduce(x, S.MPI_AVG))
same(y.detach(), torch.full((3,), (size - 1) / 2, dtype=D), "AVG value")
(y * (rank + 1)).sum().backward()
same(x.grad, torch.full((3,), (size + 1) / 2, dtype=D), "AVG grad")

# several in flight: started in one order, waited in another; the adjoints overlap too
a, b, c = rand(5), rand(2, 2), rand(rank + 1, 3)
xa, xb, xc = (t.clone().requires_grad_() for t in (a, b, c))
ha = comm.Iallreduce(xa * 2, S.MPI_SUM)
hb = comm.Ibcast_(xb * 1, 0)
hc = comm.Iallgather(xc * 3, 0)
yc, ya, yb = comm.Wait(hc), comm.Wait(ha), comm.Wait(hb)
loss = (ya * (rank + 1)).sum() + (yb**2).sum() + (yc * (rank + 2)).sum()
loss.backward()
ref = [t.clone().requires_grad_() for t in (a, b, c)]
(
    (comm.Allreduce(ref[0] * 2, S.MPI_SUM) * (rank + 1)).sum()
    + (comm.Bcast_(ref[1] * 1, 0) ** 2).sum()
    + (comm.Allgather(ref[2] * 3, 0) * (rank + 2)).sum()
).backward()
for got, want, what in zip((xa, xb, xc), ref, "abc"):
    same(got.grad, want.grad, f"in flight {what}")
same(ya.detach(), comm.Allreduce(a * 2, S.MPI_SUM), "in flight value")

# JoinDummiesHandle orders a computation after a handle; a handle whose result is
# unused still takes part in the backward (zeros), so every rank runs the adjoint
x = rand(4).requires_grad_()
h = comm.Iallreduce(x * 1, S.MPI_SUM)
z = mpiad.JoinDummies(x * 5, [h.dummy])
comm.Wait(h)  # result unused
z.sum().backward()
same(x.grad, torch.full((4,), 5.0, dtype=D), "unused result")

# without grad: plain tensors; in-place ops fill the given tensor at the Wait
t = torch.full((3,), float(rank))
h = comm.Ibcast_(t, 0)
assert "Ibcast_ pending" in repr(h) or "Ibcast_ done" in repr(h)
assert comm.Wait(h) is t and torch.equal(t, torch.zeros(3))
r = torch.ones(2, dtype=torch.int64)
assert torch.equal(comm.Wait(comm.Ireduce_(r, S.MPI_SUM, 0)), torch.full((2,), size if rank == 0 else 0))
raises(RuntimeError, lambda: comm.Wait(h), "already waited")


# gradcheck of rank k's local Jacobian, as for the blocking ops (grads.py)
def gradcheck(name: str, x_local: torch.Tensor, fn: Fn) -> None:
    for k in range(size):
        const = x_local.detach().clone()

        def f(x: torch.Tensor, k: int = k) -> torch.Tensor:
            y = fn(x * 1.0 if rank == k else const + 0.0 * x)
            out = torch.cat([y.reshape(-1), (0.0 * x.sum()).reshape(1)])
            return out if rank == k else 0.0 * out

        ok = torch.autograd.gradcheck(f, (x_local.detach().clone().requires_grad_(),), fast_mode=True)
        assert ok, name


gradcheck("Iallreduce MAX", rand(3), nb(lambda x: comm.Iallreduce(x, S.MPI_MAX)))
gradcheck("Iallreduce AVG", rand(3), nb(lambda x: comm.Iallreduce(x, S.MPI_AVG)))
gradcheck("Igather", rand(rank + 1, 2), nb(lambda x: comm.Igather(x, 0, 0)))
gradcheck("Iscatter", rand(total, 2), nb(lambda x: comm.Iscatter(x, 0, rank + 1, 0)))
gradcheck("Ialltoall", rand(2, total), nb(lambda x: comm.Ialltoall(x, 0, 1, rank + 1)))
gradcheck("Ireduce_scatter", rand(total), nb(lambda x: comm.Ireduce_scatter(x, S.MPI_SUM, 0, rank + 1)))
gradcheck("Ibcast_", rand(2, 3), nb(lambda x: comm.Ibcast_(x, size - 1)))
gradcheck("Ireduce_ PROD", rand(3), nb(lambda x: comm.Ireduce_(x, S.MPI_PROD, 0)))
gradcheck("Iallgather", rand(rank + 1, 2), nb(lambda x: comm.Iallgather(x, 0)))
MPI.COMM_WORLD.Barrier()

# a tensor the backward formula needs (PROD: the input and the result), changed in place
# after the call: backward raises, as for the blocking op, instead of using the new values
for fn in (lambda x: comm.Allreduce(x, S.MPI_PROD), nb(lambda x: comm.Iallreduce(x, S.MPI_PROD))):
    a = rand(2).requires_grad_()
    xin = a * 1.0
    y = fn(xin)
    with torch.no_grad():
        xin.mul_(100)
    raises(RuntimeError, lambda: y.sum().backward(), "modified by an inplace operation")
    y = fn(a * 1.0)
    with torch.no_grad():
        y.mul_(2)
    raises(RuntimeError, lambda: y.sum().backward(), "modified by an inplace operation")

# bad input raises before any communication (rank 0 only: communicating would hang)
if rank == 0:
    for call, exc, words in (
        (lambda: comm.Iallreduce(torch.ones(2), 99), ValueError, "op = 99"),
        (lambda: comm.Iallreduce(torch.ones(2, dtype=torch.int32), S.MPI_AVG), TypeError, "MPI_AVG"),
        (lambda: comm.Ibcast_(torch.ones(2), size), ValueError, "root"),
        (lambda: comm.Igather([1.0], 0, 0), TypeError, "torch.Tensor"),
        (lambda: comm.Iallgather(torch.ones(2), 1), ValueError, "gatheraxis = 1"),
        (lambda: comm.Iscatter(torch.ones(2), 0, -1, 0), ValueError, "numelem"),
        (lambda: comm.Ialltoall(torch.ones(2), 0, 1, 1), ValueError, "scatteraxis = 1"),
        (lambda: comm.Ireduce_scatter(torch.ones(size + 1), S.MPI_SUM), ValueError, "divide"),
        (lambda: comm.Ireduce_(torch.ones(2), S.MPI_BXOR, 0), TypeError, "MPI_BXOR"),
    ):
        raises(exc, call, words)
MPI.COMM_WORLD.Barrier()

# debug mode: a non-blocking call matched with a blocking one (or another op) raises everywhere
mpiad.set_debug(True)
if size > 1:
    x = torch.ones(3)
    call = (lambda: comm.Wait(comm.Iallreduce(x, S.MPI_SUM))) if rank == 0 else (lambda: comm.Allreduce(x, S.MPI_SUM))
    raises(RuntimeError, call, "mismatching", "Iallreduce", "Allreduce")
    xs = torch.ones(2 + (rank == size - 1))
    raises(RuntimeError, lambda: comm.Wait(comm.Iallgather(xs.view(1, -1), 0)), "mismatching", "Iallgather")
xg = torch.ones(3, requires_grad=True)
comm.Wait(comm.Iallreduce(xg, S.MPI_SUM)).sum().backward()
assert torch.equal(xg.grad, torch.full((3,), float(size)))
mpiad.set_debug(None)

MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"nonblocking: all checks passed on {size} ranks")
