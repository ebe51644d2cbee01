"""The link's weight (csrc/link.hpp) on 2 ranks exchanging messages (run under mpiexec -n 2).

Checks:
  * with ``KVPS_LINK_RATE`` unset the server measures the link when it starts:
    ``stats()["link_rate"]`` is a rate in bytes/s and ``link_weight`` lies in [0, 1];
  * with a slow link given (``KVPS_LINK_RATE=10mbit``, against which the real
    bytes are counted) bytes bind: ``link_weight`` rises above 0.9, and a stream
    of one-off keys (each intended once, for one clock) keeps moving: a move
    sends a 64-byte row's slot once against the row twice for a pull and a push,
    so it pays with its first use. Intent stays on (``intent_all_keys`` 1, no
    switch), no key is left classic, and the keys are served here;
  * ``KVPS_LINK_RATE=off`` weighs no bytes (``link_rate`` 0, ``link_weight`` 0);
  * every push, through whichever path, is counted exactly.

ledger.py and cost_model.py check the same stream where engine work binds
(there the one-off keys stay at their owners, and intent pauses).
"""

from __future__ import annotations

import faulthandler
import os

import numpy as np
from _settle import settle_and_check_sums
from mpi4py import MPI

import kvps

faulthandler.dump_traceback_later(130)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2
NK, L = 400_000, 16
other = 1 - rank
rng = np.random.default_rng(3 + rank)
used = np.zeros(NK, dtype=bool)


def foreign(n: int) -> np.ndarray:
    """n keys homed on the other rank, never used before."""
    cand = np.flatnonzero(~used)
    cand = cand[cand % size == other]
    keys = np.sort(rng.choice(cand, size=n, replace=False)).astype(np.int64)
    used[keys] = True
    return keys


def server() -> tuple[kvps.Server, kvps.Worker]:
    kvps.setup(NK, 1, "all")
    s = kvps.Server(L, shared_memory=False, intent_lookahead=0)
    return s, kvps.Worker(0, s)


# measured
os.environ.pop("KVPS_LINK_RATE", None)
s, w = server()
st = s.stats()
assert st["link_rate"] > 1e5 and 0.0 <= st["link_weight"] <= 1.0, st
measured = st["link_rate"]
s.barrier()
s.shutdown()

# a slow link: one-off keys keep moving
os.environ["KVPS_LINK_RATE"] = "10mbit"
s, w = server()
pushed = np.zeros(NK, dtype=np.int64)
assert s.stats()["link_rate"] == 10**7 // 8, s.stats()


def step(keys: np.ndarray) -> int:
    """Intend keys for this clock, sync, pull and push +1 to each, advance; the pull's timestamp."""
    c = w.current_clock()
    w.intent(keys, c, c + 1)
    w.wait_sync()
    ts = w.pull(keys, np.zeros(len(keys) * L, dtype=np.float32))
    w.wait(w.push(keys, np.ones(len(keys) * L, dtype=np.float32)))
    pushed[keys] += 1
    w.advance_clock()
    return ts


late_remote = 0
for i in range(200):
    ts = step(foreign(300))
    if i >= 150:
        late_remote += ts != -1
st = s.stats()
assert st["link_weight"] > 0.9, st
assert st["intent_all_keys"] == 1 and st["intent_switches"] == 0, st
assert st["intent_classic"] == 0, st
assert late_remote == 0, f"{late_remote} of the last 50 clocks' one-off keys were not moved here: {st}"
s.barrier()
settle_and_check_sums(w, s, comm, pushed, L, clocks=2)
slow = s.stats()
s.barrier()
s.shutdown()

# not weighed
os.environ["KVPS_LINK_RATE"] = "off"
s, w = server()
st = s.stats()
assert st["link_rate"] == 0 and st["link_weight"] == 0.0, st
s.barrier()
s.shutdown()
if rank == 0:
    print(f"link weight ok: measured {measured / 1e6:.0f} MB/s; at 10mbit {slow}", flush=True)
