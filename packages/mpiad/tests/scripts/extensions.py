"""Beyond mpi4torch: every dtype, MINLOC/MAXLOC, Reduce_scatter/Sendrecv/Barrier,
bad input (raised before any communication), debug mode."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mpi4py.MPI as MPI
import pytest
import torch

import mpiad
from mpiad import _algo

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
W = MPI.COMM_WORLD
S = mpiad


def local(r: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank r's input, known on every rank (so references need no communication)."""
    base = torch.arange(6) % 3 + r + 1
    if dtype == torch.bool:
        return (torch.arange(6) + r) % 2 == 0
    if dtype.is_complex:
        return torch.complex(base.double(), -base.double() + 0.5).to(dtype)
    return base.to(dtype)


def stack(dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([local(r, dtype) for r in range(size)])


REDUCE: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    S.MPI_SUM: lambda t: t.sum(0).to(t.dtype),
    S.MPI_PROD: lambda t: t.prod(0).to(t.dtype),
    S.MPI_MAX: lambda t: t.amax(0) if t.dtype != torch.bool else t.any(0),
    S.MPI_MIN: lambda t: t.amin(0) if t.dtype != torch.bool else t.all(0),
    S.MPI_LAND: lambda t: t.bool().all(0).to(t.dtype),
    S.MPI_LOR: lambda t: t.bool().any(0).to(t.dtype),
    S.MPI_LXOR: lambda t: (t.bool().sum(0) % 2 == 1).to(t.dtype),
}


def _band(t: torch.Tensor) -> torch.Tensor:
    out = t[0]
    for x in t[1:]:
        out = out & x
    return out


def _bor(t: torch.Tensor) -> torch.Tensor:
    out = t[0]
    for x in t[1:]:
        out = out | x
    return out


def _bxor(t: torch.Tensor) -> torch.Tensor:
    out = t[0]
    for x in t[1:]:
        out = out ^ x
    return out


REDUCE.update({S.MPI_BAND: _band, S.MPI_BOR: _bor, S.MPI_BXOR: _bxor})
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
CPLX = (torch.complex64, torch.complex128)
ALL = FLOATS + INTS + CPLX + (torch.bool,)


def ops_for(dtype: torch.dtype) -> list[int]:
    if dtype in FLOATS:
        return [S.MPI_SUM, S.MPI_PROD, S.MPI_MAX, S.MPI_MIN]
    if dtype in CPLX:
        return [S.MPI_SUM, S.MPI_PROD]
    if dtype == torch.bool:
        return [S.MPI_MAX, S.MPI_MIN, S.MPI_LAND, S.MPI_LOR, S.MPI_LXOR, S.MPI_BAND, S.MPI_BOR, S.MPI_BXOR]
    return list(REDUCE)


def real_sum(y: torch.Tensor) -> torch.Tensor:
    s = y.sum()
    return s.real if s.is_complex() else s


# ---------------------------------------------------------------- every dtype
for dt in ALL:
    x = local(rank, dt)
    for op in ops_for(dt):
        want = REDUCE[op](stack(dt))
        got = comm.Allreduce(x, op)
        assert got.dtype == dt and torch.equal(got, want), (dt, op, got, want)
        red = comm.Reduce_(x.clone(), op, size - 1)
        assert torch.equal(red, want if rank == size - 1 else torch.zeros_like(want)), (dt, op, red)
    assert torch.equal(comm.Bcast_(x.clone(), 0), local(0, dt))
    assert torch.equal(comm.Allgather(x.view(2, 3), 1), torch.cat([local(r, dt).view(2, 3) for r in range(size)], 1))
    g = comm.Gather(x.view(6, 1), 0, 0)
    if rank == 0:
        assert torch.equal(g, stack(dt).view(-1, 1))
    root_t = torch.cat([local(r, dt) for r in range(size)]) if rank == 0 else torch.empty(0, dtype=dt)
    assert torch.equal(comm.Scatter(root_t, 0, 6, 0), x)
    a2a = comm.Alltoall(x.repeat(size).view(1, -1), 0, 1, 6)
    assert torch.equal(a2a, stack(dt)), dt
    recv = comm.Sendrecv(x, (rank + 1) % size, 2, None, (rank - 1) % size, 2)
    assert torch.equal(recv, local((rank - 1) % size, dt))
    if dt in FLOATS + CPLX:  # gradients flow in every floating dtype
        xg = x.clone().requires_grad_()
        real_sum(comm.Allreduce(xg, S.MPI_SUM)).backward()
        assert torch.equal(xg.grad, torch.full_like(xg, size)), (dt, xg.grad)
        xg = x.clone().view(2, 3).requires_grad_()
        real_sum(comm.Allgather(xg, 0)).backward()
        assert torch.equal(xg.grad, torch.full_like(xg, size))

# float16 / bfloat16 sums are computed in float32 and rounded once per combine
if size == 2:
    for dt in (torch.float16, torch.bfloat16):
        gen = torch.Generator().manual_seed(7)
        xs = [torch.randn(1000, generator=gen).to(dt) for _ in range(2)]
        got = comm.Allreduce(xs[rank], S.MPI_SUM)
        assert torch.equal(got, (xs[0].float() + xs[1].float()).to(dt)), dt
big = torch.full((4,), 40000.0, dtype=torch.float16)  # 40000 * size overflows float16 for size >= 2
assert torch.isinf(comm.Allreduce(big, S.MPI_SUM)).all() == (size >= 2)

# MINLOC / MAXLOC: (value, index) pairs; ties -> lower index
for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
    vals = torch.tensor([rank, -rank, 5, rank % 2], dtype=torch.float64)
    pairs = torch.stack([vals, torch.full((4,), rank, dtype=torch.float64)], -1).to(dt)
    mx = comm.Allreduce(pairs, S.MPI_MAXLOC).double()
    mn = comm.Allreduce(pairs, S.MPI_MINLOC).double()
    assert mx[:, 0].tolist() == [size - 1, 0, 5, min(1, size - 1)] and mx[:, 1].tolist() == [
        size - 1,
        0,
        0,
        min(1, size - 1),
    ], mx
    assert mn[:, 0].tolist() == [0, -(size - 1), 5, 0] and mn[:, 1].tolist() == [0, size - 1, 0, 0], mn

# large messages: every Allreduce algorithm (MPI_Allreduce; Reduce + Bcast on one node; the ring
# across nodes)
for mode in ("mpi", "reduce_bcast", "ring", "auto"):
    _algo.configure(mode, 1 << 18)  # exercise the large-message algorithms with 512 KiB messages
    big = torch.arange(1 << 17, dtype=torch.float32) * (rank + 1)  # 512 KiB
    want = torch.arange(1 << 17, dtype=torch.float32) * (size * (size + 1) // 2)
    assert torch.equal(comm.Allreduce(big, S.MPI_SUM), want), mode
    inplace = big.clone()
    assert comm.Allreduce(inplace, S.MPI_SUM, out=inplace) is inplace and torch.equal(inplace, want)
    bh = torch.full((1 << 18,), float(rank + 1), dtype=torch.float16)
    assert torch.equal(comm.Allreduce(bh, S.MPI_MAX), torch.full_like(bh, size))
    bg = big.clone().requires_grad_()
    yb = comm.Allreduce(bg, S.MPI_SUM)
    (yb * (rank + 1)).sum().backward()
    assert torch.equal(bg.grad, torch.full_like(big, size * (size + 1) // 2))
    # MPI_AVG: the sum divided by the size, forward and backward, on both algorithms
    avg = comm.Allreduce(big, S.MPI_AVG)
    assert torch.allclose(avg, want / size), mode
    ag = big.clone().requires_grad_()
    (comm.Allreduce(ag, S.MPI_AVG) * (rank + 1)).sum().backward()
    assert torch.allclose(ag.grad, torch.full_like(big, (size + 1) / 2)), mode
_algo.configure()

# The pipelined ring (the default across nodes from MPIAD_RING_BYTES), forced for every size:
# item counts that do not split evenly into blocks and 1 MiB pieces (fewer items than ranks,
# pieces with one item more), every kind of reduction, in place, MPI_AVG, autograd.
_algo.configure("ring", 0)
for n in (0, 1, size - 1, size + 1, 1001, (1 << 18) + 3, (1 << 19) + size):
    for dt in (torch.float32, torch.float64, torch.int64, torch.int8, torch.float16, torch.bfloat16):
        x = (torch.arange(n) % 7 + rank).to(dt)
        want = (torch.arange(n) % 7 * size + size * (size - 1) // 2).to(dt)
        assert torch.equal(comm.Allreduce(x, S.MPI_SUM), want), (n, dt)
        ip = x.clone()
        assert comm.Allreduce(ip, S.MPI_SUM, out=ip) is ip and torch.equal(ip, want), (n, dt)
        assert torch.equal(comm.Allreduce(x, S.MPI_MIN), (torch.arange(n) % 7).to(dt)), (n, dt)
    if n:
        # (value, index) pairs: the largest |value| is on the odd ranks (ties: the lowest rank)
        v = (torch.arange(n, dtype=torch.float64) % 5) * (1 if rank % 2 else -1)
        pairs = torch.stack([v, torch.full((n,), float(rank), dtype=torch.float64)], -1)
        mx = comm.Allreduce(pairs, S.MPI_MAXLOC)
        zero = torch.arange(n) % 5 == 0
        assert torch.equal(mx[:, 0], torch.arange(n, dtype=torch.float64) % 5 if size > 1 else v), n
        assert torch.equal(mx[:, 1], torch.where(zero | (size == 1), 0.0, 1.0).double()), n
    avg = comm.Allreduce(torch.full((n,), float(rank + 1)), S.MPI_AVG)
    assert torch.allclose(avg, torch.full((n,), (size + 1) / 2)), n
    g = torch.ones(n, requires_grad=True)
    (comm.Allreduce(g, S.MPI_SUM) * (rank + 1)).sum().backward()
    assert torch.equal(g.grad, torch.full((n,), float(size * (size + 1) // 2))), n
# sums that round: every rank ends with the same bits, close to MPI_Allreduce's
noisy = torch.rand((1 << 19) + 5, generator=torch.Generator().manual_seed(rank), dtype=torch.float32)
ring_sum = comm.Allreduce(noisy, S.MPI_SUM)
assert all(torch.equal(ring_sum, t) for t in W.allgather(ring_sum)), "ring results differ between ranks"
_algo.configure("mpi")
assert torch.allclose(ring_sum, comm.Allreduce(noisy, S.MPI_SUM), rtol=1e-5)
# an intercommunicator keeps MPI_Allreduce (its result combines the *other* group's values)
if size % 2 == 0:
    local = MPI.COMM_WORLD.Split(rank % 2, rank)
    inter_mpi = local.Create_intercomm(0, MPI.COMM_WORLD, 1 - rank % 2, tag=7)
    inter = mpiad.comm_from_mpi4py(inter_mpi)
    _algo.configure("ring", 0)
    got = inter.Allreduce(torch.full((1000,), float(rank + 1)), S.MPI_SUM)
    others = sum(r + 1 for r in range(size) if r % 2 != rank % 2)
    assert torch.equal(got, torch.full((1000,), float(others))), (got[:3], others)
    inter_mpi.Free()
    local.Free()
# a communicator the ring used (it keeps a communicator of its own) is freed with it, many times over
_algo.configure("ring", 0)
for i in range(40):
    sub_mpi = MPI.COMM_WORLD.Split(rank % 2, rank)
    sub = mpiad.comm_from_mpi4py(sub_mpi)
    got = sub.Allreduce(torch.full((1000,), float(i)), S.MPI_SUM)
    assert torch.equal(got, torch.full((1000,), float(i * sub_mpi.size)))
    sub_mpi.Free()
_algo.configure()
assert _algo.ring_bytes() == mpiad._mpiad.RING_BYTES and _algo.large_bytes() == _algo.DEFAULT_LARGE_BYTES
os.environ["MPIAD_RING_BYTES"] = "256k"  # not a number of bytes
with pytest.raises(ValueError, match="MPIAD_RING_BYTES"):
    _algo.configure()
del os.environ["MPIAD_RING_BYTES"]
for bad in ({"mode": "rings"}, {"ring_bytes": -1}, {"large_bytes": -5}):
    try:
        _algo.configure(**bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"configure({bad}) did not raise")
_algo.configure()

# Reduce_scatter, default equal split
x = torch.arange(2 * size, dtype=torch.float32) * (rank + 1)
rs = comm.Reduce_scatter(x, S.MPI_SUM)
assert torch.equal(rs, torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) * (size * (size + 1) // 2))
rs = comm.Reduce_scatter(torch.full((size, 2), rank, dtype=torch.int64), S.MPI_MAX, 0)
assert torch.equal(rs, torch.full((1, 2), size - 1, dtype=torch.int64))
comm.Barrier()

# non-contiguous inputs are handled
x = torch.arange(12.0).view(3, 4).t() * (rank + 1)
assert torch.equal(comm.Allreduce(x, S.MPI_SUM), torch.arange(12.0).view(3, 4).t() * (size * (size + 1) // 2))
x = torch.zeros(4, 3).t() + rank  # a non-contiguous view, written in place
comm.Bcast_(x, 0)
assert torch.equal(x, torch.zeros(3, 4))

# no-grad fast path returns the right thing under no_grad too
with torch.no_grad():
    y = comm.Allreduce(torch.ones(3, requires_grad=True), S.MPI_SUM)
    assert not y.requires_grad and torch.equal(y, torch.full((3,), float(size)))


# ------------------------------------------------------------ bad input
def raises(exc: type[BaseException], fn: Callable[[], Any], *words: str) -> None:
    try:
        fn()
    except exc as e:
        msg = str(e)
        assert all(w in msg for w in words), (msg, words)
    else:
        raise AssertionError(f"no {exc.__name__} raised (expected words {words})")


t = torch.ones(3)
if rank == 0:  # only rank 0: if any of these communicated, the job would hang
    raises(TypeError, lambda: comm.Allreduce([1.0, 2.0], S.MPI_SUM), "torch.Tensor", "list")
    raises(ValueError, lambda: comm.Allreduce(t, 99), "op = 99")
    raises(TypeError, lambda: comm.Allreduce(t, S.MPI_BAND), "MPI_BAND", "float32")
    raises(TypeError, lambda: comm.Allreduce(torch.ones(2, dtype=torch.complex64), S.MPI_MAX), "MPI_MAX", "complex64")
    raises(TypeError, lambda: comm.Allreduce(torch.ones(2, dtype=torch.bool), S.MPI_SUM), "MPI_SUM", "bool")
    raises(ValueError, lambda: comm.Allreduce(torch.ones(3), S.MPI_MAXLOC), "pairs", "(3,)")
    raises(TypeError, lambda: comm.Allreduce(torch.ones(2, dtype=torch.uint16), S.MPI_SUM), "dtype", "uint16")
    raises(TypeError, lambda: comm.Allreduce(torch.ones(2).to_sparse(), S.MPI_SUM), "strided")
    raises(TypeError, lambda: comm.Allreduce(t, "sum"), "op must be an int")
    raises(ValueError, lambda: comm.Bcast_(t, size), "root", str(size))
    raises(ValueError, lambda: comm.Bcast_(t, -1), "root = -1")
    raises(TypeError, lambda: comm.Bcast_(t, 0.0), "root must be an int")
    raises(ValueError, lambda: comm.Reduce_(t, S.MPI_SUM, size + 3), "root")
    raises(ValueError, lambda: comm.Gather(t, 1, 0), "gatheraxis = 1")
    raises(ValueError, lambda: comm.Gather(t, 0, size), "root")
    raises(ValueError, lambda: comm.Allgather(t.view(1, 3), 2), "gatheraxis = 2")
    raises(ValueError, lambda: comm.Scatter(t, 0, -1, 0), "numelem")
    raises(ValueError, lambda: comm.Scatter(t, 0, 1, size), "root")
    raises(ValueError, lambda: comm.Alltoall(t, 0, 1, 1), "scatteraxis = 1")
    raises(ValueError, lambda: comm.Alltoall(t, 0, 0, -2), "numelem")
    raises(ValueError, lambda: comm.Reduce_scatter(torch.ones(size + 1), S.MPI_SUM), "divide")
    raises(TypeError, lambda: comm.Reduce_scatter(torch.ones(2, 2), S.MPI_MAXLOC), "MPI_MAXLOC")
    raises(ValueError, lambda: comm.Isend(t, size, 0), "dest")
    raises(ValueError, lambda: comm.Isend(t, 0, -1), "tag")
    raises(ValueError, lambda: comm.Irecv(t, -1, 0), "source")
    raises(TypeError, lambda: comm.Irecv(t.numpy(), 0, 0), "torch.Tensor", "ndarray")
    raises(TypeError, lambda: comm.Wait("handle"), "WaitHandle")
    raises(ValueError, lambda: comm.Sendrecv(t, size), "dest")
    raises(TypeError, lambda: mpiad.JoinDummies(t, [1.0]), "dummies[0]")
    raises(TypeError, lambda: mpiad.JoinDummies(t, t), "list")
    raises(TypeError, lambda: mpiad.JoinDummies(3, [t]), "loopthrough")
    raises(TypeError, lambda: mpiad.JoinDummiesHandle(t, [t]), "WaitHandle")
    raises(TypeError, lambda: mpiad.comm_from_mpi4py(3), "mpi4py")
    raises(ValueError, lambda: mpiad.comm_from_mpi4py(MPI.COMM_NULL), "COMM_NULL")
W.Barrier()

# errors needing the other ranks' arguments: raised on every rank, before the data moves
raises(ValueError, lambda: comm.Scatter(torch.ones(size + 1), 0, 1, 0), "numelem", "sum to")
raises(ValueError, lambda: comm.Scatter(torch.ones(size), 3, 1, 0), "scatteraxis = 3", "root's 1-d")
# negative scatteraxis, resolved against root's tensor (non-roots pass a 1-d placeholder)
src = torch.arange(2.0 * size).view(2, size) if rank == 0 else torch.empty(1)
xg = src.clone().requires_grad_()
sc = comm.Scatter(xg, -1, 1, 0)
assert torch.equal(sc, torch.tensor([[float(rank)], [float(size + rank)]]))
(sc * (rank + 1)).sum().backward()
want = torch.arange(1.0, size + 1).repeat(2, 1) if rank == 0 else torch.zeros(1)
assert torch.equal(xg.grad, want), xg.grad
raises(ValueError, lambda: comm.Alltoall(torch.ones(2, size + 1), 0, 1, 1), "numelem", "sum to")
raises(ValueError, lambda: comm.Reduce_scatter(torch.ones(size), S.MPI_SUM, 0, 2 if rank == 0 else 1), "sum to")
raises(RuntimeError, lambda: comm.Gather(torch.ones(2, 2 + rank), 0, 0), "mismatching")
raises(
    RuntimeError,
    lambda: comm.Allgather(torch.ones(2, dtype=torch.float32 if rank else torch.float64), 0),
    "mismatching",
)
h = comm.Isend(t, rank, 0)
r = comm.Irecv(torch.empty(3), rank, 0)
comm.Wait(h)
comm.Wait(r)
raises(RuntimeError, lambda: comm.Wait(h), "already waited")
# a non-differentiable op in backward
xi = torch.ones(3, dtype=torch.float64, requires_grad=True)
raises(
    RuntimeError,
    lambda: comm.Reduce_scatter(xi * 1, S.MPI_MAX, 0, 3 if rank == 0 else 0).sum().backward(),
    "MPI_SUM only",
)
W.Barrier()

# --------------------------------------------------------------- debug mode
mpiad.set_debug(True)
assert mpiad.debug_enabled()
x = torch.ones(3 + (rank == size - 1))  # the last rank passes a different shape
raises(RuntimeError, lambda: comm.Allreduce(x, S.MPI_SUM), "mismatching collectives", f"rank {size - 1}", "Allreduce")
x = torch.ones(3)
if size > 1:
    call = (lambda: comm.Allreduce(x, S.MPI_SUM)) if rank == 0 else (lambda: comm.Bcast_(x, 0))
    raises(RuntimeError, call, "mismatching", "Allreduce", "Bcast_")
    call = (
        (lambda: comm.Reduce_(x.clone(), S.MPI_SUM, 0))
        if rank == 0
        else (lambda: comm.Reduce_(x.clone(), S.MPI_MAX, 0))
    )
    raises(RuntimeError, call, "mismatching", "Reduce_")
    xd = torch.ones(3, dtype=torch.float64 if rank == 0 else torch.float32)
    raises(RuntimeError, lambda: comm.Bcast_(xd, 0), "float64", "float32")
# matching calls pass, with autograd too
xg = torch.ones(3, requires_grad=True)
comm.Allreduce(xg, S.MPI_SUM).sum().backward()
assert torch.equal(xg.grad, torch.full((3,), float(size)))
assert torch.equal(comm.Bcast_(torch.full((2,), float(rank)), 0), torch.zeros(2))
mpiad.set_debug(None)

W.Barrier()
if rank == 0:
    print(f"extensions: all checks passed on {size} ranks")
