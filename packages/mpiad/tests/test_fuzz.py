"""Generated bad input for mpiad's collectives and point-to-point calls on a one-rank COMM_WORLD.

On one rank every collective returns its input (an Allreduce / Reduce / Bcast / Gather /
Scatter / Alltoall of one contribution), so plain torch is the reference: random dtypes,
shapes (zero-size too), strides, overlapping views (``expand``, ``as_strided``), lazy
conjugates and negatives, NaN/inf, a ``meta`` tensor for a wrong device, out-of-range
roots, axes, tags and ops, and ``out=`` buffers that do not fit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mpiad
from distkit_common.dtypes import CODES
from mpiad._checks import _VALID_ALL, CODE

FUZZ = settings(max_examples=50, deadline=None, derandomize=True)
COMM = mpiad.COMM_WORLD

#: every dtype distkit codes, and two it refuses (no distkit code)
DTYPES = [*(getattr(torch, name) for name in CODES), torch.uint16, torch.float8_e4m3fn]
VIEWS = ["plain", "transpose", "step", "expand", "as_strided", "conj", "neg", "offset", "meta", "scalar"]
OPS = [mpiad.MPI_SUM, mpiad.MPI_MAX, mpiad.MPI_MIN, mpiad.MPI_PROD, mpiad.MPI_BAND, mpiad.MPI_BOR, mpiad.MPI_BXOR]
OPS += [mpiad.MPI_MINLOC, mpiad.MPI_MAXLOC]


def _values(shape: tuple[int, ...], dtype: torch.dtype, special: float) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    base = (torch.arange(n, dtype=torch.float64) % 13 - 6).reshape(shape)
    if dtype.is_floating_point or dtype.is_complex:
        if n:
            base.view(-1)[0] = special
        return base.to(dtype)
    if dtype is torch.bool:
        return base > 0
    if dtype in (torch.uint8, torch.uint16):
        return base.abs().to(dtype)
    return base.to(dtype)


def make(shape: list[int], dtype: torch.dtype, view: str, special: float) -> torch.Tensor:
    """A tensor of ``shape`` (about) in the memory layout ``view``."""
    if view == "scalar":
        return _values((), dtype, special)
    t = _values(tuple(shape), dtype, special)
    if view == "transpose" and t.dim() >= 2:
        return t.transpose(0, -1)
    if view == "step" and t.dim() >= 1:
        return _values((shape[0] * 2, *shape[1:]), dtype, special)[::2]
    if view == "expand" and t.dim() >= 1:
        return t[:1].expand(3, *t.shape[1:]) if t.shape[0] else t
    if view == "as_strided" and t.numel():  # overlapping windows of one buffer
        flat = t.reshape(-1)
        return flat.as_strided((max(flat.numel() - 1, 1), 2), (1, 1)) if flat.numel() >= 2 else flat
    if view == "conj" and dtype.is_complex:
        return t.conj()
    if view == "neg" and dtype.is_complex:
        return t.conj().imag  # a strided view of a conjugate
    if view == "offset" and t.numel():
        return t.reshape(-1)[1:]
    if view == "meta":
        return t.to("meta")
    return t


def expected_error(t: torch.Tensor) -> tuple[type[Exception], str] | None:
    """What every collective must raise for ``t`` before communicating, or None."""
    if t.device.type == "meta":
        return ValueError, "got meta"
    if t.dtype not in CODE:
        return TypeError, "unsupported dtype"
    return None


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    want = want.resolve_conj().resolve_neg()
    if got.dtype.is_floating_point or got.dtype.is_complex:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    else:
        assert torch.equal(got, want)


tensors = st.builds(
    make,
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    dtype=st.sampled_from(DTYPES),
    view=st.sampled_from(VIEWS),
    special=st.sampled_from([1.0, float("nan"), float("inf"), -float("inf"), -0.0]),
)


@FUZZ
@given(
    t=tensors,
    op=st.one_of(st.sampled_from(OPS), st.sampled_from([-1, 12, 99, 2**40]), st.sampled_from([1.0, "sum", True])),
    requires_grad=st.booleans(),
)
@example(t=torch.ones(3, 2), op=mpiad.MPI_MINLOC, requires_grad=False)
@example(t=torch.ones(3, 1), op=mpiad.MPI_MAXLOC, requires_grad=False)
@example(t=torch.zeros(0, 2, dtype=torch.float64), op=mpiad.MPI_SUM, requires_grad=True)
@example(t=torch.ones(4, dtype=torch.float64), op=mpiad.MPI_BXOR, requires_grad=False)
def test_allreduce_returns_its_input_or_refuses(t: torch.Tensor, op: Any, requires_grad: bool) -> None:
    differentiable = t.dtype.is_floating_point and t.device.type == "cpu" and not t.is_conj() and not t.is_neg()
    if requires_grad and differentiable:
        t = t.detach().clone().requires_grad_(True) if not t.is_contiguous() else t.requires_grad_(True)
    err = expected_error(t)
    if err is None and (type(op) is not int):
        err = (TypeError, "op must be an int")
    elif err is None and not 0 <= op < 12:
        err = (ValueError, f"op = {op} is not one of")
    elif err is None and (op, t.dtype) not in _VALID_ALL:
        err = (TypeError, "is not supported for dtype")
    elif err is None and op in (mpiad.MPI_MINLOC, mpiad.MPI_MAXLOC) and (t.dim() == 0 or t.shape[-1] != 2):
        err = (ValueError, r"needs \(value, index\) pairs")
    before = t.detach().clone().resolve_conj().resolve_neg() if t.device.type != "meta" else None
    if err is not None:
        with pytest.raises(err[0], match=err[1]):
            COMM.Allreduce(t, op)
        with pytest.raises(RuntimeError):  # mpi4torch's callers catch RuntimeError
            COMM.Allreduce(t, op)
        return
    got = COMM.Allreduce(t, op)
    assert_same(got.detach(), t.detach())
    assert got.data_ptr() != t.data_ptr() or got.numel() == 0  # a new tensor
    assert before is not None
    assert_same(t.detach().resolve_conj().resolve_neg(), before)  # the input is untouched
    if got.requires_grad and op == mpiad.MPI_SUM:
        got.sum().backward()
        assert t.grad is not None and torch.equal(t.grad, torch.ones_like(t))


@FUZZ
@given(
    t=tensors,
    out_kind=st.sampled_from(["fresh", "same", "overlap", "wrong_shape", "wrong_dtype", "strided", "meta", "conj"]),
)
@example(t=torch.arange(8.0), out_kind="overlap")
@example(t=torch.arange(4.0), out_kind="same")
def test_allreduce_out(t: torch.Tensor, out_kind: str) -> None:
    err = expected_error(t)
    if err is None and (t.dtype, mpiad.MPI_SUM) and (mpiad.MPI_SUM, t.dtype) not in _VALID_ALL:
        err = (TypeError, "is not supported for dtype")
    if err is None and not t.is_contiguous():
        err = (ValueError, "out= is only supported for contiguous tensors")
    ref = t.detach().clone().resolve_conj().resolve_neg() if t.device.type != "meta" else t
    shape = tuple(t.shape)
    out: torch.Tensor
    if out_kind == "same":
        out = t
    elif out_kind == "overlap" and t.numel() >= 2 and t.dim() == 1 and t.is_contiguous():
        buf = torch.empty(t.numel() + 1, dtype=t.dtype)
        buf[: t.numel()] = t
        t = buf[: t.numel()]
        out = buf[1:]
        err = err or (ValueError, "overlaps the input")
    elif out_kind == "wrong_shape":
        out = torch.empty(*shape, 2, dtype=t.dtype)
        err = err or (ValueError, "out must be")
    elif out_kind == "wrong_dtype":
        out = torch.empty(shape, dtype=torch.float64 if t.dtype != torch.float64 else torch.float32)
        err = err or (ValueError, "out must be")
    elif out_kind == "strided" and t.numel() >= 2:
        out = torch.empty(*shape, 2, dtype=t.dtype)[..., 0]
        err = err or (ValueError, "out must be a contiguous tensor")
    elif out_kind == "meta":
        out = torch.empty(shape, dtype=t.dtype, device="meta")
        err = err or (ValueError, "out must be a contiguous tensor on the input's device")
    elif out_kind == "conj" and t.dtype.is_complex:
        out = torch.empty(shape, dtype=t.dtype).conj()
        err = err or (ValueError, "lazy conjugate")
    else:
        out = torch.full(shape, 3, dtype=t.dtype) if t.dtype in CODE else torch.empty(shape, dtype=t.dtype)
    if err is not None:
        snapshot = out.clone() if out.device.type == "cpu" and out is not t else None
        with pytest.raises(err[0], match=err[1]):
            COMM.Allreduce(t, mpiad.MPI_SUM, out=out)
        if snapshot is not None:
            assert_same(out, snapshot)  # nothing written
        return
    assert COMM.Allreduce(t, mpiad.MPI_SUM, out=out) is out
    assert_same(out, ref)


@FUZZ
@given(t=tensors, root=st.one_of(st.integers(-2, 2), st.just(2**40), st.just(True)), op=st.sampled_from(OPS[:4]))
@example(t=torch.ones(2), root=1, op=mpiad.MPI_SUM)
def test_bcast_and_reduce_in_place(t: torch.Tensor, root: Any, op: int) -> None:
    tensor_err = expected_error(t)
    root_err: tuple[type[Exception], str] | None = None
    if isinstance(root, bool) or not isinstance(root, int):
        root_err = (TypeError, "root must be an int")
    elif root != 0:
        root_err = (ValueError, f"root = {root} is out of range")
    for name in ("Bcast_", "Reduce_"):
        e = tensor_err
        if e is None and name == "Reduce_" and (op, t.dtype) not in _VALID_ALL:
            e = (TypeError, "is not supported for dtype")  # the op is checked before the root
        e = e or root_err
        call = (lambda: COMM.Bcast_(t, root)) if name == "Bcast_" else (lambda: COMM.Reduce_(t, op, root))
        if e is not None:
            with pytest.raises(e[0], match=e[1]):
                call()
            continue
        before = t.clone().resolve_conj().resolve_neg()
        assert_same(call(), before)
        assert_same(t.resolve_conj().resolve_neg(), before)


@FUZZ
@given(t=tensors, axis=st.integers(-4, 4), root=st.sampled_from([0, 1, -1]))
@example(t=torch.ones(2, 2), axis=-3, root=0)
def test_gather_and_allgather(t: torch.Tensor, axis: int, root: int) -> None:
    err = expected_error(t)
    if (err is None and not -t.dim() <= axis < max(t.dim(), 0)) or (err is None and t.dim() == 0):
        err = (ValueError, f"gatheraxis = {axis}")
    gerr = err or ((ValueError, f"root = {root} is out of range") if root != 0 else None)
    if gerr is not None:
        with pytest.raises(gerr[0], match=gerr[1]):
            COMM.Gather(t, axis, root)
    else:
        assert_same(COMM.Gather(t, axis, root), t)
    if err is not None:
        with pytest.raises(err[0], match=err[1]):
            COMM.Allgather(t, axis)
    else:
        assert_same(COMM.Allgather(t, axis), t)
        h = COMM.Iallgather(t, axis)
        assert_same(COMM.Wait(h), t)


@FUZZ
@given(
    t=tensors,
    saxis=st.integers(-4, 4),
    gaxis=st.integers(-4, 4),
    numelem=st.one_of(st.integers(-1, 5), st.just(2**62)),
)
def test_scatter_alltoall_reduce_scatter(t: torch.Tensor, saxis: int, gaxis: int, numelem: int) -> None:
    base = expected_error(t)
    nd = t.dim()
    saxis_ok = nd > 0 and -nd <= saxis < nd
    fits = saxis_ok and numelem == t.shape[saxis]
    calls = {
        "Scatter": lambda: COMM.Scatter(t, saxis, numelem, 0),
        "Alltoall": lambda: COMM.Alltoall(t, gaxis, saxis, numelem),
        "Reduce_scatter": lambda: COMM.Reduce_scatter(t, mpiad.MPI_SUM, saxis, numelem),
    }
    for name, call in calls.items():
        if base is not None:
            with pytest.raises(base[0], match=base[1]):
                call()
            continue
        if name == "Reduce_scatter" and (mpiad.MPI_SUM, t.dtype) not in _VALID_ALL:
            with pytest.raises(TypeError, match="is not supported for dtype"):
                call()
            continue
        ok = fits and (name != "Alltoall" or (nd > 0 and -nd <= gaxis < nd))
        if not ok:
            with pytest.raises(ValueError):
                call()
            continue
        assert_same(call(), t)


@FUZZ
@given(
    t=tensors,
    peer=st.sampled_from([0, 1, -1]),
    tag=st.one_of(st.integers(-1, 40), st.sampled_from([2**31, 2**62, COMM._tag_ub - 10, COMM._tag_ub - 9])),
)
def test_send_and_receive_to_self(t: torch.Tensor, peer: int, tag: int) -> None:
    err = expected_error(t)
    if err is None and peer != 0:
        err = (ValueError, "is out of range")
    if err is None and not 0 <= tag <= COMM._tag_ub - 10:
        err = (ValueError, f"tag = {tag} is out of range")
    if err is not None:
        with pytest.raises(err[0], match=err[1]):
            COMM.Isend(t, peer, tag)
        with pytest.raises(err[0], match=err[1]):
            COMM.Irecv(torch.empty_like(t) if t.device.type == "cpu" else t, peer, tag)
        return
    h = COMM.Isend(t, 0, tag)
    got = COMM.Recv(torch.full_like(t.contiguous(), 0), 0, tag)
    COMM.Wait(h)
    assert_same(got, t.contiguous())


def test_a_freed_communicator_is_refused() -> None:
    from mpi4py import MPI

    dup = MPI.COMM_WORLD.Dup()
    dup.Free()  # the mpi4py object is now MPI.COMM_NULL
    with pytest.raises(ValueError, match="cannot wrap MPI.COMM_NULL"):
        mpiad.comm_from_mpi4py(dup)
