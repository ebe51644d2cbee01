"""mpiad.DataParallel: 20 SGD steps of an MLP and of a small transformer equal
single-process training on the global batch (within 1e-6), with several buckets,
gradient accumulation under no_sync(), a parameter unused everywhere (keeps
grad None) and one used on rank 0 only (its gradient is averaged anyway)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import mpi4py.MPI as MPI
import torch

import mpiad

comm = mpiad.COMM_WORLD
rank, size = comm.rank, comm.size
D = torch.double
STEPS, MICRO, LOCAL_BATCH = 20, 2, 4


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.extra = torch.nn.Linear(8, 1)  # used by rank 0's shard only
        self.unused = torch.nn.Linear(8, 3)  # never used: its grad stays None

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        return self.head(self.layer(self.embed(x)).mean(1))


def raises(exc: type[BaseException], fn: Callable[[], object], *words: str) -> None:
    try:
        fn()
    except exc as e:
        msg = str(e)
        assert all(w in msg for w in words), (msg, words)
    else:
        raise AssertionError(f"no {exc.__name__} raised (expected words {words})")


def data(model: str, step: int, micro: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's shard of the global batch of a step (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 * step + 100 * micro + r)
    x = (
        torch.randn(LOCAL_BATCH, 8, dtype=D, generator=g)
        if model == "mlp"
        else torch.randn(LOCAL_BATCH, 5, 4, dtype=D, generator=g)
    )
    return x, torch.randn(LOCAL_BATCH, 1, dtype=D, generator=g)


def loss_of(net: torch.nn.Module, model: str, step: int, micro: int, r: int) -> torch.Tensor:
    x, y = data(model, step, micro, r)
    return torch.nn.functional.mse_loss(net(x, use_extra=(r == 0)), y)


def train(model: str, set_to_none: bool) -> None:
    torch.manual_seed(0 if rank == 0 else 1 + rank)  # different inits: DataParallel starts from rank 0's
    base = (MLP() if model == "mlp" else Tiny()).to(D)
    ref = copy.deepcopy(base)
    dp = mpiad.DataParallel(base, bucket_cap_mb=0.0005)  # 500 B buckets: several per model
    assert dp.bucket_count >= 4, dp.bucket_count
    for p, q in zip(ref.parameters(), base.parameters()):  # the reference starts from rank 0's init too
        p.data.copy_(q.data)
    opt = torch.optim.SGD(dp.parameters(), lr=0.05, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        with dp.no_sync():  # accumulate the first micro-batches locally
            for micro in range(MICRO - 1):
                loss_of(dp, model, step, micro, rank).backward()
        loss_of(dp, model, step, MICRO - 1, rank).backward()  # this backward averages over the ranks
        opt.step()
        # single process: the mean over the global batch, every micro-batch
        ropt.zero_grad(set_to_none=set_to_none)
        total = sum(loss_of(ref, model, step, m, r) for r in range(size) for m in range(MICRO))
        (total / size).backward()
        ropt.step()
    for (name, p), q in zip(dp.module.named_parameters(), ref.parameters()):
        err = (p - q).abs().max().item()
        assert err < 1e-6, (model, name, err)
        if name.startswith("unused"):
            assert p.grad is None and q.grad is None, name
    if rank == 0:
        print(f"{model}: 20 steps match single-process training (buckets: {dp.bucket_count})", flush=True)


train("mlp", set_to_none=True)
train("transformer", set_to_none=False)

# bad input
for call, exc, words in (
    (lambda: mpiad.DataParallel(3), TypeError, "torch.nn.Module"),  # type: ignore[arg-type]
    (lambda: mpiad.DataParallel(torch.nn.Linear(2, 2), bucket_cap_mb=0), ValueError, "bucket_cap_mb"),
    (lambda: mpiad.DataParallel(torch.nn.Linear(2, 2), comm=MPI.COMM_WORLD), TypeError, "Communicator"),
):
    raises(exc, call, words)
if size > 1:  # different models on the ranks: a clear error on every rank, not a hang
    raises(ValueError, lambda: mpiad.DataParallel(torch.nn.Linear(2, 2 + (rank == 1))), "models differ")

MPI.COMM_WORLD.Barrier()
if rank == 0:
    print(f"data_parallel: all checks passed on {size} ranks")
