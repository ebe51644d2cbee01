"""kvps on 4 ranks as 2 nodes of 2, memory shared within a node.

On one machine the ranks act as 2 nodes (DISTKIT_NODE_ID = rank // 2); across the
hosts of the simulated cluster (2 hosts x 2 ranks, ranks 0-1 on the first) they
are on 2 hosts and Open MPI's own co-location decides.

Checks: a key of the node's other rank is served in place (ts == -1) and intent
does not move it; a key on the other node is relocated (intended by one rank)
or replicated (intended by ranks on both nodes) as without shared memory; a
pull of a key on the other node is a message; pushes through every path sum
exactly.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket

import numpy as np
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(100)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 4
hosts = comm.allgather(socket.gethostname())
if len(set(hosts)) == 1:
    os.environ["DISTKIT_NODE_ID"] = str(rank // 2)  # read when a Server is created
else:  # real hosts: the same grouping, by Open MPI
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
NK, L = 400, 3
OWNED, NOT_HERE, REPLICA = (_kvps.KEY_STATES[s] for s in ("owned", "not_here", "replica"))

for tech in ("relocation_only", "all"):
    kvps.setup(NK, 1, tech)
    s = kvps.Server(L)
    w = kvps.Worker(0, s)
    assert s.shares_memory
    e = s._engine
    buf = np.zeros(L * 5, dtype=np.float32)
    same = np.array([k for k in range(NK) if k % size == 1][:5], dtype=np.int64)  # rank 1: node 0
    other = np.array([k for k in range(NK) if k % size == 2][:5], dtype=np.int64)  # rank 2: node 1
    if rank == 2:  # a key on the other node is a message
        assert w.pull(np.arange(0, 20, 4, dtype=np.int64), buf) != -1
    if rank == 0:
        assert w.pull(same, buf) == -1  # in place in rank 1's shard
        assert w.pull(other, buf) != -1
    s.barrier()
    c = w.current_clock()
    if rank == 0:
        w.intent(same, c, c + 2)
        w.intent(other, c, c + 2)
    w.wait_sync()
    s.barrier()
    if tech == "all" and rank == 3:  # then a rank of the other node intends `same` too: a replica there
        w.intent(same, c, c + 2)
    w.wait_sync()
    s.barrier()
    if rank == 0:
        assert [e.key_state(int(k)) for k in same] == [NOT_HERE] * 5, "intent moved a key served in place"
        assert [e.key_state(int(k)) for k in other] == [OWNED] * 5, "a key on the other node was not relocated"
        assert w.pull(same, buf) == -1 and w.pull(other, buf) == -1
        assert e.num_replicas() == 0
    if rank == 1:
        assert [e.key_state(int(k)) for k in same] == [OWNED] * 5
    if tech == "all" and rank == 3:
        assert [e.key_state(int(k)) for k in same] == [REPLICA] * 5, "no replica on the other node"
    s.barrier()
    # every rank pushes rank+1 to every key, through every path at once
    allk = np.arange(NK, dtype=np.int64)
    for _ in range(10):
        w.push(allk, np.full(NK * L, rank + 1, dtype=np.float32), True)
    w.waitall()
    for _ in range(3):
        w.advance_clock()
    w.wait_sync()
    s.barrier()
    w.wait_sync()
    s.barrier()
    out = np.zeros(NK * L, dtype=np.float32)
    w.wait(w.pull(allk, out))
    assert np.all(out == 10 * sum(range(1, size + 1))), (rank, out[:6])
    st = s.stats()
    assert st["shared"] > 0 and st["remote"] > 0 and st["local"] > 0, st
    print(f"nodes stats: rank {rank} on {hosts[rank]} {tech} {json.dumps(st, sort_keys=True)}", flush=True)
    s.barrier()
    s.shutdown()
    if rank == 0:
        print(f"nodes ok: {tech} on hosts {sorted(set(hosts))}", flush=True)
