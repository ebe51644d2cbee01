"""distkit-common in one script: `mpiexec -n 2 python -m mpi4py common_quickstart.py`.

Every rank finds its place in the job from the launcher's variables, checks its arguments with
the shared validators, and agrees with the other ranks on whether a step failed.
"""

import numpy as np
import torch
from mpi4py import MPI

from distkit_common import launch_info, rows
from distkit_common.collective import CollectiveError, all_ranks
from distkit_common.dtypes import code_of
from distkit_common.validate import as_index_tensor

comm = MPI.COMM_WORLD
info = launch_info()  # from Open MPI's variables here; torchrun's, SLURM's, PMIx's elsewhere
assert (info.rank, info.world_size) == (comm.rank, comm.size), info
print(f"rank {info.rank} of {info.world_size} (launcher {info.launcher}, local rank {info.local_rank})")

assert code_of(torch.bfloat16) == 1  # the dtype code every native module takes
keys = as_index_tensor(np.array([3, 1]), "keys", upper=10)
assert keys.tolist() == [3, 1]
try:
    as_index_tensor(np.array([3, 12]), "keys", upper=10)
except IndexError as e:
    print("refused:", e)  # names the bad key and its position
else:
    raise AssertionError("an out-of-range key was accepted")

# a failure on rank 0 is raised on every rank: rank 0 its own error, the others a CollectiveError
try:
    with all_ranks(comm, "write shard"):
        if comm.rank == 0:
            raise ValueError("disk full")
except ValueError as e:
    if comm.rank != 0 and not isinstance(e, CollectiveError):
        raise AssertionError(f"rank {comm.rank} got {e!r}, not a CollectiveError") from e
    print(f"rank {comm.rank}: {type(e).__name__}: {e}")
else:
    raise AssertionError("the failure of rank 0 did not reach this rank")

# the native row gather every package builds on
table = torch.arange(12.0).reshape(6, 2)
idx = torch.tensor([5, 0, 5])
out = torch.empty(3, 2)
rows.row_op("gather", [table.data_ptr()], 6, 6, 2, 2, 1, table.dtype, idx.data_ptr(), True, 3, out.data_ptr())
assert torch.equal(out, table[idx])
