"""Create HOST and CHUNKED tensors, then the last rank is SIGKILLed mid-run (run under mpiexec).

The test then checks that nothing was left in /dev/shm.
"""

from __future__ import annotations

import os
import signal

import torch
from mpi4py import MPI

import wholemem as wg

mpi = MPI.COMM_WORLD
rank, size = mpi.Get_rank(), mpi.Get_size()
wg.init_lib()
comm = wg.communicator_from_mpi4py(mpi)
host = wg.create_wm_tensor(comm, [1000, 16], [], torch.float32, wg.WmTensorType.HOST)
chunked = wg.create_wm_tensor(comm, [1000, 16], [], torch.float32, wg.WmTensorType.CHUNKED)
wg.scatter(chunked, torch.tensor([rank]), torch.ones(1, 16))
host[rank] = 1.0
comm.barrier()
print(f"rank {rank}: tensors created", flush=True)
if rank == size - 1:
    os.kill(os.getpid(), signal.SIGKILL)
comm.barrier()  # the others are stuck here until the launcher kills them
