"""End-to-end smoke of every package on N ranks (stands in until the composed job exists)."""

from __future__ import annotations

from mpi4py import MPI

import distkit_common
import distx_fake
import kvps
import mpiad
import shardlayers
import wholemem

comm = MPI.COMM_WORLD
for mod in (distkit_common, wholemem, shardlayers, distx_fake, kvps, mpiad):
    assert mod.__version__ == distkit_common.__version__, mod
total = comm.allreduce(comm.rank)
if comm.rank == 0:
    print(f"distkit {distkit_common.__version__}: 6 packages import on {comm.size} ranks (rank sum {total})")
