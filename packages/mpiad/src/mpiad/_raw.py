"""Communication without autograd: validation, buffer preparation, the MPI calls.

Every function here takes a communicator handle (mpi4py's ``Comm.handle``),
checks its arguments locally first (raising before any communication), and
returns new tensors. Where sizes must be exchanged anyway (Gather, Scatter,
Alltoall, ...) the exchanged header also lets every rank check the others'
arguments, so inconsistent calls raise the same error on every rank.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from distkit_common.dtypes import CODES

from . import _mpiad
from ._constants import MPI_MAXLOC, MPI_MINLOC, OP_NAMES
from ._errors import MpiadTypeError, MpiadValueError

Tensor = torch.Tensor

_CODE: dict[torch.dtype, int] = {getattr(torch, name): code for name, code in CODES.items()}
_MAXDIM = 16

# signature ids of the collectives (debug mode and headers)
OP_ALLREDUCE, OP_BCAST, OP_REDUCE, OP_GATHER, OP_ALLGATHER, OP_SCATTER, OP_ALLTOALL, OP_REDUCE_SCATTER = range(1, 9)
_OPNAMES = {
    OP_ALLREDUCE: "Allreduce",
    OP_BCAST: "Bcast_",
    OP_REDUCE: "Reduce_",
    OP_GATHER: "Gather",
    OP_ALLGATHER: "Allgather",
    OP_SCATTER: "Scatter",
    OP_ALLTOALL: "Alltoall",
    OP_REDUCE_SCATTER: "Reduce_scatter",
}


def _env_debug() -> bool:
    return os.environ.get("MPIAD_DEBUG", "0") not in ("", "0", "false", "False")


_debug: bool = _env_debug()


def debug_enabled() -> bool:
    """Whether debug mode is on (``MPIAD_DEBUG=1`` at import, or :func:`mpiad.set_debug`)."""
    return _debug


def set_debug(flag: bool | None) -> None:
    """Switch debug mode on/off for this process (``None``: back to ``MPIAD_DEBUG``).

    Every rank must use the same setting (debug mode adds a collective).
    """
    global _debug
    _debug = _env_debug() if flag is None else bool(flag)


# ---------------------------------------------------------------------------- checks
def dtype_code(t: Tensor, name: str = "tensor") -> int:
    """distkit dtype code of ``t`` (TypeError for unsupported dtypes)."""
    code = _CODE.get(t.dtype)
    if code is None:
        supported = ", ".join(str(d).removeprefix("torch.") for d in _CODE)
        raise MpiadTypeError(f"{name} has unsupported dtype {t.dtype}; supported: {supported}")
    return code


def check_tensor(t: Any, name: str = "tensor") -> Tensor:
    """TypeError unless ``t`` is a strided CPU/CUDA tensor of a supported dtype."""
    if not isinstance(t, torch.Tensor):
        raise MpiadTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} {t!r:.80}")
    if t.layout != torch.strided:
        raise MpiadTypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if not (t.is_cpu or t.is_cuda):  # (meta tensors have no memory for MPI)
        raise MpiadValueError(f"{name} must live on the CPU or a CUDA device, got {t.device}")
    dtype_code(t, name)
    return t


def check_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np

            if isinstance(v, np.integer):
                return int(v)
        except ImportError:  # pragma: no cover
            pass
        raise MpiadTypeError(f"{name} must be an int, got {type(v).__name__} {v!r:.80}")
    return v


def check_rank(v: Any, name: str, size: int) -> int:
    v = check_int(v, name)
    if not 0 <= v < size:
        raise MpiadValueError(f"{name} = {v} is out of range for a communicator of size {size} (valid: 0..{size - 1})")
    return v


def check_axis(v: Any, name: str, ndim: int) -> int:
    v = check_int(v, name)
    if not -ndim <= v < ndim:
        raise MpiadValueError(f"{name} = {v} is out of range for a tensor with {ndim} dimension(s)")
    return v % ndim


def check_tag(v: Any, name: str, tag_ub: int = 32767) -> int:
    """``v`` as a tag: 0 .. ``tag_ub`` - 10 (the backward message uses tag + 10)."""
    v = check_int(v, name)
    if not 0 <= v <= tag_ub - 10:
        raise MpiadValueError(
            f"{name} = {v} is out of range (0..{tag_ub - 10}: MPI_TAG_UB = {tag_ub}, tag+10 carries the gradient)"
        )
    return v


def check_op(op: Any, t: Tensor) -> int:
    op = check_int(op, "op")
    if op not in OP_NAMES:
        raise MpiadValueError(f"op = {op} is not one of the MPI_* constants")
    _check_op_dtype(op, t.dtype)
    if op in (MPI_MINLOC, MPI_MAXLOC) and (t.dim() == 0 or t.shape[-1] != 2):
        raise MpiadValueError(
            f"{OP_NAMES[op]} needs (value, index) pairs in the last dimension (size 2), got shape {tuple(t.shape)}"
        )
    return op


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_COMPLEX = (torch.complex64, torch.complex128)


def _check_op_dtype(op: int, dtype: torch.dtype) -> None:
    """The rules of the native ``check_op`` in Python (so torch.compile can trace them)."""
    if op in (0, 1):  # MAX, MIN
        ok = dtype not in _COMPLEX
    elif op in (2, 3):  # SUM, PROD
        ok = dtype != torch.bool
    elif op in (10, 11):  # MINLOC, MAXLOC
        ok = dtype not in _COMPLEX and dtype != torch.bool
    else:  # logical / bitwise
        ok = dtype not in _FLOATS and dtype not in _COMPLEX
    if not ok:
        raise MpiadTypeError(f"{OP_NAMES[op]} is not supported for dtype {str(dtype).removeprefix('torch.')}")


def op_name(op: int) -> str:
    return OP_NAMES.get(op, str(op))


# ----------------------------------------------------------------- CUDA staging
_cuda_aware: bool | None = None


def cuda_aware() -> bool:
    """Whether device pointers are handed to MPI directly (CUDA-aware MPI)."""
    global _cuda_aware
    if _cuda_aware is None:
        _cuda_aware = bool(_mpiad.cuda_aware()) and os.environ.get("MPIAD_CUDA_AWARE", "1") != "0"
    return _cuda_aware


def deactivate_cuda_aware_mpi_support() -> None:
    """Always stage CUDA tensors through host memory (as mpi4torch's function of this name)."""
    global _cuda_aware
    _cuda_aware = False


def to_mpi(t: Tensor) -> Tensor:
    """A contiguous tensor whose memory MPI may read: ``t`` itself when possible.

    CUDA tensors go to pinned host memory unless the MPI is CUDA-aware; the
    current stream is synchronised first so the data is complete.
    """
    if t.is_cuda:
        if not cuda_aware():
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t)  # synchronous: waits for the kernels that produce t
            return host
        x = t if t.is_contiguous() else t.contiguous()
        # MPI reads device memory outside torch's streams: everything queued on the
        # current stream (including the copy above) must be complete
        torch.cuda.current_stream(t.device).synchronize()
        return x
    return t if t.is_contiguous() else t.contiguous()


def from_mpi(buf: Tensor, like: Tensor) -> Tensor:
    """Move an MPI result back to ``like``'s device (no-op on the CPU)."""
    if buf.is_cpu and like.is_cpu:
        return buf
    if buf.device != like.device:
        return buf.to(like.device, non_blocking=False)
    return buf


def mpi_empty(shape: Sequence[int], like: Tensor) -> Tensor:
    """An uninitialised receive buffer for ``like``'s dtype where MPI can write."""
    if like.is_cuda:
        if not cuda_aware():
            return torch.empty(tuple(shape), dtype=like.dtype, pin_memory=True)
        buf = torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        # the caching allocator may hand out memory that kernels still queued on the
        # current stream use; MPI writes outside the stream, so let them finish
        torch.cuda.current_stream(like.device).synchronize()
        return buf
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)


def _sync_device(t: Tensor) -> None:
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()


# ------------------------------------------------------------- debug signatures
def _signature(opid: int, t: Tensor | None, a: int = 0, b: int = 0, c: int = 0) -> list[int]:
    if t is None:
        return [opid, -1, -1, *([-1] * _MAXDIM), a, b, c]
    if t.dim() > _MAXDIM:
        raise MpiadValueError(f"tensors with more than {_MAXDIM} dimensions are not supported, got {t.dim()}")
    shape = list(t.shape) + [-1] * (_MAXDIM - t.dim())
    return [opid, dtype_code(t), t.dim(), *shape, a, b, c]


def _describe(sig: Sequence[int]) -> str:
    opid, code, ndim = sig[0], sig[1], sig[2]
    name = _OPNAMES.get(opid, f"op#{opid}")
    if code < 0:
        return f"{name}()"
    from distkit_common.dtypes import NAMES

    shape = list(sig[3 : 3 + ndim])
    a, b, c = sig[3 + _MAXDIM :]
    return f"{name}({NAMES.get(code, code)}{shape}, args=({a}, {b}, {c}))"


def exchange(comm: int, sig: list[int]) -> list[list[int]]:
    """Every rank's signature (one MPI_Allgather of small ints)."""
    flat = _mpiad.allgather_i64(comm, sig)
    n = len(sig)
    return [flat[i : i + n] for i in range(0, len(flat), n)]


def check_signatures(sigs: list[list[int]], *, free_axis: int | None = None, shapes: bool = True) -> None:
    """Raise RuntimeError on every rank when the ranks called different things.

    ``free_axis``: a dimension whose size may differ between ranks; ``shapes``:
    whether shapes must match at all.
    """
    ref = sigs[0]
    for r, s in enumerate(sigs):
        bad = s[0] != ref[0] or s[1] != ref[1] or s[-3:] != ref[-3:]
        if shapes and not bad:
            bad = s[2] != ref[2] or any(
                x != y for i, (x, y) in enumerate(zip(s[3 : 3 + _MAXDIM], ref[3 : 3 + _MAXDIM])) if i != free_axis
            )
        if bad:
            lines = "\n".join(f"  rank {i}: {_describe(x)}" for i, x in enumerate(sigs))
            raise RuntimeError(f"mpiad: ranks called mismatching collectives (rank {r} differs from rank 0):\n{lines}")


def debug_check(comm: int, opid: int, t: Tensor | None, a: int = 0, b: int = 0, c: int = 0, **kw: Any) -> None:
    if _debug:
        check_signatures(exchange(comm, _signature(opid, t, a, b, c)), **kw)


# ------------------------------------------------------------------ collectives
#: Messages from this many bytes on use :func:`large_algo`. Measured on this project's
#: 2-core VM, 2 ranks, float32, same buffers, median of 7-9 interleaved rounds.
#: Reduce + Bcast / MPI_Allreduce on a quiet machine: 1.6 (1 MiB), 1.75 (4 MiB),
#: 1.0-1.3 (8 MiB), 1.04 (16 MiB), 0.62 (32 MiB), 0.76 (64 MiB); with ~6 other jobs
#: running it won from 32 KiB on (0.5-0.76), because Open MPI's 2-rank Allreduce
#: synchronises more often and pays for every descheduled peer. The default, 32 MiB,
#: follows the quiet machine; MPIAD_LARGE_BYTES changes it.
LARGE_BYTES = int(os.environ.get("MPIAD_LARGE_BYTES", str(32 << 20)))
_ALGO: dict[int, int] = {}


def large_algo(comm: int) -> int:
    """Allreduce algorithm for large messages on ``comm`` (decided once, collectively).

    ``MPIAD_ALLREDUCE=mpi`` always uses MPI_Allreduce, ``reduce_bcast`` always
    MPI_Reduce + MPI_Bcast; ``auto`` (default) picks the latter when all ranks
    share one node (measured 1.5-4x faster than Open MPI's default there).
    Called inside a large Allreduce, so every rank of ``comm`` takes part.
    """
    a = _ALGO.get(comm)
    if a is None:
        mode = os.environ.get("MPIAD_ALLREDUCE", "auto")
        a = 0 if mode == "mpi" else 1 if mode == "reduce_bcast" else int(_mpiad.comm_is_shared(comm))
        _ALGO[comm] = a
    return a


# ---------------------------------------------------------- output buffer pool
# Large outputs come from a small pool of host buffers that are handed out again
# only when nothing references their memory any more (no tensor, view, numpy
# array, DLPack capsule or autograd-saved tensor): fresh multi-MiB allocations
# cost page faults that can exceed the communication itself.
POOL_MIN_BYTES = 1 << 20
_pool_limit = int(os.environ.get("MPIAD_POOL_BYTES", str(256 << 20)))
_pool: dict[int, list[Tensor]] = {}
_pool_bytes = 0
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def empty_cache() -> None:
    """Release the pooled output buffers of large Allreduce results."""
    global _pool_bytes
    _pool.clear()
    _pool_bytes = 0


def _alias(st: torch.UntypedStorage, like: Tensor) -> Tensor:
    strides, acc = [], 1
    for d in reversed(like.shape):
        strides.append(acc)
        acc *= d
    return torch.empty(0, dtype=like.dtype).set_(st, 0, like.shape, strides[::-1])


def new_output(like: Tensor) -> Tensor:
    """An uninitialised contiguous CPU tensor shaped like ``like`` (pooled when large)."""
    nbytes = like.numel() * like.element_size()
    if nbytes < POOL_MIN_BYTES or _use_count is None or _pool_limit <= 0:
        return torch.empty(like.shape, dtype=like.dtype)
    global _pool_bytes
    bufs = _pool.setdefault(nbytes, [])
    for b in bufs:
        st = b.untyped_storage()
        if _use_count(st._cdata) == 2:  # the pool's own tensor + `st`: nobody else
            return _alias(st, like)
    b = torch.empty(nbytes, dtype=torch.uint8)
    if len(bufs) < 2 and _pool_bytes + nbytes <= _pool_limit:
        bufs.append(b)
        _pool_bytes += nbytes
    return _alias(b.untyped_storage(), like)


def allreduce(comm: int, t: Tensor, op: int) -> Tensor:
    """Elementwise reduction over all ranks; a new tensor on every rank."""
    debug_check(comm, OP_ALLREDUCE, t, op)
    x = to_mpi(t)
    out = new_output(x) if x.is_cpu else torch.empty_like(x)
    n = x.numel()
    algo = large_algo(comm) if n * x.element_size() >= LARGE_BYTES else 0
    _mpiad.allreduce(comm, x.data_ptr(), out.data_ptr(), n, _CODE[x.dtype], op, algo)
    return from_mpi(out, t)


def bcast_into(comm: int, t: Tensor, root: int) -> None:
    """Broadcast root's ``t`` into every rank's ``t`` (in place)."""
    debug_check(comm, OP_BCAST, t, root)
    x = to_mpi(t)
    _mpiad.bcast(comm, x.data_ptr(), x.numel(), _CODE[x.dtype], root)
    if x is not t:
        with torch.no_grad():
            t.copy_(x)


def bcast(comm: int, t: Tensor, root: int) -> Tensor:
    """Functional broadcast: a new tensor holding root's values."""
    out = t.detach().clone(memory_format=torch.contiguous_format)
    bcast_into(comm, out, root)
    return out


def reduce_into(comm: int, t: Tensor, op: int, root: int, rank: int) -> None:
    """Reduce every rank's ``t`` into root's ``t`` (in place); non-roots get zeros."""
    debug_check(comm, OP_REDUCE, t, op, root)
    x = to_mpi(t)
    _mpiad.reduce(comm, x.data_ptr(), x.data_ptr(), x.numel(), _CODE[x.dtype], op, root)
    with torch.no_grad():
        if rank != root:
            t.zero_()
        elif x is not t:
            t.copy_(x)


def reduce(comm: int, t: Tensor, op: int, root: int, rank: int) -> Tensor:
    """Functional reduce to root (zeros elsewhere)."""
    out = t.detach().clone(memory_format=torch.contiguous_format)
    reduce_into(comm, out, op, root, rank)
    return out


def _front(t: Tensor, axis: int) -> Tensor:
    """``t`` with ``axis`` moved to the front, contiguous (no copy when already so)."""
    return to_mpi(t.movedim(axis, 0) if axis else t)


def _back(buf: Tensor, axis: int, like: Tensor) -> Tensor:
    out = buf.movedim(0, axis).contiguous() if axis else buf
    return from_mpi(out, like)


def _displs(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def gather(comm: int, t: Tensor, axis: int, root: int, rank: int, size: int) -> Tensor:
    """Concatenate every rank's ``t`` along ``axis`` on ``root``.

    Non-root ranks get a tensor of size 0 along ``axis`` (as mpi4torch).
    """
    sigs = exchange(comm, _signature(OP_GATHER, t, axis, root))
    check_signatures(sigs, free_axis=axis)
    sizes = [s[3 + axis] for s in sigs]
    x = _front(t, axis)
    inner = _inner(t, axis)
    total = sum(sizes) if rank == root else 0
    out = mpi_empty((total, *x.shape[1:]), t)
    counts = [s * inner for s in sizes]
    _mpiad.gatherv(comm, x.data_ptr(), x.numel(), out.data_ptr(), counts, _displs(counts), _CODE[x.dtype], root)
    return _back(out, axis, t)


def _inner(t: Tensor, axis: int) -> int:
    n = 1
    for i, s in enumerate(t.shape):
        if i != axis:
            n *= s
    return n


def allgather(comm: int, t: Tensor, axis: int) -> Tensor:
    """Concatenate every rank's ``t`` along ``axis`` on every rank."""
    sigs = exchange(comm, _signature(OP_ALLGATHER, t, axis))
    check_signatures(sigs, free_axis=axis)
    sizes = [s[3 + axis] for s in sigs]
    x = _front(t, axis)
    inner = _inner(t, axis)
    out = mpi_empty((sum(sizes), *x.shape[1:]), t)
    counts = [s * inner for s in sizes]
    _mpiad.allgatherv(comm, x.data_ptr(), x.numel(), out.data_ptr(), counts, _displs(counts), _CODE[x.dtype])
    return _back(out, axis, t)


def scatter(comm: int, t: Tensor, axis: int, numelem: int, root: int, rank: int) -> Tensor:
    """Split root's ``t`` along ``axis``; rank r receives ``numelem`` (its own) slices.

    On non-root ranks ``t`` only supplies the dtype (and device).
    """
    sigs = exchange(comm, [*_signature(OP_SCATTER, t, axis, root, 0), numelem])
    check_signatures([x[:-1] for x in sigs], shapes=False)  # op, dtype, axis, root agree
    rsig = sigs[root]
    ndim = rsig[2]
    if not -ndim <= axis < ndim:
        raise MpiadValueError(f"Scatter: scatteraxis = {axis} is out of range for root's {ndim}-d tensor")
    axis %= ndim
    shape = list(rsig[3 : 3 + ndim])
    numelems = [s[-1] for s in sigs]
    if any(n < 0 for n in numelems) or sum(numelems) != shape[axis]:
        raise MpiadValueError(
            f"Scatter: the ranks' numelem {numelems} sum to {sum(numelems)}, but root's tensor has "
            f"{shape[axis]} elements along scatteraxis {axis}"
        )
    inner = 1
    for i, s in enumerate(shape):
        if i != axis:
            inner *= s
    rest = shape[:axis] + shape[axis + 1 :]
    out = mpi_empty((numelem, *rest), t)
    counts = [n * inner for n in numelems]
    if rank == root:
        x = _front(t, axis)
        _mpiad.scatterv(comm, x.data_ptr(), counts, _displs(counts), out.data_ptr(), out.numel(), _CODE[x.dtype], root)
    else:
        _sync_device(t)
        _mpiad.scatterv(comm, 0, [], [], out.data_ptr(), out.numel(), _CODE[t.dtype], root)
    return _back(out, axis, t)


def alltoall(comm: int, t: Tensor, gaxis: int, saxis: int, numelem: int) -> Tensor:
    """Redistribute: slices along ``saxis`` go to the ranks (``numelem`` each, per
    receiver), received blocks are concatenated along ``gaxis``. One MPI_Alltoallv."""
    sigs = exchange(comm, _signature(OP_ALLTOALL, t, gaxis, saxis, numelem))
    check_signatures([[*s[:-1], 0] for s in sigs], free_axis=gaxis)
    size, me = len(sigs), None
    numelems = [s[-1] for s in sigs]
    gsizes = [s[3 + gaxis] for s in sigs]
    ssizes = [s[3 + saxis] for s in sigs]
    inner = [1] * size
    for r, s in enumerate(sigs):
        for i in range(s[2]):
            if i != saxis:
                inner[r] *= s[3 + i]
    if any(n < 0 for n in numelems):
        raise MpiadValueError(f"Alltoall: numelem must be >= 0, got {numelems}")
    x = _front(t, saxis)
    rest = list(x.shape[1:])
    if gaxis != saxis:
        bad = [r for r in range(size) if ssizes[r] != sum(numelems)]
        if bad:
            raise MpiadValueError(
                f"Alltoall: the ranks' numelem {numelems} sum to {sum(numelems)}, but rank {bad[0]}'s tensor has "
                f"{ssizes[bad[0]]} elements along scatteraxis {saxis}"
            )
        me = _mpiad.comm_rank(comm)
        scounts = [n * inner[me] for n in numelems]
        rcounts = [numelem * inner[r] for r in range(size)]
        out = mpi_empty((sum(rcounts),), t)
        _mpiad.alltoallv(
            comm, x.data_ptr(), scounts, _displs(scounts), out.data_ptr(), rcounts, _displs(rcounts), _CODE[x.dtype]
        )
        blocks = []
        g_in_rest = gaxis if gaxis < saxis else gaxis - 1
        for r, piece in enumerate(out.split(rcounts)):
            shp = list(rest)
            shp[g_in_rest] = gsizes[r]
            blocks.append(piece.view(numelem, *shp).movedim(0, saxis))
        return from_mpi(torch.cat(blocks, dim=gaxis), t)
    # gather axis == scatter axis: re-partition the global concatenation
    if sum(gsizes) != sum(numelems):
        raise MpiadValueError(
            f"Alltoall: the ranks' numelem {numelems} sum to {sum(numelems)}, but their tensors hold "
            f"{sum(gsizes)} elements along axis {gaxis} in total"
        )
    me = _mpiad.comm_rank(comm)
    cur, new = _displs(gsizes), _displs(numelems)
    row = inner[me]
    scounts, sdispl, rcounts, rdispl = [], [], [], []
    for r in range(size):
        lo, hi = max(cur[me], new[r]), min(cur[me] + gsizes[me], new[r] + numelems[r])
        scounts.append(max(0, hi - lo) * row)
        sdispl.append(max(0, lo - cur[me]) * row)
        lo, hi = max(cur[r], new[me]), min(cur[r] + gsizes[r], new[me] + numelem)
        rcounts.append(max(0, hi - lo) * row)
        rdispl.append(max(0, lo - new[me]) * row)
    out = mpi_empty((numelem, *rest), t)
    _mpiad.alltoallv(comm, x.data_ptr(), scounts, sdispl, out.data_ptr(), rcounts, rdispl, _CODE[x.dtype])
    return _back(out, saxis, t)


def reduce_scatter(comm: int, t: Tensor, op: int, axis: int, numelem: int) -> Tensor:
    """Reduce every rank's ``t`` elementwise; rank r keeps its ``numelem`` slices along ``axis``."""
    sigs = exchange(comm, [*_signature(OP_REDUCE_SCATTER, t, op, axis, 0), numelem])
    check_signatures([s[:-1] for s in sigs])
    numelems = [s[-1] for s in sigs]
    if any(n < 0 for n in numelems) or sum(numelems) != t.shape[axis]:
        raise MpiadValueError(
            f"Reduce_scatter: the ranks' numelem {numelems} sum to {sum(numelems)}, but the tensors have "
            f"{t.shape[axis]} elements along axis {axis}"
        )
    x = _front(t, axis)
    inner = _inner(t, axis)
    out = mpi_empty((numelem, *x.shape[1:]), t)
    _mpiad.reduce_scatter(comm, x.data_ptr(), out.data_ptr(), [n * inner for n in numelems], _CODE[x.dtype], op)
    return _back(out, axis, t)


def sendrecv(comm: int, t: Tensor, dest: int, sendtag: int, like: Tensor, source: int, recvtag: int) -> Tensor:
    """Send ``t`` to ``dest`` and receive a tensor shaped like ``like`` from ``source``."""
    if like.dtype != t.dtype:
        raise MpiadTypeError(f"Sendrecv: send dtype {t.dtype} differs from receive dtype {like.dtype}")
    x = to_mpi(t)
    out = mpi_empty(like.shape, like)
    _mpiad.sendrecv(
        comm, x.data_ptr(), x.numel(), dest, sendtag, out.data_ptr(), out.numel(), source, recvtag, _CODE[x.dtype]
    )
    return from_mpi(out, like)
