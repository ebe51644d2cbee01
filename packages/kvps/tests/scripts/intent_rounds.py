"""Intent rounds with a long lookahead on 2 ranks acting as 2 nodes (run under mpiexec -n 2).

With peers on another node (``DISTKIT_NODE_ID``: each rank its own) and
``intent_lookahead=8`` intents take effect in rounds every 2 clocks
(``intent.hpp``: a quarter of the lookahead), at least 6 clocks before their
window. Checks:
  * intents signalled 8 clocks ahead, without any ``wait_sync``, still bring
    the keys here before their window opens (waited for at the clock before
    it, however slow the machine): every pull of keys intended through a
    round is answered locally (a pull returns -1);
  * an intent for the current clock (too late for any round) takes effect at
    once: after ``wait_sync`` its keys are here;
  * every push, through whichever path and with the windows ending between
    rounds, is counted exactly.
"""

from __future__ import annotations

import faulthandler
import os
import time

import numpy as np
from _settle import settle_and_check_sums
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(100)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2
NK, L, AHEAD, STEPS = 20_000, 4, 8, 48
os.environ["DISTKIT_NODE_ID"] = str(rank)  # read when the Server is created

kvps.setup(NK, 1, "all")
s = kvps.Server(L, shared_memory=False, intent_lookahead=AHEAD)
w = kvps.Worker(0, s)
other = 1 - rank
rng = np.random.default_rng(11 + rank)
pushed = np.zeros(NK, dtype=np.int64)
# keys homed on the other rank; each step uses its own set, intended for two
# clocks (a window of two always moves its keys: no cost-model judgement here)
sets = [np.unique(rng.choice(NK // 2, size=64, replace=False) * 2 + other).astype(np.int64) for _ in range(STEPS)]
for i in range(AHEAD):
    w.intent(sets[i], i, i + 2)
OWNED = _kvps.KEY_STATES["owned"]


def arrived_before_use(keys: np.ndarray, step: int) -> None:
    """Wait, still at the clock before the keys' window, until they are here (no wait_sync, which
    would run the relocations itself). Their intents were signalled 8 clocks ahead and went out
    in a round at least 6 clocks before: they arrive without the clock moving on. How long that
    takes in seconds depends on the machine (a loaded one schedules the ranks' progress threads
    late), so the wait is for the event, bounded generously."""
    deadline = time.monotonic() + 120
    while not all(s._engine.key_state(int(k)) == OWNED for k in keys):
        assert time.monotonic() < deadline, f"rank {rank}: the keys intended for step {step} did not arrive before it"
        time.sleep(0.002)


local = 0
for i in range(STEPS):
    c = w.current_clock()
    assert c == i
    if i + AHEAD < STEPS:
        w.intent(sets[i + AHEAD], c + AHEAD, c + AHEAD + 2)
    keys = sets[i]
    buf = np.zeros(len(keys) * L, dtype=np.float32)
    ts = w.pull(keys, buf)
    if ts == -1:
        local += 1
    else:
        w.wait(ts)
    w.wait(w.push(keys, np.ones(len(keys) * L, dtype=np.float32)))
    pushed[keys] += 1
    if AHEAD <= i + 1 < STEPS:
        arrived_before_use(sets[i + 1], i + 1)
    w.advance_clock()
used = STEPS - AHEAD  # the first AHEAD sets were intended before the clock started
assert local >= used, f"only {local} of {STEPS} steps found their intended keys here"

# too late for a round: takes effect at once
late = np.unique(rng.choice(NK // 2, size=64, replace=False) * 2 + other).astype(np.int64)
c = w.current_clock()
w.intent(late, c, c + 2)
w.wait_sync()
assert w.pull(late, np.zeros(len(late) * L, dtype=np.float32)) == -1, "a late intent did not take effect at once"
w.wait(w.push(late, np.ones(len(late) * L, dtype=np.float32)))
pushed[late] += 1

# every window ends (replicas and intents are dropped), then exact sums
settle_and_check_sums(w, s, comm, pushed, L, clocks=AHEAD + 4)
st = s.stats()
s.barrier()
s.shutdown()
if rank == 0:
    print(f"intent rounds ok: {local} of {STEPS} steps local, {st}", flush=True)
