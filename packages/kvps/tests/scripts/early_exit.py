"""A rank that exits without Server.shutdown() makes its peers fail fast (run under mpiexec -n 2).

Rank 1 leaves after a first barrier (its atexit hook tells the peers it is
going away). Rank 0 then blocks in a barrier and in a pull of a key homed on
rank 1: both must raise RuntimeError naming rank 1, not hang (the test's timeout,
generous for a loaded machine, is what catches a hang: nothing here measures time).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

import kvps

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2

kvps.setup(10, 1, "all")
server = kvps.Server(4)
w = kvps.Worker(0, server)
w.push(np.arange(10, dtype=np.int64), np.ones(40, dtype=np.float32))
server.barrier()

if rank == 1:
    # usually rank 0 is blocked in its barrier by now; if not (a loaded machine), its barrier
    # starts after the goodbye, and must raise just the same
    time.sleep(1.0)
    print("rank 1 leaves without shutdown", flush=True)
    sys.exit(0)

with pytest.raises(RuntimeError, match=r"kvps rank 1 exited without calling Server\.shutdown\(\)"):
    w.barrier()  # rank 1 never arrives
with pytest.raises(RuntimeError, match="rank 1 exited"):
    w.pull(np.array([1], dtype=np.int64), np.zeros(4, dtype=np.float32))  # homed on rank 1
with pytest.raises(RuntimeError, match="rank 1 exited"):
    w.wait_sync()
# the server is broken for good: local operations refuse too
with pytest.raises(RuntimeError, match="rank 1 exited"):
    w.push(np.array([0], dtype=np.int64), np.ones(4, dtype=np.float32))
print("early exit ok: rank 0 failed with the error naming rank 1", flush=True)
