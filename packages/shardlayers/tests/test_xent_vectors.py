"""The cross-entropy kernels' per-vector logic (xent.hpp), run on the host, against float64 and torch.

The CUDA kernels cut each row into 16-byte vectors from its real address (a shorter head when the
row starts misaligned, a shorter tail), fold every vector into the running max and exp sums with one
rescale per vector, merge 256 threads' partials warp by warp, and write the gradient vector by
vector. ``xent_stats_blockwise_cpu`` / ``xent_grad_elementwise_cpu`` run exactly that code on the
host; the CPU kernel runs the same functions with one thread and 8-element vectors. Both are checked
here against float64 closed forms and ``F.cross_entropy`` for every dtype, misaligned starts, row
lengths that are not multiples of 8, ignored rows, class weights, label smoothing and vocabulary
shards.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from distkit_common.dtypes import code_of
from shardlayers import _shardlayers
from shardlayers._xent import VocabParallelCrossEntropy, acc_dtype, merge_stats, native_grad, native_stats

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# stats are float32 sums of exact exps (float64 for float64 logits): relative tolerance of the sum
SUM_RTOL = {torch.float64: 1e-13}


def _stats(algo: str, x: torch.Tensor, target: torch.Tensor, vstart: int, w: torch.Tensor | None) -> torch.Tensor:
    n, c = x.shape
    out = torch.full((n, 4), float("nan"), dtype=acc_dtype(x.dtype))
    fn = _shardlayers.xent_stats_blockwise_cpu if algo == "cuda" else _shardlayers.xent_stats_cpu
    wp = 0 if w is None else w.data_ptr()
    fn(x.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), vstart, wp, True, out.data_ptr())
    return out


def _grad(
    algo: str,
    x: torch.Tensor,
    target: torch.Tensor,
    vstart: int,
    w: torch.Tensor | None,
    coef: torch.Tensor,
    g: torch.Tensor,
) -> None:
    n, c = x.shape
    assert g.shape == (n, c) and g.is_contiguous()
    fn = _shardlayers.xent_grad_elementwise_cpu if algo == "cuda" else _shardlayers.xent_grad_cpu
    wp = 0 if w is None else w.data_ptr()
    fn(x.data_ptr(), g.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), vstart, wp, coef.data_ptr())


def _offset_view(
    rows: int, cols: int, stride: int, offset: int, dtype: torch.dtype, gen: torch.Generator
) -> torch.Tensor:
    """A [rows, cols] view starting `offset` elements into a buffer, rows `stride` elements apart
    (an odd stride gives every row its own alignment)."""
    buf = (torch.randn(rows * stride + offset + cols, generator=gen) * 4).to(dtype)
    return buf.as_strided((rows, cols), (stride, 1), offset)


def _ref_stats(x: torch.Tensor, target: torch.Tensor, vstart: int, w: torch.Tensor | None) -> torch.Tensor:
    xf = x.double()
    c = x.shape[1]
    m = xf.max(1).values
    live = torch.isfinite(m)
    s = torch.where(live, torch.exp(xf - torch.where(live, m, 0)[:, None]).sum(1), 0)
    lt = target - vstart
    inside = (lt >= 0) & (lt < c)
    xt = torch.where(inside, xf.gather(1, lt.clamp(0, c - 1)[:, None])[:, 0], 0)
    sw = (xf * (w.double() if w is not None else 1)).sum(1)
    return torch.stack([torch.where(live, m, float("-inf")), s, xt, sw], 1)


@pytest.mark.parametrize("algo", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_stats_every_alignment_and_length(algo: str, dtype: torch.dtype) -> None:
    """Row lengths 1..17 and 2053 (never a multiple of the vector for most), starts misaligned by
    every element offset within 16 bytes, an odd row stride: max exact, target logit exact, sums
    within float32 rounding of the float64 ones."""
    gen = torch.Generator().manual_seed(5)
    per16 = 16 // torch.tensor([], dtype=dtype).element_size()
    for c in [1, 2, 3, 7, 8, 9, 15, 16, 17, 2053]:
        for offset in range(per16):
            n = 5
            x = _offset_view(n, c, c + 3, offset, dtype, gen)
            x[1, : c // 2] = float("-inf")  # masked head: the live vectors come later
            x[2] = torch.arange(c, dtype=torch.float64).to(dtype) / 4  # ascending: a rescale at every vector
            target = torch.randint(0, c, (n,), generator=gen) + 10
            target[3] = -100
            acc = acc_dtype(dtype)
            w = torch.rand(c, generator=gen, dtype=acc) + 0.5
            got = _stats(algo, x, target, 10, w).double()
            ref = _ref_stats(x, target, 10, w)
            where = f"{algo} {dtype} c={c} offset={offset}"
            assert torch.equal(got[:, 0], ref[:, 0]), where
            assert torch.equal(got[:, 2], ref[:, 2]), where
            rtol = SUM_RTOL.get(dtype, 2e-6)
            torch.testing.assert_close(got[:, 1], ref[:, 1], rtol=rtol, atol=0, msg=where)
            live = torch.isfinite(ref[:, 3])  # a masked class makes sum w x -inf, as in the float64 sum
            assert torch.equal(got[~live, 3], ref[~live, 3]), where
            scale = (x.double().abs() * w.double()).sum(1)[live]  # the sum's condition: |w x| summed
            assert torch.all((got[live, 3] - ref[live, 3]).abs() <= rtol * scale), where


@pytest.mark.parametrize("algo", ["cpu", "cuda"])
def test_stats_masked_and_nan_rows(algo: str) -> None:
    """A fully masked row is (-inf, 0), never NaN; a NaN logit makes the row's sum NaN (as torch's
    loss is NaN); a row with a single live class at the end sums to exactly 1."""
    x = torch.zeros(5, 37)
    x[0] = float("-inf")
    x[1] = float("-inf")
    x[1, 36] = 3.0
    x[2, 20] = float("nan")
    x[3, :9] = float("-inf")
    x[3, 4] = float("nan")  # NaN inside an otherwise masked vector
    x[4, 4] = float("nan")  # the same, and no live vector merges into that thread's partial after it
    x[4, 5:] = float("-inf")
    target = torch.zeros(5, dtype=torch.int64)
    got = _stats(algo, x, target, 0, None)
    assert got[0, 0] == float("-inf") and got[0, 1] == 0
    assert got[1, 0] == 3.0 and got[1, 1] == 1.0
    assert torch.isnan(got[2, 1]) and torch.isnan(got[3, 1]) and torch.isnan(got[4, 1])


@pytest.mark.parametrize("algo", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_grad_every_alignment_and_length(algo: str, dtype: torch.dtype) -> None:
    """The gradient a * exp(x - m) - cw * w - [j == t] ct, element by element against float64
    rounded once to the logits' dtype, with the logits and the gradient each misaligned (so the
    gradient rows are sometimes not at the logits' alignment) and a zero (ignored) row that
    overflows exp."""
    gen = torch.Generator().manual_seed(6)
    per16 = 16 // torch.tensor([], dtype=dtype).element_size()
    acc = acc_dtype(dtype)
    for c in [1, 7, 9, 17, 301]:
        for offset in range(per16):
            for g_offset in (0, 1):
                n = 4
                x = _offset_view(n, c, c + 1, offset, dtype, gen)
                x[3] = 60000.0 if dtype == torch.float16 else 1000.0
                target = torch.randint(0, c, (n,), generator=gen)
                w = torch.rand(c, generator=gen, dtype=acc) + 0.5
                st = _ref_stats(x, target, 0, w)
                coef = torch.rand(n, 4, generator=gen, dtype=acc)
                coef[:, 0] = st[:, 0].to(acc)
                coef[3] = 0
                gbuf = torch.full((n * c + g_offset,), float("nan"), dtype=dtype)
                g = gbuf[g_offset:].view(n, c)
                _grad(algo, x, target, 0, w, coef, g)
                cf = coef.double()
                ref = cf[:, 1:2] * torch.exp(x.double() - cf[:, 0:1]) - cf[:, 3:4] * w.double()
                ref[torch.arange(n), target] -= cf[:, 2]
                ref[3] = 0
                where = f"{algo} {dtype} c={c} offset={offset} g_offset={g_offset}"
                assert torch.equal(g[3], torch.zeros(c, dtype=dtype)), where
                if dtype in (torch.float32, torch.float64):
                    # a few ulps of the terms: x - m rounds to eps |x - m| (the exponent's error, as
                    # in torch), exp within ~1 ulp, one multiply and two subtractions
                    eps = torch.finfo(dtype).eps
                    d = (x.double() - cf[:, 0:1]).abs()
                    soft = cf[:, 1:2] * torch.exp(x.double() - cf[:, 0:1])
                    bound = eps * ((d + 4) * soft + 4 * cf[:, 2:4].sum(1, True) * w.double().max())
                    assert torch.all((g[:3].double() - ref[:3]).abs() <= bound[:3]), where  # row 3: zero
                else:
                    # float32 arithmetic, one rounding to 16 bits: within one ulp of the rounded value
                    ulp = torch.finfo(dtype).eps * ref[:3].abs() + torch.finfo(dtype).tiny
                    assert torch.all((g[:3].double() - ref[:3]).abs() <= ulp), where


def _ulp_bound(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """How far a 16-bit gradient may be from the float64 one: one ulp of the value (a float32 result
    rounded once), plus float32 rounding of the row's terms (4e-6 of the row's largest entry) where
    the terms a * exp(x - m) - cw * w cancel."""
    return torch.finfo(dtype).eps * ref.abs() + 4e-6 * ref.abs().amax(1, keepdim=True) + torch.finfo(dtype).tiny


def _xent(
    x: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    reduction: str,
    eps: float,
    num_classes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_(True)
    loss = VocabParallelCrossEntropy.apply(leaf, target, weight, -100, reduction, eps, None, num_classes)
    (loss.sum() if reduction == "none" else loss).backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


def _torch(
    x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: str, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_(True)
    loss = F.cross_entropy(leaf, target, weight, ignore_index=-100, reduction=reduction, label_smoothing=eps)
    (loss.sum() if reduction == "none" else loss).backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


@pytest.fixture(params=["cpu kernel", "cuda algorithm"])
def algorithm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "cuda algorithm":
        monkeypatch.setattr(_shardlayers, "xent_stats_cpu", _shardlayers.xent_stats_blockwise_cpu)
        monkeypatch.setattr(_shardlayers, "xent_grad_cpu", _shardlayers.xent_grad_elementwise_cpu)
    return str(request.param)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_weight", [False, True])
def test_matches_f_cross_entropy(algorithm: str, dtype: torch.dtype, eps: float, with_weight: bool) -> None:
    """Loss and gradient against F.cross_entropy in float64 on the same (rounded) logits, with
    ignored rows, 1003 classes (not a multiple of 8) and the mean reduction.

    Tolerances: the loss (float32, from float32 sums) within 2e-6 relative of float64; the gradient
    within one ulp of float64's value in its dtype plus float32 rounding of the row's terms
    (_ulp_bound). (An absolute 2e-7 held for the mean reduction, whose entries are <= 1/N, but not for
    reduction="none", whose entries reach 1: there the kernel was 3 float32 ulps off, at 6 % of this
    bound, and torch's own float32 result, once the yardstick, is closer or not depending on its CPU
    kernels.)"""
    gen = torch.Generator().manual_seed(7)
    n, c = 29, 1003
    x = (torch.randn(n, c, generator=gen) * 3).to(dtype)
    target = torch.randint(0, c, (n,), generator=gen)
    target[::5] = -100
    weight = torch.rand(c, generator=gen) + 0.5 if with_weight else None
    w64 = weight.double() if weight is not None else None
    for reduction in ("mean", "none"):
        loss, grad = _xent(x, target, weight, reduction, eps)
        loss64, grad64 = _torch(x.double(), target, w64, reduction, eps)
        assert loss.dtype == torch.float32 and grad.dtype == dtype
        torch.testing.assert_close(loss.double(), loss64, rtol=2e-6, atol=1e-7)
        err = (grad.double() - grad64).abs()
        assert torch.all(err <= _ulp_bound(grad64, dtype)), (err.max(), algorithm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_shards_merge_to_the_whole_row(algorithm: str, dtype: torch.dtype) -> None:
    """Three vocabulary shards of 1000 classes at 0, 333 and 667 (their rows start misaligned in
    the full logits): the merged statistics equal the whole rows', and each shard's gradient from the
    merged coefficients is the whole gradient's slice."""
    gen = torch.Generator().manual_seed(8)
    n, c = 11, 1000
    x = (torch.randn(n, c, generator=gen) * 3).to(dtype)
    x[0, 333:] = float("-inf")  # shards 1 and 2 fully masked for row 0
    target = torch.randint(0, c, (n,), generator=gen)
    bounds = [0, 333, 667, c]
    shards = [x[:, a:b] for a, b in itertools.pairwise(bounds)]
    allst = torch.stack([native_stats(s, target, a, None, True) for s, a in zip(shards, bounds)])
    whole = native_stats(x, target, 0, None, True)
    merged = merge_stats(allst)
    assert torch.equal(merged[:, 0], whole[:, 0]) and torch.equal(merged[:, 2], whole[:, 2])
    torch.testing.assert_close(merged[:, 1], whole[:, 1], rtol=2e-6, atol=0)
    torch.testing.assert_close(merged[:, 3], whole[:, 3], rtol=1e-5, atol=1e-4)
    coef = torch.stack([merged[:, 0], 1 / merged[:, 1], torch.full((n,), 0.5), torch.zeros(n)], 1)
    full = native_grad(x, target, 0, None, coef)
    for s, a in zip(shards, bounds):
        assert torch.equal(native_grad(s, target, a, None, coef), full[:, a : a + s.shape[1]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_vocabulary_matches_f_cross_entropy(algorithm: str, dtype: torch.dtype) -> None:
    """A padded local vocabulary (num_classes below the columns): the padding columns get no
    gradient, the real ones F.cross_entropy's."""
    gen = torch.Generator().manual_seed(9)
    n, real, cols = 13, 45, 48
    x = (torch.randn(n, cols, generator=gen) * 2).to(dtype)
    target = torch.randint(0, real, (n,), generator=gen)
    target[4] = -100
    loss, grad = _xent(x, target, None, "mean", 0.0, num_classes=real)
    loss64, grad64 = _torch(x[:, :real].double(), target, None, "mean", 0.0)
    torch.testing.assert_close(loss.double(), loss64, rtol=2e-6, atol=1e-7)
    assert torch.all(grad[:, real:] == 0)
    err = (grad[:, :real].double() - grad64).abs()
    if dtype == torch.float32:
        _, grad32 = _torch(x[:, :real], target, None, "mean", 0.0)
        assert err.max() <= max(2e-8, 2 * (grad32.double() - grad64).abs().max()), err.max()
    else:
        assert torch.all(err <= _ulp_bound(grad64, dtype)), err.max()


def test_misaligned_pointers_are_refused() -> None:
    x = torch.zeros(2, 3)
    t = torch.zeros(2, dtype=torch.int64)
    out = torch.empty(2, 4)
    coef = torch.zeros(2, 4)
    g = torch.empty(2, 3)
    for fn in (_shardlayers.xent_stats_cpu, _shardlayers.xent_stats_blockwise_cpu):
        with pytest.raises(ValueError, match="logits pointer .* not aligned"):
            fn(x.data_ptr() + 2, 2, 3, 3, code_of(x.dtype), t.data_ptr(), 0, 0, False, out.data_ptr())
    for fn in (_shardlayers.xent_grad_cpu, _shardlayers.xent_grad_elementwise_cpu):
        with pytest.raises(ValueError, match="grad pointer .* not aligned"):
            fn(x.data_ptr(), g.data_ptr() + 1, 2, 3, 3, code_of(x.dtype), t.data_ptr(), 0, 0, coef.data_ptr())
