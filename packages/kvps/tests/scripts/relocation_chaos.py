"""Keys moved back and forth faster than their values travel (run under mpiexec -n 2..4).

Few keys, two worker threads per rank, every worker intending a random few
of them from the next clock on (one worker for one clock, the other for 1-3),
then pushing and pulling them at once; now and then a worker localizes one.
The homes relocate each key again and again, often back to a rank (the home
itself included) while its value is still on the way there and already
ordered on to another rank. Checks: no operation is forwarded in a loop, no
transfer reaches a rank the key is not on its way to, and every push counts
exactly once.

Arguments: the mode, ``msg`` (every foreign key a message) or ``shm`` (4
ranks acting as 2 nodes of 2, memory shared within a node: intents move keys
between the nodes while co-located ranks use each other's keys in place), and
the technique (``all``, ``relocation_only``, ``replication_only``).
"""

from __future__ import annotations

import faulthandler
import os
import sys

import numpy as np
from _settle import settle_and_check_sums
from _threads import run_threads
from mpi4py import MPI

import kvps

faulthandler.dump_traceback_later(100)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
NT, NK, PER_STEP, STEPS = 2, 12, 4, 400
shared, technique = sys.argv[1] == "shm", sys.argv[2]
if shared:  # (with every rank on one node, intents would move nothing: all keys are in reach)
    assert size == 4
    os.environ["DISTKIT_NODE_ID"] = str(rank // 2)  # read when the Server is created

kvps.setup(NK, NT, technique)
s = kvps.Server(1, shared_memory=shared)
workers = [kvps.Worker(w, s) for w in range(NT)]
pushed = np.zeros((NT, NK), dtype=np.int64)


def body(t: int) -> None:
    kv = workers[t]
    rng = np.random.default_rng(100 * rank + t)
    kv.barrier()
    for step in range(STEPS):
        ks = np.unique(rng.integers(0, NK, size=PER_STEP)).astype(np.int64)
        if step % 5 == t:  # now and then a localize of one of them, racing the intents
            kv.localize(ks[:1], True)
        # worker 0: windows of one clock (moves); worker 1: of 1-3 clocks (replicas too)
        start = kv.current_clock() + 1
        kv.intent(ks, start, start + (1 if t == 0 else int(rng.integers(1, 4))))
        kv.push(ks, np.ones(len(ks), dtype=np.float32), True)
        kv.pull(ks, np.zeros(len(ks), dtype=np.float32), True)
        pushed[t, ks] += 1
        kv.advance_clock()
    kv.waitall()
    kv.barrier()


run_threads(body, NT)
settle_and_check_sums(workers[0], s, comm, pushed.sum(axis=0), 1, clocks=4)
s.barrier()
s.shutdown()
if rank == 0:
    print(f"relocation chaos ok: ranks={size} shm={shared} technique={technique}")
