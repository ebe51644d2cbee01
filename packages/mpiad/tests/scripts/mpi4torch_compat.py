# ruff: noqa: PT017  (plain asserts: this runs under mpiexec, not pytest)
"""Drop-in check: code written for mpi4torch, run with ``import mpiad as mpi4torch``.

Covers what the ported suite (port_mpi4torch.py) leaves out: mpi4torch's
public names and parameter names (keyword calls), the Alltoall equivalences
with rank-dependent numelem, the other two non-blocking orders (Isend/Recv/Wait,
Irecv/Send/Wait) on a message above the eager limit, mpi4torch's
examples/isend-recv-wait.py with its exact output, the in-place
semantics mpi4torch users observe (buffers filled, leaves overwritten,
aliases returned) and mpi4torch's test_torchscript.
"""

from __future__ import annotations

import inspect

import mpi4py.MPI as MPI
import torch

import mpiad as mpi4torch

comm = mpi4torch.COMM_WORLD
rank, size = comm.rank, comm.size
nxt, prv = (rank + 1) % size, (rank - 1) % size
D = torch.double
torch.manual_seed(7 + rank)


def api_surface() -> None:
    original_all = [
        "MPI_MAX",
        "MPI_MIN",
        "MPI_SUM",
        "MPI_PROD",
        "MPI_LAND",
        "MPI_BAND",
        "MPI_LOR",
        "MPI_BOR",
        "MPI_LXOR",
        "MPI_BXOR",
        "MPI_MINLOC",
        "MPI_MAXLOC",
        "WaitHandle",
        "JoinDummies",
        "JoinDummiesHandle",
        "MPI_Communicator",
        "COMM_WORLD",
        "comm_from_mpi4py",
        "deactivate_cuda_aware_mpi_support",
    ]
    missing = [n for n in original_all if n not in mpi4torch.__all__ or not hasattr(mpi4torch, n)]
    assert not missing, missing
    assert isinstance(comm, mpi4torch.MPI_Communicator)
    # parameter names of mpi4torch's MPI_Communicator methods (keyword calls must keep working)
    params = {
        "Allreduce": ["tensor", "op"],
        "Bcast_": ["tensor", "root"],
        "Reduce_": ["tensor", "op", "root"],
        "Gather": ["tensor", "gatheraxis", "root"],
        "Allgather": ["tensor", "gatheraxis"],
        "Scatter": ["tensor", "scatteraxis", "numelem", "root"],
        "Alltoall": ["tensor", "gatheraxis", "scatteraxis", "numelem"],
        "Isend": ["tensor", "dest", "tag"],
        "Irecv": ["tensor", "source", "tag"],
        "Wait": ["waithandle"],
        "Send": ["tensor", "dest", "tag"],
        "Recv": ["tensor", "source", "tag"],
    }
    for name, want in params.items():
        got = list(inspect.signature(getattr(comm, name)).parameters)[: len(want)]
        assert got == want, (name, got)
    assert list(inspect.signature(mpi4torch.JoinDummies).parameters) == ["loopthrough", "dummies"]
    assert list(inspect.signature(mpi4torch.JoinDummiesHandle).parameters) == ["handle", "dummies"]
    assert isinstance(comm.rank, int) and isinstance(comm.size, int)
    assert (comm.rank, comm.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    # any mpi4py communicator, e.g. COMM_SELF (a one-rank world of its own)
    selfcomm = mpi4torch.comm_from_mpi4py(MPI.COMM_SELF)
    assert (selfcomm.rank, selfcomm.size) == (0, 1)
    xs = torch.arange(3.0, requires_grad=True)
    ys = selfcomm.Allreduce(xs, mpi4torch.MPI_SUM)
    (ys * 2).sum().backward()
    assert torch.equal(ys, torch.arange(3.0)) and torch.equal(xs.grad, torch.full((3,), 2.0))
    # keyword calls as an mpi4torch user may write them
    x = torch.full((2, 3), float(rank + 1), dtype=D)
    assert torch.equal(
        comm.Allreduce(tensor=x, op=mpi4torch.MPI_SUM), torch.full((2, 3), size * (size + 1) / 2, dtype=D)
    )
    g = comm.Allgather(tensor=x, gatheraxis=0)
    assert g.shape == (2 * size, 3) and g[::2, 0].tolist() == [float(r + 1) for r in range(size)]
    s = comm.Scatter(tensor=torch.arange(size * 3, dtype=D).view(size, 3), scatteraxis=0, numelem=1, root=0)
    assert torch.equal(s, torch.arange(3 * rank, 3 * rank + 3, dtype=D).view(1, 3))
    a = comm.Alltoall(tensor=x, gatheraxis=0, scatteraxis=1, numelem=3 if rank == 0 else 0)
    assert a.shape == ((2 * size, 3) if rank == 0 else (2 * size, 0))


def alltoall_equivalences() -> None:
    # Alltoall == Scatter(Gather(.)) with a rank-dependent numelem and a rank-dependent gather size
    total = size * (size + 1) // 2
    tmp = torch.rand([3, 4, rank + 1, 4, total, 2], dtype=D)
    via_root = comm.Scatter(comm.Gather(tmp, 2, 0), 4, rank + 1, 0)
    direct = comm.Alltoall(tmp, 2, 4, rank + 1)
    assert direct.shape == (3, 4, total, 4, rank + 1, 2), direct.shape
    assert torch.equal(direct, via_root)
    # gatheraxis == scatteraxis: rank r holds the global indices [r(r+1)/2, (r+1)(r+2)/2) and
    # receives size-r of them, i.e. the tail of the global range counted from the back
    tmp = torch.rand([3, 4, rank + 1, 2], dtype=D)
    tmp[0, 0, :, 0] = torch.arange(rank * (rank + 1) // 2, (rank + 1) * (rank + 2) // 2, dtype=D)
    res = comm.Alltoall(tmp, 2, 2, size - rank)
    hi = total - (size - rank - 1) * (size - rank) // 2
    lo = total - (size - rank) * (size - rank + 1) // 2
    assert res.shape == (3, 4, size - rank, 2)
    assert torch.equal(res[0, 0, :, 0], torch.arange(lo, hi, dtype=D)), res[0, 0, :, 0]
    # backward of the equivalence: every element reaches exactly one place
    tmp = torch.rand([2, rank + 1, total], dtype=D, requires_grad=True)
    out = comm.Alltoall(tmp, 1, 2, rank + 1)
    (out * (rank + 1)).sum().backward()
    # element (i, j, k) of rank r's input lands on the rank owning column k
    owner = torch.repeat_interleave(torch.arange(size, dtype=D), torch.arange(1, size + 1))
    assert torch.equal(tmp.grad, (owner + 1).expand(2, rank + 1, total)), tmp.grad


N = 200_000  # 1.6 MB: above Open MPI's eager limit, so the messages really wait for their peer


def nonblocking_orders() -> None:
    # Isend, Recv, Wait with the JoinDummies chaining
    tmp = torch.rand(N, dtype=D).requires_grad_()
    req = comm.Isend(tmp, nxt, 0)
    buf = torch.empty_like(tmp)
    res = comm.Recv(mpi4torch.JoinDummies(buf, [req.dummy]), prv, 0)
    res2 = comm.Wait(mpi4torch.JoinDummiesHandle(req, [res]))
    assert torch.equal(res2, tmp.detach())  # Wait of an Isend gives the sent tensor
    assert res.data_ptr() == buf.data_ptr()  # received straight into the caller's buffer
    out = mpi4torch.JoinDummies(res, [res2]) * rank
    out.sum().backward()
    assert torch.equal(tmp.grad, torch.full_like(tmp, float(nxt)))
    # Irecv, Send, Wait
    tmp = torch.rand(N, dtype=D).requires_grad_()
    req = comm.Irecv(mpi4torch.JoinDummies(torch.empty_like(tmp), [tmp]), prv, 0)
    sent = comm.Send(tmp, nxt, 0)
    assert torch.equal(sent, tmp.detach())
    got = comm.Wait(mpi4torch.JoinDummiesHandle(req, [sent]))
    (got * rank).sum().backward()
    assert torch.equal(tmp.grad, torch.full_like(tmp, float(nxt)))
    # the values of both orders: a ring shift
    x = torch.arange(5, dtype=D) + 100 * rank
    h = comm.Irecv(torch.empty(5, dtype=D), prv, 9)
    comm.Send(x, nxt, 9)
    assert torch.equal(comm.Wait(h), torch.arange(5, dtype=D) + 100 * prv)
    # Recv without autograd fills (and returns) the given buffer
    buf = torch.zeros(5, dtype=torch.int64)
    h = comm.Isend(torch.arange(5) * (rank + 1), nxt, 11)
    got = comm.Recv(buf, prv, 11)
    comm.Wait(h)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(buf, torch.arange(5) * (prv + 1))


def large_tags() -> None:
    """mpi4torch passed any tag to MPI: tags up to MPI_TAG_UB - 10 work (backward uses tag + 10)."""
    ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    top = ub - 10
    x = torch.full((3,), float(rank + 1), dtype=D, requires_grad=True)
    h = comm.Isend(x, nxt, top)
    got = comm.Recv(mpi4torch.JoinDummies(torch.empty(3, dtype=D), [h.dummy]), prv, top)
    w = comm.Wait(mpi4torch.JoinDummiesHandle(h, [got]))
    assert torch.equal(got.detach(), torch.full((3,), float(prv + 1), dtype=D))
    (mpi4torch.JoinDummies(got, [w]) * (rank + 1)).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(nxt + 1), dtype=D)), x.grad
    try:
        comm.Isend(x, nxt, top + 1)
    except mpi4torch.MpiadValueError as e:
        assert "MPI_TAG_UB" in str(e)
    else:
        raise AssertionError("tag above MPI_TAG_UB - 10 accepted")


def isend_recv_wait_example() -> None:
    """mpi4torch's examples/isend-recv-wait.py: a ring, loss = a + received b."""
    a = torch.tensor([1.0 + rank]).requires_grad_()
    handle = comm.Isend(a, nxt, 0)
    recvbuffer = mpi4torch.JoinDummies(torch.empty_like(a), [handle.dummy])
    b = comm.Recv(recvbuffer, prv, 0)
    wait_ret = comm.Wait(mpi4torch.JoinDummiesHandle(handle, [b]))
    res = mpi4torch.JoinDummies(a + b, [wait_ret])
    assert res.tolist() == [2.0 + rank + prv], res
    res.backward()
    assert a.grad.tolist() == [2.0], a.grad  # 1 from a + b, 1 from the next rank's b


def inplace_semantics() -> None:
    # Reduce_ on a leaf that requires grad: the leaf's memory holds the result, grad = 1 everywhere
    tmp = torch.full((4,), float(rank + 1), dtype=D, requires_grad=True)
    res = comm.Reduce_(tmp, mpi4torch.MPI_SUM, 0)
    want = size * (size + 1) / 2 if rank == 0 else 0.0
    assert res.data_ptr() == tmp.data_ptr()
    assert (res == want).all() and (tmp.detach() == want).all(), (res, tmp)
    (res * 3).sum().backward()
    assert torch.equal(tmp.grad, torch.full((4,), 3.0, dtype=D))
    # Bcast_ on a leaf: non-roots' leaves are overwritten with root's values
    root = size - 1
    tmp = torch.full((3,), float(rank), dtype=D, requires_grad=True)
    res = comm.Bcast_(tmp, root)
    assert res.data_ptr() == tmp.data_ptr() and (tmp.detach() == root).all()
    (res * (rank + 1)).sum().backward()
    want = float(size * (size + 1) // 2) if rank == root else 0.0
    assert torch.equal(tmp.grad, torch.full((3,), want, dtype=D)), tmp.grad
    # without autograd: integer tensors, written in place, non-root zeros
    t = torch.tensor([rank + 1, 2 * (rank + 1)], dtype=torch.int32)
    r = comm.Reduce_(t, mpi4torch.MPI_MAX, root)
    assert r.data_ptr() == t.data_ptr()
    assert t.tolist() == ([size, 2 * size] if rank == root else [0, 0])
    t = torch.tensor([rank], dtype=torch.int64)
    comm.Bcast_(t, 0)
    assert t.item() == 0
    # Reduce_'s reuse guard for non-leaves (mpi4torch raised RuntimeError in backward)
    tmp = 0.0 + torch.rand(10, dtype=D).requires_grad_()
    res = tmp + comm.Reduce_(tmp, mpi4torch.MPI_SUM, 0)
    try:
        res.sum().backward()
    except RuntimeError as e:
        assert "Reuse of variables passed to in-place MPI kernels not supported! Try using the return value" in str(e)
    else:
        raise AssertionError("reusing Reduce_'s input did not raise")
    # JoinDummies: the same object without grad-requiring dummies, an alias otherwise
    y = torch.zeros(3)
    assert mpi4torch.JoinDummies(y, [torch.ones(2)]) is y
    d = torch.ones(2, requires_grad=True)
    j = mpi4torch.JoinDummies(y, [d])
    assert j.requires_grad and j.data_ptr() == y.data_ptr()
    (j * 2).sum().backward()
    assert torch.equal(d.grad, torch.zeros(2))


def gather_nonroot_and_scatter_nonroot() -> None:
    # non-root ranks get an empty gather axis, keep the other sizes and the dtype
    x = torch.full((2, rank + 1, 3), rank, dtype=torch.int32)
    g = comm.Gather(x, 1, 0)
    if rank == 0:
        assert g.shape == (2, size * (size + 1) // 2, 3) and g.dtype == torch.int32
        assert g[0, :, 0].tolist() == [r for r in range(size) for _ in range(r + 1)]
    else:
        assert g.shape == (2, 0, 3) and g.dtype == torch.int32
    # Scatter: non-root ranks pass any tensor of the right dtype (mpi4torch's tests pass rand([1]))
    src = torch.arange(4 * size, dtype=torch.float32).view(4, size) if rank == 0 else torch.rand(1)
    s = comm.Scatter(src, 1, 1, 0)
    assert torch.equal(s, (torch.arange(4, dtype=torch.float32) * size + rank).view(4, 1)), s


def torchscript_as_in_mpi4torch() -> None:
    """mpi4torch's test_torchscript as its authors wrote it: a scripted function whose
    communicator argument is annotated with the class, the op a module constant."""
    tmp = torch.rand(10, dtype=torch.double).requires_grad_()

    @torch.jit.script
    def myfunc(x, comm_: mpi4torch.MPI_Communicator):  # type: ignore[no-untyped-def]
        return comm_.Allreduce(x, mpi4torch.MPI_SUM)

    res = myfunc(tmp, comm)
    res.sum().backward()
    assert (tmp.grad == comm.size * torch.ones(10, dtype=torch.double)).all()


def errors_are_runtime_errors() -> None:
    """mpi4torch's TorchScript communicator surfaced every error as RuntimeError; mpiad's
    ValueError / TypeError subclasses are RuntimeErrors too, raised on every rank."""
    bad = [
        (lambda: comm.Allreduce(torch.ones(2), 12), mpi4torch.MpiadValueError, "op = 12"),
        (lambda: comm.Allreduce([1.0], mpi4torch.MPI_SUM), mpi4torch.MpiadTypeError, "torch.Tensor"),
        (lambda: comm.Allreduce(torch.ones(2), mpi4torch.MPI_BXOR), mpi4torch.MpiadTypeError, "MPI_BXOR"),
        (lambda: comm.Bcast_(torch.ones(2), size), mpi4torch.MpiadValueError, "root"),
        (lambda: comm.Gather(torch.ones(2), 1, 0), mpi4torch.MpiadValueError, "gatheraxis"),
        (lambda: comm.Scatter(torch.ones(1, 3), 0, 2, 0), mpi4torch.MpiadValueError, "sum to"),
        (lambda: comm.Alltoall(torch.ones(2, size + 1), 0, 1, 1), mpi4torch.MpiadValueError, "sum to"),
        (lambda: comm.Isend(torch.ones(2), size + 2, 0), mpi4torch.MpiadValueError, "dest"),
        (lambda: comm.Wait(None), mpi4torch.MpiadTypeError, "WaitHandle"),  # type: ignore[arg-type]
    ]
    for fn, exc, words in bad:
        try:
            fn()
        except RuntimeError as e:
            assert isinstance(e, exc) and words in str(e), (type(e), e)
        else:
            raise AssertionError(f"no error for {words}")
    assert issubclass(mpi4torch.MpiadValueError, ValueError) and issubclass(mpi4torch.MpiadTypeError, TypeError)


for fn in (
    errors_are_runtime_errors,
    api_surface,
    alltoall_equivalences,
    nonblocking_orders,
    large_tags,
    isend_recv_wait_example,
    inplace_semantics,
    gather_nonroot_and_scatter_nonroot,
    torchscript_as_in_mpi4torch,
):
    fn()
    MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"mpi4torch_compat: all checks passed on {size} ranks")
