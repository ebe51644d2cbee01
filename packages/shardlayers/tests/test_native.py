"""The native kernel against a torch reference, and the single-process API (no process group)."""

from __future__ import annotations

import pytest
import torch

import distkit_common
import shardlayers
import shardlayers as ts
from distkit_common.dtypes import code_of
from shardlayers import _shardlayers
from shardlayers._xent import native_grad, native_stats


def test_native_version_matches_package() -> None:
    assert _shardlayers.version() == shardlayers.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _shardlayers.get_num_threads() >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_weight", [False, True])
def test_native_stats_and_grad_match_torch(dtype: torch.dtype, with_weight: bool) -> None:
    g = torch.Generator().manual_seed(0)
    n, c, vstart = 37, 301, 100
    x = (torch.randn(n, c + 5, generator=g) * 5).to(dtype)[:, :c]  # row stride > c
    target = torch.randint(0, 600, (n,), generator=g)
    target[:5] = torch.arange(vstart, vstart + 5)
    x[1, 7:20] = float("-inf")  # masked classes contribute exactly nothing
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    w = torch.rand(c, generator=g, dtype=acc) + 0.5 if with_weight else None
    st = native_stats(x, target, vstart, w, True)
    xf = x.to(acc)
    m = xf.max(1).values
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(st[:, 0], m, rtol=0, atol=0)
    torch.testing.assert_close(st[:, 1], torch.exp(xf - m[:, None]).sum(1), rtol=tol, atol=tol)
    lt = target - vstart
    inside = (lt >= 0) & (lt < c)
    xt = torch.where(inside, xf.gather(1, lt.clamp(0, c - 1)[:, None])[:, 0], torch.zeros(n, dtype=acc))
    torch.testing.assert_close(st[:, 2], xt, rtol=0, atol=0)
    torch.testing.assert_close(st[:, 3], (xf * (w if w is not None else 1)).sum(1), rtol=tol, atol=tol * 100)
    coef = torch.rand(n, 4, generator=g, dtype=acc)
    coef[:, 0] += m
    coef[3] = 0  # an ignored row
    grad = native_grad(x, target, vstart, w, coef)
    ref = coef[:, 1:2] * torch.exp(xf - coef[:, 0:1]) - coef[:, 3:4] * (w if w is not None else 1)
    ref[inside, lt[inside]] -= coef[inside, 2]
    assert grad.dtype == dtype
    rtol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, tol)
    torch.testing.assert_close(grad.to(acc), ref.to(dtype).to(acc), rtol=rtol, atol=rtol)
    assert torch.all(grad[3] == 0)


def test_native_bad_input() -> None:
    x = torch.zeros(2, 3)
    t = torch.zeros(2, dtype=torch.int64)
    out = torch.empty(2, 4)
    with pytest.raises(ValueError, match="columns"):
        _shardlayers.xent_stats_cpu(x.data_ptr(), 2, 3, 2, code_of(x.dtype), t.data_ptr(), 0, 0, False, out.data_ptr())
    with pytest.raises(TypeError, match="floating"):
        _shardlayers.xent_stats_cpu(
            x.data_ptr(), 2, 3, 3, code_of(torch.int32), t.data_ptr(), 0, 0, False, out.data_ptr()
        )
    with pytest.raises(ValueError, match="null"):
        _shardlayers.xent_stats_cpu(0, 2, 3, 3, code_of(x.dtype), t.data_ptr(), 0, 0, False, out.data_ptr())
    with pytest.raises(RuntimeError, match="CUDA"):
        _shardlayers.xent_stats_cuda(x.data_ptr(), 2, 3, 3, 2, t.data_ptr(), 0, 0, False, out.data_ptr(), 0)


def test_slice() -> None:
    x = torch.arange(30.0).reshape(3, 10)
    a, b = ts.slice(x, 2, dim=-1)
    assert a.shape == b.shape == (3, 5)
    assert torch.equal(torch.cat([a, b], -1), x)
    parts = ts.slice(x, 3, dim=1, contiguous=True, uneven=True)
    assert [p.shape[1] for p in parts] == [4, 3, 3] and all(p.is_contiguous() for p in parts)
    assert ts.slice(x, 2, dim=None) == (x, x)
    with pytest.raises(ValueError, match="not divisible"):
        ts.slice(x, 3, dim=-1)
    with pytest.raises(IndexError, match="out of range"):
        ts.slice(x, 2, dim=2)
    with pytest.raises(ValueError, match=">= 1"):
        ts.slice(x, 0)
    with pytest.raises(TypeError, match="tensor"):
        ts.slice([1, 2], 2)  # type: ignore[arg-type]


def test_tags_single_process() -> None:
    data = torch.empty(20, 30)
    assert ts.get_parallel_dim(data) is None
    ts.register_parallel_dim(data, -1)
    assert ts.get_parallel_dim(data) == -1
    p = torch.nn.Parameter(torch.empty(20, 30))
    ts.register_parallel_attribute(p, -1, 1)
    assert ts.get_parallel_dim(p) == -1 and getattr(p, ts._ORDER_TYPE) == 1
    with pytest.raises(ValueError, match="order_type"):
        ts.register_parallel_attribute(p, -1, 2)
    with pytest.raises(ValueError, match="parallel_dim"):
        ts.register_parallel_dim(data, 3)
    with pytest.raises(TypeError, match="tensor"):
        ts.get_parallel_dim([1])  # type: ignore[arg-type]
    h = ts.nn.RegisterParallelDim(-1)(torch.randn(4, 6, requires_grad=True))
    y = torch.nn.functional.silu(h).view(2, 2, 6) + 1
    assert ts.get_parallel_dim(y) == -1 and isinstance(y, ts.ParallelTensor)
    assert ts.get_parallel_dim(y @ torch.randn(6, 6)) is None
    other = ts.nn.RegisterParallelDim(0)(torch.randn(4, 6))
    with pytest.raises(ValueError, match="tag mismatch"):
        _ = h + other
    y.sum().backward()  # autograd flows through the subclass


def test_plain_layers_and_no_process_group() -> None:
    torch.manual_seed(0)
    ref = torch.nn.Linear(20, 30)
    torch.manual_seed(0)
    m = ts.nn.ParallelLinear(20, 30)
    assert m.weight.shape == (30, 20)  # nn.Linear layout [out, in]
    torch.testing.assert_close(m.weight, ref.weight, rtol=0, atol=0)
    x = torch.randn(3, 20)
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)
    assert ts.relocate_state_dict(m, m.state_dict()).keys() == m.state_dict().keys()
    assert ts.register_ddp_parameters_to_ignore(m) == []
    with pytest.raises(RuntimeError, match="no process group"):
        ts.nn.ParallelLinear(20, 30, dim=-1)
    with pytest.raises(RuntimeError, match="no process group"):
        ts.nn.ParallelEmbedding(20, 30, dim=0)
    with pytest.raises(RuntimeError, match="no process group"):
        ts.distributed.init_process_group(1)
    with pytest.raises(RuntimeError, match="no process group"):
        ts.distributed.get_group()
    with pytest.raises(RuntimeError, match="no process group"):
        ts.distributed.scatter(torch.zeros(2))
    with pytest.raises(RuntimeError, match="no process group"):
        ts.nn.functional.parallel_cross_entropy(ts.nn.RegisterParallelDim(-1)(x), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="no process group"):
        ts.nn.convert_parallel_linear(torch.nn.Sequential(torch.nn.Linear(2, 2)), -1)
    with pytest.raises(ValueError, match="dim must be one of"):
        ts.nn.convert_parallel_linear(torch.nn.Linear(2, 2), 5)
    with pytest.raises(TypeError, match="nn.Module"):
        ts.collect_state_dict("model", {})  # type: ignore[arg-type]


def test_rng_tracker() -> None:
    tr = ts.random.RNGStatesTracker()
    tr.add("a", 7)
    torch.manual_seed(1)
    before = torch.rand(1)
    torch.manual_seed(1)
    with tr.fork("a"):
        inside = torch.rand(1)
    after = torch.rand(1)
    assert torch.equal(after, before)  # default stream untouched
    assert torch.equal(inside, torch.rand(1, generator=torch.Generator().manual_seed(7)))
    with pytest.raises(ValueError, match="already"):
        tr.add("b", 7)
    with pytest.raises(KeyError), tr.fork("missing"):
        pass


def test_init_helper_and_constructor_bad_input() -> None:
    t = torch.empty(3, 4)
    torch.manual_seed(3)
    ts.nn.init.shard_init_helper_(torch.nn.init.uniform_, t, a=-1.0, b=1.0)
    torch.manual_seed(3)
    torch.testing.assert_close(t, torch.nn.init.uniform_(torch.empty(3, 4), a=-1.0, b=1.0), rtol=0, atol=0)
    with pytest.raises(TypeError, match="callable"):
        ts.nn.init.shard_init_helper_(None, t)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tensor"):
        ts.nn.init.shard_init_helper_(torch.nn.init.zeros_, [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_features"):
        ts.nn.ParallelLinear(0, 3)
    with pytest.raises(TypeError, match="out_features"):
        ts.nn.ParallelLinear(3, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="padding_idx"):
        ts.nn.ParallelEmbedding(4, 3, padding_idx=4)
    with pytest.raises(TypeError, match="weight"):
        ts.nn.ParallelCrossEntropyLoss(weight=[1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int64"):
        ts.nn.ParallelEmbedding(4, 3)(torch.zeros(2))
    with pytest.raises(TypeError, match="floating"):
        ts.nn.functional.parallel_cross_entropy(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
