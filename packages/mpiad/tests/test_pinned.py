"""The pinned staging pool (mpiad._pinned) with a plain allocator: size classes, reuse, limits, threads."""

from __future__ import annotations

import threading

import pytest
import torch

from mpiad import _pinned
from mpiad._pinned import MIN_CLASS_BYTES, PinnedPool, size_class


def _plain(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8)


def test_size_classes_are_powers_of_two() -> None:
    assert size_class(0) == size_class(1) == size_class(MIN_CLASS_BYTES) == MIN_CLASS_BYTES
    assert size_class(MIN_CLASS_BYTES + 1) == 2 * MIN_CLASS_BYTES
    for n in (5000, 65535, 65536, 65537, (1 << 30) + 1):
        c = size_class(n)
        assert c >= n and c & (c - 1) == 0 and c // 2 < n
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="non-negative int"):
            size_class(bad)  # type: ignore[arg-type]


def test_buffers_are_reused_per_class() -> None:
    pool = PinnedPool(alloc=_plain)
    a = pool.take((3, 5), torch.float32)
    assert a.shape == (3, 5) and a.dtype == torch.float32 and a.is_contiguous()
    pa = a.data_ptr()
    pool.give(a)
    assert pool.cached_bytes() == MIN_CLASS_BYTES
    b = pool.take((1000,), torch.int32)  # 4000 bytes: the same class, the same buffer
    assert b.data_ptr() == pa and (pool.hits, pool.misses) == (1, 1)
    c = pool.take((1000,), torch.int32)  # the class is empty: a new buffer
    assert c.data_ptr() != pa and (pool.hits, pool.misses) == (1, 2)
    d = pool.take((1025,), torch.int32)  # 4100 bytes: the next class
    pool.give(b)
    pool.give(c)
    pool.give(d)
    assert pool.cached_bytes() == 4 * MIN_CLASS_BYTES
    e = pool.take((2048,), torch.float32)  # 8192 bytes: d's buffer
    assert e.data_ptr() == d.data_ptr() and pool.hits == 2
    pool.clear()
    assert pool.cached_bytes() == 0
    pool.take((10,), torch.float64)
    assert pool.misses == 4


def test_values_survive_a_round_trip_and_empty_shapes_work() -> None:
    pool = PinnedPool(alloc=_plain)
    x = pool.take((4, 2), torch.complex64)
    want = torch.arange(8.0).reshape(4, 2).to(torch.complex64) * (1 + 2j)
    x.copy_(want)
    assert torch.equal(x, want)
    pool.give(x)
    z = pool.take((0, 3), torch.float32)
    assert z.shape == (0, 3)
    pool.give(z)


def test_limits_per_class_total_and_largest() -> None:
    pool = PinnedPool(alloc=_plain, per_class=2, max_cached_bytes=3 * MIN_CLASS_BYTES, max_class_bytes=1 << 14)
    bufs = [pool.take((MIN_CLASS_BYTES,), torch.uint8) for _ in range(3)]
    for b in bufs:
        pool.give(b)
    assert pool.cached_bytes() == 2 * MIN_CLASS_BYTES  # 2 per class
    big = pool.take((1 << 13,), torch.uint8)
    pool.give(big)  # 2 + 2 classes would exceed 3
    assert pool.cached_bytes() == 2 * MIN_CLASS_BYTES
    huge = pool.take((1 << 15,), torch.uint8)
    pool.give(huge)  # above max_class_bytes: never cached
    assert pool.cached_bytes() == 2 * MIN_CLASS_BYTES


def test_give_rejects_foreign_tensors_and_bad_shapes() -> None:
    pool = PinnedPool(alloc=_plain)
    with pytest.raises(ValueError, match="not a buffer of the pinned staging pool"):
        pool.give(torch.empty(100))
    with pytest.raises(ValueError, match="not a buffer of the pinned staging pool"):
        pool.give(torch.empty(4096, dtype=torch.uint8))
    once = pool.take((4,), torch.float32)
    pool.give(once)
    with pytest.raises(ValueError, match="not a buffer of the pinned staging pool"):
        pool.give(once)  # given back twice: the second would hand one buffer to two callers
    assert pool.cached_bytes() == MIN_CLASS_BYTES
    with pytest.raises(ValueError, match="negative dimension"):
        pool.take((2, -1), torch.float32)


def test_threads_never_share_a_buffer() -> None:
    pool = PinnedPool(alloc=_plain, per_class=8)
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(200):
            b = pool.take((256,), torch.int64)
            b.fill_(k * 1000 + i)
            if not bool((b == k * 1000 + i).all()):
                errors.append(f"thread {k} saw its buffer changed")
            pool.give(b)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert pool.hits + pool.misses == 1600 and pool.misses <= 8
    assert pool.cached_bytes() == pool.misses * MIN_CLASS_BYTES  # every buffer came back


def test_module_pool_is_cleared() -> None:
    _pinned.pool.give(_pinned.PinnedPool(alloc=_plain).take((8,), torch.uint8))
    assert _pinned.pool.cached_bytes() > 0
    _pinned.clear()
    assert _pinned.pool.cached_bytes() == 0
