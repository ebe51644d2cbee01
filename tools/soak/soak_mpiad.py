"""mpiad soak on N ranks: blocking and non-blocking collectives with autograd backward,
values and gradients checked exactly (integer-valued doubles) (run under mpiexec by tools/soak.py).

usage: soak_mpiad.py <seconds> <out dir>
"""

from __future__ import annotations

import faulthandler
import sys

import torch
from _probe import Soak

import mpiad

SECONDS, OUT = float(sys.argv[1]), sys.argv[2]
faulthandler.dump_traceback_later(SECONDS + 300)
comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
soak = Soak(comm.mpi4py, "mpiad", SECONDS, OUT)
gen = torch.Generator().manual_seed(7)  # the same draws on every rank: shapes and every rank's inputs
D = torch.double


def inputs(n: int) -> list[torch.Tensor]:
    """Every rank's input (integer values): each rank knows the others', so sums are closed-form."""
    return [torch.randint(-50, 50, (n, 3), generator=gen).to(D) for _ in range(size)]


while True:
    for _ in range(10):
        n = int(torch.randint(1, 200, (1,), generator=gen))
        xs = inputs(n)
        ws = inputs(n)  # each rank's upstream weights
        # Allreduce(SUM): value sum(x), gradient sum over ranks of their upstreams
        for nonblocking in (False, True):
            x = xs[rank].clone().requires_grad_()
            y = comm.Wait(comm.Iallreduce(x)) if nonblocking else comm.Allreduce(x)
            assert torch.equal(y.detach(), sum(xs)), (rank, "allreduce value")
            (y * ws[rank]).sum().backward()
            assert x.grad is not None and torch.equal(x.grad, sum(ws)), (rank, "allreduce grad")
            soak.ops["iallreduce" if nonblocking else "allreduce"] += 1
        # Allgather along 0: value every rank's rows in order; gradient the sum of the upstreams' rows of this rank
        x = xs[rank].clone().requires_grad_()
        nonblocking = bool(torch.randint(2, (1,), generator=gen))
        y = comm.Wait(comm.Iallgather(x, 0)) if nonblocking else comm.Allgather(x, 0)
        assert torch.equal(y.detach(), torch.cat(xs)), (rank, "allgather value")
        up = torch.cat(ws)
        (y * up).sum().backward()  # the same upstream on every rank: size times this rank's slice
        assert x.grad is not None and torch.equal(x.grad, size * ws[rank]), (rank, "allgather grad")
        soak.ops["allgather"] += 1
        # Bcast_ from a drawn root: value the root's, gradient at the root the sum of the upstreams
        root = int(torch.randint(size, (1,), generator=gen))
        x = xs[rank].clone().requires_grad_()
        y = comm.Bcast_(x * 1.0, root)
        assert torch.equal(y.detach(), xs[root]), (rank, "bcast value")
        (y * ws[rank]).sum().backward()
        exp = sum(ws) if rank == root else torch.zeros_like(xs[rank])
        assert x.grad is not None and torch.equal(x.grad, exp), (rank, "bcast grad")
        soak.ops["bcast"] += 1
    if not soak.next_round():
        break
soak.finish()
if rank == 0:
    print("mpiad soak ok", flush=True)
