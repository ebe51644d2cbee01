"""Every tensor type x dtype x layout on N ranks (run under mpiexec by test_multirank.py).

usage: worker_tensors.py <shared tmp dir>
"""

from __future__ import annotations

import sys

import pytest
import torch
from mpi4py import MPI

import wholemem as wg

T = wg.WmTensorType
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64]


def expected(rows: torch.Tensor, ncols: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Values encoding the row id: (3*row + 5*col) % 101 (exact in every dtype, unique per row for N <= 101)."""
    if ncols is None:
        return ((rows * 3) % 101).to(dtype)
    cols = torch.arange(ncols)
    return ((rows[:, None] * 3 + cols[None, :] * 5) % 101).to(dtype)


def owned_rows(t: object) -> tuple[int, int]:
    local, first = wg.get_local_tensor(t)
    return first, first + local.shape[0]


def check_tensor(
    comm: wg.WholeMemoryCommunicator, ty: wg.WmTensorType, shape: list[int], stride: list[int], dtype: torch.dtype
) -> None:
    rank, size = comm.rank, comm.size
    t = wg.create_wm_tensor(comm, shape, stride, dtype, ty)
    n = shape[0]
    ncols = shape[1] if len(shape) == 2 else None
    if ty is T.HOST:
        assert isinstance(t, torch.Tensor) and t.shape == torch.Size(shape)
        if stride:
            assert t.stride() == tuple(stride), (t.stride(), stride)
    else:
        assert isinstance(t, wg.ChunkedTensor if ty is T.CHUNKED else wg.NCCLTensor)
        assert t.shape == torch.Size(shape) and t.dtype == dtype and t.dim() == len(shape)
        assert t.get_ptr() != 0
        if stride:
            assert tuple(t.stride) == tuple(stride) and t.stride() == tuple(stride)
    # WholeGraph's plan: (local_start, local_entry_count, entry_per_rank, total_entry_count), k = ceil(n/size)
    k = -(-n // size)
    start = min(n, rank * k)
    plan = (start, min(n, (rank + 1) * k) - start, k, n)
    assert wg.get_partition_plan(t) == plan, (wg.get_partition_plan(t), plan)
    assert wg.get_partition_plan(t, n) == plan and wg.get_partition_plan(comm, n) == plan
    lo, hi = owned_rows(t)
    assert (lo, hi) == (plan[0], plan[0] + plan[1]), (lo, hi, plan)
    # zero-initialised
    assert torch.all(wg.gather(t, torch.arange(n)) == 0)
    comm.barrier()
    # owners scatter their rows
    mine = torch.arange(lo, hi)
    wg.scatter(t, mine, expected(mine, ncols, dtype))
    comm.barrier()
    # every rank gathers random rows (int64 and int32 indices)
    g = torch.Generator().manual_seed(1234 + rank)
    idx = torch.randint(0, max(n, 1), (3 * n + 1 if n else 0,), generator=g)
    got = wg.gather(t, idx)
    assert torch.equal(got, expected(idx, ncols, dtype)), (ty, dtype, shape)
    out = torch.empty_like(got)
    wg.gather(t, idx.to(torch.int32), out=out)
    assert torch.equal(out, got)
    # the local part holds the owned rows
    local, first = wg.get_local_tensor(t)
    assert torch.equal(local, expected(torch.arange(first, first + local.shape[0]), ncols, dtype))
    if ty is T.HOST:
        assert torch.equal(t, expected(torch.arange(n), ncols, dtype))
    # sub-tensor view
    if ncols is not None and n >= 3 and ncols >= 3:
        sub = wg.get_sub_tensor(t, [1, 1], [n - 1, ncols - 1])
        assert tuple(sub.shape) == (n - 2, ncols - 2)
        sidx = torch.randint(0, n - 2, (n,), generator=g)
        full = expected(sidx + 1, ncols, dtype)[:, 1 : ncols - 1]
        assert torch.equal(wg.gather(sub, sidx), full)
        sl, sf = wg.get_local_tensor(sub)
        assert torch.equal(sl, expected(torch.arange(sf + 1, sf + 1 + sl.shape[0]), ncols, dtype)[:, 1 : ncols - 1])
    # a write by the last rank is seen by all
    comm.barrier()
    if n < 2:
        return
    special = torch.full((1, *shape[1:]), 77).to(dtype)
    if rank == size - 1:
        wg.scatter(t, torch.tensor([0]), special)
    elif ty is T.NCCL:
        wg.scatter(t, torch.empty(0, dtype=torch.int64), torch.empty((0, *shape[1:]), dtype=dtype))
    comm.barrier()
    assert torch.equal(
        wg.gather(t, torch.tensor([0, n - 1])), torch.cat([special, expected(torch.tensor([n - 1]), ncols, dtype)])
    )
    comm.barrier()


def main() -> None:
    mpi = MPI.COMM_WORLD
    rank, size = mpi.Get_rank(), mpi.Get_size()
    tmp = sys.argv[1]
    wg.init_lib()
    uid = mpi.bcast(wg.get_unique_id() if rank == 0 else None, root=0)
    comm = wg.create_communicator(size, uid, rank)
    assert (comm.rank, comm.size, comm.local_size, comm.num_nodes) == (rank, size, size, 1)
    n = 7 * size + 2  # uneven: the last rank owns fewer rows
    for ty in (T.HOST, T.CHUNKED, T.NCCL):
        for dtype in DTYPES:
            check_tensor(comm, ty, [n], [], dtype)
            check_tensor(comm, ty, [n, 5], [], dtype)
        # strided layouts: padded rows, column-major, 1-D with a gap, fewer rows than ranks
        check_tensor(comm, ty, [n, 4], [7, 1], torch.float32)
        check_tensor(comm, ty, [n, 3], [1, n], torch.int64)
        check_tensor(comm, ty, [n], [2], torch.bfloat16)
        check_tensor(comm, ty, [1, 3], [], torch.float32)
        check_tensor(comm, ty, [0, 3], [], torch.float32)

    # the original's free functions, defaults and (start, count) sub-tensors
    assert wg.get_rank(comm) == rank and wg.get_size(comm) == size
    wg.barrier(comm)
    c = wg.create_wm_tensor(comm, [n, 4])  # strides=[], float32, CHUNKED by default
    assert isinstance(c, wg.ChunkedTensor) and c.dtype == torch.float32 and c.stride() == (4, 1)
    assert wg.get_wm_tensor_type(c) is T.CHUNKED and wg.get_wm_communicator(c) is comm
    nt = wg.create_wm_tensor(comm, [n, 4], [], torch.float32, T.NCCL)
    h = wg.create_wm_tensor(comm, [n, 4], [], torch.float32, T.HOST)
    assert wg.get_wm_tensor_type(nt) is T.NCCL and wg.get_wm_tensor_type(h) is T.HOST
    assert wg.get_wm_communicator(h) is comm
    for x in (c, nt):
        lo, hi = owned_rows(x)
        wg.scatter(x, torch.arange(lo, hi), expected(torch.arange(lo, hi), 4, torch.float32))
    comm.barrier()
    full = expected(torch.arange(n), 4, torch.float32)
    sc = wg.get_sub_chunked_tensor(c, [2, 1], [3])  # rows 2..4, columns 1..3 (count missing = to the end)
    assert tuple(sc.shape) == (3, 3)
    assert torch.equal(wg.gather(sc, torch.tensor([0, 2, 1])), full[[2, 4, 3], 1:])
    tail = wg.get_sub_chunked_tensor(c, [n - 2], [-1])
    assert tuple(tail.shape) == (2, 4) and torch.equal(wg.gather(tail, torch.tensor([1, 0])), full[[n - 1, n - 2]])
    sn = wg.get_sub_nccl_tensor(nt, [1, 0], [2, 2])  # rows 1..2, columns 0..1
    assert tuple(sn.shape) == (2, 2)
    assert torch.equal(wg.gather(sn, torch.tensor([1, 0, 1])), full[[2, 1, 2], :2])  # collective
    comm.barrier()

    # DISTRIBUTED is NCCL
    assert isinstance(wg.create_wm_tensor(comm, [4, 2], [], torch.float32, wg.DISTRIBUTED), wg.NCCLTensor)

    # file round trips with a different number of parts than ranks, across types
    for src_ty, dst_ty in ((T.HOST, T.NCCL), (T.NCCL, T.CHUNKED), (T.CHUNKED, T.HOST)):
        for shape, dtype in (([n, 6], torch.float32), ([n], torch.int64), ([n, 3], torch.bfloat16)):
            ncols = shape[1] if len(shape) == 2 else None
            src = wg.create_wm_tensor(comm, shape, [], dtype, src_ty)
            lo, hi = owned_rows(src)
            wg.scatter(src, torch.arange(lo, hi), expected(torch.arange(lo, hi), ncols, dtype))
            comm.barrier()
            d = f"{tmp}/{src_ty.name}_{len(shape)}_{dtype}"
            files = wg.store_to_files(src, d, num_parts=size + 2)
            assert len(files) == size + 2
            dst = wg.create_wm_tensor(comm, shape, [], dtype, dst_ty)
            wg.load_from_files(dst, d)
            assert torch.equal(wg.gather(dst, torch.arange(n)), expected(torch.arange(n), ncols, dtype))
            dst2 = wg.create_wm_tensor(comm, shape, [], dtype, src_ty)
            wg.load_from_files(dst2, list(reversed(list(reversed(files)))))  # plain file list, no metadata
            assert torch.equal(wg.gather(dst2, torch.arange(n)), expected(torch.arange(n), ncols, dtype))

    # WholeGraph's file convention: each rank wrote its local rows to <prefix>_part_<rank>_of_<size>
    orig = wg.create_wm_tensor(comm, [n, 3], [], torch.float64, T.HOST)
    lo, hi = owned_rows(orig)
    local, _ = wg.get_local_tensor(orig)
    local.copy_(expected(torch.arange(lo, hi), 3, torch.float64))
    local.numpy().tofile(f"{tmp}/orig_part_{rank}_of_{size}")
    comm.barrier()
    assert wg.stat_filelist_element_count(f"{tmp}/orig", torch.float64) == 3 * n
    for ty in (T.CHUNKED, T.NCCL):
        back = wg.create_wm_tensor_from_file([n, 3], torch.float64, comm, f"{tmp}/orig", ty)
        assert torch.equal(wg.gather(back, torch.arange(n)), expected(torch.arange(n), 3, torch.float64))
    flat = wg.create_wm_tensor_from_file([], torch.float64, comm, f"{tmp}/orig")  # 1-D, CHUNKED by default
    assert isinstance(flat, wg.ChunkedTensor) and tuple(flat.shape) == (3 * n,)
    assert torch.equal(wg.gather(flat, torch.arange(3 * n)), expected(torch.arange(n), 3, torch.float64).reshape(-1))
    comm.barrier()

    # mismatched arguments raise on every rank (no hang)
    if size > 1:
        with pytest.raises(ValueError, match="same arguments"):
            wg.create_wm_tensor(comm, [10 + rank, 2], [], torch.float32, T.HOST)
        bad_dtype = torch.complex64 if rank == size - 1 else torch.float32
        if rank == size - 1:
            with pytest.raises(TypeError, match="dtype"):
                wg.create_wm_tensor(comm, [10, 2], [], bad_dtype, T.CHUNKED)
        else:
            with pytest.raises(RuntimeError, match=f"rank {size - 1}"):
                wg.create_wm_tensor(comm, [10, 2], [], bad_dtype, T.CHUNKED)
    comm.barrier()
    wg.destroy_communicator(comm)
    with pytest.raises(RuntimeError, match="destroyed"):
        comm.barrier()
    with pytest.raises(RuntimeError, match="destroyed"):
        wg.get_rank(comm)
    wg.finalize_lib()
    if rank == 0:
        print("worker_tensors OK", size)


if __name__ == "__main__":
    main()
