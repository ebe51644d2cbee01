"""The intent ledger (csrc/ledger.hpp) on 2 ranks exchanging messages (run under mpiexec -n 2).

Checks:
  * a workload intent cannot pay for (every clock a few hundred keys, each used
    once) pauses intent on both ranks: ``intent_all_keys`` turns 0, and a
    one-clock intent then moves nothing: its keys are pulled by messages and
    counted as classic;
  * keys this rank's intents had moved here (recurring keys, not probe keys)
    stay here once their intents end while intent is paused (relocation
    sticks) and are served locally;
  * a window of several clocks still moves its keys while intent is paused,
    and they stay after the window;
  * keys localized while intent is paused stay where they were localized, and
    so do keys a one-clock intent told before the pause moved here;
  * the one-off keys intent moved here are given back to their homes: at the
    pause those whose windows had ended, the others when their windows end
    (give_back, give_back_ended); the homes count them;
  * when the workload turns to keys that recur (each rank its own, used every
    clock), the probe keys show the gain and intent resumes on both ranks; from
    then on those keys are local;
  * every push, through whichever path, is counted exactly.
"""

from __future__ import annotations

import faulthandler
import os

import numpy as np
from _settle import settle_and_check_sums
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(130)
# what is checked is the judgment by engine work (link_weight.py: where the link binds)
os.environ["KVPS_LINK_RATE"] = "off"
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2
NK, L, AHEAD = 400_000, 2, 4
other = 1 - rank
OWNED = _kvps.KEY_STATES["owned"]

kvps.setup(NK, 1, "all")
s = kvps.Server(L, shared_memory=False, intent_lookahead=AHEAD)
w = kvps.Worker(0, s)
rng = np.random.default_rng(11 + rank)
used = np.zeros(NK, dtype=bool)  # keys handed out already (never reused by foreign())
pushed = np.zeros(NK, dtype=np.int64)


def foreign(n: int, probes: bool = True) -> np.ndarray:
    """n unused keys homed on the other rank (without probe keys unless `probes`)."""
    cand = np.flatnonzero(~used)
    cand = cand[cand % size == other]
    if not probes:
        cand = cand[~_kvps.probe_keys(cand)]
    keys = np.sort(rng.choice(cand, size=n, replace=False)).astype(np.int64)
    used[keys] = True
    return keys


def use(keys: np.ndarray) -> int:
    """Pull and push +1 to keys; the pull's timestamp (-1: every key was local)."""
    ts = w.pull(keys, np.zeros(len(keys) * L, dtype=np.float32))
    w.wait(ts)
    w.wait(w.push(keys, np.ones(len(keys) * L, dtype=np.float32)))
    pushed[keys] += 1
    return ts


def run(plan: list[np.ndarray], lo: int, hi: int, until: str | None = None) -> int:
    """Use plan[i] for i in [lo, hi), one clock each, signalling plan[i + AHEAD]'s
    intent (the first AHEAD were signalled before); stop early (every 8 clocks, on
    both ranks together) once `until` ("paused" / "resumed") holds on both.
    Returns the index reached."""
    for i in range(lo, hi):
        c = w.current_clock()
        if i + AHEAD < len(plan):
            w.intent(plan[i + AHEAD], c + AHEAD, c + AHEAD + 1)
        use(plan[i])
        w.advance_clock()
        if until and i % 8 == 7:
            on = s.stats()["intent_all_keys"]
            if comm.allreduce(on == (0 if until == "paused" else 1), op=MPI.LAND):
                return i + 1
    return hi


# ------------------------------------------------------- phase 1: intent pauses
# recurring keys (used every clock, no probe keys: they do not sway the ledger)
# that the rank's intent moves here, among a stream of one-off keys
mine = foreign(60, probes=False)
CLOCKS = 300
plan = [np.union1d(mine, foreign(300)) for _ in range(CLOCKS)]
c0 = w.current_clock()
for i in range(AHEAD):
    w.intent(plan[i], c0 + i, c0 + i + 1)
# one-clock intents signalled now, while intent is on, for clocks after the pause: their
# keys are told to the home when the windows take effect, and their drops come while paused
later = {c0 + 140 + 40 * j: foreign(20, probes=False) for j in range(6)}
for start, ks in later.items():
    w.intent(ks, start, start + 1)
    w.intent(ks, start + 1, start + 2)  # back to back: the key recurs, so it moves here
s.barrier()
run(plan, 0, 16)  # intent on (the ledger has not judged yet): the recurring keys move here
w.wait_sync()
assert all(s._engine.key_state(int(k)) == OWNED for k in mine), "recurring keys were not moved here"
done = run(plan, 16, CLOCKS - AHEAD, until="paused")
st = s.stats()
assert st["intent_all_keys"] == 0, f"rank {rank}: intent did not pause on one-off keys: {st}"
assert st["intent_switches"] >= 1 and st["intent_probe_cost"] > st["intent_probe_gain"], st

# paused: the recurring keys' intents ended (the windows are held back now), and
# they stay here: relocation sticks until another rank's intent takes a key
for _ in range(AHEAD + 2):
    w.advance_clock()
w.wait_sync()
s.barrier()
w.wait_sync()
gone = [k for k in mine if s._engine.key_state(int(k)) != OWNED]
assert not gone, f"rank {rank}: {len(gone)} moved keys left after their intents ended while paused"
theirs = comm.sendrecv(mine, dest=other, source=other)
assert not any(s._engine.key_state(int(k)) == OWNED for k in theirs), "keys moved to the other rank came back home"
assert use(mine) == -1, "keys moved here were not served locally after their windows"
# ... but the one-off keys intent moved here went back to their homes: those whose
# windows had ended at the pause then (give_back), the others when their windows ended
# (give_back_ended). Left here, every other rank's first request for one would be forwarded.
# (Probe keys stay, as with intent on: their later uses show the ledger what moves gain.)
early = np.setdiff1d(np.concatenate(plan[:done]), mine)
early = early[~_kvps.probe_keys(early)]
held = [int(k) for k in early if s._engine.key_state(int(k)) == OWNED]
assert not held, f"rank {rank}: {len(held)} of {len(early)} one-off keys moved here were not given back"
assert comm.allreduce(s.stats()["given_back"]) > 0, "no key was given back when intent paused"

# paused: one-clock intents move nothing, not even for keys that recur (intended
# in consecutive clocks), which the cost model would move with intent on
late = foreign(200, probes=False)
before = s.stats()
for _ in range(2):
    c = w.current_clock()
    w.intent(late, c, c + 1)
    w.wait_sync()
    r0 = s.stats()["remote"]
    assert use(late) != -1
    assert s.stats()["remote"] - r0 == 2 * len(late), "a paused one-clock intent moved keys"  # (pull + push)
    w.advance_clock()
assert s.stats()["intent_classic"] - before["intent_classic"] == 2 * len(late), s.stats()

# paused: a window of several clocks announces several uses and still moves its keys
long = foreign(100, probes=False)
c = w.current_clock()
w.intent(long, c, c + 3)
w.wait_sync()
assert use(long) == -1, "a window of several clocks did not move its keys while intent was paused"

# paused: keys localized here stay here, and so do the keys of the long window
loc = foreign(50, probes=False)
w.wait(w.localize(loc))
assert all(s._engine.key_state(int(k)) == OWNED for k in loc), "localize did not move the keys here"
for _ in range(3 * max(16, 2 * AHEAD)):  # three probe slices
    w.advance_clock()
    w.wait_sync()
s.barrier()
w.wait_sync()
assert s.stats()["intent_all_keys"] == 0
assert use(long) == -1, "the keys of a window of several clocks left after the window"
swept = [int(k) for k in loc if s._engine.key_state(int(k)) != OWNED]
assert not swept, f"rank {rank}: {len(swept)} localized keys left while intent was paused"
assert use(loc) == -1, "localized keys were not local"

# paused: a key that a told one-clock intent moved here and the application then
# localized stays here when that intent ends (its drop does not send it home)
now = w.current_clock()
start = min(c for c in later if c >= now + AHEAD + 2)
ks = later[start]
while w.current_clock() < start:
    w.advance_clock()
    w.wait_sync()
s.barrier()
w.wait_sync()
assert all(s._engine.key_state(int(k)) == OWNED for k in ks), "the told intents did not move their keys here"
w.wait(w.localize(ks))
for _ in range(2 + AHEAD + 2):  # past the windows' end: the drops reach the homes
    w.advance_clock()
    w.wait_sync()
s.barrier()
w.wait_sync()
assert s.stats()["intent_all_keys"] == 0
gone = [int(k) for k in ks if s._engine.key_state(int(k)) != OWNED]
assert not gone, f"rank {rank}: the paused drop of a told intent sent {len(gone)} localized keys home"
s.barrier()

# ------------------------------------------------- phase 2: intent resumes
# each rank its own keys (with probe keys), used every clock: moving them pays
own = foreign(3000)
CLOCKS = 600
plan = [own] * CLOCKS
c0 = w.current_clock()
for i in range(AHEAD):
    w.intent(own, c0 + i, c0 + i + 1)
s.barrier()
done = run(plan, 0, CLOCKS - AHEAD - 12, until="resumed")
st2 = s.stats()
assert st2["intent_all_keys"] == 1, f"rank {rank}: intent did not resume on recurring keys after {done} clocks: {st2}"
assert st2["intent_probe_gain"] > st2["intent_probe_cost"], st2
run(plan, done, done + AHEAD + 8)  # (intents signalled before resuming take effect)
c = w.current_clock()
w.intent(own, c, c + 1)
w.wait_sync()
assert use(own) == -1, "recurring keys were not moved here once intent resumed"
w.advance_clock()
s.barrier()
settle_and_check_sums(w, s, comm, pushed, L, clocks=AHEAD + 2)
s.barrier()
s.shutdown()
if rank == 0:
    print(f"ledger ok: paused {st} / resumed after {done} clocks {st2}", flush=True)
