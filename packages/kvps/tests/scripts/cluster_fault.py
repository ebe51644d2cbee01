"""A training loop that checkpoints every round, for the fault tests across hosts.

Usage: cluster_fault.py loop <checkpoint dir>
       cluster_fault.py load <checkpoint dir> <rounds>

``loop`` (2 hosts x 2 ranks): round r: every rank pushes 1 to every key
(concurrently, through shared memory and messages), then ``server.save``, so the
checkpoint of round r holds r * size in every element. From round 3 on, each
rank prints ``WROTE SHARD 3`` once its shard file is written and the ranks of
the second host then stay inside the save: the tests inject their fault
(SIGKILL of that host's ranks, or its link down) at that line, while a
checkpoint is being written.

``load`` (any rank count): the checkpoint at the path is the last complete one,
of round ``rounds``, exactly; the interrupted save left it untouched.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import kvps
from distkit_common import fsio

faulthandler.dump_traceback_later(float(os.environ.get("KVPS_TEST_DUMP_AFTER_S", "150")))
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
host = socket.gethostname()
MODE, PATH = sys.argv[1], sys.argv[2]
NK, DIM = 20_000, 16
SAVED_RANKS = 4

hosts = comm.allgather(host)
kvps.setup(NK, 1, "all")
server = kvps.Server(DIM)
w = kvps.Worker(0, server)
allk = np.arange(NK, dtype=np.int64)

if MODE == "loop":
    assert size == SAVED_RANKS and len(set(hosts)) == 2, hosts
    write_file = fsio.write_file
    current = 0

    def write_then_stall(path: str, data: bytes, **kw: bool) -> None:
        write_file(path, data, **kw)
        if current >= 3 and path.endswith(".vals"):
            print(f"rank {rank} on {host} WROTE SHARD {current}", flush=True)
            if host != hosts[0]:
                time.sleep(120)  # inside the save when the fault comes

    fsio.write_file = write_then_stall  # kvps._persist calls it through the module
    for current in range(1, 100):
        w.push(allk, np.ones(NK * DIM, dtype=np.float32))
        server.barrier()
        server.save(PATH)
        if rank == 0:
            print(f"SAVED {current}", flush=True)
    raise AssertionError("the fault never came")
else:
    rounds = int(sys.argv[3])
    server.load(PATH)
    out = np.zeros(NK * DIM, dtype=np.float32)
    w.pull(allk, out)
    bad = np.flatnonzero(out != rounds * SAVED_RANKS)
    assert bad.size == 0, (
        f"rank {rank}: {bad.size} elements differ from round {rounds}'s {rounds * SAVED_RANKS}: {out[bad[:5]]}"
    )
    server.barrier()
    server.shutdown()
    if rank == 0:
        print(f"fault load ok: round {rounds} on {size} ranks", flush=True)
