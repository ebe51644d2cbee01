"""CUDA tensors through mpiad (run by test_gpu.py, one process group per mode).

Every op runs twice on the same inputs, on CPU tensors and on CUDA tensors
(staged through pinned host memory unless the MPI is CUDA-aware): values and
gradients must agree. Modes: ``collectives`` (blocking and non-blocking, with
autograd), ``p2p`` (Isend/Irecv/Wait, Send/Recv, Sendrecv; an Irecv fills the
CUDA tensor passed in), ``data_parallel`` (a CUDA model's averaged gradients).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
S = mpiad
DEV = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(DEV)
D = torch.double
Fn = Callable[[torch.Tensor], torch.Tensor]


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.device.type == "cuda", (what, a.device)
    a = a.cpu()
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12), (what, rank, a, b)


def compare(name: str, x0: torch.Tensor, fn: Fn) -> None:
    """fn on CPU and on CUDA: values and gradients (rank-dependent upstream) agree."""
    res = []
    for dev in ("cpu", DEV):
        x = x0.clone().to(dev).requires_grad_()
        y = fn(x * 1.0)
        w = torch.arange(1.0, y.numel() + 1, dtype=D, device=dev).view_as(y) * (rank + 1)
        (y * w).sum().backward()
        res.append((y.detach(), x.grad))
    (yc, gc), (yg, gg) = res
    same(yg, yc, f"{name} value")
    same(gg, gc, f"{name} grad")


def rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, dtype=D, generator=torch.Generator().manual_seed(7 + rank)) + 0.5


def collectives() -> None:
    ns = [r + 1 for r in range(size)]
    total, root = sum(ns), size - 1
    for op in (S.MPI_SUM, S.MPI_AVG, S.MPI_MAX, S.MPI_PROD):
        compare(f"Allreduce {op}", rand(3, 2), lambda x, op=op: comm.Allreduce(x, op))
        compare(f"Iallreduce {op}", rand(3, 2), lambda x, op=op: comm.Wait(comm.Iallreduce(x, op)))
        compare(f"Reduce_ {op}", rand(4), lambda x, op=op: comm.Reduce_(x, op, root))
    compare("Bcast_", rand(2, 3), lambda x: comm.Bcast_(x, root))
    compare("Ibcast_", rand(2, 3), lambda x: comm.Wait(comm.Ibcast_(x, root)))
    compare("Ireduce_", rand(4), lambda x: comm.Wait(comm.Ireduce_(x, S.MPI_SUM, 0)))
    compare("Gather", rand(2, rank + 1), lambda x: comm.Gather(x, 1, 0))
    compare("Igather", rand(2, rank + 1), lambda x: comm.Wait(comm.Igather(x, 1, 0)))
    compare("Allgather", rand(rank + 1, 2), lambda x: comm.Allgather(x, 0))
    compare("Iallgather", rand(rank + 1, 2), lambda x: comm.Wait(comm.Iallgather(x, 0)))
    compare("Scatter", rand(total, 2), lambda x: comm.Scatter(x, 0, rank + 1, root))
    compare("Iscatter", rand(total, 2), lambda x: comm.Wait(comm.Iscatter(x, 0, rank + 1, root)))
    compare("Alltoall", rand(rank + 2, total), lambda x: comm.Alltoall(x, 0, 1, rank + 1))
    compare("Ialltoall", rand(rank + 2, total), lambda x: comm.Wait(comm.Ialltoall(x, 0, 1, rank + 1)))
    compare("Reduce_scatter", rand(2, total), lambda x: comm.Reduce_scatter(x, S.MPI_SUM, 1, rank + 1))
    compare("Ireduce_scatter", rand(2, total), lambda x: comm.Wait(comm.Ireduce_scatter(x, S.MPI_SUM, 1, rank + 1)))
    # a non-contiguous CUDA input, written back in place
    t = torch.zeros(4, 3, device=DEV).t() + rank
    comm.Bcast_(t, 0)
    assert torch.equal(t.cpu(), torch.zeros(3, 4))
    # float16 on the device
    h = torch.full((5,), float(rank + 1), dtype=torch.float16, device=DEV)
    assert torch.equal(comm.Allreduce(h, S.MPI_SUM).cpu(), torch.full((5,), size * (size + 1) / 2).half())
    # out= on the device: the staged result is copied straight into it; in place too
    x = torch.full((1000,), float(rank + 1), device=DEV)
    out = torch.empty_like(x)
    assert comm.Allreduce(x, S.MPI_SUM, out=out) is out
    assert torch.equal(out.cpu(), torch.full((1000,), size * (size + 1) / 2))
    assert comm.Allreduce(x, S.MPI_MAX, out=x) is x and torch.equal(x.cpu(), torch.full((1000,), float(size)))
    # staging buffers come back to the pinned pool and are reused (no new cudaHostAlloc)
    from mpiad import _pinned

    if not mpiad.cuda_aware():
        comm.Allreduce(x, S.MPI_SUM)
        misses = _pinned.pool.misses
        for _ in range(5):
            comm.Allreduce(x, S.MPI_SUM, out=out)
            comm.Allreduce(x, S.MPI_SUM)
        assert _pinned.pool.misses == misses, (misses, _pinned.pool.misses)


def p2p() -> None:
    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def ring(x: torch.Tensor) -> torch.Tensor:
        h = comm.Isend(x, nxt, 7)
        res1 = comm.Recv(mpiad.JoinDummies(torch.empty(4, dtype=D, device=x.device), [h.dummy]), prv, 7)
        res2 = comm.Wait(mpiad.JoinDummiesHandle(h, [res1]))
        return mpiad.JoinDummies(res1, [res2])

    compare("Isend/Recv/Wait ring", rand(4), ring)
    compare("Sendrecv", rand(3), lambda x: comm.Sendrecv(x, nxt, 1, None, prv, 1))
    # an Irecv fills the CUDA tensor it is given (and returns it), contiguous or not
    for buf in (torch.zeros(6, dtype=D, device=DEV), torch.zeros(3, 2, dtype=D, device=DEV).t()):
        h = comm.Isend(torch.full(buf.shape, float(rank + 1), dtype=D, device=DEV), nxt, 9)
        got = comm.Wait(comm.Irecv(buf, prv, 9))
        comm.Wait(h)
        assert got.device == DEV and got.data_ptr() == buf.data_ptr(), (got.device, buf.device)
        assert torch.equal(buf.cpu(), torch.full(buf.shape, float(prv + 1), dtype=D))


def data_parallel() -> None:
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    gpu = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double().to(DEV)
    gpu.load_state_dict(cpu.state_dict())
    grads = []
    for net in (mpiad.DataParallel(cpu, bucket_cap_mb=0.0002), mpiad.DataParallel(gpu, bucket_cap_mb=0.0002)):
        dev = next(net.parameters()).device
        x = rand(4, 6).to(dev)
        net(x).square().sum().backward()
        grads.append([p.grad for p in net.parameters()])
    for gc, gg in zip(*grads):
        same(gg, gc, "DataParallel grad")


{"collectives": collectives, "p2p": p2p, "data_parallel": data_parallel}[sys.argv[1]]()
torch.cuda.synchronize()
MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"cuda {sys.argv[1]}: all checks passed on {size} ranks")
