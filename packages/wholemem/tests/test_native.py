"""The native module builds, loads and agrees with the package metadata."""

from __future__ import annotations

import pytest

import distkit_common
import wholemem
from wholemem import _wholemem


def test_native_version_matches_package() -> None:
    assert _wholemem.version() == wholemem.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert _wholemem.get_num_threads() >= 1


def test_segment_is_owner_only_and_unlinkable() -> None:
    import os
    import stat

    import torch

    seg = _wholemem.Segment.create(4096)
    path = "/dev/shm" + seg.name
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    peer = _wholemem.Segment.open(seg.name, 4096)
    a = torch.frombuffer(seg, dtype=torch.uint8)
    b = torch.frombuffer(peer, dtype=torch.uint8)
    a[7] = 42
    assert int(b[7]) == 42  # the same memory through two mappings
    seg.unlink()
    assert not os.path.exists(path) and not seg.linked
    del seg, peer
    b[8] = 1  # the tensor keeps its mapping alive


def test_chunk_table_ops() -> None:
    import pytest
    import torch

    # 3 chunks of 4 rows (the last one short), rows of 5 with padded row stride 6
    chunks = [torch.zeros(4 * 6, dtype=torch.float64) for _ in range(3)]
    table = _wholemem.Table([int(c.data_ptr()) for c in chunks], 4, 10, 5, 6, 1, 3)
    idx = torch.tensor([9, 0, 4], dtype=torch.int32)
    vals = torch.arange(15.0, dtype=torch.float64).reshape(3, 5)
    table.scatter(int(idx.data_ptr()), False, 3, int(vals.data_ptr()))
    assert torch.equal(chunks[2][6:11], vals[0]) and torch.equal(chunks[1][0:5], vals[2])
    table.scatter_add(int(idx.data_ptr()), False, 3, int(vals.data_ptr()), 2.0)
    out = torch.empty(3, 5, dtype=torch.float64)
    table.gather(int(idx.data_ptr()), False, 3, int(out.data_ptr()))
    assert torch.equal(out, 3 * vals)
    bad = torch.tensor([1, 10])
    with pytest.raises(IndexError, match="index 10 at position 1"):
        table.gather(int(bad.data_ptr()), True, 2, int(out.data_ptr()))
    with pytest.raises(ValueError, match="cannot hold"):
        _wholemem.Table([int(chunks[0].data_ptr())], 4, 10, 5, 6, 1, 3)


def test_table_windows() -> None:
    """Sub-tensors run on their base table through a window (rows [row0, row0 + nrows),
    columns [col0, col0 + ncols)); indices are relative to the window and checked against it."""
    import torch

    base = torch.arange(60, dtype=torch.int64).reshape(12, 5)
    chunks = [base[0:5].contiguous(), base[5:10].contiguous(), base[10:12].contiguous()]
    table = _wholemem.Table([int(c.data_ptr()) for c in chunks], 5, 12, 5, 5, 1, 6)
    idx = torch.tensor([0, 3, 5], dtype=torch.int32)  # window rows 4..9 cross a chunk boundary
    out = torch.empty(3, 2, dtype=torch.int64)
    table.gather(int(idx.data_ptr()), False, 3, int(out.data_ptr()), row0=4, nrows=6, col0=2, ncols=2)
    assert torch.equal(out, base[[4, 7, 9], 2:4])
    vals = -torch.arange(6, dtype=torch.int64).reshape(3, 2)
    table.scatter(int(idx.data_ptr()), False, 3, int(vals.data_ptr()), row0=4, nrows=6, col0=2, ncols=2)
    table.scatter_add(int(idx.data_ptr()), False, 3, int(vals.data_ptr()), 1.0, row0=4, nrows=6, col0=2, ncols=2)
    whole = torch.cat(chunks)
    assert torch.equal(whole[[4, 7, 9], 2:4], 2 * vals)
    assert torch.equal(whole[:, :2], base[:, :2]) and torch.equal(whole[:4], base[:4])
    bad = torch.tensor([0, 6])
    with pytest.raises(IndexError, match="index 6 at position 1 is out of range for 6 rows"):
        table.gather(int(bad.data_ptr()), True, 2, int(out.data_ptr()), row0=4, nrows=6, col0=2, ncols=2)
    with pytest.raises(ValueError, match=r"row window \[10, 13\) is outside the table's 12 rows"):
        table.gather(int(idx.data_ptr()), False, 3, int(out.data_ptr()), row0=10, nrows=3)
    with pytest.raises(ValueError, match=r"column window \[4, 6\)"):
        table.gather(int(idx.data_ptr()), False, 3, int(out.data_ptr()), col0=4, ncols=2)


def test_dlpack_bytes_alias_and_keep_their_owner() -> None:
    import gc
    import weakref

    import torch

    class Owner:
        pass

    buf = torch.arange(16, dtype=torch.uint8)
    owner = Owner()
    owner.buf = buf  # type: ignore[attr-defined]
    alive = weakref.ref(owner)
    cap = _wholemem.bytes_as_dlpack(int(buf.data_ptr()) + 4, 8, _wholemem.DLPACK_CPU, 0, owner)
    t = torch.from_dlpack(cap)
    del owner, cap
    gc.collect()
    assert alive() is not None  # the tensor keeps the owner
    assert t.dtype == torch.uint8 and t.shape == (8,) and t.data_ptr() == buf.data_ptr() + 4
    t[0] = 200  # aliases the memory
    assert int(buf[4]) == 200
    del t
    gc.collect()
    assert alive() is None  # released with the tensor
    unused = _wholemem.bytes_as_dlpack(int(buf.data_ptr()), 8, _wholemem.DLPACK_CPU, 0, buf)
    del unused  # a capsule never consumed frees itself
    with pytest.raises(ValueError, match="device type"):
        _wholemem.bytes_as_dlpack(int(buf.data_ptr()), 8, 7, 0, buf)


def test_atomic_add_on_shared_memory() -> None:
    seg = _wholemem.Segment.create(64)
    peer = _wholemem.Segment.open(seg.name, 64)
    seg.unlink()
    assert _wholemem.atomic_add_i64(int(seg.address) + 8, 3) == 3
    assert _wholemem.atomic_add_i64(int(peer.address) + 8, -1) == 2  # the same counter through another mapping
    with pytest.raises(ValueError, match="aligned"):
        _wholemem.atomic_add_i64(int(seg.address) + 4, 1)


def test_optimizer_kernel_closed_form() -> None:
    import torch

    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    g = torch.tensor([[0.5, -1.0]])
    s0 = torch.zeros(2, 2)
    table = _wholemem.Table([int(w.data_ptr())], 2, 2, 2, 2, 1, 2)
    idx = torch.tensor([1])
    # Adagrad: s = g^2, w -= lr * g / (|g| + eps)
    _wholemem.optim_update(
        _wholemem.OPTIM_ADAGRAD,
        table,
        int(idx.data_ptr()),
        1,
        int(g.data_ptr()),
        int(s0.data_ptr()),
        0,
        0,
        lr=0.1,
        weight_decay=0.0,
        eps=0.0,
        beta1=0.0,
        beta2=0.0,
        alpha=0.0,
    )
    assert torch.allclose(w, torch.tensor([[1.0, 2.0], [2.9, 4.1]]))
    assert torch.equal(s0, torch.tensor([[0.0, 0.0], [0.25, 1.0]]))


def test_lazy_adam_kernel_per_row_bias_correction() -> None:
    """WholeGraph's LazyAdam: beta1^t / beta2^t count each row's own updates, eps is added to sqrt(v_hat).

    With a constant gradient g and eps = 0, m_hat = g and v_hat = g^2 after any number of
    updates of a row, so every update moves it by exactly lr * sign(g); a global step count
    (torch SparseAdam) would move a row first touched at step 2 by lr / (1 + beta1) instead.
    """
    import torch

    b1, b2, lr = 0.9, 0.999, 0.1
    w = torch.zeros(3, 2, dtype=torch.float64)
    m, v = torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.float64)
    rs = torch.ones(3, 2, dtype=torch.float64)
    table = _wholemem.Table([int(w.data_ptr())], 3, 3, 2, 2, 1, 3)

    def step(rows: list[int], eps: float = 0.0) -> None:
        idx = torch.tensor(rows)
        g = torch.tensor([[0.5, -2.0]] * len(rows), dtype=torch.float64)
        _wholemem.optim_update(
            _wholemem.OPTIM_LAZY_ADAM, table, int(idx.data_ptr()), len(rows), int(g.data_ptr()), int(m.data_ptr()), int(v.data_ptr()),
            int(rs.data_ptr()), lr=lr, weight_decay=0.0, eps=eps, beta1=b1, beta2=b2, alpha=0.0,
        )  # fmt: skip

    step([0])
    step([0, 1])
    assert torch.allclose(w, torch.tensor([[-0.2, 0.2], [-0.1, 0.1], [0.0, 0.0]], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(rs, torch.tensor([[b1**2, b2**2], [b1, b2], [1.0, 1.0]], dtype=torch.float64))
    assert torch.allclose(m[1], torch.tensor([0.5, -2.0], dtype=torch.float64) * (1 - b1))
    # eps is added to sqrt(v_hat) (v_hat = 0.25 for column 0 at t = 1): row 2 moves by lr * 0.5 / (0.5 + 0.5)
    step([2], eps=0.5)
    assert abs(w[2, 0].item() - (-lr * 0.5 / (0.5 + 0.5))) < 1e-8  # lr is passed as float32
    with pytest.raises(ValueError, match="per-row state"):
        _wholemem.optim_update(
            _wholemem.OPTIM_LAZY_ADAM, table, 0, 0, 0, int(m.data_ptr()), int(v.data_ptr()), 0, 0.1, 0, 0, b1, b2, 0
        )


def test_cuda_paths_raise_clearly_without_a_gpu() -> None:
    import pytest

    if _wholemem.cuda_device_count() > 0:
        pytest.skip("a GPU is visible")
    if not _wholemem.cuda_compiled():
        with pytest.raises(RuntimeError, match="no CUDA support"):
            _wholemem.Table([1], 1, 1, 2, 2, 1, 2, True, 0)
        with pytest.raises(RuntimeError, match="no CUDA support"):
            _wholemem.device_alloc(16, 0)
        return
    # the device chunk table is uploaded at construction: no device, no table
    with pytest.raises(RuntimeError, match="device chunk table needs a CUDA device, and none is visible"):
        _wholemem.Table([1], 1, 1, 2, 2, 1, 2, True, 0)
    with pytest.raises(ValueError, match="device index"):
        _wholemem.Table([1], 1, 1, 2, 2, 1, 2, True)
    for call in (
        lambda: _wholemem.device_alloc(16, 0),
        lambda: _wholemem.device_free(1, 0),
        lambda: _wholemem.ipc_get_handle(1),
        lambda: _wholemem.ipc_open_handle(b"x" * 64, 0),
        lambda: _wholemem.ipc_close_handle(1, 0),
        lambda: _wholemem.device_synchronize(0),
        lambda: _wholemem.check_indices_device(1, True, 1, 1, 0, 0),
        lambda: _wholemem.host_register(4096, 16, 0),
        lambda: _wholemem.host_unregister(4096),
    ):
        with pytest.raises(RuntimeError, match="needs a CUDA device, and none is visible"):
            call()
