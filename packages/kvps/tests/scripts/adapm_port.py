"""Ports of AdaPM's own tests and example (run under mpiexec, 2 worker threads per rank).

Each section mirrors one original file of alexrenz/AdaPM, scaled down:
  * bindings/example.py: float value-length tensor, one key of another length,
    intent(keys, clock+1) + advance_clock + wait_sync, set, async push/pull,
    sampling with scheme="local", min=, max=; 2-D value buffers;
  * tests/test_set_operation.cc: set, then concurrent pushes under intent
    "chaos" = set + sum, repeated;
  * tests/test_dynamic_allocation.cc: every worker pushes one key while
    everybody localizes it constantly: exact sum;
  * tests/test_locality_api.cc: initial locality (home ranks), swapped by localize;
  * tests/test_many_key_operations.cc (quick mode): pulls under localize see the
    init values; monotone pushes; pushes reverted by -sum return to the start;
  * tests/test_variable_length_values.cc: mixed-length pushes/pulls, localize
    while two workers spam cancelling pushes;
  * tests/test_sampling.cc: sampled values exact, without-replacement samples
    unique, "local" samples answered locally, log-uniform keys in range;
  * worker.begin_setup()/end_setup() semantics, intent() returning -1.
"""

from __future__ import annotations

import faulthandler

import numpy as np
import pytest
import torch
from _threads import run_threads
from mpi4py import MPI

import kvps
from kvps import _kvps

faulthandler.dump_traceback_later(150)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
NT = 2


# ------------------------------------------------------------------ example.py
def example() -> None:
    num_keys, vpk = 1000, 2
    kvps.setup(num_keys, NT)
    value_lengths = torch.ones(num_keys) * vpk  # a FLOAT tensor, as in the original
    value_lengths[400] = 10
    s = kvps.Server(value_lengths)
    s.enable_sampling_support(scheme="local", with_replacement=True, distribution="uniform", min=0, max=num_keys // 2)
    workers = [kvps.Worker(w, s) for w in range(NT)]
    assert workers[0].get_key_size(400) == 10 and workers[0].get_key_size() == vpk
    assert workers[0].get_key_size(key_id=3) == vpk

    def body(w: int) -> None:
        kv = workers[w]
        wid = rank * NT + w
        keys = torch.LongTensor([1, 2, 3, 4])
        keys2 = torch.LongTensor([1, 333, 666, 960]) + wid
        vals = torch.ones(len(keys) * vpk, dtype=torch.float32)
        kv.pull(keys, vals)
        assert torch.equal(vals, torch.zeros(8)), vals
        kv.barrier()
        assert kv.intent(keys2, kv.current_clock() + 1) == -1
        kv.barrier()  # every worker signalled its intent
        assert kv.advance_clock() == 1 and kv.current_clock() == 1
        kv.wait_sync()
        kv.barrier()
        kv.wait_sync()
        # the intended keys (relocated or replicated) are local now
        assert kv.pull(keys2, torch.zeros(8)) == -1
        assert kv.pull(keys2.numpy(), np.zeros(8, dtype=np.float32)) == -1
        kv.barrier()
        # async push + pull, wait for both
        ts1 = kv.push(keys2, torch.ones(8), True)
        ts2 = kv.pull(keys2, vals, True)
        kv.wait(ts1)
        kv.wait(ts2)
        kv.wait(-1)
        kv.waitall()
        # the key with a longer value; 2-D buffers work as in the original
        longer = torch.ones(10)
        kv.pull(torch.LongTensor([400]), longer)
        two_d = np.zeros((4, vpk), dtype=np.float32)
        kv.pull(np.array([1, 2, 3, 4]), two_d)
        with pytest.raises(ValueError, match="sum to"):
            kv.pull(np.array([400]), np.zeros((2, vpk), dtype=np.float32))
        # sampling (scheme "local": drawn from keys held here, pulled locally)
        N = 8
        sid = kv.prepare_sample(N, kv.current_clock())
        sk = np.zeros(N, dtype=np.int64)
        sv = np.ones(N * vpk, dtype=np.float32)
        assert kv.pull_sample(sid, sk[:5], sv[: 5 * vpk]) == -1
        assert kv.pull_sample(id=sid, keys=sk[5:], vals=sv[5 * vpk :]) == -1
        assert np.all((sk >= 0) & (sk < num_keys // 2)), sk
        kv.barrier()
        kv.finalize()

    run_threads(body, NT)
    # every worker pushed 1 to each of its keys2 once: exact sums per key
    w0 = workers[0]
    cnt = np.zeros(num_keys)
    for wid in range(size * NT):
        for k in (1, 333, 666, 960):
            cnt[k + wid] += 1
    allk = np.arange(num_keys, dtype=np.int64)
    got = np.zeros(int(value_lengths.sum()), dtype=np.float32)
    w0.pull(allk, got)
    want = np.repeat(cnt.astype(np.float32), value_lengths.numpy().astype(np.int64))
    assert np.array_equal(got, want), np.nonzero(got != want)[0][:5]
    s.barrier()
    s.shutdown()
    if rank == 0:
        print("port ok: example")


# --------------------------------------------------- set, locality, many keys
def core_ports() -> None:
    NK, vpk = 100, 2
    kvps.setup(NK, NT, "all")
    s = kvps.Server(vpk)
    workers = [kvps.Worker(w, s) for w in range(NT)]
    nworkers = size * NT
    key9 = np.array([9], dtype=np.int64)

    # test_set_operation.cc (5 check runs of 100 pushes instead of 50 x 100)
    RUNS, CHECKS = 100, 5

    def set_op(w: int) -> None:
        kv = workers[w]
        wid = rank * NT + w
        rng = np.random.default_rng(7)
        kv.barrier()
        for _ in range(CHECKS):
            correct = rng.integers(0, 1000, size=2).astype(np.float32)
            if wid == 0:
                kv.set(key9, correct)
                test = np.zeros(2, dtype=np.float32)
                kv.pull(key9, test)
                assert np.array_equal(test, correct), (test, correct)
                kv.advance_clock()
            kv.barrier()
            pulls = []
            for run in range(RUNS):
                if run % 100 == 0:  # chaos: intent for a single clock (end=0 -> start+1)
                    assert kv.intent(key9, kv.current_clock() + 10) == -1
                kv.push(key9, np.array([wid, 2 * wid], dtype=np.float32), True)
                buf = np.zeros(2, dtype=np.float32)
                kv.pull(key9, buf, True)
                pulls.append(buf)
                kv.advance_clock()
            for _ in range(10):
                kv.advance_clock()
            kv.waitall()
            kv.wait_sync()
            kv.barrier()
            kv.wait_sync()
            kv.barrier()
            if wid == 0:
                test = np.zeros(2, dtype=np.float32)
                kv.pull(key9, test)
                tot = sum(range(nworkers)) * RUNS
                assert np.array_equal(test, correct + np.array([tot, 2 * tot], np.float32)), (test, correct, tot)
            for b in pulls:  # pulls saw set + some pushes: never below the set value
                assert b[0] >= correct[0] and b[1] >= correct[1], (b, correct)
            kv.barrier()

    run_threads(set_op, NT)

    # test_dynamic_allocation.cc: one key, pushes from all while all localize it
    RUNS2 = 1500
    k9v = np.zeros(2, dtype=np.float32)
    workers[0].pull(key9, k9v)
    s.barrier()

    def dyn(w: int) -> None:
        kv = workers[w]
        kv.barrier()
        for run in range(RUNS2):
            if run % 100 == 0:
                kv.localize(key9, True)
            kv.push(key9, np.array([1, 2], dtype=np.float32), True)
            kv.pull(key9, np.zeros(2, dtype=np.float32), True)
        kv.waitall()
        kv.barrier()

    run_threads(dyn, NT)
    out = np.zeros(2, dtype=np.float32)
    workers[0].pull(key9, out)
    n = nworkers * RUNS2
    assert np.array_equal(out, k9v + np.array([n, 2 * n], np.float32)), (out, k9v, n)
    s.barrier()

    # test_locality_api.cc: home ranks first, swapped by localize
    w0 = workers[0]
    a, b = 0, size - 1  # keys homed on rank 0 and on the last rank
    ka = np.array([a + size * 7], dtype=np.int64)
    kb = np.array([b + size * 11], dtype=np.int64)
    buf = np.zeros(2, dtype=np.float32)

    def local(k: np.ndarray) -> bool:
        """Owned here; a pull then returns -1 (as does one of a key in a co-located shard)."""
        owned = s._engine.key_state(int(k[0])) == _kvps.KEY_STATES["owned"]
        ts = w0.pull(k, buf)
        assert (ts == -1) == (owned or s.shares_memory), (ts, owned)
        return owned

    assert local(ka) == (rank == 0)
    assert local(kb) == (rank == size - 1)
    s.barrier()
    if size > 1:
        if rank == 0:
            w0.localize(kb)
        if rank == size - 1:
            w0.localize(ka)
        s.barrier()
        assert local(kb) == (rank == 0)
        assert local(ka) == (rank == size - 1)
    s.barrier()

    # test_many_key_operations.cc (quick mode, fewer runs), with hot keys replicated
    vpk3 = 10
    s.shutdown()
    kvps.setup(NK, NT, "all")
    s = kvps.Server(vpk3)
    workers = [kvps.Worker(w, s) for w in range(NT)]
    allk = np.arange(NK, dtype=np.int64)
    gen = np.random.default_rng(7)
    init = gen.integers(-5000, 5000, size=NK * vpk3).astype(np.float32)
    hot = np.arange(0, NK, 5, dtype=np.int64)
    R = 150

    def rkeys(rng: np.random.Generator) -> np.ndarray:
        return rng.choice(NK, size=int(rng.integers(1, 20)), replace=False).astype(np.int64)

    def many(w: int) -> None:
        kv = workers[w]
        wid = rank * NT + w
        rng = np.random.default_rng(100 + wid)
        kv.begin_setup()
        if wid == 0:
            kv.push(allk, init)
        kv.intent(hot, 0, 10**6)  # every worker: replicate the hot keys
        kv.end_setup()
        # pulls and localizes: everything equals init
        pulls = []
        for _ in range(R):
            kv.localize(rkeys(rng), True)
            pk = rkeys(rng)
            pv = np.full(len(pk) * vpk3, 12, dtype=np.float32)
            pulls.append((pk, pv, kv.pull(pk, pv, True)))
        kv.waitall()
        for pk, pv, _ in pulls:
            want = init.reshape(NK, vpk3)[pk].ravel()
            assert np.array_equal(pv, want), (pk, pv[:4], want[:4])
        kv.barrier()
        # monotone pushes: a pull sees at least init + this worker's earlier pushes
        mine = init.copy().reshape(NK, vpk3)
        pulls = []
        for _ in range(R):
            kv.localize(rkeys(rng), True)
            pk = rkeys(rng)
            pv = np.zeros(len(pk) * vpk3, dtype=np.float32)
            kv.pull(pk, pv, True)
            pulls.append((pk, pv, mine[pk].copy()))
            qk = rkeys(rng)
            qv = rng.integers(1, 1000, size=len(qk) * vpk3).astype(np.float32)
            kv.push(qk, qv)
            mine[qk] += qv.reshape(-1, vpk3)
        kv.waitall()
        for _pk, pv, lo in pulls:
            assert np.all(pv.reshape(-1, vpk3) >= lo), "a pull went below the pushes it must see"
        kv.wait_sync()
        kv.barrier()
        kv.wait_sync()  # a second round: every replica holds every rank's deltas
        kv.barrier()
        # eventual consistency: pushes, then their negation, return to the start
        before = np.zeros(NK * vpk3, dtype=np.float32)
        kv.pull(allk, before)
        kv.barrier()
        total = np.zeros((NK, vpk3), dtype=np.float32)
        for _ in range(R):
            kv.localize(rkeys(rng), True)
            qk = rkeys(rng)
            qv = rng.integers(1, 1000, size=len(qk) * vpk3).astype(np.float32)
            kv.push(qk, qv, True)
            total[qk] -= qv.reshape(-1, vpk3)
        kv.push(allk, total.ravel())
        kv.waitall()
        kv.wait_sync()
        kv.barrier()
        kv.wait_sync()
        kv.barrier()
        after = np.zeros(NK * vpk3, dtype=np.float32)
        kv.pull(allk, after)
        assert np.array_equal(before, after), np.nonzero(before != after)[0][:5]
        kv.barrier()

    run_threads(many, NT)
    s.barrier()
    s.shutdown()
    if rank == 0:
        print("port ok: set/dynamic/locality/many")


# ------------------------------------------------ variable lengths + sampling
def varlen_sampling() -> None:
    NK = 150
    lengths = np.full(NK, 2, dtype=np.int64)
    lengths[[34, 32, 50, 30, 40, 140]] = 3
    lengths[[41, 80, 9, 90, 61]] = 1
    kvps.setup(NK, NT, "relocation_only")
    s = kvps.Server(torch.from_numpy(lengths))
    workers = [kvps.Worker(w, s) for w in range(NT)]
    w0 = workers[0]
    off = np.concatenate([[0], np.cumsum(lengths)])

    def pull(keys: list[int]) -> np.ndarray:
        out = np.zeros(int(lengths[keys].sum()), dtype=np.float32)
        w0.pull(np.array(keys, dtype=np.int64), out)
        return out

    # pushes from one rank with mixed lengths, pulled everywhere
    cases = [
        ([0], [1, 2]),
        ([1, 2], [14, 15, 26, 27]),
        ([3, 34], [31, 32, 341, 342, 343]),
        ([5, 32, 41], [51, 52, 321, 322, 323, 411]),
        ([50, 80, 72], [501, 502, 503, 801, 721, 722]),
    ]
    for keys, vals in cases:
        if rank == size - 1:
            w0.push(np.array(keys, dtype=np.int64), np.array(vals, dtype=np.float32))
        s.barrier()
        assert np.array_equal(pull(keys), np.array(vals, np.float32)), (keys, pull(keys))
        s.barrier()
    # every rank pushes (split request): value * size
    keys, vals = [42, 61], [421, 422, 611]
    w0.push(np.array(keys, dtype=np.int64), np.array(vals, dtype=np.float32))
    s.barrier()
    assert np.array_equal(pull(keys), size * np.array(vals, np.float32))
    s.barrier()

    # localize while the other workers spam pushes that cancel out
    for target, keys, vals in [
        (0, [140], [140, 141, 142]),
        (size - 1, [10, 30, 20, 40], [11, 12, 31, 32, 33, 21, 22, 41, 42, 43]),
    ]:
        kk = np.array(keys, dtype=np.int64)
        if rank == 0:
            w0.push(kk, np.array(vals, dtype=np.float32))
        s.barrier()

        def spam(w: int, kk: np.ndarray = kk, vals: list[int] = vals, target: int = target) -> None:
            kv = workers[w]
            if rank == target and w == 0:
                kv.localize(kk)
            else:
                sign = 1.0 if (rank * NT + w) % 2 == 0 else -1.0
                v = np.array(vals, dtype=np.float32) * 10 * sign
                for _ in range(300):
                    kv.push(kk, v, True)
                    kv.pull(kk, np.zeros(len(vals), dtype=np.float32), True)
                kv.waitall()
            kv.barrier()
            # the spamming workers' pushes: +10 v from even, -10 v from odd worker ids
            if kv is w0:
                net = sum(1 if wid % 2 == 0 else -1 for wid in range(size * NT) if wid != target * NT)
                extra = np.array(vals, np.float32) * 10 * 300 * net
                got = np.zeros(len(vals), dtype=np.float32)
                ts = kv.pull(kk, got)
                assert np.array_equal(got, np.array(vals, np.float32) + extra), (got, vals)
                if rank == target:
                    assert ts == -1, "localized keys are not local"
            kv.barrier()

        run_threads(spam, NT)
        for k in keys:  # reset these keys to 0 for the next case
            if rank == 0:
                cur = pull([k])
                w0.push(np.array([k], dtype=np.int64), -cur)
        s.barrier()

    # test_sampling.cc: values key*100+z, samples pulled in random chunks
    allk = np.arange(NK, dtype=np.int64)
    init = np.concatenate([k * 100 + np.arange(lengths[k]) for k in range(NK)]).astype(np.float32)

    def setup_phase(w: int) -> None:  # every worker takes part, as in AdaPM
        workers[w].begin_setup()
        if rank == 0 and w == 0:
            workers[w].set(allk, init)
        workers[w].end_setup()

    run_threads(setup_phase, NT)
    for scheme, repl, dist in [
        ("naive", True, "uniform"),
        ("preloc", False, "uniform"),
        ("pool", True, "log-uniform"),
        ("local", False, "uniform"),
    ]:
        s.enable_sampling_support(scheme, repl, dist, 10, 140)
        rng = np.random.default_rng(rank)
        sids = [w0.prepare_sample(5, w0.current_clock() + i) for i in range(20)]
        for sid in sids:
            got_keys = []
            left = 5
            while left:
                m = min(left, int(rng.integers(1, 4)))
                kout = np.zeros(m, dtype=np.int64)
                # the value buffer must match the drawn keys: ask the size first
                with pytest.raises(ValueError, match="sum to"):
                    w0.pull_sample(sid, kout, np.zeros(0, dtype=np.float32))
                ks = w0._samples.next_keys(sid, kout)  # the keys the pull will take (not taken yet)
                vout = np.zeros(int(lengths[ks].sum()), dtype=np.float32)
                if left % 2:  # AdaPM's binding: positional async flag, or its keyword names
                    ts = w0.pull_sample(sid, kout, vout, True)
                else:
                    ts = w0.pull_sample(id=sid, keys=kout, vals=vout, **{"async": True})
                w0.wait(ts)
                assert np.all((kout >= 10) & (kout < 140)), kout
                want = np.concatenate([init[off[k] : off[k + 1]] for k in kout])
                assert np.array_equal(vout, want), (kout, vout, want)
                if scheme == "local":
                    assert ts == -1, "local sampling pulled a remote key"
                got_keys += kout.tolist()
                left -= m
            if not repl:
                assert len(set(got_keys)) == 5, got_keys
            w0.advance_clock()
        w0.wait_sync()
        s.barrier()
    s.barrier()
    s.shutdown()
    if rank == 0:
        print("port ok: varlen/sampling")


example()
core_ports()
varlen_sampling()
