"""materialize_shard: one block of a deferred tensor, equal to the same block of eager construction,
built without running the recorded ops (the tensor stays deferred); bad input and unsupported ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from distx_fake import deferred_init as di
from distx_fake import fake


class Inits(nn.Module):
    """The initializers of real models on sizes that are not multiples of 16 (normal_'s tail)."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.trunc = nn.Parameter(torch.empty(33, 17, dtype=dtype))
        self.xavier = nn.Parameter(torch.empty(9, 21, dtype=dtype))
        self.small = nn.Parameter(torch.empty(3, 5, dtype=dtype))  # normal_ on < 16 elements
        self.scaled = nn.Parameter(torch.empty(40, 6, dtype=dtype))
        nn.init.trunc_normal_(self.trunc, std=0.02)
        nn.init.xavier_normal_(self.xavier)
        nn.init.normal_(self.small, 1.0, 3.0)
        nn.init.kaiming_uniform_(self.scaled, a=0.5)
        with torch.no_grad():
            self.scaled.mul_(0.5).add_(0.25)
            self.scaled[:, 2].fill_(7.0)  # in place on a column view
            self.scaled.t()[4, 10:30].zero_()  # through a transposed view


def _linear(dtype: torch.dtype) -> nn.Module:
    return nn.Linear(37, 53, dtype=dtype)


def _embedding(dtype: torch.dtype) -> nn.Module:
    return nn.Embedding(50, 24, padding_idx=3, dtype=dtype)  # normal_, then the padding row zeroed


def _windows(n: int) -> list[tuple[int, int]]:
    return [(0, n), (1, n // 2), (n - 1, 1), (n // 3, n // 3 + 1), (n // 2, 0)]


@pytest.mark.parametrize("build", [_linear, _embedding, Inits], ids=["linear", "embedding", "inits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_shard_equals_the_eager_block_and_runs_nothing(build: Callable[..., nn.Module], dtype: torch.dtype) -> None:
    torch.manual_seed(7)
    eager = dict(build(dtype).named_parameters())
    torch.manual_seed(7)
    m = di.deferred_init(build, dtype)
    params = dict(m.named_parameters())
    assert params.keys() == eager.keys()
    for name, p in params.items():
        for dim in range(p.dim()):
            for start, length in _windows(p.shape[dim]):
                got = di.materialize_shard(p, dim, start, length)
                want = eager[name].detach().narrow(dim, start, length)
                assert not fake.is_fake(got) and got.is_contiguous() and not got.requires_grad
                assert got.dtype == dtype and got.shape == want.shape, (name, dim, start, length)
                assert torch.equal(got, want), f"{name} dim {dim} [{start}, {start + length}) differs"
        # negative dims count from the end
        assert torch.equal(di.materialize_shard(p, -1, 1, 2), eager[name].detach().narrow(-1, 1, 2))
        # the shards ran none of the recorded ops: the tensor stays deferred, and materializes whole as eager
        assert di.is_deferred(p)
        pending = p._distx_graph.closure(p)
        if name == "trunc":  # torch's trunc_normal_ rejects by reading values: built while recording
            assert not pending
        else:
            assert pending and not any(n.done for n in pending), name
    di.materialize_module(m)
    for name, p in m.named_parameters():
        assert torch.equal(p, eager[name]), name


def test_shard_of_tensors_that_await_no_materialization() -> None:
    real = torch.arange(12.0).reshape(3, 4)
    got = di.materialize_shard(real, 1, 1, 2)
    assert torch.equal(got, real[:, 1:3]) and got.is_contiguous()
    got.fill_(-1.0)  # a copy, not a view
    assert real[0, 1].item() == 1.0

    torch.manual_seed(3)
    eager = nn.Linear(6, 5)
    torch.manual_seed(3)
    m = di.deferred_init(nn.Linear, 6, 5)
    whole = di.materialize_tensor(m.weight)  # m.weight is still the fake; its value is cached
    assert torch.equal(di.materialize_shard(m.weight, 0, 2, 3), eager.weight.detach()[2:5])
    assert torch.equal(di.materialize_shard(m.weight, 0, 2, 3), whole.detach()[2:5])

    with fake.fake_mode():
        f = torch.empty(4, 3)
    piece = di.materialize_shard(f, 0, 1, 2)  # a fake of fake_mode has no values: its block is fake
    assert fake.is_fake(piece) and piece.shape == (2, 3)


class _Exp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8, 4))
        with torch.no_grad():
            self.w.exp_()


class _FromOther(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(6, 2))
        self.b = nn.Parameter(self.a.detach() * 2)


class _ReadThenChanged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((4, 3), 2.0))
        self.seen = self.w.sum().item()  # replays w's ops while recording
        with torch.no_grad():
            self.w.add_(1.0)


class _ReadOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((4, 3), 2.0))
        self.seen = self.w.sum().item()


def test_shard_of_ops_without_a_block_replay_raises() -> None:
    m = di.deferred_init(_Exp)
    with pytest.raises(di.ShardMaterializeError, match=r"exp_.*materialize the module first"):
        di.materialize_shard(m.w, 0, 0, 4)
    assert torch.equal(di.materialize_tensor(m.w), torch.full((8, 4), torch.e))  # still materializes whole

    m2 = di.deferred_init(_FromOther)
    with pytest.raises(di.ShardMaterializeError, match="another deferred tensor"):
        di.materialize_shard(m2.b, 0, 0, 3)

    m3 = di.deferred_init(_ReadThenChanged)
    assert m3.seen == 24.0
    with pytest.raises(di.ShardMaterializeError, match="part of its recorded ops ran already"):
        di.materialize_shard(m3.w, 0, 1, 2)
    assert torch.equal(di.materialize_tensor(m3.w), torch.full((4, 3), 3.0))

    m4 = di.deferred_init(_ReadOnly)  # every op ran while recording: the block of that value
    assert torch.equal(di.materialize_shard(m4.w, 1, 1, 2), torch.full((4, 2), 2.0))


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (([1.0, 2.0], 0, 0, 1), TypeError, "expects a tensor, got list"),
        ((None, 0, 0, 1), TypeError, "expects a tensor, got NoneType"),
        (("W", 2, 0, 1), IndexError, "dim 2 is out of range for a tensor of 2 dimensions"),
        (("W", -3, 0, 1), IndexError, "dim -3 is out of range"),
        (("W", 0.0, 0, 1), TypeError, "dim must be an int, got float"),
        (("W", 0, True, 1), TypeError, "start must be an int, got bool"),
        (("W", 0, 0, "2"), TypeError, "length must be an int, got str"),
        (("W", 0, -1, 1), ValueError, "start -1 and length 1 do not lie within size 5 of dim 0"),
        (("W", 0, 6, 0), ValueError, "start 6 and length 0"),
        (("W", 1, 2, 3), ValueError, "start 2 and length 3 do not lie within size 4 of dim 1"),
        (("W", 0, 0, -1), ValueError, "length -1"),
    ],
)
def test_shard_bad_input(args: tuple[Any, ...], exc: type[Exception], match: str) -> None:
    m = di.deferred_init(nn.Linear, 4, 5)
    args = tuple(m.weight if a == "W" else a for a in args)
    with pytest.raises(exc, match=match):
        di.materialize_shard(*args)
    assert di.is_deferred(m.weight) and not any(n.done for n in m.weight._distx_graph.closure(m.weight))
