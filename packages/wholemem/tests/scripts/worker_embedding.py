"""wg.Embedding on N ranks vs a single-process dense reference (run under mpiexec).

usage: worker_embedding.py <shared tmp dir>
Every rank replays every rank's batches on a dense torch table, so each can check
the distributed result against the single-process reference after 10 steps.
"""

from __future__ import annotations

import sys
import warnings

import torch
from mpi4py import MPI

import wholemem as wg

T = wg.WmTensorType
N, D, B, STEPS = 37, 6, 15, 10


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, N, (B,), generator=g), torch.randn(B, D, generator=g, dtype=torch.float64)


def loss_fn(rows: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((rows - target.to(rows.dtype)) ** 2).sum() * 0.5


def manual_reference(opt: object, init: torch.Tensor, size: int) -> torch.Tensor:
    """Dense float64 reference of WholeGraph's sparse update rules (touched rows only)."""
    w = init.clone().to(torch.float64)
    s0 = torch.zeros_like(w)
    s1 = torch.zeros_like(w)
    bt = torch.ones(N, 2, dtype=torch.float64)  # LazyAdam: per-row beta1^t, beta2^t
    for step in range(1, STEPS + 1):
        g = torch.zeros_like(w)
        for r in range(size):
            idx, tgt = batch(step, r)
            g.index_add_(0, idx, w[idx] - tgt)
        touched = torch.zeros(N, dtype=torch.bool)
        for r in range(size):
            touched[batch(step, r)[0]] = True
        gt = g[touched] + opt.weight_decay * w[touched]
        wt = w[touched]
        if isinstance(opt, wg.SGD):
            wt = wt - opt.lr * gt
        elif isinstance(opt, wg.Adagrad):
            s0[touched] += gt * gt
            wt = wt - opt.lr * gt / (s0[touched].sqrt() + opt.eps)
        elif isinstance(opt, wg.RMSProp):
            s0[touched] = opt.alpha * s0[touched] + (1 - opt.alpha) * gt * gt
            wt = wt - opt.lr * gt / (s0[touched].sqrt() + opt.eps)
        else:
            b1, b2 = opt.betas
            s0[touched] = b1 * s0[touched] + (1 - b1) * gt
            s1[touched] = b2 * s1[touched] + (1 - b2) * gt * gt
            bt[touched] *= torch.tensor([b1, b2], dtype=torch.float64)
            mhat = s0[touched] / (1 - bt[touched, :1])
            vhat = s1[touched] / (1 - bt[touched, 1:])
            wt = wt - opt.lr * mhat / (vhat.sqrt() + opt.eps)
        w[touched] = wt
    return w


def torch_reference(opt: object, init: torch.Tensor, size: int) -> torch.Tensor:
    """float32 torch.optim reference (sparse gradients) for SGD / Adagrad."""
    ref = torch.nn.Embedding(N, D, sparse=True)
    ref.weight.data.copy_(init)
    if isinstance(opt, wg.SGD):
        o: torch.optim.Optimizer = torch.optim.SGD([ref.weight], lr=opt.lr)
    else:
        assert isinstance(opt, wg.Adagrad)
        o = torch.optim.Adagrad([ref.weight], lr=opt.lr, eps=opt.eps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's sparse-invariant notice
        for step in range(1, STEPS + 1):
            o.zero_grad()
            for r in range(size):
                idx, tgt = batch(step, r)
                loss_fn(ref(idx), tgt).backward()
            o.step()
    return ref.weight.data


def train(emb: wg.Embedding, rank: int) -> None:
    for step in range(1, STEPS + 1):
        idx, tgt = batch(step, rank)
        loss_fn(emb(idx), tgt).backward()
        emb.step()


def main() -> None:
    mpi = MPI.COMM_WORLD
    rank, size = mpi.Get_rank(), mpi.Get_size()
    tmp = sys.argv[1]
    wg.init_lib()
    comm = wg.communicator_from_mpi4py(mpi)
    assert (comm.rank, comm.size) == (rank, size)
    init = torch.randn(N, D, generator=torch.Generator().manual_seed(7))
    types = (T.HOST, T.CHUNKED, T.NCCL)
    # float32 against torch.optim (SGD and sparse Adagrad have WholeGraph's formulas)
    for k, opt in enumerate((wg.SGD(lr=0.05), wg.Adagrad(lr=0.1))):
        ty = types[k % 3]
        emb = wg.Embedding(comm, N, D, optimizer=opt, tensor_type=ty, init=init)
        train(emb, rank)
        got = wg.gather(emb.weight, torch.arange(N))
        err = (got - torch_reference(opt, init, size)).abs().max().item()
        assert err <= 1e-6, (type(opt).__name__, ty, err)
    # float32 (the original's kernel precision) against the float64 dense reference, default hyper-parameters
    for k, opt in enumerate((wg.LazyAdam(lr=0.01), wg.RMSProp(lr=0.01), wg.Adagrad(lr=0.1))):
        ty = types[(k + 2) % 3]
        emb = wg.Embedding(comm, N, D, optimizer=opt, tensor_type=ty, init=init)
        train(emb, rank)
        got = wg.gather(emb.weight, torch.arange(N)).double()
        err = (got - manual_reference(opt, init, size)).abs().max().item()
        assert err <= 1e-6, (type(opt).__name__, ty, err)
    # LazyAdam's bias correction counts each row's own updates: rows touched in fewer steps differ from
    # a global-step (torch SparseAdam) correction, and the per-row state holds beta^t_row
    lz = wg.Embedding(comm, N, D, optimizer=wg.LazyAdam(lr=0.01), tensor_type=T.NCCL, init=init)
    train(lz, rank)
    counts = torch.zeros(N, dtype=torch.int64)
    for step in range(1, STEPS + 1):
        hit = torch.zeros(N, dtype=torch.bool)
        for r in range(size):
            hit[batch(step, r)[0]] = True
        counts += hit
    assert counts.min().item() < STEPS  # some rows skipped some steps (the case that differs)
    _, first = wg.get_local_tensor(lz.weight)
    rs = lz.optimizer_states[2]
    want = torch.stack([0.9 ** counts[first : first + rs.shape[0]], 0.999 ** counts[first : first + rs.shape[0]]], 1)
    assert torch.allclose(rs.double(), want.double(), rtol=1e-6, atol=0), (rs, want)
    # float64 against the hand-written dense reference, every optimizer x type, with weight decay
    opts = (
        wg.SGD(lr=0.05, weight_decay=0.01),
        wg.Adagrad(lr=0.1, weight_decay=0.01),
        wg.LazyAdam(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01),
        wg.RMSProp(lr=0.01, alpha=0.9, weight_decay=0.01),
    )
    for opt in opts:
        ref = manual_reference(opt, init, size)
        for ty in types:
            emb = wg.Embedding(comm, N, D, optimizer=opt, tensor_type=ty, dtype=torch.float64, init=init.double())
            train(emb, rank)
            got = wg.gather(emb.weight, torch.arange(N))
            err = (got - ref).abs().max().item()
            assert err <= 1e-6, (type(opt).__name__, ty, err)
    # save / load with optimizer state, into another type with a different number of parts
    opt = wg.LazyAdam(lr=0.02)
    a = wg.Embedding(comm, N, D, optimizer=opt, tensor_type=T.CHUNKED, init=init)
    train(a, rank)
    a.save(f"{tmp}/emb", num_parts=size + 1)
    b = wg.Embedding(comm, N, D, optimizer=opt, tensor_type=T.NCCL, seed=3)
    # the default initialisation does not depend on the number of ranks
    want = torch.randn(4096, D, generator=torch.Generator().manual_seed(3 * 1_000_003))[:N]
    assert torch.equal(wg.gather(b.weight, torch.arange(N)), want)
    b.load(f"{tmp}/emb")
    assert b.step_count == a.step_count == STEPS
    assert torch.equal(wg.gather(a.weight, torch.arange(N)), wg.gather(b.weight, torch.arange(N)))
    for e in (a, b):  # one more identical step: the restored state must match
        idx, tgt = batch(99, rank)
        loss_fn(e(idx), tgt).backward()
        e.step()
    assert torch.equal(wg.gather(a.weight, torch.arange(N)), wg.gather(b.weight, torch.arange(N)))
    # a 16-bit table trains (float32 optimizer state)
    h = wg.Embedding(comm, N, D, optimizer=wg.SGD(lr=0.05), tensor_type=T.HOST, dtype=torch.bfloat16, init=init)
    train(h, rank)
    ref = torch_reference(wg.SGD(lr=0.05), init, size)
    assert (wg.gather(h.weight, torch.arange(N)).float() - ref).abs().max().item() < 0.1
    comm.destroy()
    wg.finalize_lib()
    if rank == 0:
        print("worker_embedding OK", size)


if __name__ == "__main__":
    main()
