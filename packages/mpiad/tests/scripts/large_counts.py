"""Counts above INT_MAX.

``small``: every op on small buffers with the int limit lowered to 7 elements, so
the large-count paths (derived datatypes, chunked reductions, MPI_Alltoallw for
the v-collectives) run; the results must equal those of the ordinary calls.
``big``: a uint8 tensor of 2^31 + 24 bytes (above 2 GiB) through Allreduce,
Bcast_ and Send/Recv with the real limit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import mpi4py.MPI as MPI
import torch

import mpiad
from mpiad import _mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
S = mpiad
W = MPI.COMM_WORLD


def small() -> None:
    g = torch.Generator().manual_seed(rank)

    def rand(*shape: int) -> torch.Tensor:  # integer values: sums are exact in any order
        return torch.randint(0, 9, shape, generator=g).double()

    x = rand(5, 11)
    ns = [r + 9 for r in range(size)]
    total = sum(ns)
    pairs = torch.stack([rand(20), torch.full((20,), float(rank))], -1)
    ops: dict[str, Callable[[], torch.Tensor]] = {
        "Allreduce SUM": lambda: comm.Allreduce(x, S.MPI_SUM),
        "Allreduce AVG": lambda: comm.Allreduce(x, S.MPI_AVG),
        "Allreduce half MAX": lambda: comm.Allreduce(x.half(), S.MPI_MAX),
        "Allreduce MAXLOC": lambda: comm.Allreduce(pairs, S.MPI_MAXLOC),
        "Reduce_": lambda: comm.Reduce_(x.clone(), S.MPI_PROD, size - 1),
        "Bcast_": lambda: comm.Bcast_(x.clone(), size - 1),
        "Gather": lambda: comm.Gather(rand(ns[rank], 3), 0, 0),
        "Allgather": lambda: comm.Allgather(rand(2, ns[rank]), 1),
        "Scatter": lambda: comm.Scatter(rand(total, 2), 0, ns[rank], 0),
        "Alltoall g!=s": lambda: comm.Alltoall(rand(3, total), 0, 1, ns[rank]),
        "Alltoall g==s": lambda: comm.Alltoall(rand(ns[rank], 2), 0, 0, ns[-1 - rank]),
        "Reduce_scatter": lambda: comm.Reduce_scatter(rand(total, 2), S.MPI_SUM, 0, ns[rank]),
        "Sendrecv": lambda: comm.Sendrecv(x, (rank + 1) % size, 4, None, (rank - 1) % size, 4),
        "Isend/Recv": lambda: send_recv(x),
        "Iallreduce": lambda: comm.Wait(comm.Iallreduce(x, S.MPI_SUM)),
        "Iallgather": lambda: comm.Wait(comm.Iallgather(rand(ns[rank], 2), 0)),
        "Ireduce_scatter": lambda: comm.Wait(comm.Ireduce_scatter(rand(total), S.MPI_SUM, 0, ns[rank])),
    }
    want = {}
    state = g.get_state()
    for name, fn in ops.items():
        want[name] = fn()
    g.set_state(state)
    _mpiad.set_count_limit(7)
    try:
        for name, fn in ops.items():
            got = fn()
            assert got.shape == want[name].shape and torch.equal(got, want[name]), (name, got, want[name])
        # gradients through the large-count paths
        xg = x.clone().requires_grad_()
        (comm.Allgather(xg, 1) * (rank + 1)).sum().backward()
        assert torch.equal(xg.grad, torch.full_like(x, size * (size + 1) / 2))
    finally:
        _mpiad.set_count_limit(2**31 - 1)


def send_recv(x: torch.Tensor) -> torch.Tensor:
    h = comm.Isend(x, (rank + 1) % size, 6)
    out = comm.Recv(torch.empty_like(x), (rank - 1) % size, 6)
    comm.Wait(h)
    return out


def big() -> None:
    n = 2**31 + 24  # bytes: above INT_MAX elements
    x = torch.full((n,), rank + 1, dtype=torch.uint8)
    x[-1] = 7 * (rank + 1)
    comm.Allreduce(x, S.MPI_SUM, out=x)  # in place: chunked MPI_Allreduce calls
    s = size * (size + 1) // 2
    assert x[0].item() == s and x[2**31 - 1].item() == s and x[2**31].item() == s and x[-1].item() == 7 * s % 256
    assert bool((x[: 1 << 20] == s).all()) and bool((x[-(1 << 20) : -1] == s).all())
    if rank == 0:
        x[-2] = 99
    comm.Bcast_(x, 0)  # one derived datatype
    assert x[-2].item() == 99 and x[2**31 + 1].item() == s
    if size >= 2 and rank < 2:  # point to point: 0 -> 1
        if rank == 0:
            x[-3] = 42
            comm.Send(x, 1, 3)
        else:
            x[-3] = 0
            y = comm.Recv(x, 0, 3)
            assert y.data_ptr() == x.data_ptr() and x[-3].item() == 42
    del x
    W.Barrier()


(small if sys.argv[1:] == ["small"] else big)()
W.Barrier()
if rank == 0:
    print(f"large counts ({sys.argv[1]}): all checks passed on {size} ranks")
