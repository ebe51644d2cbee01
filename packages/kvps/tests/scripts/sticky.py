"""Relocation sticks (AdaPM's semantics) on 3 ranks exchanging messages (run under mpiexec -n 3).

Every rank acts as a host of its own (no shared memory), as ranks on different
hosts do. Checks, while every rank pushes +1 to random keys all along:
  * a key that one rank intends for one clock becomes local there, and stays
    local after its window ends (not sent home), for many clocks;
  * keys that two ranks intend at the same time have a local copy on both
    (one owns the key, the other holds a replica) and their pulls are local;
  * a key another rank intends later moves on to that rank and leaves the first;
  * every push, through whichever path, is counted exactly.
"""

from __future__ import annotations

import faulthandler

import numpy as np
from _settle import settle_and_check_sums
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(100)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 3
NK, L, AHEAD = 30_000, 2, 2
OWNED, REPLICA = _kvps.KEY_STATES["owned"], _kvps.KEY_STATES["replica"]

kvps.setup(NK, 1, "all")
s = kvps.Server(L, shared_memory=False, intent_lookahead=AHEAD)
w = kvps.Worker(0, s)
rng = np.random.default_rng(3 + rank)
pushed = np.zeros(NK, dtype=np.int64)
# keys homed on rank 1, to be used by rank 0 (A), by ranks 0 and 2 together (B)
A = np.arange(1, 3000, 3, dtype=np.int64)[:400]
B = np.arange(3001, 9000, 3, dtype=np.int64)[:300]
assert np.all(A % size == 1) and np.all(B % size == 1)


def noise() -> None:
    """+1 to 200 random keys (concurrent pushes of every rank, through every path)."""
    ks = np.unique(rng.integers(0, NK, size=200)).astype(np.int64)
    w.push(ks, np.ones(len(ks) * L, dtype=np.float32), True)
    pushed[ks] += 1


def clock(n: int = 1) -> None:
    for _ in range(n):
        noise()
        w.advance_clock()


def use(keys: np.ndarray) -> int:
    ts = w.pull(keys, np.zeros(len(keys) * L, dtype=np.float32))
    w.wait(ts)
    w.wait(w.push(keys, np.ones(len(keys) * L, dtype=np.float32)))
    pushed[keys] += 1
    return ts


def states(keys: np.ndarray) -> np.ndarray:
    return np.array([s._engine.key_state(int(k)) for k in keys])


s.barrier()
# 1. rank 0 intends A for one clock: A moves there and stays after the window
if rank == 0:
    c = w.current_clock()
    w.intent(A, c, c + 1)
    w.wait_sync()
    assert np.all(states(A) == OWNED), "an intended key did not move to the only rank intending it"
    assert use(A) == -1
clock(3 * AHEAD + 20)  # long past the window
w.wait_sync()
s.barrier()
w.wait_sync()
if rank == 0:
    assert np.all(states(A) == OWNED), f"{np.count_nonzero(states(A) != OWNED)} keys left after their window ended"
    assert use(A) == -1, "a key moved here was not local after its window"
else:
    assert not np.any(states(A) == OWNED), "a key moved to rank 0 went back home"
s.barrier()

# 2. ranks 0 and 2 intend B at the same time (several clocks): a local copy on both
if rank in (0, 2):
    c = w.current_clock()
    w.intent(B, c, c + 4)
s.barrier()
w.wait_sync()
s.barrier()
w.wait_sync()
if rank in (0, 2):
    st = states(B)
    assert np.all((st == OWNED) | (st == REPLICA)), f"rank {rank}: keys two ranks intend are not here: {np.unique(st)}"
    assert w.pull(B, np.zeros(len(B) * L, dtype=np.float32)) == -1
owners = comm.allreduce((states(B) == OWNED).astype(np.int64))
assert np.all(owners == 1), "a key has no single owner"
s.barrier()
clock(6)
s.barrier()

# 3. rank 2 intends A later (rank 0 no longer does): A moves on to rank 2
if rank == 2:
    c = w.current_clock()
    w.intent(A, c, c + 1)
    w.wait_sync()
    assert np.all(states(A) == OWNED), "a key another rank intends later did not move on"
    assert use(A) == -1
s.barrier()
w.wait_sync()
s.barrier()
if rank == 0:
    assert not np.any(states(A) == OWNED), "a key rank 2 took stayed on rank 0"
s.barrier()
settle_and_check_sums(w, s, comm, pushed, L, clocks=AHEAD + 6)
s.barrier()
s.shutdown()
if rank == 0:
    print("sticky ok", flush=True)
