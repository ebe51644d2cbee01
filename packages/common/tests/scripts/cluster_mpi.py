"""Job for test_cluster: every rank reports where it runs and an exact allreduce sum (mpi4py).

--fail-rank R: rank R raises after the sum; --hang-rank R: rank R sleeps forever;
--loop: allreduce until killed, rank 0 printing LOOP RUNNING once under way (fault tests);
--chatty-host H: instead, the ranks on host H write output without pause (never idle in MPI) and
the others wait in a barrier, so H's daemon always has output in flight to mpiexec.
"""

import argparse
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--loop", action="store_true")
parser.add_argument("--chatty-host", default="")
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
# ranks Open MPI considers co-located (shared memory between them): those of one host
node = comm.Split_type(MPI.COMM_TYPE_SHARED)
x = np.full(1024, float(rank + 1))
y = np.empty_like(x)
comm.Allreduce(x, y)
# one write per line: ranks of a host share the launcher's pipe, and two-part writes interleave
sys.stdout.write(
    f"rank {rank} size {size} host {socket.gethostname()} "
    f"local {os.environ['OMPI_COMM_WORLD_LOCAL_RANK']} node_size {node.size} "
    f"master {os.environ['MASTER_ADDR']} sum {int(y[0])} exact {bool((y == size * (size + 1) / 2).all())}\n"
)
sys.stdout.flush()
if rank == args.fail_rank:
    raise ValueError(f"boom from rank {rank}")
if rank == args.hang_rank:
    time.sleep(3600)
if args.chatty_host:
    comm.Barrier()
    if rank == 0:
        print("LOOP RUNNING", flush=True)
    if socket.gethostname() == args.chatty_host:
        for i in range(10**9):
            sys.stdout.write(f"rank {rank} line {i} {'x' * 200}\n")
            sys.stdout.flush()
            time.sleep(0.001)
    comm.Barrier()
if args.loop:
    for i in range(10**9):
        comm.Allreduce(x, y)
        if i == 100 and rank == 0:
            print("LOOP RUNNING", flush=True)
        time.sleep(0.005)
comm.Barrier()
