"""wholemem in one script: `mpiexec -n 2 python -m mpi4py wholemem_quickstart.py`.

A CHUNKED tensor shared by the ranks of a node, a gather of any rows, and a trainable
embedding whose rows are partitioned over the ranks (DISTRIBUTED), saved in 4 parts.
"""

import tempfile

import torch
from mpi4py import MPI

import wholemem as wg

mpi = MPI.COMM_WORLD
wg.init_lib()
uid = mpi.bcast(wg.get_unique_id() if mpi.rank == 0 else None)  # any channel works
comm = wg.create_communicator(mpi.size, uid, mpi.rank)

feat = wg.create_wm_tensor(comm, [1000, 16], [], torch.float32, wg.WmTensorType.CHUNKED)
local, first = wg.get_local_tensor(feat)  # this rank's rows, shared memory
local.copy_(torch.arange(first, first + len(local)).float()[:, None].expand(-1, 16))
comm.barrier()
rows = wg.gather(feat, torch.tensor([999, 0, 500]))  # any row, from any rank
assert torch.equal(rows[:, 0], torch.tensor([999.0, 0.0, 500.0]))

emb = wg.Embedding(comm, 1000, 8, optimizer=wg.LazyAdam(lr=0.01), tensor_type=wg.DISTRIBUTED)
loss = emb(torch.randint(0, 1000, (64,))).pow(2).sum()
loss.backward()
emb.step()  # collective: each gradient row goes to the rank that owns the row
folder = mpi.bcast(tempfile.mkdtemp(prefix="wholemem-example-") if mpi.rank == 0 else None)
emb.save(folder, num_parts=4)  # raw row-major parts + part.json, loadable on any rank count
print(f"rank {mpi.rank}: rows {first}..{first + len(local) - 1} are mine; loss {loss.item():.3f}")
comm.destroy()
wg.finalize_lib()
