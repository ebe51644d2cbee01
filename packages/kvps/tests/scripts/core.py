"""Core behaviours of kvps on N ranks x 2 worker threads (run under mpiexec).

Usage: core.py <technique>:<key_pushes_total>[:shm] [...]   (one scenario each, in one launch;
       ":shm" lets co-located ranks serve each other's keys in shared memory,
       else every key of another rank goes through messages)
Checks (plain asserts; any failure aborts the job):
  * concurrent pushes from every rank and thread (while keys relocate and
    replicate under localize/intent traffic) sum exactly;
  * duplicate keys in one push accumulate;
  * a pulled counter never goes backwards while pushes run;
  * pulls of keys with active intent after wait_sync are local (ts == -1)
    for the techniques that move keys;
  * set then pushes = set + sum; replicas converge after sync rounds and are
    dropped when the intent ends;
  * variable value lengths; a key count the rank count does not divide;
  * with shared memory, keys of co-located ranks are served in place (no
    message, ts == -1) while they relocate, and everything above still holds.
"""

from __future__ import annotations

import faulthandler
import re
import sys
import threading

import numpy as np
import pytest
import torch
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(120)  # diagnose a hang before the test's timeout
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def scenario(TECH: str, TOTAL: int, SHM: bool) -> None:
    NK = 1003
    NT = 2

    kvps.setup(NK, NT, TECH)
    lengths = (1 + np.arange(NK) % 3).astype(np.int64)
    server = kvps.Server(lengths, shared_memory=SHM)
    assert server.shares_memory == (SHM and size > 1)
    assert server.my_rank() == rank
    workers = [kvps.Worker(t, server) for t in range(NT)]
    w0 = workers[0]
    assert w0.num_keys == NK and w0.get_key_size(4) == 2

    def vals_for(keys: np.ndarray, fill: float = 1.0) -> np.ndarray:
        return np.full(int(lengths[keys].sum()), fill, dtype=np.float32)

    def pull(w: kvps.Worker, keys: np.ndarray) -> tuple[int, np.ndarray]:
        out = np.zeros(int(lengths[keys].sum()), dtype=np.float32)
        ts = w.pull(keys, out)
        return ts, out

    # ---------------------------------------------------------------- phase A
    per_thread = TOTAL // (size * NT)
    BATCH = 4
    counts = [np.zeros(NK, dtype=np.int64) for _ in range(NT)]
    errors: list[BaseException] = []
    WATCH = 5

    def body(t: int) -> None:
        try:
            w = workers[t]
            rng = np.random.default_rng(1000 * rank + t)
            last = -1.0
            for i in range(per_thread // BATCH):
                keys = rng.integers(0, NK, size=BATCH, dtype=np.int64)
                if i % 97 == 0:
                    keys[1] = keys[0]  # a duplicate: must accumulate
                w.push(keys, vals_for(keys), True)
                np.add.at(counts[t], keys, 1)
                if i % 64 == 63:
                    w.waitall()
                if t == 0 and i % 50 == 0:
                    w.localize(rng.integers(0, NK, size=3, dtype=np.int64), True)
                    c = w.current_clock()
                    w.intent(rng.integers(0, NK, size=5, dtype=np.int64), c, c + 2)
                    w.advance_clock()
                if t == 1 and i % 20 == 0:
                    _, v = pull(w, np.array([WATCH], dtype=np.int64))
                    assert v[0] >= last, f"pull went backwards: {v[0]} < {last}"
                    last = float(v[0])
            w.barrier()
        except BaseException as e:
            errors.append(e)
            raise

    threads = [threading.Thread(target=body, args=(t,)) for t in range(NT)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for _ in range(3):  # let phase A's intents expire
        w0.advance_clock()
    # flush replica deltas to the owners, then refresh every replica
    w0.wait_sync()
    server.barrier()
    w0.wait_sync()
    server.barrier()
    expected = comm.allreduce(counts[0] + counts[1], op=MPI.SUM)
    assert int(expected.sum()) == (per_thread // BATCH) * BATCH * NT * size
    allk = np.arange(NK, dtype=np.int64)
    _, got = pull(w0, allk)
    want = np.repeat(expected.astype(np.float32), lengths)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, (
        f"rank {rank}: {bad.size} wrong values, first at element {bad[:5]}: {got[bad[:5]]} != {want[bad[:5]]}"
    )
    server.barrier()

    # ---------------------------------------------------------------- phase B
    # set then pushes; intent locality; replica convergence; drop after intent
    shared = np.array([7, 8, 9, 10, 11], dtype=np.int64)
    mine = np.array([k for k in range(NK) if k >= 20 and k % size == (rank + 1) % size][:10], dtype=np.int64)
    if rank == 0:
        w0.set(shared, vals_for(shared, 10.0))
    server.barrier()
    c = w0.current_clock()
    w0.intent(mine, c, c + 3)
    w0.intent(shared, c, c + 3)
    w0.wait_sync()
    ts_mine, _ = pull(w0, mine)
    ts_shared, _ = pull(w0, shared)
    if TECH == "none":
        # another rank's key: a message, or in place in its shard (one node)
        assert ts_mine == -1 if SHM or size == 1 else ts_mine != -1
    elif TECH in ("all", "relocation_only"):
        assert ts_mine == -1, f"{TECH}: intended keys not local after wait_sync"
    # one node sharing memory: every shard is served in place, intent moves nothing
    moved = not (SHM and size > 1)
    if TECH in ("all", "replication_only"):
        assert ts_shared == -1, f"{TECH}: shared intended keys not local after wait_sync"
        nrep = comm.allreduce(server._engine.num_replicas())
        if size > 1:
            assert (nrep > 0) == moved, f"{nrep} replicas for keys intended by every rank"
    for k in mine:
        st = server._engine.key_state(int(k))
        if TECH in ("all", "relocation_only") and moved:
            assert st == _kvps.KEY_STATES["owned"], (k, st)
    # push rank+1 to the shared keys (local on replicas), converge
    w0.push(shared, vals_for(shared, float(rank + 1)))
    w0.wait_sync()
    server.barrier()
    w0.wait_sync()
    server.barrier()
    _, v = pull(w0, shared)
    target = 10.0 + size * (size + 1) / 2
    assert np.all(v == target), f"rank {rank}: replicas did not converge: {v} != {target}"
    allv = comm.allgather(v)
    assert all(np.array_equal(a, allv[0]) for a in allv)
    # only rank 0 pushes: the other ranks' clean replicas learn of it through
    # the version check of the refresh (nothing pushed locally to ship)
    if rank == 0:
        w0.push(shared, vals_for(shared, 5.0))
    for _ in range(2):
        w0.wait_sync()
        server.barrier()
    _, v = pull(w0, shared)
    target += 5.0
    assert np.all(v == target), f"rank {rank}: clean replicas did not refresh: {v} != {target}"
    # intent window over: replicas dropped, values still exact
    for _ in range(3):
        w0.advance_clock()
    w0.wait_sync()
    server.barrier()
    assert server._engine.num_replicas() == 0, server._engine.num_replicas()
    _, v = pull(w0, shared)
    assert np.all(v == target)
    server.barrier()

    # ---------------------------------------------------------------- phase C
    # bad input: clear exceptions before anything is sent, state untouched
    _, before = pull(w0, allk)
    k3 = np.array([1, 2, 3], dtype=np.int64)
    n3 = int(lengths[k3].sum())

    def raises(exc: type[BaseException], fn, *args, match: str = "") -> None:
        with pytest.raises(exc, match=re.escape(match) if match else None):
            fn(*args)

    for op in (w0.push, w0.set, w0.pull):
        raises(TypeError, op, k3.astype(np.float64), np.ones(n3, np.float32), match="int64")
        raises(TypeError, op, k3.astype(np.int32), np.ones(n3, np.float32), match="int64")
        raises(IndexError, op, np.array([1, -2, 3]), np.ones(n3, np.float32), match="negative")
        raises(IndexError, op, np.array([1, NK, 3]), np.ones(n3, np.float32), match="out of range")
        raises(ValueError, op, k3.reshape(3, 1), np.ones(n3, np.float32), match="1-D")
        raises(TypeError, op, k3, np.ones(n3, np.float64), match="float32")
        raises(TypeError, op, k3, torch.ones(n3, dtype=torch.float64), match="float32")
        raises(ValueError, op, k3, np.ones(n3 + 1, np.float32), match="sum to")
        raises(ValueError, op, k3, np.ones((n3, 2), np.float32)[:, 0], match="contiguous")
        raises(ValueError, op, k3, torch.ones(2 * n3)[::2], match="contiguous")
        raises(TypeError, op, [1, 2, 3], np.ones(n3, np.float32), match="int64")
        raises(TypeError, op, k3, np.ones(n3, np.float32), "yes", match="bool")
        raises(ValueError, op, torch.tensor([1, 2, 3]).view(3, 1), torch.ones(n3), match="1-D")
    ro = np.ones(n3, np.float32)
    ro.flags.writeable = False
    raises(ValueError, w0.pull, k3, ro, match="read-only")
    raises(IndexError, w0.localize, np.array([NK + 5]), match="out of range")
    raises(ValueError, w0.intent, k3, 5, 3, match="empty")
    raises(ValueError, w0.intent, k3, -1, match=">= 0")
    raises(IndexError, w0.get_key_size, NK)
    raises(ValueError, kvps.Worker, NT, server)
    raises(TypeError, kvps.Worker, 0, "server")
    raises(RuntimeError, w0.prepare_sample, 3, 0)
    server.barrier()
    _, after = pull(w0, allk)
    assert np.array_equal(before, after), "bad input changed the server state"
    # torch keys and values work like numpy ones
    tk = torch.tensor([0, 3, 6], dtype=torch.int64)
    tv = torch.zeros(int(lengths[tk.numpy()].sum()))
    w0.pull(tk, tv)
    assert torch.equal(tv, torch.from_numpy(np.repeat(expected[[0, 3, 6]].astype(np.float32), lengths[[0, 3, 6]])))
    server.barrier()
    st = server.stats()
    if size > 1:  # which path served the keys of other ranks
        # (with shared memory only keys in flight between ranks take messages)
        assert (st["shared"] > 0) == SHM and (st["remote"] > st["shared"]) == (not SHM), st
    assert st["local"] > 0, st
    server.shutdown()
    raises(RuntimeError, w0.pull, k3, np.ones(n3, np.float32), match="shut down")
    # a float64 server: pushes from every rank sum exactly in double precision
    s64 = kvps.Server(3, dtype=torch.float64)
    w64 = kvps.Worker(0, s64)
    k64 = np.arange(0, NK, 5, dtype=np.int64)
    w64.push(k64, np.full(3 * len(k64), 0.1 * (rank + 1), dtype=np.float64))
    s64.barrier()
    o64 = np.zeros(3 * len(k64), dtype=np.float64)
    w64.pull(k64, o64)
    want64 = sum(0.1 * (r + 1) for r in range(size))
    assert np.allclose(o64, want64, rtol=0, atol=1e-15 * size), (o64[:3], want64)
    with pytest.raises(TypeError, match="float64"):
        w64.push(k64, np.zeros(3 * len(k64), dtype=np.float32))
    s64.shutdown()
    # messages from one rank are applied in the order sent, also when a large one (received by
    # rendezvous, in pieces) comes before a small one: an asynchronous set of many rows (>64 KiB),
    # then an asynchronous push to the first of them, all keys homed on the next rank
    if size > 1:
        so = kvps.Server(64, shared_memory=False)
        wo = kvps.Worker(0, so)
        ko = np.arange((rank + 1) % size, NK, size, dtype=np.int64)
        wo.set(ko, np.full(64 * len(ko), 2.0, dtype=np.float32), True)
        wo.push(ko[:1], np.full(64, 1.0, dtype=np.float32), True)
        wo.waitall()
        so.barrier()
        oo = np.zeros(64 * len(ko), dtype=np.float32)
        wo.pull(ko, oo)
        assert (oo[:64] == 3.0).all() and (oo[64:] == 2.0).all(), (oo[:2], oo[64:66])
        so.shutdown()
    if rank == 0:
        print(f"core ok: technique={TECH} ranks={size} shm={SHM} key_pushes={int(expected.sum())} served={st}")


for spec in sys.argv[1:]:
    tech, total, *flags = spec.split(":")
    scenario(tech, int(total), flags == ["shm"])
