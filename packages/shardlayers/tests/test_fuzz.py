"""Generated bad input for shardlayers on one rank: the vocab-parallel cross-entropy (a one-rank gloo
group in this process, so the class-split path with its native kernels runs), ``ts.slice``, the
parallel layers without a process group, and the embedding's index checks.

References are plain torch (``F.cross_entropy``, ``torch.split``/``torch.chunk``, ``nn.Linear``,
``F.embedding``); the other outcome allowed is the documented exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import shardlayers as ts

FUZZ = settings(
    max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-rank gloo world and tensor-parallel group of size 1 in this process."""
    store = dist.FileStore(str(Path(tmp_path_factory.mktemp("store")) / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    ts.distributed.init_process_group(1)
    try:
        yield
    finally:
        ts.distributed.destroy_process_group()
        dist.destroy_process_group()


def _logits(n: int, c: int, dtype: torch.dtype, layout: str, special: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g, dtype=torch.float64) * 4
    if special == "nan" and x.numel():
        x[0, 0] = float("nan")
    elif special == "inf" and x.numel():
        x[0, 0] = float("inf")
    elif special == "-inf" and x.numel():
        x[:, 0] = float("-inf")  # a masked class
    elif special == "large":
        x = x + 1e4
    x = x.to(dtype)
    if layout == "transposed":
        return x.t().contiguous().t()
    if layout == "padded":
        return torch.cat([x, torch.zeros(n, 3, dtype=dtype)], 1)[:, :c]
    if layout == "expand" and n:
        return x[:1].expand(n, c)
    return x


@pytest.mark.usefixtures("one_rank_group")
@FUZZ
@given(
    n=st.integers(0, 6),
    c=st.integers(1, 7),
    dtype=st.sampled_from(FLOATS),
    layout=st.sampled_from(["contiguous", "transposed", "padded", "expand"]),
    special=st.sampled_from(["none", "nan", "inf", "-inf", "large"]),
    targets=st.lists(st.one_of(st.integers(-1, 8), st.sampled_from([-100, 2**31, -(2**40)])), min_size=6, max_size=6),
    target_dtype=st.sampled_from([torch.int64, torch.int32]),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    smoothing=st.sampled_from([0.0, 0.1, 1.0]),
    weighted=st.booleans(),
    seed=st.integers(0, 3),
)
@example(
    n=2, c=3, dtype=torch.float32, layout="contiguous", special="none", targets=[3, 0, 0, 0, 0, 0],
    target_dtype=torch.int64, reduction="mean", smoothing=0.0, weighted=False, seed=0,
)  # fmt: skip
@example(
    n=3, c=4, dtype=torch.float32, layout="contiguous", special="none", targets=[-100] * 6,
    target_dtype=torch.int64, reduction="mean", smoothing=0.0, weighted=True, seed=0,
)  # fmt: skip
# expanded logits (row stride 0): the loss, and the gradient summed into the one stored row
@example(
    n=4, c=5, dtype=torch.float32, layout="expand", special="none", targets=[0, 4, 2, -100, 0, 0],
    target_dtype=torch.int64, reduction="mean", smoothing=0.1, weighted=True, seed=1,
)  # fmt: skip
def test_vocab_parallel_cross_entropy_matches_torch(
    n: int,
    c: int,
    dtype: torch.dtype,
    layout: str,
    special: str,
    targets: list[int],
    target_dtype: torch.dtype,
    reduction: str,
    smoothing: float,
    weighted: bool,
    seed: int,
) -> None:
    x = _logits(n, c, dtype, layout, special, seed)
    raw = targets[:n]
    if target_dtype is torch.int32:
        raw = [v if -(2**31) <= v < 2**31 else -1 for v in raw]
    target = torch.tensor(raw, dtype=target_dtype)
    acc = torch.float64 if dtype is torch.float64 else torch.float32
    weight = torch.linspace(0.5, 2.0, c, dtype=acc) if weighted else None
    if layout == "expand" and n:  # rows that share memory (row stride 0): the gradient sums into one row
        leaf = x[:1].clone().requires_grad_(True)
        tagged = ts.nn.RegisterParallelDim(-1)(leaf.expand(n, c))
    else:
        leaf = x.clone().requires_grad_(True)
        tagged = ts.nn.RegisterParallelDim(-1)(leaf)
    bad = [(i, v) for i, v in enumerate(raw) if v != -100 and not 0 <= v < c]
    if bad:
        with pytest.raises(IndexError, match=str(bad[0][1])):
            ts.nn.functional.parallel_cross_entropy(
                tagged, target, weight, reduction=reduction, label_smoothing=smoothing
            )
        return
    got = ts.nn.functional.parallel_cross_entropy(
        tagged, target, weight, reduction=reduction, label_smoothing=smoothing
    )
    if layout == "expand" and n:
        ref_x = x[:1].detach().to(acc).requires_grad_(True)
        ref_in = ref_x.expand(n, c)
    else:
        ref_x = x.detach().to(acc).requires_grad_(True)
        ref_in = ref_x
    want = F.cross_entropy(ref_in, target.long(), weight, reduction=reduction, label_smoothing=smoothing)
    assert got.shape == want.shape
    finite = torch.isfinite(want.detach())
    if bool(finite.all()):
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
        torch.testing.assert_close(got.detach().to(acc), want.detach(), rtol=tol, atol=tol * 10)
    else:  # NaN / inf where torch gives them (the loss of a masked target is inf, of a NaN logit NaN)
        assert torch.equal(torch.isnan(got.detach()), torch.isnan(want.detach())) or bool(
            torch.isnan(want.detach()).any() and torch.isnan(got.detach()).any()
        )
    if leaf.requires_grad and bool(finite.all()) and got.numel() and special in ("none", "large"):
        got.sum().backward()
        want.sum().backward()
        assert leaf.grad is not None and ref_x.grad is not None
        tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
        torch.testing.assert_close(leaf.grad.to(acc), ref_x.grad, rtol=tol, atol=tol)


@pytest.mark.usefixtures("one_rank_group")
@FUZZ
@given(
    n=st.integers(0, 4),
    c=st.integers(1, 5),
    target_shape=st.sampled_from(["ok", "extra", "short", "2d"]),
    target_kind=st.sampled_from(["int64", "float", "uint8", "list", "meta"]),
    input_kind=st.sampled_from(["float32", "int64", "bool", "list"]),
    reduction=st.sampled_from(["mean", "batchmean", "none", None]),
    smoothing=st.sampled_from([0.0, -0.1, 1.5, float("nan")]),
    weight_kind=st.sampled_from(["none", "ok", "short", "list"]),
)
def test_cross_entropy_bad_arguments(
    n: int,
    c: int,
    target_shape: str,
    target_kind: str,
    input_kind: str,
    reduction: Any,
    smoothing: float,
    weight_kind: str,
) -> None:
    x: Any = torch.zeros(n, c)
    if input_kind == "int64":
        x = torch.zeros(n, c, dtype=torch.int64)
    elif input_kind == "bool":
        x = torch.zeros(n, c, dtype=torch.bool)
    if isinstance(x, torch.Tensor):
        x = ts.nn.RegisterParallelDim(-1)(x)
    if input_kind == "list":
        x = [[0.0] * c] * n
    tshape = {"ok": (n,), "extra": (n + 1,), "short": (max(n - 1, 0),), "2d": (n, 1)}[target_shape]
    t: Any = torch.zeros(tshape, dtype=torch.int64)
    if target_kind == "float":
        t = t.float()
    elif target_kind == "uint8":
        t = t.to(torch.uint8)
    elif target_kind == "list":
        t = t.tolist()
    elif target_kind == "meta":
        t = t.to("meta")
    w: Any = {"none": None, "ok": torch.ones(c), "short": torch.ones(c + 1), "list": [1.0] * c}[weight_kind]
    kwargs: dict[str, Any] = {"label_smoothing": smoothing}
    if reduction is not None:
        kwargs["reduction"] = reduction
    expect: tuple[type[Exception], str] | None = None
    if input_kind != "float32":
        expect = (TypeError, "input must be a floating tensor")
    elif target_kind in ("float", "uint8", "list"):
        expect = (TypeError, "target must be an int64/int32 tensor")
    elif reduction == "batchmean":
        expect = (ValueError, "reduction must be one of")
    elif not 0.0 <= smoothing <= 1.0:
        expect = (ValueError, "label_smoothing must be in")
    elif weight_kind == "list":
        expect = (TypeError, "weight must be a tensor")
    elif target_shape != "ok" and not (target_shape == "short" and n == 0):
        expect = (ValueError, "target shape")
    elif target_kind == "meta":
        expect = (RuntimeError, "Expected all tensors to be on the same device")
    elif weight_kind == "short":
        expect = (ValueError, "weight")
    if expect is None:
        got = ts.nn.functional.parallel_cross_entropy(x, t, w, **kwargs)
        want = F.cross_entropy(torch.zeros(n, c), t, w, reduction=reduction or "mean", label_smoothing=smoothing)
        torch.testing.assert_close(got, want, equal_nan=True)
        return
    with pytest.raises(expect[0], match=expect[1]):
        ts.nn.functional.parallel_cross_entropy(x, t, w, **kwargs)


@FUZZ
@given(
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=3),
    parts=st.one_of(st.integers(-1, 5), st.just(64), st.just(True), st.just(2.0)),
    dim=st.one_of(st.integers(-4, 4), st.none()),
    contiguous=st.booleans(),
    uneven=st.booleans(),
    view=st.sampled_from(["plain", "transpose", "expand"]),
)
@example(shape=[3, 10], parts=3, dim=-1, contiguous=False, uneven=False, view="plain")
@example(shape=[3, 0], parts=2, dim=1, contiguous=True, uneven=False, view="plain")
def test_slice_is_torch_split_or_chunk(
    shape: list[int], parts: Any, dim: int | None, contiguous: bool, uneven: bool, view: str
) -> None:
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    if view == "transpose" and x.dim() >= 2:
        x = x.transpose(0, 1)
    elif view == "expand" and x.dim() >= 1 and x.shape[0]:
        x = x[:1].expand(4, *x.shape[1:])
    call = lambda: ts.slice(x, parts, dim, contiguous, uneven=uneven)  # noqa: E731
    if isinstance(parts, bool) or not isinstance(parts, int):
        with pytest.raises(TypeError, match="num_partitions"):
            call()
        return
    if parts < 1:
        with pytest.raises(ValueError, match=">= 1"):
            call()
        return
    if dim is None:
        assert all(p is x for p in call()) and len(call()) == parts
        return
    if not -x.dim() <= dim < x.dim() or x.dim() == 0:
        with pytest.raises(IndexError, match="out of range"):
            call()
        return
    size = x.shape[dim]
    if size % parts and not uneven:
        with pytest.raises(ValueError, match="not divisible"):
            call()
        return
    got = call()
    assert len(got) == parts
    if size % parts == 0:
        want = torch.split(x, size // parts, dim) if size else tuple(x for _ in range(parts))
    else:
        chunk = -(-size // parts)
        want = tuple(x.narrow(dim, min(i * chunk, size), max(0, min(chunk, size - i * chunk))) for i in range(parts))
    assert len(want) == parts
    for g, w in zip(got, want):
        assert torch.equal(g, w) and g.shape == w.shape
        if contiguous:
            assert g.is_contiguous()


@FUZZ
@given(
    num=st.integers(1, 6),
    dim=st.integers(1, 4),
    idx=st.lists(st.one_of(st.integers(-2, 8), st.sampled_from([2**31, -(2**63)])), max_size=6),
    idx_kind=st.sampled_from(["int64", "int32", "float", "2d", "strided", "meta"]),
    padding_idx=st.one_of(st.none(), st.integers(-7, 7)),
)
@example(num=4, dim=3, idx=[4], idx_kind="int64", padding_idx=None)
@example(num=4, dim=3, idx=[0], idx_kind="int64", padding_idx=4)
@example(num=4, dim=2, idx=[1, 3], idx_kind="meta", padding_idx=None)
def test_plain_embedding_matches_torch(num: int, dim: int, idx: list[int], idx_kind: str, padding_idx: Any) -> None:
    if padding_idx is not None and not -num <= padding_idx < num:
        with pytest.raises(ValueError, match="padding_idx"):
            ts.nn.ParallelEmbedding(num, dim, padding_idx=padding_idx)
        return
    torch.manual_seed(0)
    emb = ts.nn.ParallelEmbedding(num, dim, padding_idx=padding_idx)
    i = torch.tensor(idx, dtype=torch.int64)
    arg: Any = i
    if idx_kind == "int32":
        arg = i.clamp(-(2**31), 2**31 - 1).to(torch.int32)
    elif idx_kind == "float":
        arg = i.float()
    elif idx_kind == "2d":
        arg = i.reshape(1, -1)
    elif idx_kind == "strided":
        arg = torch.stack([i, i], 1)[:, 0]
    elif idx_kind == "meta":
        arg = i.to("meta")
    if idx_kind == "float":
        with pytest.raises(TypeError, match="int64"):
            emb(arg)
        return
    if idx_kind == "meta":  # (F.embedding returns uninitialised CPU memory here)
        with pytest.raises(RuntimeError, match="input is on meta but the embedding weight on cpu"):
            emb(arg)
        return
    wide = torch.as_tensor(arg).long()
    if bool(((wide < 0) | (wide >= num)).any()):
        with pytest.raises(IndexError, match="out of range"):
            emb(arg)
        return
    got = emb(arg)
    want = F.embedding(wide, emb.weight, padding_idx=padding_idx)
    assert torch.equal(got, want)


@FUZZ
@given(
    in_f=st.integers(1, 5),
    out_f=st.integers(1, 5),
    batch=st.lists(st.integers(0, 3), max_size=2),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
    wrong_in=st.booleans(),
    view=st.sampled_from(["plain", "transpose", "expand", "meta"]),
)
def test_plain_linear_matches_nn_linear(
    in_f: int, out_f: int, batch: list[int], dtype: torch.dtype, wrong_in: bool, view: str
) -> None:
    torch.manual_seed(1)
    ref = torch.nn.Linear(in_f, out_f).double()
    torch.manual_seed(1)
    m = ts.nn.ParallelLinear(in_f, out_f).double()
    torch.testing.assert_close(m.weight, ref.weight, rtol=0, atol=0)
    k = in_f + 1 if wrong_in else in_f
    x = torch.arange(math.prod(batch) * k, dtype=torch.float64).reshape(*batch, k).to(dtype)
    if view == "transpose" and x.dim() == 2:
        x = x.t().contiguous().t()  # the same values, column-major
    elif view == "expand" and x.dim() >= 2 and x.shape[0]:
        x = x[:1].expand(3, *x.shape[1:])
    elif view == "meta":
        x = x.to("meta")
    if dtype is not torch.float64 or wrong_in or view == "meta":
        with pytest.raises(RuntimeError):  # torch's own errors (dtype, shape, device)
            m(x).cpu()  # (a meta result has no values: reading them must fail, not give garbage)
        return
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)
