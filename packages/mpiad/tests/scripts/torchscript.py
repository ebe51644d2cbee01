# ruff: noqa: PT017  (plain asserts: this runs under mpiexec, not pytest)
"""TorchScript: scripted functions and modules that take an ``mpiad.MPI_Communicator``.

Every scriptable collective gives the values and gradients of eager mode (the
same function run unscripted) and of the closed forms; a scripted module may
hold the communicator as an attribute; bad arguments raise on rank 0 alone
(any communication would hang the job); methods TorchScript cannot express
fail at scripting time, naming the method.
"""

from __future__ import annotations

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
D = torch.double
Tensor = torch.Tensor
torch.manual_seed(3 + rank)


def every_op(x: Tensor, comm_: mpiad.MPI_Communicator) -> list[Tensor]:
    r = comm_.rank
    n = comm_.size
    c = float(r + 1)
    return [
        comm_.Allreduce(x * c, mpiad.MPI_SUM),
        comm_.Allreduce(x + c, mpiad.MPI_PROD),
        comm_.Allreduce(x * c, mpiad.MPI_MAX),
        comm_.Allreduce(x, mpiad.MPI_AVG),
        comm_.Bcast_(x * c, n - 1),
        comm_.Reduce_(x * c, mpiad.MPI_SUM, 0),
        comm_.Reduce_scatter(x.repeat(n) * c),  # MPI_SUM, axis 0, the even split
        comm_.Reduce_scatter(x.repeat(n).view(n, -1), mpiad.MPI_SUM, 0, 1),
        comm_.Gather(x.view(1, -1) * c, 0, 0),
        comm_.Allgather(x.view(1, -1) * c, 0),
        comm_.Scatter(x.view(1, -1).repeat(n, 1) * c, 0, 1, n - 1),
        comm_.Alltoall(x.view(1, -1).repeat(1, n) * c, 0, 1, x.numel()),
        mpiad.JoinDummies(x * 2.0, [comm_.Allreduce(x, mpiad.MPI_MIN)]),
    ]


def loss_and_grads(fn, x0: Tensor) -> tuple[list[Tensor], Tensor]:  # type: ignore[no-untyped-def]
    x = x0.clone().requires_grad_()
    outs = fn(x, comm)
    # rank- and position-dependent upstream gradients
    loss = sum(
        ((o * (rank + 2 + i)) * torch.arange(1, o.numel() + 1, dtype=D).view_as(o)).sum() for i, o in enumerate(outs)
    )
    loss.backward()
    assert x.grad is not None
    return [o.detach() for o in outs], x.grad


def matches_eager() -> None:
    scripted = torch.jit.script(every_op)
    x0 = torch.rand(4, dtype=D) + 0.5
    eager_out, eager_grad = loss_and_grads(every_op, x0)
    script_out, script_grad = loss_and_grads(scripted, x0)
    assert len(eager_out) == len(script_out) == 13
    for i, (a, b) in enumerate(zip(eager_out, script_out)):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-13, atol=0), (i, a, b)
    assert torch.allclose(eager_grad, script_grad, rtol=1e-12, atol=1e-14), (eager_grad, script_grad)


def closed_forms() -> None:
    """Each op alone, scripted, against its closed-form value and gradient."""
    xs = [torch.arange(1.0, 4.0, dtype=D) + q for q in range(size)]  # every rank's input, known everywhere
    x0, c = xs[rank], [float(q + 1) for q in range(size)]
    u = [float(q + 2) for q in range(size)]  # rank q's upstream gradient weight
    tot_u = sum(u)

    def run(fn) -> tuple[Tensor, Tensor]:  # type: ignore[no-untyped-def]
        x = x0.clone().requires_grad_()
        y = fn(x, comm)
        (y * u[rank]).sum().backward()
        assert x.grad is not None
        return y.detach(), x.grad

    @torch.jit.script
    def allreduce_sum(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Allreduce(x * float(comm_.rank + 1), mpiad.MPI_SUM)

    y, g = run(allreduce_sum)
    assert torch.equal(y, sum(c[q] * xs[q] for q in range(size)))
    assert torch.equal(g, torch.full((3,), c[rank] * tot_u, dtype=D))

    @torch.jit.script
    def allreduce_prod(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Allreduce(x, mpiad.MPI_PROD)

    y, g = run(allreduce_prod)
    prod = torch.stack(xs).prod(0)
    assert torch.allclose(y, prod, rtol=1e-15)
    assert torch.allclose(g, tot_u * prod / x0, rtol=1e-14)

    @torch.jit.script
    def bcast(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Bcast_(x * float(comm_.rank + 1), comm_.size - 1)

    root = size - 1
    y, g = run(bcast)
    assert torch.equal(y, c[root] * xs[root])
    assert torch.equal(g, torch.full((3,), c[root] * tot_u if rank == root else 0.0, dtype=D))

    @torch.jit.script
    def reduce(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Reduce_(x * float(comm_.rank + 1), mpiad.MPI_SUM, 0)

    y, g = run(reduce)
    if rank == 0:
        assert torch.equal(y, sum(c[q] * xs[q] for q in range(size)))
    assert torch.equal(g, torch.full((3,), c[rank] * u[0], dtype=D))  # root's upstream, on every rank

    @torch.jit.script
    def allgather(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Allgather(x.view(1, -1), 0)

    y, g = run(allgather)
    assert torch.equal(y, torch.stack(xs))
    assert torch.equal(g, torch.full((3,), tot_u, dtype=D))

    @torch.jit.script
    def gather(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Gather(x.view(1, -1), 0, 0)

    y, g = run(gather)
    assert y.shape == ((size, 3) if rank == 0 else (0, 3))
    if rank == 0:
        assert torch.equal(y, torch.stack(xs))
    assert torch.equal(g, torch.full((3,), u[0], dtype=D))

    @torch.jit.script
    def scatter(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Scatter(x.view(1, -1).repeat(comm_.size, 1), 0, 1, 0)

    y, g = run(scatter)
    assert torch.equal(y, xs[0].view(1, -1))
    assert torch.equal(g, torch.full((3,), tot_u if rank == 0 else 0.0, dtype=D))

    @torch.jit.script
    def reduce_scatter(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Reduce_scatter(x.repeat(comm_.size))

    y, g = run(reduce_scatter)  # rank r keeps elements 3r..3r+2 of the summed, repeated inputs
    assert torch.equal(y, sum(xs))
    assert torch.equal(g, torch.full((3,), tot_u, dtype=D))


class Net(torch.nn.Module):
    """A model holding the communicator, as mpi4torch users script them."""

    def __init__(self, comm_: mpiad.MPI_Communicator) -> None:
        super().__init__()
        self.comm = comm_
        self.lin = torch.nn.Linear(3, 2, dtype=D)

    def forward(self, x: Tensor) -> Tensor:
        return self.comm.Allreduce(self.lin(x), mpiad.MPI_SUM) / float(self.comm.size)


def scripted_module() -> None:
    torch.manual_seed(11)  # same weights on every rank
    net = Net(comm)
    snet = torch.jit.script(Net(comm))
    snet.load_state_dict(net.state_dict())
    x = torch.rand(5, 3, dtype=D) + rank  # rank-dependent data
    net(x).square().sum().backward()
    snet(x).square().sum().backward()
    for (name, p), q in zip(net.named_parameters(), snet.parameters()):
        assert p.grad is not None and q.grad is not None
        assert torch.allclose(p.grad, q.grad, rtol=1e-13, atol=1e-15), name


def errors() -> None:
    @torch.jit.script
    def bad_op(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Allreduce(x, 12)

    @torch.jit.script
    def bad_dtype_op(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Allreduce(x, mpiad.MPI_BXOR)

    @torch.jit.script
    def bad_root(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Bcast_(x, comm_.size)

    @torch.jit.script
    def bad_axis(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Gather(x, 1, 0)

    @torch.jit.script
    def bad_split(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Reduce_scatter(x)

    @torch.jit.script
    def bad_out(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Allreduce(x, mpiad.MPI_SUM, x)

    cases = [
        (bad_op, torch.ones(2), "op = 12"),
        (bad_dtype_op, torch.ones(2), "MPI_BXOR"),
        (bad_root, torch.ones(2), "root"),
        (bad_axis, torch.ones(2), "gatheraxis"),
        (bad_split, torch.ones(size + 1), "does not divide"),
        (bad_out, torch.ones(2), "not supported under TorchScript"),
    ]
    if rank == 0:  # raised before any communication, or the job would hang
        for i, (fn, x, words) in enumerate(cases):
            try:
                fn(x, comm)
            except (RuntimeError, torch.jit.Error) as e:
                # the ops' checks raise RuntimeError (as mpi4torch's did), the two checks
                # in the scripted methods (the last two cases) torch.jit.Error
                assert isinstance(e, RuntimeError if i < 4 else torch.jit.Error), (words, type(e))
                assert words in str(e), (words, e)
            else:
                raise AssertionError(f"no error for {words}")

    def p2p(x: Tensor, comm_: mpiad.MPI_Communicator) -> Tensor:
        return comm_.Send(x, 0, 0)

    try:
        torch.jit.script(p2p)
    except RuntimeError as e:
        assert "Send" in str(e), e
    else:
        raise AssertionError("point to point ops are eager only, scripting them must fail")


for fn in (matches_eager, closed_forms, scripted_module, errors):
    fn()
    MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"torchscript: all checks passed on {size} ranks")
