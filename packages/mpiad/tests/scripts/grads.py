# ruff: noqa: B023
"""Values and gradients of every differentiable op against a single-process reference,
with rank-dependent upstream gradients; then torch.autograd.gradcheck in float64."""

from __future__ import annotations

import os
from collections.abc import Callable

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
W = MPI.COMM_WORLD
D = torch.double
gen = torch.Generator().manual_seed(100 + rank)
VERBOSE = bool(os.environ.get("VERBOSE"))
Ref = Callable[[list[torch.Tensor], int], torch.Tensor]


def allgather_obj(t: torch.Tensor) -> list[torch.Tensor]:
    return [torch.as_tensor(a) for a in W.allgather(t.detach().numpy())]


def check(name: str, x_local: torch.Tensor, dist: Callable[[torch.Tensor], torch.Tensor], ref: Ref) -> None:
    """dist on every rank vs ref(all ranks' inputs, r) in one process; loss_r = sum(w_r * y_r)."""
    if VERBOSE:
        print(rank, "check", name, flush=True)
    x = x_local.clone().requires_grad_()
    y = dist(x * 1.0)  # a non-leaf, so in-place ops do not touch x
    w = torch.randn(y.shape, dtype=y.dtype, generator=gen)
    (y * w).sum().backward()
    xs = [a.clone().requires_grad_() for a in allgather_obj(x_local)]
    ws = allgather_obj(w)
    ys = [ref(xs, r) for r in range(size)]
    (sum((yr * wr).sum() for yr, wr in zip(ys, ws)) + 0.0 * sum(a.sum() for a in xs)).backward()
    assert y.shape == ys[rank].shape, (name, y.shape, ys[rank].shape)
    assert torch.allclose(y, ys[rank]), (name, y, ys[rank])
    assert torch.allclose(x.grad, xs[rank].grad), (name, x.grad, xs[rank].grad)


def offsets(ns: list[int]) -> list[int]:
    return [sum(ns[:i]) for i in range(len(ns))]


def rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, dtype=D, generator=gen) + 0.5


# ---------------------------------------------------------------- references
S = mpiad
for op, red in (
    (S.MPI_SUM, lambda t: t.sum(0)),
    (S.MPI_PROD, lambda t: t.prod(0)),
    (S.MPI_MAX, lambda t: t.max(0).values),
    (S.MPI_MIN, lambda t: t.min(0).values),
):
    check(
        f"Allreduce{op}",
        rand(3, 4),
        lambda x, op=op: comm.Allreduce(x, op),
        lambda xs, r, red=red: red(torch.stack(xs)),
    )
    for root in {0, size - 1}:
        check(
            f"Reduce_{op}@{root}",
            rand(5),
            lambda x, op=op, root=root: comm.Reduce_(x, op, root),
            lambda xs, r, red=red, root=root: red(torch.stack(xs)) if r == root else torch.zeros(5, dtype=D),
        )
for root in {0, size - 1}:
    check(f"Bcast_@{root}", rand(2, 3), lambda x, root=root: comm.Bcast_(x, root), lambda xs, r, root=root: xs[root])

# uneven sizes along the gather axis: rank r contributes r+1 rows
for root in {0, size - 1}:
    check(
        f"Gather@{root}",
        rand(2, rank + 1, 3),
        lambda x, root=root: comm.Gather(x, 1, root),
        lambda xs, r, root=root: torch.cat(xs, 1) if r == root else torch.empty(2, 0, 3, dtype=D),
    )
check("Allgather", rand(rank + 1, 2), lambda x: comm.Allgather(x, 0), lambda xs, r: torch.cat(xs, 0))
check("Allgather axis -1", rand(2, rank + 2), lambda x: comm.Allgather(x, -1), lambda xs, r: torch.cat(xs, 1))
ns = [r + 1 for r in range(size)]
total = sum(ns)
for root in {0, size - 1}:
    check(
        f"Scatter@{root}",
        rand(3, total),
        lambda x, root=root: comm.Scatter(x, 1, rank + 1, root),
        lambda xs, r, root=root: xs[root].narrow(1, offsets(ns)[r], ns[r]),
    )
check(
    "Alltoall g!=s",
    rand(rank + 2, total, 2),
    lambda x: comm.Alltoall(x, 0, 1, rank + 1),
    lambda xs, r: torch.cat([xi.narrow(1, offsets(ns)[r], ns[r]) for xi in xs], 0),
)
check(
    "Alltoall g==s",
    rand(rank + 1, 2),
    lambda x: comm.Alltoall(x, 0, 0, size - rank),
    lambda xs, r: torch.cat(xs, 0).narrow(0, sum(size - i for i in range(r)), size - r),
)
check(
    "Reduce_scatter",
    rand(2, total),
    lambda x: comm.Reduce_scatter(x, mpiad.MPI_SUM, 1, rank + 1),
    lambda xs, r: torch.stack(xs).sum(0).narrow(1, offsets(ns)[r], ns[r]),
)
check(
    "Sendrecv ring",
    rand(4),
    lambda x: comm.Sendrecv(x, (rank + 1) % size, 3, None, (rank - 1) % size, 3),
    lambda xs, r: xs[(r - 1) % size],
)


def send_recv_ring(x: torch.Tensor) -> torch.Tensor:
    """The README idiom: Isend, Recv into a buffer joined with the send handle, Wait."""
    h = comm.Isend(x, (rank + 1) % size, 7)
    res1 = comm.Recv(mpiad.JoinDummies(torch.empty(4, dtype=D), [h.dummy]), (rank - 1) % size, 7)
    res2 = comm.Wait(mpiad.JoinDummiesHandle(h, [res1]))
    return mpiad.JoinDummies(res1, [res2])


check("Send/Recv ring", rand(4), send_recv_ring, lambda xs, r: xs[(r - 1) % size])
# MAXLOC / MINLOC on (value, index) pairs
pair = torch.stack([rand(4), torch.full((4,), float(rank), dtype=D)], -1)
check(
    "Allreduce MAXLOC",
    pair,
    lambda x: comm.Allreduce(x, mpiad.MPI_MAXLOC),
    lambda xs, r: (
        torch.stack([torch.stack(xs)[..., 0].max(0).values, torch.stack(xs)[..., 0].max(0).indices.to(D)], -1)
        + 0 * sum(xi.sum() for xi in xs)
    ),
)

# ------------------------------------------------ ties, zeros (closed form)
x = torch.ones(3, dtype=D, requires_grad=True)  # every rank holds the max: lowest rank gets it
comm.Allreduce(x, mpiad.MPI_MAX).sum().backward()
assert torch.equal(x.grad, torch.full((3,), float(size) if rank == 0 else 0.0, dtype=D)), x.grad
x = (
    torch.tensor([0.0, 2.0, 0.0], dtype=D, requires_grad=True)
    if rank == 0
    else torch.tensor([3.0, 2.0, 5.0], dtype=D, requires_grad=True)
)
comm.Allreduce(x, mpiad.MPI_PROD).sum().backward()
others = 3.0 ** (size - 1), 2.0 ** (size - 1), 5.0 ** (size - 1)
if rank == 0:
    assert torch.allclose(x.grad, size * torch.tensor(others, dtype=D)), x.grad
else:  # rank 0 holds a zero in entries 0 and 2
    assert torch.allclose(x.grad, size * torch.tensor([0.0, 2.0 ** (size - 1), 0.0], dtype=D)), x.grad
xz = torch.tensor([0.0], dtype=D, requires_grad=True)  # two or more zeros: gradient 0
comm.Allreduce(xz, mpiad.MPI_PROD).sum().backward()
assert xz.grad.item() == (1.0 if size == 1 else 0.0)


# ------------------------------------------------------------ gradcheck
def gradcheck(name: str, x_local: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Checks rank k's local Jacobian, for every k: other ranks feed constants and zero upstream."""
    if VERBOSE:
        print(rank, "gradcheck", name, flush=True)
    for k in range(size):
        const = x_local.detach().clone()

        def f(x: torch.Tensor, k: int = k) -> torch.Tensor:
            inp = x * 1.0 if rank == k else const + 0.0 * x
            y = fn(inp)
            out = torch.cat([y.reshape(-1), (0.0 * x.sum()).reshape(1)])
            return out if rank == k else 0.0 * out

        x = x_local.detach().clone().requires_grad_()
        ok = torch.autograd.gradcheck(f, (x,), fast_mode=True, check_undefined_grad=False)
        assert ok, name


ops = {"SUM": S.MPI_SUM, "PROD": S.MPI_PROD, "MAX": S.MPI_MAX, "MIN": S.MPI_MIN}
for nm, op in ops.items():
    gradcheck(f"Allreduce {nm}", rand(3), lambda x, op=op: comm.Allreduce(x, op))
    gradcheck(f"Reduce_ {nm}", rand(3), lambda x, op=op: comm.Reduce_(x, op, size - 1))
gradcheck("Bcast_", rand(3), lambda x: comm.Bcast_(x, 0))
gradcheck("Gather", rand(rank + 1, 2), lambda x: comm.Gather(x, 0, 0))
gradcheck("Allgather", rand(2, rank + 1), lambda x: comm.Allgather(x, 1))
gradcheck("Scatter", rand(total, 2), lambda x: comm.Scatter(x, 0, rank + 1, 0))
gradcheck("Alltoall", rand(2, total), lambda x: comm.Alltoall(x, 0, 1, rank + 1))
gradcheck("Reduce_scatter", rand(total), lambda x: comm.Reduce_scatter(x, mpiad.MPI_SUM, 0, rank + 1))
gradcheck("Isend/Recv/Wait", rand(4), send_recv_ring)
gradcheck("Sendrecv", rand(3), lambda x: comm.Sendrecv(x, (rank + 1) % size, 1, None, (rank - 1) % size, 1))
gradcheck("Allreduce MAXLOC", pair, lambda x: comm.Allreduce(x, mpiad.MPI_MAXLOC)[..., 0])
gradcheck("complex SUM", torch.randn(3, dtype=torch.complex128, generator=gen), lambda x: comm.Allreduce(x, S.MPI_SUM))
gradcheck(
    "complex PROD", torch.randn(3, dtype=torch.complex128, generator=gen), lambda x: comm.Allreduce(x, S.MPI_PROD)
)

W.Barrier()
if rank == 0:
    print(f"grads: all checks passed on {size} ranks")
