"""kvps soak on N ranks: mixed pull / push / set / intent / localize on random keys with
periodic save and load, every sum checked exactly (run under mpiexec by tools/soak.py).

usage: soak_kvps.py <seconds> <out dir>

Every push adds small integers (exact in float32), so the value of a key is known: the
value it was last set to plus every rank's pushes since. A check settles the servers (every
intent window ends, sync rounds), sums the ranks' ledgers and compares every key's values.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import numpy as np
from _probe import Soak
from mpi4py import MPI

import kvps

SECONDS, OUT = float(sys.argv[1]), sys.argv[2]
faulthandler.dump_traceback_later(SECONDS + 300)  # a hang says where before the driver's timeout
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
NK = 3000
lengths = (1 + np.arange(NK) % 4).astype(np.int64)
#: rounds of OPS mixed operations; every CHECK_EVERY rounds a settle and exact check, after
#: every SET_EVERY-th check a set phase, after every SAVE_EVERY-th a save, a round, a load
OPS, CHECK_EVERY, SET_EVERY, SAVE_EVERY = 100, 4, 2, 3
CKPT = os.path.join(OUT, "kvps-checkpoint")

kvps.setup(NK, 1, "all")
server = kvps.Server(lengths)
w = kvps.Worker(0, server)
rng = np.random.default_rng(1000 + rank)
allk = np.arange(NK, dtype=np.int64)
base = np.zeros(NK, dtype=np.int64)  # every key's last set value (the same on every rank)
pushed = np.zeros(NK, dtype=np.int64)  # this rank's pushes since that set
soak = Soak(comm, "kvps", SECONDS, OUT)
checks = loads = 0


def expand(per_key: np.ndarray, keys: np.ndarray) -> np.ndarray:
    return np.repeat(per_key.astype(np.float32), lengths[keys])


def some_keys(most: int) -> np.ndarray:
    return np.sort(rng.choice(NK, size=int(rng.integers(1, most + 1)), replace=False)).astype(np.int64)


def mixed_round() -> None:
    """OPS random operations; asynchronous ones keep their buffers until the round's waitall."""
    pending = []
    for _ in range(OPS):
        op = rng.choice(["pull", "push", "intent", "clock", "localize"], p=[0.3, 0.35, 0.15, 0.1, 0.1])
        asynchronous = bool(rng.integers(2))
        if op == "pull":
            keys = some_keys(64)
            vals = np.full(int(lengths[keys].sum()), -1.0, dtype=np.float32)
            w.wait(w.pull(keys, vals, asynchronous))
            # pushes only add, and concurrent ones may or may not have arrived: at least the set value
            low = expand(base[keys], keys)
            assert np.all(vals >= low) and np.all(vals == np.round(vals)), f"rank {rank}: pulled {vals} < {low}"
        elif op == "push":
            keys = some_keys(64)
            inc = rng.integers(1, 4, size=len(keys))
            vals = expand(inc, keys)
            ts = w.push(keys, vals, asynchronous)
            if asynchronous:
                pending.append(vals)
            else:
                w.wait(ts)
            pushed[keys] += inc
            soak.extra["pushed"] += int(inc.sum())
        elif op == "intent":
            c = w.current_clock()
            start = c + int(rng.integers(0, 3))
            w.intent(some_keys(128), start, start + int(rng.integers(1, 4)))
        elif op == "clock":
            w.advance_clock()
        else:
            keys = some_keys(16)
            ts = w.localize(keys, asynchronous)
            if asynchronous:
                pending.append(keys)
            else:
                w.wait(ts)
        soak.ops[op] += 1
    w.waitall()
    pending.clear()


def settle() -> None:
    """Every intent window ends, replicas flush (the README's convergence recipe)."""
    for _ in range(8):
        w.advance_clock()
    w.wait_sync()
    server.barrier()
    w.wait_sync()
    server.barrier()


def check(what: str) -> np.ndarray:
    """Settle, then every key equals its set value plus every rank's pushes; the total pushes."""
    global checks
    settle()
    total = comm.allreduce(pushed)
    out = np.zeros(int(lengths.sum()), dtype=np.float32)
    w.wait(w.pull(allk, out))
    exp = expand(base + total, allk)
    bad = np.flatnonzero(out != exp)
    assert bad.size == 0, (
        f"rank {rank}, {what}, round {soak.rounds}: {bad.size} values differ, first at {bad[:5].tolist()}: "
        f"{out[bad[:5]].tolist()} != {exp[bad[:5]].tolist()}"
    )
    server.barrier()  # every rank pulled before anyone pushes again
    checks += 1
    return total


def set_phase() -> None:
    """Each rank sets a random tenth of its home keys; every rank learns the new values."""
    mine = allk[allk % size == rank]
    keys = np.sort(rng.choice(mine, size=len(mine) // 10, replace=False)).astype(np.int64)
    vals = rng.integers(0, 1000, size=len(keys))
    w.wait(w.set(keys, expand(vals, keys)))
    soak.ops["set"] += 1
    for k, v in comm.allgather((keys, vals)):
        base[k] = v
        pushed[k] = 0
    settle()


def save_round_load(n: int) -> None:
    """Save, push more, load: the state is the saved one again, exactly."""
    global loads, base
    fmt = "kvps" if n % 2 == 0 else "distx"
    total = comm.allreduce(pushed)
    server.save(CKPT + f"-{fmt}", format=fmt)
    mixed_round()  # changes that the load must undo
    settle()
    server.load(CKPT + f"-{fmt}", format=fmt)
    soak.ops["save+load"] += 1
    base = base + total
    pushed[:] = 0
    loads += 1
    check(f"after load ({fmt})")


home = allk[allk % size == rank]
w.wait(w.set(home, expand(np.zeros(len(home)), home)))
server.barrier()
while True:
    mixed_round()
    if soak.rounds % CHECK_EVERY == CHECK_EVERY - 1:
        check("periodic")
        if checks % SET_EVERY == 0:
            set_phase()
        if checks % SAVE_EVERY == 0:
            save_round_load(checks // SAVE_EVERY)
    if not soak.next_round():
        break
total = check("final")
soak.finish(checks=checks, loads=loads, stats=server.stats())
server.shutdown()
if rank == 0:
    print(f"kvps soak ok: {checks} exact checks, {loads} loads", flush=True)
