"""Single-process checks: the API surface, constants, local validation, staging helpers."""

from __future__ import annotations

import pytest
import torch

import mpiad
from mpiad import _staging


def test_mpi4torch_names_and_constant_values() -> None:
    names = [
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
    ]
    assert [getattr(mpiad, n) for n in names] == list(range(12))  # mpi4torch's numbering
    for n in [
        "COMM_WORLD",
        "comm_from_mpi4py",
        "JoinDummies",
        "JoinDummiesHandle",
        "WaitHandle",
        "MPI_Communicator",
        "deactivate_cuda_aware_mpi_support",
    ]:
        assert n in mpiad.__all__
    methods = [
        "Allreduce",
        "Bcast_",
        "Reduce_",
        "Gather",
        "Allgather",
        "Scatter",
        "Alltoall",
        "Isend",
        "Irecv",
        "Wait",
        "Send",
        "Recv",
        "Reduce_scatter",
        "Sendrecv",
        "Barrier",
    ]
    for m in methods:
        assert callable(getattr(mpiad.COMM_WORLD, m))
    assert mpiad.MPI_Communicator is mpiad.Communicator


def test_single_rank_world_values_and_grads() -> None:
    comm = mpiad.COMM_WORLD
    assert (comm.rank, comm.size) == (0, 1)
    x = torch.arange(6.0, dtype=torch.float64).view(2, 3).requires_grad_()
    y = comm.Allgather(comm.Alltoall(comm.Allreduce(x, mpiad.MPI_SUM), 0, 1, 3), 1)
    (y * 2).sum().backward()
    assert torch.equal(y, x.detach())
    assert torch.equal(x.grad, torch.full((2, 3), 2.0, dtype=torch.float64))
    h = comm.Isend(torch.ones(2), 0, 3)
    assert "pending" in repr(h) or "done" in repr(h)
    got = comm.Recv(torch.empty(2), 0, 3)
    comm.Wait(h)
    assert torch.equal(got, torch.ones(2))
    comm.Barrier()


def test_local_validation_messages() -> None:
    comm = mpiad.COMM_WORLD
    with pytest.raises(ValueError, match="root = 1 is out of range"):
        comm.Bcast_(torch.ones(2), 1)
    with pytest.raises(TypeError, match="MPI_BXOR is not supported for dtype float64"):
        comm.Allreduce(torch.ones(2, dtype=torch.float64), mpiad.MPI_BXOR)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        comm.Gather(None, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gatheraxis = -3"):
        comm.Allgather(torch.ones(2, 2), -3)
    with pytest.raises(ValueError, match="must live on the CPU or a CUDA device, got meta"):
        comm.Gather(torch.ones(2, device="meta"), 0, 0)  # no memory: never handed to MPI
    with pytest.raises(ValueError, match="got meta"):
        comm.Allreduce(torch.ones(2, device="meta"), mpiad.MPI_SUM)
    with pytest.raises(TypeError, match="mpi4py communicator"):
        mpiad.comm_from_mpi4py(object())


def test_staging_helpers_on_cpu() -> None:
    t = torch.arange(6.0).view(2, 3)
    assert _staging.to_mpi(t) is t  # contiguous CPU: handed over as is
    nc = t.t()
    staged = _staging.to_mpi(nc)
    assert staged.is_contiguous() and torch.equal(staged, nc)
    assert _staging.from_mpi(t, t) is t
    buf = _staging.mpi_empty((4,), t)
    assert buf.shape == (4,) and buf.dtype == t.dtype and buf.device == t.device
    assert mpiad.cuda_aware() is False  # PyPI Open MPI is built without CUDA
    mpiad.deactivate_cuda_aware_mpi_support()
    assert mpiad.cuda_aware() is False


def test_debug_switch() -> None:
    assert not mpiad.debug_enabled()
    mpiad.set_debug(True)
    try:
        assert mpiad.debug_enabled()
        assert torch.equal(mpiad.COMM_WORLD.Allreduce(torch.ones(2), mpiad.MPI_SUM), torch.ones(2))
    finally:
        mpiad.set_debug(None)


def test_allreduce_out_parameter() -> None:
    comm = mpiad.COMM_WORLD
    x = torch.arange(4.0)
    out = torch.empty(4)
    assert comm.Allreduce(x, mpiad.MPI_SUM, out=out) is out
    assert torch.equal(out, x)
    assert comm.Allreduce(x, mpiad.MPI_MAX, out=x) is x  # in place
    with pytest.raises(ValueError, match="out must be"):
        comm.Allreduce(x, mpiad.MPI_SUM, out=torch.empty(3))
    with pytest.raises(ValueError, match="out must be a contiguous tensor on the input's device"):
        comm.Allreduce(x, mpiad.MPI_SUM, out=torch.empty(4, device="meta"))
    with pytest.raises(ValueError, match="out= is only supported"):
        comm.Allreduce(x.clone().requires_grad_(), mpiad.MPI_SUM, out=out)


def test_large_outputs_reuse_only_unreferenced_buffers() -> None:
    comm = mpiad.COMM_WORLD
    x = torch.rand(1 << 19)  # 2 MiB: pooled
    a = comm.Allreduce(x, mpiad.MPI_SUM)
    pa = a.data_ptr()
    b = comm.Allreduce(x, mpiad.MPI_SUM)
    assert b.data_ptr() != pa  # a still alive
    del a
    d = comm.Allreduce(x, mpiad.MPI_SUM)
    assert d.data_ptr() == pa and torch.equal(d, x)  # a's memory came back
    view = d[10:]
    del d
    assert comm.Allreduce(x, mpiad.MPI_SUM).data_ptr() != pa  # a view keeps it
    del view
    arr = comm.Allreduce(x, mpiad.MPI_SUM).numpy()
    assert comm.Allreduce(x, mpiad.MPI_SUM).data_ptr() != arr.__array_interface__["data"][0]
    w = torch.ones(1 << 19, requires_grad=True)
    g = comm.Allreduce(x, mpiad.MPI_SUM)
    pg = g.data_ptr()
    y = g * w  # autograd saves g
    del g
    assert comm.Allreduce(x, mpiad.MPI_SUM).data_ptr() != pg
    y.sum().backward()
    assert torch.equal(w.grad, x)
    mpiad.empty_cache()


def test_allreduce_latency_paths() -> None:
    from mpiad import _mpiad

    comm = mpiad.COMM_WORLD
    # autograd latency path (one node; contiguous and expanded upstream gradients)
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = comm.Allreduce(x, mpiad.MPI_SUM)
    assert type(y.grad_fn).__name__ == "AllreduceSmallBackward" and torch.equal(y, x.detach())
    y.sum().backward()  # stride-0 gradient: the general backward
    assert torch.equal(x.grad, torch.ones(3))
    (gx,) = torch.autograd.grad(comm.Allreduce(x, mpiad.MPI_SUM), x, torch.tensor([4.0, 5.0, 6.0]))
    assert torch.equal(gx, torch.tensor([4.0, 5.0, 6.0]))
    # ops that save the input, a Parameter, double backward
    p = torch.nn.Parameter(torch.tensor([2.0, 5.0]))
    (gp,) = torch.autograd.grad(comm.Allreduce(p, mpiad.MPI_MAX).sum(), p)
    assert torch.equal(gp, torch.ones(2))
    g = torch.tensor([1.0, 2.0], requires_grad=True)
    (gp,) = torch.autograd.grad(comm.Allreduce(p, mpiad.MPI_PROD), p, g, create_graph=True)
    assert gp.requires_grad and torch.equal(gp.detach(), torch.tensor([1.0, 2.0]))
    (gg,) = torch.autograd.grad(gp.sum(), g)
    assert torch.equal(gg, torch.ones(2))
    with torch.no_grad():  # requires_grad but no autograd: the C latency path
        z = comm.Allreduce(x, mpiad.MPI_SUM)
    assert z.grad_fn is None and torch.equal(z, x.detach())
    # bools are not ops, even though True == 1 == MPI_MIN
    with pytest.raises(TypeError, match="op must be an int"):
        comm.Allreduce(torch.ones(2), True)  # type: ignore[arg-type]
    # the METH_FASTCALL native entry checks like the pybind11 one
    h, a, b = comm._handle, torch.arange(4.0), torch.empty(4)
    _mpiad.allreduce_fast(h, a.data_ptr(), b.data_ptr(), 16, 2, mpiad.MPI_SUM)
    assert torch.equal(a, b)
    pairs, out = torch.tensor([[3.0, 0.0], [1.0, 0.0]]), torch.empty(2, 2)
    _mpiad.allreduce_fast(h, pairs.data_ptr(), out.data_ptr(), 16, 2, mpiad.MPI_MAXLOC)
    assert torch.equal(out, pairs)
    with pytest.raises(TypeError, match="takes 6 integers"):
        _mpiad.allreduce_fast(h, 0, 0, 16, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _mpiad.allreduce_fast(h, 0, 0, 16.0, 2, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a multiple of 4"):
        _mpiad.allreduce_fast(h, a.data_ptr(), b.data_ptr(), 6, 2, mpiad.MPI_SUM)
    with pytest.raises(TypeError, match="MPI_BXOR is not supported for dtype float32"):
        _mpiad.allreduce_fast(h, a.data_ptr(), b.data_ptr(), 16, 2, mpiad.MPI_BXOR)
    with pytest.raises(TypeError, match="unknown dtype code 99"):
        _mpiad.allreduce_fast(h, a.data_ptr(), b.data_ptr(), 16, 99, mpiad.MPI_SUM)


def test_allreduce_c_path_takes_only_what_python_would_accept() -> None:
    """The C latency path (csrc/tensor_fast.hpp) either completes a call or answers
    None and leaves it to the Python path: every case that is not a plain no-grad
    call on a contiguous CPU tensor must come back None, untouched."""
    import sys
    import warnings

    from mpiad import _checks, _mpiad, _reductions

    assert _reductions.TENSOR_FAST_PATH  # this torch defines the attributes in C
    comm = mpiad.COMM_WORLD
    h, S, fast = comm._handle, mpiad.MPI_SUM, _mpiad.allreduce_tensor
    x = torch.arange(4.0)
    before = sys.getrefcount(x)
    y = fast(h, x, S, None)
    assert type(y) is torch.Tensor and y.data_ptr() != x.data_ptr() and torch.equal(y, x)
    out = torch.empty(4)
    assert fast(h, x, S, out) is out and torch.equal(out, x)
    assert fast(h, x, S, x) is x  # in place
    p = torch.nn.Parameter(torch.arange(3.0), requires_grad=False)
    assert torch.equal(fast(h, p, mpiad.MPI_MAX, None), p)
    with torch.no_grad():  # requires_grad, but grad mode off: no autograd to record
        assert torch.equal(fast(h, x.clone().requires_grad_(), S, None), x)
    for _ in range(1000):
        fast(h, x, S, out)
        fast(h, x, S, None)
    assert sys.getrefcount(x) == before and sys.getrefcount(out) == 2
    big = torch.ones(1 << 18)  # 1 MiB: a pooled output
    assert torch.equal(fast(h, big, S, None), big)

    class Sub(torch.Tensor):
        pass

    nc = torch.arange(8.0).view(2, 4).t()
    not_mine = [
        (x.as_subclass(Sub), S, None),
        (nc, S, None),  # not contiguous
        (torch.ones(2, device="meta"), S, None),
        (x, True, None),  # a bool is not an op
        (x, 1.0, None),
        (x, 1 << 70, None),
        (x, 12345, None),  # unknown op
        (x, mpiad.MPI_BXOR, None),  # not defined for float32
        (torch.ones(2, 2), mpiad.MPI_MAXLOC, None),  # pairs: Python's shape check
        ([1.0, 2.0], S, None),
        (x, S, torch.empty(3)),  # out: shape
        (x, S, torch.empty(2, 2)),
        (x, S, torch.empty(4, dtype=torch.float64)),  # dtype
        (x, S, torch.empty(4, requires_grad=True)),
        (x, S, torch.empty(8)[::2]),  # not contiguous
        (x, S, torch.empty(4).as_subclass(Sub)),
        (x, S, torch.empty(4, device="meta")),
        (x, S, "out"),
        (torch.tensor([1 + 2j, 3 - 1j]).conj(), S, None),  # lazy conjugate: MPI would read the raw values
        (torch.tensor([1 + 2j, 3 - 1j]).conj().imag, S, None),  # lazy negative
        (x, S, torch.tensor([1 + 2j]).conj()),
        (torch.arange(2.0, requires_grad=True), S, "self"),  # in place on a tensor that requires grad
        (torch.arange(8.0), S, "overlap"),  # out partly overlaps the input
        (x.to_sparse(), S, None),
    ]
    with torch.no_grad():
        t_nograd = torch.arange(2.0, requires_grad=True)
        assert fast(h, t_nograd, S, t_nograd) is None  # Python raises: an out that requires grad
    for t, op, o in not_mine:
        if o == "self":
            o = t
        elif o == "overlap":
            t, o = t[:4], t[2:6]
        if isinstance(o, torch.Tensor) and o.device.type == "cpu" and not o.requires_grad and not o.is_conj():
            o.fill_(-7.0)
        assert fast(h, t, op, o) is None, (t, op, o)
        if isinstance(o, torch.Tensor) and o.device.type == "cpu" and not o.requires_grad and not o.is_conj():
            assert bool((o == -7.0).all()), "a refused out= was written"
    # a call needing autograd is answered with its dtype code (the autograd latency path)
    xg = torch.arange(4.0, requires_grad=True)
    code = fast(h, xg, S, None)
    assert type(code) is int and code == _checks.CODE[torch.float32]
    assert fast(h, xg, S, torch.empty(4)) is None  # out= with autograd: Python's error
    assert fast(h, torch.ones(1 << 18, requires_grad=True), S, None) is None  # pooled size: the general node
    with pytest.raises(TypeError, match="takes 4 arguments"):
        fast(h, x, S)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fast("h", x, S, None)  # type: ignore[arg-type]
    from mpi4py import MPI

    with pytest.raises(ValueError, match="MPI_COMM_NULL"):
        fast(MPI.COMM_NULL.handle, x, S, None)
    # and the public method answers the refused cases as before
    assert torch.equal(comm.Allreduce(nc, S), nc)
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert torch.equal(comm.Allreduce(z.conj(), S), z.conj().resolve_conj())  # the values, not the raw memory
    assert torch.equal(comm.Allreduce(z.conj().imag, S), torch.tensor([-2.0, 1.0]))
    zo = torch.empty(2, dtype=torch.complex64)
    assert comm.Allreduce(z.conj(), S, out=zo) is zo and torch.equal(zo, z.conj().resolve_conj())
    with pytest.raises(ValueError, match="lazy conjugate"):
        comm.Allreduce(z, S, out=torch.empty(2, dtype=torch.complex64).conj())
    base = torch.arange(8.0)
    with pytest.raises(ValueError, match="overlaps the input"):
        comm.Allreduce(base[:4], S, out=base[2:6])
    with pytest.raises(TypeError, match="dense"):
        comm.Allreduce(x.to_sparse(), S)
    with warnings.catch_warnings():  # (torch: strided-layout nested tensors are a prototype)
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    assert type(nested) is torch.Tensor and fast(h, nested, S, None) is None
    with pytest.raises(TypeError, match="nested"):
        comm.Allreduce(nested, S)
    freed = torch.ones(4)
    freed.untyped_storage().resize_(0)  # as FSDP frees a parameter
    assert fast(h, freed, S, None) is None
    with pytest.raises(ValueError, match="no memory"):
        comm.Allreduce(freed, S)
    with torch.device("meta"):  # a default-device context: the outputs are still CPU tensors
        assert comm.Allreduce(big, S).device.type == "cpu" and comm.Allreduce(x, S).device.type == "cpu"
    # writing into out= bumps its version, so autograd reports a saved tensor that MPI overwrote
    w = torch.ones(4, requires_grad=True)
    saved = torch.ones(4)
    loss = (w * saved).sum()  # autograd saves `saved`
    v0 = saved._version
    comm.Allreduce(x, S, out=saved)
    assert saved._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(ValueError, match="out must be"):
        comm.Allreduce(x, S, out=torch.empty(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="op must be an int"):
        comm.Allreduce(x, 1.0)  # type: ignore[arg-type]


def test_allreduce_of_a_tensor_left_from_a_functorch_transform() -> None:
    # a tensor that escaped torch.func.grad is a dead wrapper without storage;
    # the autograd latency path unwraps it as Function.apply does
    comm = mpiad.COMM_WORLD
    leaked: list[torch.Tensor] = []

    def f(t: torch.Tensor) -> torch.Tensor:
        leaked.append(t)
        return t.sum()

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    torch.func.grad(f)(x)
    (w,) = leaked
    with pytest.raises(RuntimeError, match="storage"):
        w.data_ptr()
    y = comm.Allreduce(w, mpiad.MPI_SUM)
    assert type(y.grad_fn).__name__ == "AllreduceSmallBackward" and torch.equal(y.detach(), x.detach())
    y.sum().backward()  # into the tensor the wrapper wrapped, as torch's own ops do
    assert torch.equal(x.grad, torch.ones(2))


def test_irecv_fills_the_tensor_passed_in() -> None:
    # a receive buffer MPI cannot write directly (non-contiguous here; a CUDA tensor
    # without CUDA-aware MPI takes the same staging path) is filled at the Wait
    comm = mpiad.COMM_WORLD
    buf = torch.zeros(3, 2).t()
    h = comm.Isend(torch.arange(6.0).view(2, 3), 0, 5)
    got = comm.Wait(comm.Irecv(buf, 0, 5))
    comm.Wait(h)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(buf, torch.arange(6.0).view(2, 3))


def _scripted_allreduce(x: torch.Tensor, comm_: mpiad.MPI_Communicator) -> torch.Tensor:
    return mpiad.JoinDummies(comm_.Allreduce(x * 3.0, mpiad.MPI_SUM), [x]) * float(comm_.size + comm_.rank)


def _bad_op(x: torch.Tensor, comm_: mpiad.MPI_Communicator) -> torch.Tensor:
    return comm_.Allreduce(x, 12)


class _Allreducing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.comm = mpiad.COMM_WORLD  # the attribute's type is inferred: the TorchScript class
        self.w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.Reduce_scatter(self.comm.Allgather((self.w * x).view(1, -1), 0), mpiad.MPI_SUM, 1)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_function_and_module_take_the_communicator() -> None:
    # mpi4torch's communicator was a TorchScript class; scripting this used to fail at
    # Allreduce's keyword-only out= ("Compiled functions can't take variable number of arguments")
    comm = mpiad.COMM_WORLD
    f = torch.jit.script(_scripted_allreduce)
    x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64, requires_grad=True)
    y = f(x, comm)
    assert "mpiad::allreduce" in str(f.inlined_graph) and "mpiad::join_dummies" in str(f.inlined_graph)
    assert torch.equal(y, torch.tensor([3.0, 6.0, 12.0], dtype=torch.float64))  # size 1, rank 0
    (y * torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([3.0, 30.0, 300.0], dtype=torch.float64))
    m = torch.jit.script(_Allreducing())
    x = torch.tensor([3.0, 5.0], dtype=torch.float64)
    out = m(x)
    assert torch.equal(out, torch.tensor([[3.0, -10.0]], dtype=torch.float64))
    out.sum().backward()
    assert torch.equal(m.w.grad, x)
    bad = torch.jit.script(_bad_op)
    with pytest.raises(RuntimeError, match="op = 12 is not one of"):  # checked by the op, before MPI
        bad(torch.ones(2), comm)
