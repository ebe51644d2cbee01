"""distkit/adagrad.hpp (the Adagrad update kvps and wholemem share) on the CPU, through `adagrad_rows`.

Every element is compared bit for bit with a reference that spells out the roundings:
``acc += g * g`` rounded once (Fused, the exact value rounded to the nearest float) or twice
(product, then sum), then ``w + (-lr * g) / (sqrt(acc) + eps)`` one operation at a time; for
16-bit weights (wholemem) the weight goes through float32 and is rounded back.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from distkit_common import _distkit_common as native
from distkit_common.dtypes import code_of

LR, EPS = 0.05, 1e-8


def _inputs(n: int, np_acc: type, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, accumulators >= 0 and gradients over many magnitudes (and some zeros)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(np_acc)
    acc = (rng.random(n) * 10.0 ** rng.integers(-12, 4, n)).astype(np_acc)
    g = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 3, n)).astype(np_acc)
    acc[:16] = 0
    g[16:24] = 0
    return w, acc, g


def _nearest_f32(x: Fraction) -> np.float32:
    """``x`` rounded to the nearest float32 (ties to even)."""
    f = np.float32(float(x))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(c.view(np.uint32)) & 1))
    return np.float32(best)


def _acc_ref(acc: np.ndarray, g: np.ndarray, fused: bool) -> np.ndarray:
    if not fused:
        return acc + g * g  # numpy rounds the product, then the sum, in the arrays' dtype
    exact = [Fraction(float(gi)) ** 2 + Fraction(float(ai)) for gi, ai in zip(g, acc)]
    if acc.dtype == np.float64:
        return np.array([float(x) for x in exact])  # Fraction -> float rounds correctly
    return np.array([_nearest_f32(x) for x in exact], dtype=np.float32)


def _run(w: torch.Tensor, acc: np.ndarray, g: np.ndarray, fused: bool) -> None:
    native.adagrad_rows(w.data_ptr(), acc.ctypes.data, g.ctypes.data, w.numel(), code_of(w.dtype), LR, EPS, fused)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adagrad_update_rounds_as_the_reference(dtype: torch.dtype, fused: bool) -> None:
    np_t = np.float32 if dtype == torch.float32 else np.float64
    w, acc, g = _inputs(3000, np_t)
    want_acc = _acc_ref(acc, g, fused)
    want_w = w + (np_t(-LR) * g) / (np.sqrt(want_acc) + np_t(EPS))
    tw = torch.from_numpy(w.copy())
    got_acc = acc.copy()
    _run(tw, got_acc, g, fused)
    assert np.array_equal(got_acc.view(np.uint8), want_acc.astype(np_t).view(np.uint8))
    assert np.array_equal(tw.numpy().view(np.uint8), want_w.astype(np_t).view(np.uint8))


def test_fused_and_unfused_accumulators_differ_somewhere() -> None:
    """The two roundings are not the same function (else the test above could not tell them apart)."""
    _, acc, g = _inputs(3000, np.float32)
    assert not np.array_equal(_acc_ref(acc, g, True), _acc_ref(acc, g, False))


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_adagrad_update_of_16_bit_weights(dtype: torch.dtype, fused: bool) -> None:
    w32, acc, g = _inputs(3000, np.float32, seed=1)
    w16 = torch.from_numpy(w32).to(dtype)
    wf = w16.float().numpy()  # the weight as the update sees it
    want_acc = _acc_ref(acc, g, fused)
    want_w = torch.from_numpy(wf + (np.float32(-LR) * g) / (np.sqrt(want_acc) + np.float32(EPS))).to(dtype)
    got_acc = acc.copy()
    _run(w16, got_acc, g, fused)
    assert np.array_equal(got_acc.view(np.uint32), want_acc.view(np.uint32))
    assert torch.equal(w16.view(torch.int16), want_w.view(torch.int16))


def test_adagrad_rows_refuses_bad_input() -> None:
    w = torch.zeros(4)
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="n must be >= 0"):
        native.adagrad_rows(w.data_ptr(), a.ctypes.data, a.ctypes.data, -1, code_of(torch.float32), LR, EPS, True)
    with pytest.raises(TypeError, match="floating"):
        native.adagrad_rows(w.data_ptr(), a.ctypes.data, a.ctypes.data, 4, code_of(torch.int32), LR, EPS, True)
