"""Checkpoints across rank counts, value dtypes, sampling (run under mpiexec).

Usage: persist.py save <dir> <dtype> [format]       (state with relocated keys and un-flushed replica deltas)
       persist.py load <dir> <dtype> <saved_ranks> [format]
format: "kvps" (default) or "distx" (distx-fake's checkpoint format).
"""

from __future__ import annotations

import faulthandler
import os
import sys

import numpy as np
import pytest
import torch
from mpi4py import MPI

import kvps
from kvps import optim

faulthandler.dump_traceback_later(150)  # diagnose a hang before the test's timeout
MODE, PATH, DT = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3])
FMT = sys.argv[4 if MODE == "save" else 5] if len(sys.argv) > (4 if MODE == "save" else 5) else "kvps"
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
NK = 501
lengths = (2 + np.arange(NK) % 4).astype(np.int64)


ADAM_KEYS = 37


def adam_init() -> np.ndarray:
    return (np.arange(ADAM_KEYS * 4, dtype=np.float32) / 100).astype(np.float32)


def adam_grad(i: int) -> np.ndarray:
    return np.sin(np.arange(ADAM_KEYS * 4, dtype=np.float32) + i).astype(np.float32)


#: the server-side rules whose state a checkpoint carries (kvps.optim)
RULES = {"adam": lambda: optim.Adam(lr=0.05), "rowwise_adagrad": lambda: optim.RowWiseAdagrad(lr=0.1)}


def reference(name: str, steps: int) -> torch.Tensor:
    """The rows after ``steps`` pushes of adam_grad(0..): torch.optim.Adam, or row-wise Adagrad's closed form."""
    p = torch.nn.Parameter(torch.from_numpy(adam_init()).view(-1, 4))
    if name == "adam":
        o = torch.optim.Adam([p], lr=0.05)
        for i in range(steps):
            p.grad = torch.from_numpy(adam_grad(i)).view(-1, 4)
            o.step()
        return p.detach()
    acc = torch.zeros(ADAM_KEYS, 1)
    x = p.detach().clone()
    for i in range(steps):
        g = torch.from_numpy(adam_grad(i)).view(-1, 4)
        acc += (g * g).mean(1, keepdim=True)
        x -= 0.1 / (acc.sqrt() + 1e-8) * g
    return x


def expected(saved_ranks: int) -> torch.Tensor:
    base = torch.cat([torch.arange(int(lengths[k]), dtype=torch.float64) + 0.5 * k for k in range(NK)])
    bump = np.zeros(NK)
    bump[:50:7] = saved_ranks  # every rank pushed +1 to keys 0, 7, ..., 49
    return (base + torch.from_numpy(np.repeat(bump, lengths))).to(DT)


kvps.setup(NK, 1, "all")
server = kvps.Server(lengths, dtype=DT)
w = kvps.Worker(0, server)
allk = np.arange(NK, dtype=np.int64)
total = int(lengths.sum())

if MODE == "save":
    mine = allk[allk % size == rank]
    vals = torch.cat([torch.arange(int(lengths[k]), dtype=torch.float64) + 0.5 * k for k in mine]).to(DT)
    assert w.set(mine, vals) == -1  # home keys are local at start
    w.barrier()
    # move keys around, create replicas and leave replica deltas un-flushed
    w.localize(np.array([(rank * 37 + 5) % NK, (rank * 53 + 11) % NK], dtype=np.int64))
    shared = np.arange(0, 50, 7, dtype=np.int64)
    w.intent(shared, 0, 5)
    w.wait_sync()
    w.barrier()
    w.push(shared, torch.ones(int(lengths[shared].sum()), dtype=DT))
    # a first checkpoint, then an overwrite with the final state
    server.save(PATH, format=FMT)
    server.save(PATH, format=FMT)
    if FMT == "kvps":
        assert sorted(os.listdir(PATH)) == sorted(
            ["meta.json", "lengths.bin"] + [f"shard-{r}.{x}" for r in range(size) for x in ("keys", "vals")]
        ), os.listdir(PATH)
    else:
        assert "metadata.json" in os.listdir(PATH), os.listdir(PATH)
    assert not [p for p in os.listdir(os.path.dirname(PATH)) if ".tmp-" in p or ".old-" in p]
    out = torch.zeros(total, dtype=DT)
    w.wait_sync()
    w.barrier()
    w.pull(allk, out)
    assert torch.equal(out, expected(size)), "state before save is wrong"
    server.shutdown()  # collective: no rank leaves while another still awaits its replies
    if sys.argv[3] == "float32":  # servers with optimizers: their state is saved with the rows
        for name, rule in RULES.items():
            kvps.setup(ADAM_KEYS, 1, "all")
            s = kvps.Server(4, optimizer=rule())
            w = kvps.Worker(0, s)
            if rank == 0:  # only rank 0 updates: a deterministic sequence of steps at every key's owner
                w.set(np.arange(ADAM_KEYS), adam_init())
                for i in range(3):
                    w.push(np.arange(ADAM_KEYS), adam_grad(i))
            s.barrier()
            s.save(f"{PATH}-{name}", format=FMT)
            s.shutdown()
else:
    saved = int(sys.argv[4])
    w.push(allk, torch.ones(total, dtype=DT))  # overwritten by the load
    w.barrier()
    server.load(PATH, format=FMT)
    out = torch.zeros(total, dtype=DT)
    w.pull(allk, out)
    exp = expected(saved)
    bad = (out != exp).nonzero().flatten()
    assert bad.numel() == 0, (
        f"rank {rank}: loaded state differs (saved on {saved} ranks, loaded on {size}) at {bad.numel()} elements, "
        f"first {bad[:6].tolist()}: {out[bad[:6]].tolist()} != {exp[bad[:6]].tolist()}"
    )
    # pushes after a load still sum exactly
    w.barrier()  # every rank checked the loaded state before anyone pushes
    w.push(allk, torch.ones(total, dtype=DT))
    w.barrier()
    w.pull(allk, out)
    if DT in (torch.float32, torch.float64):  # 16-bit sums round after every push
        assert torch.equal(out, (expected(saved).double() + size).to(DT))
    # a mismatching server refuses the checkpoint
    server.shutdown()
    if sys.argv[3] == "float32":
        # the optimizer's state came back (Adam: moments and per-row step counts; row-wise
        # Adagrad: one accumulator per row): one more step equals the 4th of the reference
        for name, rule in RULES.items():
            kvps.setup(ADAM_KEYS, 1, "all")
            s = kvps.Server(4, optimizer=rule())
            w = kvps.Worker(0, s)
            other = kvps.Server(4, optimizer=optim.Adagrad())
            with pytest.raises(ValueError, match=f"rule '{name}'"):
                other.load(f"{PATH}-{name}", format=FMT)  # another optimizer's state does not fit
            other.shutdown()
            s.load(f"{PATH}-{name}", format=FMT)
            if rank == 0:
                w.push(np.arange(ADAM_KEYS), adam_grad(3))
            s.barrier()
            got = torch.zeros(ADAM_KEYS * 4)
            w.pull(np.arange(ADAM_KEYS), got)
            torch.testing.assert_close(got.view(-1, 4), reference(name, 4), rtol=1e-6, atol=1e-7)
            s.shutdown()
    kvps.setup(NK + 1, 1, "none")
    other = kvps.Server(3, dtype=DT)
    with pytest.raises(ValueError, match="keys"):
        other.load(PATH, format=FMT)
    other.shutdown()
    kvps.setup(NK, 1, "none")
    other = kvps.Server(3, dtype=DT)
    with pytest.raises(ValueError, match="lengths"):
        other.load(PATH, format=FMT)
    with pytest.raises(OSError, match="cannot read"):
        other.load(PATH + "-missing", format=FMT)
    other.shutdown()

    # sampling: uniform lengths, preloc scheme makes samples local
    kvps.setup(200, 1, "all")
    s = kvps.Server(4, dtype=DT)
    w = kvps.Worker(0, s)
    keys = np.arange(200, dtype=np.int64)
    if rank == 0:
        w.set(keys, torch.arange(800, dtype=torch.float64).to(DT))
    w.barrier()
    with pytest.raises(ValueError, match="scheme"):
        s.enable_sampling_support("magic")
    with pytest.raises(ValueError, match="distribution"):
        s.enable_sampling_support("naive", distribution="zipf")
    with pytest.raises(ValueError, match="max_key"):
        s.enable_sampling_support("naive", max_key=201)
    with pytest.raises(ValueError, match="min_key"):
        s.enable_sampling_support("naive", min_key=50, max_key=50)
    s.enable_sampling_support("preloc", with_replacement=False, min_key=10, max_key=60)
    with pytest.raises(ValueError, match="K"):
        w.prepare_sample(0, 0)
    with pytest.raises(ValueError, match="distinct"):
        w.prepare_sample(51, 0)
    with pytest.raises(TypeError, match="ts"):
        w.wait(1.5)  # type: ignore[arg-type]
    sid = w.prepare_sample(6, 0, 3)
    w.wait_sync()
    ko = np.zeros(4, dtype=np.int64)
    vo = torch.zeros(16, dtype=DT)
    w.pull_sample(sid, ko, vo)
    assert len(set(ko.tolist())) == 4 and ko.min() >= 10 and ko.max() < 60, ko
    assert torch.equal(vo, (torch.from_numpy(ko).repeat_interleave(4) * 4 + torch.arange(4).repeat(4)).to(DT))
    ko2 = torch.zeros(2, dtype=torch.int64)
    w.pull_sample(sid, ko2, torch.zeros(8, dtype=DT))
    assert not set(ko2.tolist()) & set(ko.tolist())
    with pytest.raises(KeyError, match="exhausted"):
        w.pull_sample(sid, ko2, torch.zeros(8, dtype=DT))
    sid = w.prepare_sample(3, 0)
    with pytest.raises(ValueError, match="left"):
        w.pull_sample(sid, np.zeros(4, dtype=np.int64), torch.zeros(16, dtype=DT))
    s.enable_sampling_support("naive")
    sid = w.prepare_sample(5, 0)
    ko = np.zeros(5, dtype=np.int64)
    w.pull_sample(sid, ko, torch.zeros(20, dtype=DT))
    w.barrier()
    s.shutdown()
if rank == 0:
    print(f"persist {MODE} ok on {size} ranks ({sys.argv[3]})")
