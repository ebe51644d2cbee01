"""Helper job for test_python_helpers: every rank prints, optionally one fails or hangs."""

import argparse
import os
import sys
import time

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
args = parser.parse_args()

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank)
print(f"rank {comm.rank} of {comm.size} sum {total}", flush=True)
backing = os.environ.get("OMPI_MCA_btl_sm_backing_directory", "")  # noqa: SIM112 (Open MPI spells it so)
print(f"backing {backing} files {sorted(os.listdir(backing)) if backing else []}", flush=True)
if comm.rank == args.fail_rank:
    sys.exit(2)
if comm.rank == args.hang_rank:
    time.sleep(3600)  # only a kill ends it within a test
comm.Barrier()
