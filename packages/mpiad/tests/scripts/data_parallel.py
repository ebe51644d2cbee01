"""mpiad.DataParallel: 20 SGD steps of an MLP and of a small transformer equal
single-process training on the global batch (within 1e-6), with several buckets,
gradient accumulation under no_sync(), a parameter unused everywhere (keeps
grad None) and one used on rank 0 only (its gradient is averaged anyway).
Then what DDP users rely on around the edges: no_sync decided by the forward,
a backward of the bare module that does not communicate, a parameter used in
two reentrant checkpoints (a clear error), and a backward that raises on one
rank (the ranks go on, matched, and the gradients stay clean)."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator

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


def averaged(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """The mean over the ranks of each local gradient (the reference)."""
    return [comm.Allreduce(g.clone(), mpiad.MPI_SUM) / size for g in grads]


def local_grads(net: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    ref = copy.deepcopy(net)
    ref(x).sum().backward()
    return [q.grad.clone() for q in ref.parameters()]


def close(a: list[torch.Tensor], b: list[torch.Tensor], what: str) -> None:
    for i, (u, v) in enumerate(zip(a, b)):
        assert torch.allclose(u, v, atol=1e-12), (what, i, (u - v).abs().max().item())


def forward_decides() -> None:
    """no_sync and the bare module: what the forward ran through decides, as in DDP."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).to(D)
    dp = mpiad.DataParallel(net, bucket_cap_mb=0.0001)
    x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(rank))  # each rank its own data
    mine = local_grads(net, x)
    cases = (
        ("forward in no_sync, backward outside", True, False, mine),
        ("forward outside, backward in no_sync", False, True, averaged(mine)),
    )
    for what, fwd_in, bwd_in, want in cases:
        net.zero_grad(set_to_none=True)
        with dp.no_sync() if fwd_in else contextlib.nullcontext():
            y = dp(x).sum()
        with dp.no_sync() if bwd_in else contextlib.nullcontext():
            y.backward()
        close([p.grad for p in net.parameters()], want, what)
    # only rank 0 runs a backward of the bare module: no collective may start (it would hang)
    net.zero_grad(set_to_none=True)
    if rank == 0:
        dp.module(x).sum().backward()
        close([p.grad for p in net.parameters()], mine, "bare module")
    MPI.COMM_WORLD.Barrier()
    # a forward under no_grad (evaluation) between a forward and its backward changes nothing
    net.zero_grad(set_to_none=True)
    y = dp(x).sum()
    with torch.no_grad():
        dp(x)
    y.backward()
    close([p.grad for p in net.parameters()], averaged(mine), "eval forward in between")


def buckets_start_during_backward() -> None:
    """The last layer's buckets leave while autograd still computes the first layer's gradients;
    with the default 25 MB the whole model is one bucket."""
    torch.manual_seed(5)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
    ).to(D)
    assert mpiad.DataParallel(copy.deepcopy(net)).bucket_count == 1
    dp = mpiad.DataParallel(net, bucket_cap_mb=0.0001)
    assert dp.bucket_count >= 3, dp.bucket_count
    seen: list[bool] = []

    def first_layer(g: torch.Tensor) -> None:  # runs when the gradient is computed, before it is accumulated
        seen.append(dp._buckets[0].req is not None)

    net[0].weight.register_hook(first_layer)
    x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(rank))
    want = averaged(local_grads(net, x))
    dp(x).sum().backward()
    assert seen == [True], "the first bucket had not started when the first layer's gradient was computed"
    close([p.grad for p in net.parameters()], want, "buckets during backward")


class _Scale(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum()


def half_buckets() -> None:
    """16-bit gradients whose sum over the ranks overflows but whose average fits (divided first, as DDP)."""
    for dtype, big in ((torch.float16, 60000.0), (torch.bfloat16, 3.0e38)):
        net = _Scale(dtype)
        dp = mpiad.DataParallel(net)
        x = torch.full((3,), big, dtype=dtype) * torch.tensor([1.0, 0.5, -1.0], dtype=dtype)
        dp(x).backward()
        assert torch.isfinite(net.w.grad).all(), (dtype, net.w.grad)
        assert torch.equal(net.w.grad, x), (dtype, net.w.grad, x)  # every rank the same gradient: its average


class _Shared(torch.nn.Module):
    """One Linear applied in two reentrant (or not) checkpoints: two gradients per backward."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.shared, self.head, self.reentrant = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1), reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(self.shared, x, use_reentrant=self.reentrant)
        h = checkpoint(self.shared, torch.tanh(h), use_reentrant=self.reentrant)
        return self.head(h)


def checkpointed() -> None:
    x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    for reentrant in (False, True):
        torch.manual_seed(4)
        net = _Shared(reentrant).to(D)
        want = averaged(local_grads(net, x))
        dp = mpiad.DataParallel(net)  # one bucket: it is sent before the second gradient arrives
        if not reentrant:
            dp(x).sum().backward()
            close([p.grad for p in net.parameters()], want, "non-reentrant checkpoints")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # (torch: a reentrant checkpoint's input)
            raises(RuntimeError, lambda dp=dp: dp(x).sum().backward(), "reentrant", "use_reentrant=False")
            # the round left open is completed at the next forward, matched on every rank
            with warns("ended early"):
                y = dp(x)
        del y


class _Boom(torch.autograd.Function):
    """Identity whose backward raises where ``_Boom.on`` (an OOM, say)."""

    on = False

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        if _Boom.on:
            raise RuntimeError("boom")
        return g


class _Three(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(_Boom.apply(self.l2(torch.tanh(self.l1(x))))).sum()


def failed_backward() -> None:
    """Rank 0's backward raises after its first buckets left; the others finish theirs.
    Rank 0's next forward completes that round (the others were waiting for it), and
    neither that round nor its completion writes into the gradients it zeroed."""
    torch.manual_seed(6)
    net = _Three().to(D)
    x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(rank))
    want = averaged(local_grads(net, x))
    dp = mpiad.DataParallel(net, bucket_cap_mb=0.0001)  # 100 B: l3's buckets leave before the failure
    dp(x).backward()  # a normal round first: p.grad are now views of the buckets
    net.zero_grad(set_to_none=False)
    _Boom.on = rank == 0
    if rank == 0:
        raises(RuntimeError, lambda: dp(x).backward(), "boom")
    else:
        dp(x).backward()  # waits for rank 0's part of the round: its next forward
    _Boom.on = False
    net.zero_grad(set_to_none=False)  # every rank drops the step
    with warns("ended early") if rank == 0 else contextlib.nullcontext():
        y = dp(x)
    assert all(float(p.grad.abs().max()) == 0 for p in net.parameters()), "the abandoned round wrote into p.grad"
    y.backward()
    close([p.grad for p in net.parameters()], want, "the step after a failed backward")


@contextlib.contextmanager
def warns(words: str) -> Iterator[None]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        yield
    assert any(words in str(w.message) for w in got), [str(w.message) for w in got]


train("mlp", set_to_none=True)
train("transformer", set_to_none=False)
forward_decides()
buckets_start_during_backward()
half_buckets()
checkpointed()
failed_backward()

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
