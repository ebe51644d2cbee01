"""The native kernel against a torch reference, and the single-process API (no process group)."""

from __future__ import annotations

import pytest
import torch

import distkit_common
import shardlayers
import shardlayers as ts
from distkit_common.dtypes import code_of
from shardlayers import _shardlayers
from shardlayers._xent import VocabParallelCrossEntropy, native_grad, native_stats


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


def _one_rank_xent(x: torch.Tensor, target: torch.Tensor, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and logits gradient of the native vocab-parallel cross-entropy on one rank."""
    leaf = x.clone().requires_grad_(True)
    loss = VocabParallelCrossEntropy.apply(leaf, target, None, -100, reduction, 0.0, None, None)
    (loss.sum() if reduction == "none" else loss).backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


def _torch_xent(x: torch.Tensor, target: torch.Tensor, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(leaf, target, reduction=reduction)
    (loss.sum() if reduction == "none" else loss).backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


@pytest.fixture(params=["cpu kernel", "cuda algorithm"])
def xent_algorithm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the cross-entropy with the CPU kernels, or with the CUDA kernels' per-row / per-element
    code run on the host (same signatures)."""
    if request.param == "cuda algorithm":
        monkeypatch.setattr(_shardlayers, "xent_stats_cpu", _shardlayers.xent_stats_blockwise_cpu)
        monkeypatch.setattr(_shardlayers, "xent_grad_cpu", _shardlayers.xent_grad_elementwise_cpu)
    return str(request.param)


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e4])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_float32_cross_entropy_as_accurate_as_torch_at_large_logits(
    xent_algorithm: str, scale: float, reduction: str
) -> None:
    # TorchShard's test shapes (13 x 17 rows of 22 classes, logits scaled by 1000): the gradient
    # once took exp(x - lse) with lse = max + log(sum) rounded to one float32, so at |lse| ~ 2000
    # its rounding (~1e-4) landed in the exponent: errors of 5.4e-5 against torch's 5.6e-8
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(221, 22, generator=g) * scale
    target = torch.randint(0, 22, (221,), generator=g)
    loss64, grad64 = _torch_xent(x.double(), target, reduction)
    loss_t, grad_t = _torch_xent(x, target, reduction)
    loss, grad = _one_rank_xent(x, target, reduction)
    err_t = (grad_t.double() - grad64).abs().max().item()
    err = (grad.double() - grad64).abs().max().item()
    assert err <= 2 * err_t + 3e-8, (xent_algorithm, err, err_t)
    lerr_t = (loss_t.double() - loss64).abs().max().item()
    lerr = (loss.double() - loss64).abs().max().item()
    ulp = torch.finfo(torch.float32).eps * loss64.abs().max().item()
    assert lerr <= 2 * lerr_t + ulp, (xent_algorithm, lerr, lerr_t)


def test_cross_entropy_gradient_of_two_close_large_logits_sums_to_zero(xent_algorithm: str) -> None:
    # the report's example: the gradient was [-0.574448823928833, 0.5744620561599731]
    x = torch.tensor([[2000.0, 2000.3]])
    target = torch.tensor([0])
    loss, grad = _one_rank_xent(x, target, "sum")
    loss64, grad64 = _torch_xent(x.double(), target, "sum")
    ulp = 6e-8  # of 0.57 in float32; the old error was 5e-6
    assert abs(grad.sum().item()) <= 2 * ulp, grad
    torch.testing.assert_close(grad.double(), grad64, rtol=0, atol=2 * ulp)
    torch.testing.assert_close(loss.double(), loss64, rtol=0, atol=2 * ulp)
    assert grad[0, 1].item() == pytest.approx(0.5744544267654419, abs=2 * ulp)


def _blockwise_stats(x: torch.Tensor, target: torch.Tensor, vstart: int, w: torch.Tensor | None) -> torch.Tensor:
    n, c = x.shape
    out = torch.empty(n, 4, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    wp = 0 if w is None else w.data_ptr()
    _shardlayers.xent_stats_blockwise_cpu(
        x.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), vstart, wp, True, out.data_ptr()
    )
    return out


def _elementwise_grad(x: torch.Tensor, target: torch.Tensor, vstart: int, coef: torch.Tensor) -> torch.Tensor:
    n, c = x.shape
    g = torch.empty(n, c, dtype=x.dtype)
    _shardlayers.xent_grad_elementwise_cpu(
        x.data_ptr(), g.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), vstart, 0, coef.data_ptr()
    )
    return g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cuda_algorithm_matches_cpu_kernel_on_masked_and_ignored_rows(dtype: torch.dtype) -> None:
    """The CUDA kernels' shared per-thread / per-element code, run on the host, against the CPU kernel:
    rows with masked (-inf) classes, a row whose classes are all masked (a padded vocabulary slice),
    and ignored rows with logits large enough that 0 * exp(x) overflows to NaN."""
    g = torch.Generator().manual_seed(0)
    n, c, vstart = 9, 700, 50  # > XENT_CUDA_THREADS columns: every thread folds several, some none
    x = (torch.randn(n, c, generator=g) * 4).to(dtype)
    x[0, :] = float("-inf")  # all local classes masked
    x[1, 3::2] = float("-inf")  # half masked
    x[2, : c - 1] = float("-inf")  # one live class, in the last thread's share
    x[3, :] = 1000.0  # ignored row: exp(1000) overflows (float64 on the host, every type on the GPU)
    x[4, 10] = 900.0
    target = torch.randint(vstart, vstart + c, (n,), generator=g)
    target[3] = target[4] = -100
    for w in (None, torch.rand(c, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)):
        ref = native_stats(x, target, vstart, w, True)
        got = _blockwise_stats(x, target, vstart, w)
        assert not torch.isnan(got[:, :3]).any()
        torch.testing.assert_close(got[:, 0], ref[:, 0], rtol=0, atol=0)  # the max is exact
        assert got[0, 0] == float("-inf") and got[0, 1] == 0  # masked row: (-inf, 0), not (-inf, NaN)
        torch.testing.assert_close(got[:, 1:3], ref[:, 1:3], rtol=1e-5, atol=1e-6)
        live = torch.isfinite(ref[:, 3])
        torch.testing.assert_close(got[live, 3], ref[live, 3], rtol=1e-4, atol=1e-3)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    coef = torch.zeros(n, 4, dtype=acc)
    coef[:, 0] = ref[:, 0] + torch.log(ref[:, 1])
    coef[:, 1] = 0.25
    coef[:, 2] = 0.25
    coef[0, 0] = float("-inf")
    coef[0, 1:] = 0  # a row with no real class contributes nothing
    coef[3] = 0  # ignored rows: coefficients 0, lse a placeholder
    coef[4] = 0
    ref_g = native_grad(x, target, vstart, None, coef)
    got_g = _elementwise_grad(x, target, vstart, coef)
    assert not torch.isnan(got_g).any()
    assert torch.all(got_g[[0, 3, 4]] == 0) and torch.all(ref_g[[0, 3, 4]] == 0)
    live = [1, 2, 5, 6, 7, 8]
    torch.testing.assert_close(
        got_g[live].to(acc), ref_g[live].to(acc), rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6
    )


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
    with pytest.raises(ValueError, match="null out"):
        _shardlayers.xent_stats_cpu(x.data_ptr(), 2, 3, 3, code_of(x.dtype), t.data_ptr(), 0, 0, False, 0)
    # The CUDA entry points validate their arguments before touching any pointer, so the host
    # pointers below are never dereferenced, on machines with or without a GPU.
    if _shardlayers.cuda_compiled():
        with pytest.raises(ValueError, match="columns"):
            _shardlayers.xent_stats_cuda(x.data_ptr(), 2, 3, 2, 2, t.data_ptr(), 0, 0, False, out.data_ptr(), 0)
        with pytest.raises(ValueError, match="null"):
            _shardlayers.xent_grad_cuda(x.data_ptr(), 0, 2, 3, 3, 2, t.data_ptr(), 0, 0, 0, 0)
    if not torch.cuda.is_available():  # valid arguments: only where no GPU could run the kernel
        with pytest.raises(RuntimeError, match="CUDA"):
            _shardlayers.xent_stats_cuda(x.data_ptr(), 2, 3, 3, 2, t.data_ptr(), 0, 0, False, out.data_ptr(), 0)


def test_target_device_must_match_logits() -> None:
    logits = ts.nn.RegisterParallelDim(-1)(torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        ts.nn.functional.parallel_cross_entropy(logits, torch.zeros(3, dtype=torch.int64, device="meta"))


def test_slice() -> None:
    x = torch.arange(30.0).reshape(3, 10)
    a, b = ts.slice(x, 2, dim=-1)
    assert a.shape == b.shape == (3, 5)
    assert torch.equal(torch.cat([a, b], -1), x)
    parts = ts.slice(x, 3, dim=1, contiguous=True, uneven=True)
    assert [p.shape[1] for p in parts] == [4, 4, 2] and all(p.is_contiguous() for p in parts)  # as torch.chunk
    assert ts.slice(x, 2, dim=None) == (x, x)
    with pytest.raises(ValueError, match="not divisible"):
        ts.slice(x, 3, dim=-1)
    with pytest.raises(IndexError, match="out of range"):
        ts.slice(x, 2, dim=2)
    with pytest.raises(ValueError, match=">= 1"):
        ts.slice(x, 0)
    with pytest.raises(TypeError, match="tensor"):
        ts.slice([1, 2], 2)  # type: ignore[arg-type]


def _torchshard_slice(tensor: torch.Tensor, num_partitions: int, dim: int, contiguous: bool) -> tuple:
    """TorchShard's rule (torchshard/_tensor.py): assert the size divides, then
    ``torch.split(tensor, size // num_partitions, dim)``, optionally made contiguous."""
    n = tensor.shape[dim]
    assert n % num_partitions == 0
    chunks = torch.split(tensor, n // num_partitions, dim=dim)
    return tuple(c.contiguous() for c in chunks) if contiguous else chunks


@pytest.mark.parametrize("shape", [(3, 10), (4, 6, 8), (12,), (2, 1, 6, 4)])
def test_slice_matches_torchshard_on_every_even_split(shape: tuple[int, ...]) -> None:
    """Every dim (positive and negative), every dividing partition count, contiguous or not: the
    same chunks as TorchShard's slice, as views of the input when not made contiguous."""
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    x = x.transpose(0, -1) if x.dim() > 1 else x  # a non-contiguous input too
    checked = 0
    for dim in range(-x.dim(), x.dim()):
        n = x.shape[dim]
        for parts in range(1, n + 1):
            if n % parts:
                with pytest.raises(ValueError, match="not divisible"):  # TorchShard: AssertionError
                    ts.slice(x, parts, dim=dim)
                continue
            for contiguous in (False, True):
                ours = ts.slice(x, parts, dim=dim, contiguous=contiguous)
                theirs = _torchshard_slice(x, parts, dim, contiguous)
                assert isinstance(ours, tuple) and len(ours) == len(theirs) == parts
                for a, b in zip(ours, theirs):
                    assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
                    assert a.is_contiguous() or not contiguous
                    if not contiguous:  # views, as torch.split's
                        assert (
                            a.data_ptr() == b.data_ptr()
                            and a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
                        )
                # uneven=True changes nothing when the size divides
                again = ts.slice(x, parts, dim=dim, contiguous=contiguous, uneven=True)
                assert all(torch.equal(a, b) and a.shape == b.shape for a, b in zip(again, ours))
                checked += 1
    assert checked > 0


def test_slice_uneven_is_torch_chunk() -> None:
    """uneven=True (an extension: TorchShard cannot split sizes that do not divide) cuts as
    torch.chunk / DTensor Shard: ceil(n/p) per chunk, the last ones smaller or empty."""
    for n in range(1, 12):
        x = torch.arange(float(n))
        for parts in range(1, 6):
            got = [c.numel() for c in ts.slice(x, parts, dim=0, uneven=True)]
            chunk = -(-n // parts)
            expect = [max(0, min(chunk, n - i * chunk)) for i in range(parts)]
            assert got == expect, (n, parts, got)
            assert torch.equal(torch.cat(ts.slice(x, parts, dim=0, uneven=True)), x)
            # torch.chunk gives the same non-empty chunks (it drops empty ones)
            assert [c.numel() for c in torch.chunk(x, parts)] == [s for s in expect if s]
    assert [c.numel() for c in ts.slice(torch.empty(10), 4, dim=0, uneven=True)] == [3, 3, 3, 1]
    assert [c.numel() for c in ts.slice(torch.empty(5), 4, dim=0, uneven=True)] == [2, 2, 1, 0]


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
