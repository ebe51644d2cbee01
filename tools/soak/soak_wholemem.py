"""wholemem soak on N ranks: tensors of every CPU memory type created, scattered, gathered
and freed again and again, every value checked (run under mpiexec by tools/soak.py).

usage: soak_wholemem.py <seconds> <out dir>
"""

from __future__ import annotations

import faulthandler
import sys

import torch
from _probe import Soak
from mpi4py import MPI

import wholemem as wg

SECONDS, OUT = float(sys.argv[1]), sys.argv[2]
faulthandler.dump_traceback_later(SECONDS + 300)
mpi = MPI.COMM_WORLD
rank, size = mpi.Get_rank(), mpi.Get_size()
T = wg.WmTensorType
DTYPES = [torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.int8]


def expected(rows: torch.Tensor, ncols: int, dtype: torch.dtype, salt: int | torch.Tensor) -> torch.Tensor:
    """(3*row + 5*col + salt) % 101 (salt: one, or one per row): exact in every dtype drawn."""
    salt = torch.as_tensor(salt).reshape(-1, 1)
    return ((rows[:, None] * 3 + torch.arange(ncols)[None, :] * 5 + salt) % 101).to(dtype)


wg.init_lib()
comm = wg.create_communicator(size, mpi.bcast(wg.get_unique_id() if rank == 0 else None, root=0), rank)
soak = Soak(mpi, "wholemem", SECONDS, OUT)
# the shapes and dtypes are drawn on rank 0 and shared: creation is collective
shared = torch.Generator().manual_seed(7)
mine = torch.Generator().manual_seed(100 + rank)
while True:
    for ty in (T.HOST, T.CHUNKED, T.NCCL):
        n = int(torch.randint(1, 600, (1,), generator=shared))
        ncols = int(torch.randint(1, 9, (1,), generator=shared))
        dtype = DTYPES[int(torch.randint(len(DTYPES), (1,), generator=shared))]
        t = wg.create_wm_tensor(comm, [n, ncols], [], dtype, ty)
        soak.ops["create"] += 1
        soak.sample_segments()
        local, first = wg.get_local_tensor(t)
        own = torch.arange(first, first + local.shape[0])
        wg.scatter(t, own, expected(own, ncols, dtype, 0))  # the owners write their rows
        comm.barrier()
        # then each rank rewrites the rows r = rank (mod size), wherever they live
        rows = torch.arange(n)[rank::size]  # (none where n <= rank)
        wg.scatter(t, rows, expected(rows, ncols, dtype, 1 + rows % size))
        soak.ops["scatter"] += 2
        comm.barrier()
        idx = torch.randint(0, n, (int(torch.randint(1, 4 * n + 1, (1,), generator=mine)),), generator=mine)
        got = wg.gather(t, idx)
        assert torch.equal(got, expected(idx, ncols, dtype, 1 + idx % size)), (rank, ty, dtype, n, ncols)
        out = torch.empty_like(got)
        wg.gather(t, idx.to(torch.int32), out=out)
        assert torch.equal(out, got)
        soak.ops["gather"] += 2
        comm.barrier()  # nobody frees while another still gathers
        del t, local, got, out
        soak.ops["free"] += 1
    if not soak.next_round():
        break
soak.finish()
wg.destroy_communicator(comm)
wg.finalize_lib()
if rank == 0:
    print("wholemem soak ok", flush=True)
