# ruff: noqa: PT017, SIM108  (plain asserts: this runs under mpiexec, not pytest)
"""mpi4torch's own test-suite, ported (exact expected values), run on every rank."""

from __future__ import annotations

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
torch.manual_seed(1234 + rank)
D = torch.double


def allreduce() -> None:
    tmp = torch.rand(10, dtype=D).requires_grad_()
    res = comm.Allreduce(tmp, mpiad.MPI_SUM)
    res.sum().backward()
    assert (tmp.grad == size * torch.ones(10, dtype=D)).all()
    # values: sum of the ranks' arange*(rank+1)
    x = torch.arange(5, dtype=D) * (rank + 1)
    assert torch.equal(comm.Allreduce(x, mpiad.MPI_SUM), torch.arange(5, dtype=D) * (size * (size + 1) // 2))


def reduce_() -> None:
    tmp = torch.rand(10, dtype=D).requires_grad_()
    res = comm.Reduce_(tmp, mpiad.MPI_SUM, 0)
    res.sum().backward()
    assert (tmp.grad == torch.ones(10, dtype=D)).all()
    # the reuse error: tmp is not a leaf
    tmp = 0.0 + torch.rand(10, dtype=D).requires_grad_()
    res = tmp + comm.Reduce_(tmp, mpiad.MPI_SUM, 0)
    try:
        res.sum().backward()
    except RuntimeError as e:
        assert "use the return value" in str(e), e
    else:
        raise AssertionError("reusing the input of Reduce_ did not raise")
    # values, and zeros on non-root
    x = torch.full((4,), float(rank + 1), dtype=D)
    out = comm.Reduce_(x, mpiad.MPI_SUM, size - 1)
    want = float(size * (size + 1) // 2) if rank == size - 1 else 0.0
    assert (out == want).all() and (x == want).all()


def bcast_() -> None:
    tmp = torch.rand(10, dtype=D).requires_grad_()
    res = comm.Bcast_(tmp, 0)
    res.sum().backward()
    if rank == 0:
        assert (tmp.grad == size * torch.ones(10, dtype=D)).all()
    else:
        assert (tmp.grad == torch.zeros(10, dtype=D)).all()
    x = torch.full((3,), float(rank), dtype=D)
    out = comm.Bcast_(x, size - 1)
    assert (out == size - 1).all() and (x == size - 1).all()
    # reuse error for Bcast_ too
    tmp = 0.0 + torch.rand(10, dtype=D).requires_grad_()
    res = tmp * comm.Bcast_(tmp, 0)
    try:
        res.sum().backward()
    except RuntimeError as e:
        assert "use the return value" in str(e)
    else:
        raise AssertionError("reusing the input of Bcast_ did not raise")


def gather() -> None:
    numdim = 4
    tmp = torch.rand([2, 5, numdim, 2, 3], dtype=D)
    tmp[0, 0, :, 0, 0] = rank
    res = comm.Gather(tmp, 2, 0)
    if rank == 0:
        tmp2 = torch.squeeze(torch.sum(res[0, 0, :, 0, 0]))
        assert (tmp2 == numdim * (size - 1) * size // 2).all()
        assert res.shape == (2, 5, numdim * size, 2, 3)
    else:
        assert res.shape == (2, 5, 0, 2, 3)
    tmp = torch.rand([2, 5, numdim, 2, 3], dtype=D).requires_grad_()
    res = comm.Gather(tmp, 2, 0)
    res.sum().backward()
    assert (tmp.grad == torch.ones_like(tmp)).all()


def allgather() -> None:
    numdim = 4
    tmp = torch.rand([2, 5, numdim, 2, 3], dtype=D)
    tmp[0, 0, :, 0, 0] = rank
    res = comm.Allgather(tmp, 2)
    tmp2 = torch.squeeze(torch.sum(res[0, 0, :, 0, 0]))
    assert (tmp2 == numdim * (size - 1) * size // 2).all()
    tmp = torch.rand([2, 5, numdim, 2, 3], dtype=D).requires_grad_()
    res = comm.Allgather(tmp, 2)
    res.sum().backward()
    assert (tmp.grad == size * torch.ones_like(tmp)).all()


def scatter() -> None:
    if rank == 0:
        tmp = torch.rand([2, 5, size, 2, 3], dtype=D)
        for i in range(size):
            tmp[0, 0, i, 0, 0] = i
    else:
        tmp = torch.rand([1], dtype=D)
    res = comm.Scatter(tmp, 2, 1, 0)
    assert res.shape == (2, 5, 1, 2, 3)
    assert (res[0, 0, :, 0, 0] == rank).all()
    # scatter o gather
    if rank == 0:
        tmp = torch.rand([2, 5, size, 2, 3], dtype=D)
    else:
        tmp = torch.rand([1], dtype=D)
    res = comm.Scatter(tmp, 2, 1, 0)
    res2 = comm.Gather(res, 2, 0)
    if rank == 0:
        assert (res2 == tmp).all()
    # ad
    if rank == 0:
        tmp = torch.rand([2, 5, size, 2, 3], dtype=D).requires_grad_()
    else:
        tmp = torch.rand([1], dtype=D).requires_grad_()
    res = comm.Scatter(tmp, 2, 1, 0)
    res.sum().backward()
    if rank == 0:
        assert (tmp.grad == torch.ones_like(tmp)).all()
    else:
        assert (tmp.grad == torch.zeros_like(tmp)).all()


def alltoall() -> None:
    tmp = torch.rand([3, 4, 1, 4, size, 2], dtype=D)
    res1 = comm.Scatter(comm.Gather(tmp, 2, 0), 4, 1, 0)
    res2 = comm.Alltoall(tmp, 2, 4, 1)
    assert (res2 == res1).all()
    tmp = torch.rand([3, 4, 2, 4, 3 * size, 2], dtype=D)
    res = comm.Alltoall(tmp, 2, 4, 3)
    res2 = comm.Alltoall(res, 4, 2, 2)
    assert (res2 == tmp).all()
    tmp = torch.rand([3, 4, 2, 4, size, 2], dtype=D).requires_grad_()
    res = comm.Alltoall(tmp, 2, 4, 1)
    res.sum().backward()
    assert (tmp.grad == torch.ones_like(tmp)).all()
    # varying numelem: rank r receives r+1 slices along axis 1, gathers axis 0 (sizes differ too)
    total = size * (size + 1) // 2
    x = torch.arange((rank + 2) * total, dtype=D).reshape(rank + 2, total) + 1000 * rank
    y = comm.Alltoall(x, 0, 1, rank + 1)
    off = rank * (rank + 1) // 2
    want = torch.cat(
        [
            torch.arange((r + 2) * total, dtype=D).reshape(r + 2, total)[:, off : off + rank + 1] + 1000 * r
            for r in range(size)
        ]
    )
    assert torch.equal(y, want), (y, want)
    back = comm.Alltoall(y, 1, 0, rank + 2)
    assert torch.equal(back, x)
    # gatheraxis == scatteraxis: re-partition [r+1 rows each] into [size-r rows each]
    x = torch.arange(rank * (rank + 1) // 2, (rank + 1) * (rank + 2) // 2, dtype=D).view(-1, 1).repeat(1, 2)
    y = comm.Alltoall(x, 0, 0, size - rank)
    start = sum(size - r for r in range(rank))
    assert torch.equal(y[:, 0], torch.arange(start, start + size - rank, dtype=D)), y
    assert torch.equal(comm.Alltoall(y, 0, 0, rank + 1), x)


def joindummies() -> None:
    tmp = torch.rand(10, dtype=D).requires_grad_()
    tmp2 = torch.rand(10, dtype=D).requires_grad_()
    tmp3 = torch.rand(10, dtype=D).requires_grad_()
    res = comm.Allreduce(tmp, mpiad.MPI_SUM)
    res2 = mpiad.JoinDummies(res, [tmp2, tmp3])
    res2.sum().backward()
    assert (tmp2.grad == torch.zeros(10, dtype=D)).all()
    assert (tmp3.grad == torch.zeros(10, dtype=D)).all()
    assert (tmp.grad == size * torch.ones(10, dtype=D)).all()


def interop() -> None:
    comm1 = MPI.COMM_WORLD
    comm2 = mpiad.comm_from_mpi4py(comm1)
    assert comm1.rank == comm2.rank and comm1.size == comm2.size
    tmp = torch.rand(10, dtype=D).requires_grad_()
    res = comm2.Allreduce(tmp, mpiad.MPI_SUM)
    res.sum().backward()
    assert (tmp.grad == comm2.size * torch.ones(10, dtype=D)).all()
    # sub-communicators: even / odd ranks
    sub = mpiad.comm_from_mpi4py(MPI.COMM_WORLD.Split(rank % 2, rank))
    members = [r for r in range(size) if r % 2 == rank % 2]
    assert sub.size == len(members) and sub.rank == members.index(rank)
    x = torch.tensor([float(rank)], dtype=D, requires_grad=True)
    y = sub.Allreduce(x, mpiad.MPI_SUM)
    assert y.item() == sum(members)
    (y * (rank + 1)).sum().backward()
    assert x.grad.item() == sum(m + 1 for m in members)
    g = sub.Allgather(x.detach().view(1, 1), 0)
    assert g.view(-1).tolist() == [float(m) for m in members]
    # mpi4py and mpiad traffic interleaved on the same communicator
    obj = MPI.COMM_WORLD.allreduce(rank)
    assert obj == size * (size - 1) // 2


def nonblocking() -> None:
    tmp = torch.rand(100000, dtype=D).requires_grad_()
    req = comm.Isend(tmp, (rank + 1) % size, 0)
    req2 = comm.Irecv(mpiad.JoinDummies(torch.empty_like(tmp), [req.dummy]), (rank + size - 1) % size, 0)
    res = comm.Wait(mpiad.JoinDummiesHandle(req, [req2.dummy]))
    res2 = comm.Wait(mpiad.JoinDummiesHandle(req2, [res]))
    assert torch.equal(res, tmp.detach())
    res3 = res2 * rank
    res3.sum().backward()
    assert (tmp.grad == ((rank + 1) % size) * torch.ones_like(tmp)).all()
    # values of the ring exchange
    x = torch.full((3,), float(rank), dtype=D)
    h = comm.Isend(x, (rank + 1) % size, 5)
    y = comm.Recv(torch.empty(3, dtype=D), (rank - 1) % size, 5)
    comm.Wait(h)
    assert (y == (rank - 1) % size).all()


def seed_example() -> None:
    """The README's Isend-Recv-Wait idiom with JoinDummies, between ranks 0 and 1."""
    if size < 2 or rank > 1:
        return
    other = 1 - rank
    sendbuffer = torch.full((4,), float(rank + 1), dtype=D, requires_grad=True)
    recvbuffer = torch.empty(4, dtype=D)
    handle = comm.Isend(sendbuffer, other, 0)
    res1 = comm.Recv(mpiad.JoinDummies(recvbuffer, [handle.dummy]), other, 0)
    res2 = comm.Wait(mpiad.JoinDummiesHandle(handle, [res1]))
    res = (mpiad.JoinDummies(res1, [res2]) ** 2) * (rank + 1)
    assert (res1 == other + 1).all()
    res.sum().backward()
    # d/dsend of the partner's loss (other+1) * send^2
    assert torch.allclose(sendbuffer.grad, torch.full((4,), 2.0 * (rank + 1) * (other + 1), dtype=D))


for fn in (
    allreduce,
    reduce_,
    bcast_,
    gather,
    allgather,
    scatter,
    alltoall,
    joindummies,
    interop,
    nonblocking,
    seed_example,
):
    fn()
    MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"port_mpi4torch: all checks passed on {size} ranks")
