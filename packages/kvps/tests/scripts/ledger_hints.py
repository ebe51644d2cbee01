"""Routing hints when intent pauses, on 3 ranks exchanging messages (mpiexec -n 3).

With three ranks a key can be held by one rank, homed on a second and used by
a third, whose request goes where its routing hint points. When the ledger
pauses intent (csrc/ledger.hpp) the holders tell every rank where their keys
are now (Engine::give_back):

  * rank r's recurring keys, homed on h = r + 1 and moved to r by its intents,
    stay at r and are announced (M_HERE): rank t = r + 2, which never used
    them, then pulls them from r directly instead of through h;
  * one-off keys r's intents moved there go back to their homes, and t, which
    learnt that those homed on h were at r by pulling them while intent was
    on, points its hints back at h (M_GIVE_BACK to every rank, not only to
    the home).

Both are checked by the requests forwarded while t pulls those keys after the
pause: none, summed over the ranks. Every push is counted exactly.
"""

from __future__ import annotations

import faulthandler
import os

import numpy as np
from _settle import settle_and_check_sums
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(170)
os.environ["KVPS_LINK_RATE"] = "off"  # judged by engine work: one-off keys do not pay, intent pauses
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 3
NK, L, AHEAD, CLOCKS = 600_000, 2, 4, 300
OWNED = _kvps.KEY_STATES["owned"]


def plans_of(r: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Rank r's recurring keys (homed on r + 1, no probe keys) and its per-clock
    batches: those plus 300 one-off keys homed on r + 1 or r + 2 (the probe
    keys among them show the ledger that moving them does not pay). Every rank
    builds every rank's plan the same way (disjoint key sets per rank)."""
    rng = np.random.default_rng(7 + r)
    cand = np.arange(NK)
    cand = cand[(cand % size != r) & (cand // size % size == r)]  # (not homed on r; no other rank's)
    rng.shuffle(cand)
    homed_next = cand[(cand % size == (r + 1) % size) & ~_kvps.probe_keys(cand)]
    mine = np.sort(homed_next[:60]).astype(np.int64)
    rest = np.setdiff1d(cand, mine)
    rng.shuffle(rest)
    batch = 300
    return mine, [np.union1d(mine, np.sort(rest[i * batch : (i + 1) * batch])).astype(np.int64) for i in range(CLOCKS)]


plans = [plans_of(r) for r in range(size)]
mine, plan = plans[rank]
src = (rank + 1) % size  # the rank whose keys this one, its third rank, learns and later pulls
src_mine, src_plan = plans[src]
src_home = (src + 1) % size

kvps.setup(NK, 1, "all")
s = kvps.Server(L, shared_memory=False, intent_lookahead=AHEAD)
w = kvps.Worker(0, s)
pushed = np.zeros(NK, dtype=np.int64)


def use(keys: np.ndarray) -> None:
    w.wait(w.pull(keys, np.zeros(len(keys) * L, dtype=np.float32)))
    w.wait(w.push(keys, np.ones(len(keys) * L, dtype=np.float32)))
    pushed[keys] += 1


learnt: list[np.ndarray] = []  # src's one-off keys homed on src_home, pulled here after src's use
c0 = w.current_clock()
for i in range(AHEAD):
    w.intent(plan[i], c0 + i, c0 + i + 1)
for i in range(CLOCKS - AHEAD):
    c = w.current_clock()
    w.intent(plan[i + AHEAD], c + AHEAD, c + AHEAD + 1)
    use(plan[i])
    if 8 <= i < 40:  # intent is on (the first judgement comes later): src's moved keys sit at src
        old = np.setdiff1d(src_plan[i - 8], src_mine)
        old = old[(old % size == src_home) & ~_kvps.probe_keys(old)][:4]  # (probe keys stay)
        w.wait(w.pull(old, np.zeros(len(old) * L, dtype=np.float32)))  # (forwarded by the home: learns src)
        learnt.append(old)
    w.advance_clock()
    if i % 8 == 7 and comm.allreduce(s.stats()["intent_all_keys"] == 0, op=MPI.LAND):
        break
assert s.stats()["intent_all_keys"] == 0, f"rank {rank}: intent did not pause: {s.stats()}"
for _ in range(AHEAD + 2):  # the last windows end; one-off keys still intended at the pause go back then
    w.advance_clock()
w.wait_sync()
s.barrier()
w.wait_sync()
s.barrier()
assert all(s._engine.key_state(int(k)) == OWNED for k in mine), f"rank {rank}: recurring keys did not stay"
assert s.stats()["announced"] >= len(mine), s.stats()
learnt_keys = np.unique(np.concatenate(learnt))
assert len(learnt_keys) >= 64, len(learnt_keys)

# t pulls src's kept keys (announced) and the one-off keys it had learnt at src
# (given back to their home): no request is forwarded
f0 = comm.allreduce(s.stats()["forwarded"])
s.barrier()
ks = np.union1d(src_mine, learnt_keys).astype(np.int64)
back_home = [int(k) for k in learnt_keys if s._engine.key_state(int(k)) == OWNED]
assert not back_home, "a one-off key of another rank is held here"
w.wait(w.pull(ks, np.zeros(len(ks) * L, dtype=np.float32)))
w.wait_sync()
s.barrier()
f1 = comm.allreduce(s.stats()["forwarded"])
assert f1 == f0, f"{f1 - f0} requests forwarded after the pause (hints not updated)"

settle_and_check_sums(w, s, comm, pushed, L, AHEAD + 4)
s.shutdown()
if rank == 0:
    print("ledger hints ok", flush=True)
