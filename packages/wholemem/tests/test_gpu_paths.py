"""GPU-resident tensors: clear errors without a GPU, and the GPU code paths run over host memory.

``fake_gpu`` (conftest) swaps in a backend whose "device memory" is shared memory, so the
device binding, IPC exchange, chunk tables, GPU NCCL routing, host registration, barrier
synchronisation and lifetime rules run on any machine and their numbers are checked. The
real CUDA paths are tested by ``test_gpu_real.py`` (marked ``gpu``) on a machine with a GPU.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

import wholemem as wg
from wholemem import _wholemem

T = wg.WmTensorType
NO_GPU = not torch.cuda.is_available() or _wholemem.cuda_device_count() == 0


@pytest.mark.skipif(not NO_GPU, reason="a GPU is visible")
def test_gpu_requests_raise_clearly_without_a_gpu(comm: wg.WholeMemoryCommunicator) -> None:
    for ty in (T.HOST, T.CHUNKED, T.NCCL, T.DEVICE):
        for dev in ("cuda", "cuda:0", torch.device("cuda", 1)):
            with pytest.raises(RuntimeError, match=r"needs a CUDA GPU, and none is visible"):
                wg.create_wm_tensor(comm, [8, 2], [], torch.float32, ty, device=dev)
    with pytest.raises(RuntimeError, match="DEVICE on cuda needs a CUDA GPU"):
        wg.create_wm_tensor(comm, [8, 2], [], torch.float32, T.DEVICE)
    with pytest.raises(ValueError, match="DEVICE tensors live on a GPU"):
        wg.create_wm_tensor(comm, [8], [], torch.float32, T.DEVICE, device="cpu")
    with pytest.raises(ValueError, match="CPU or CUDA device"):
        wg.create_wm_tensor(comm, [8], [], torch.float32, T.CHUNKED, device="meta")
    with pytest.raises(TypeError, match="device must be"):
        wg.create_wm_tensor(comm, [8], [], torch.float32, T.CHUNKED, device=2.5)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        wg.Embedding(comm, 4, 2, tensor_type=T.DEVICE)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        wg.Embedding(comm, 4, 2, tensor_type=T.NCCL, device="cuda")
    # views: a clear error, never a silent CPU tensor
    h = wg.create_wm_tensor(comm, [8, 2], [], torch.float32, T.HOST)
    c = wg.create_wm_tensor(comm, [8, 2], [], torch.float32, T.CHUNKED)
    for t in (h, c):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            wg.get_tensor_view(t, "cuda")
    with pytest.raises(TypeError, match="device must be"):
        wg.get_tensor_view(h, 3.5)
    with pytest.raises(ValueError, match="unsupported device"):
        wg.get_tensor_view(h, "meta")
    # the communicator is still fine: nothing was half-created
    comm.barrier()
    assert wg.get_partition_plan(c) == (0, 8, 8, 8)


def _encode(rows: torch.Tensor, ncols: int, dtype: torch.dtype) -> torch.Tensor:
    return ((rows[:, None] * 3 + torch.arange(ncols)[None, :] * 5) % 101).to(dtype)


@pytest.mark.parametrize("ty", [T.CHUNKED, T.NCCL])
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_gpu_tensor_paths_on_host_memory(
    comm: wg.WholeMemoryCommunicator, fake_gpu: Any, ty: Any, dtype: torch.dtype
) -> None:
    t = wg.create_wm_tensor(comm, [9, 4], [6, 1], dtype, ty, device="cuda")
    assert t.is_gpu and isinstance(t, wg.ChunkedTensor if ty is T.CHUNKED else wg.NCCLTensor)
    assert tuple(t.stride) == (6, 1) and t.dtype == dtype
    # one rank: nothing is exported, so the memory comes from torch's caching allocator
    assert fake_gpu.calls["alloc"] == 0 and fake_gpu.calls["ipc_open"] == 0
    rows = torch.arange(9)
    wg.scatter(t, rows, _encode(rows, 4, dtype))
    idx = torch.tensor([8, 0, 3, 3, 5], dtype=torch.int32)
    assert torch.equal(wg.gather(t, idx), _encode(idx.long(), 4, dtype))
    out = torch.empty(5, 4, dtype=dtype)
    assert wg.gather(t, idx, out=out) is out and torch.equal(out, _encode(idx.long(), 4, dtype))
    # views: rows 2..8, columns 1..3, view-relative indices
    sub = wg.get_sub_tensor(t, [2, 1], [8, 3])
    assert torch.equal(wg.gather(sub, torch.tensor([0, 5])), _encode(torch.tensor([2, 7]), 4, dtype)[:, 1:3])
    wg.scatter(sub, torch.tensor([1]), torch.full((1, 2), 7, dtype=dtype))
    assert torch.equal(wg.gather(t, torch.tensor([3]))[0], torch.tensor([9, 7, 7, 24], dtype=dtype))
    # the local part aliases the storage
    local, first = wg.get_local_tensor(t)
    assert first == 0 and local.shape == (9, 4) and local.stride() == (6, 1)
    local[4, 0] = 42
    assert wg.gather(t, torch.tensor([4]))[0, 0] == 42
    # bad input, checked before anything runs
    with pytest.raises(IndexError, match="index 9 at position 1"):
        wg.gather(t, torch.tensor([0, 9]))
    with pytest.raises(IndexError, match="index -1 at position 0"):
        wg.scatter(t, torch.tensor([-1]), torch.zeros(1, 4, dtype=dtype))
    with pytest.raises(TypeError, match="int64 or int32"):
        wg.gather(t, torch.tensor([0.0]))
    with pytest.raises(TypeError, match="dtype"):
        wg.scatter(t, torch.tensor([0]), torch.zeros(1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        wg.scatter(t, torch.tensor([0, 1]), torch.zeros(1, 4, dtype=dtype))
    with pytest.raises(ValueError, match="contiguous"):
        wg.gather(t, torch.tensor([0, 1, 2, 3]), out=torch.empty(4, 4, dtype=dtype).t())
    with pytest.raises(TypeError, match="torch.Tensor"):
        wg.scatter(t, torch.tensor([0]), [[1, 2, 3, 4]])
    assert wg.get_tensor_view(t, "cuda") is t
    with pytest.raises(ValueError, match="no CPU view"):
        wg.get_tensor_view(t, "cpu")


def test_gpu_chunked_one_rank_is_freed_with_the_tensor(fake_gpu: Any) -> None:
    wg.init_lib()
    comm = wg.create_communicator(1, wg.get_unique_id(), 0)
    t = wg.create_wm_tensor(comm, [5, 2], [], torch.float32, T.CHUNKED, device="cuda")
    chunks = weakref.ref(t._gpu)
    local, _ = wg.get_local_tensor(t)
    sub = wg.get_sub_tensor(t, [1], [3])
    del t
    gc.collect()
    assert chunks() is not None  # the view keeps the storage
    del sub
    local[0, 0] = 1.0  # the local part is still valid: it holds the torch allocation
    gc.collect()
    assert chunks() is None  # freed with the tensor, not at destroy
    assert fake_gpu.calls["alloc"] == 0 and not fake_gpu.own
    comm.destroy()
    wg.finalize_lib()


def test_device_binding_policy() -> None:
    from wholemem._binding import pick_device

    # the local rank's GPU, unless the user already chose another than torch's default 0
    assert pick_device(4, 2, 0, False) == 2
    assert pick_device(4, 2, 0, True) == 2  # 0 is torch's default, not a choice
    assert pick_device(4, 2, 3, True) == 3  # set by the user: kept
    assert pick_device(2, 3, 0, False) == 1  # more ranks than GPUs: shared round-robin
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        pick_device(0, 0, 0, False)


def test_device_binding_from_launcher(comm: wg.WholeMemoryCommunicator, make_fake_gpu: Any, monkeypatch: Any) -> None:
    from wholemem import _binding

    be = make_fake_gpu(count=4)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert _binding.local_rank(comm) == 3
    wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.NCCL, device="cuda")
    assert be.bound == [3]  # torch.cuda.set_device(local rank) before anything ran
    wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.CHUNKED, device="cuda")
    assert be.bound == [3]  # bound once
    be.current = 1  # the user called torch.cuda.set_device(1) later: kept
    wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.CHUNKED, device="cuda")
    assert be.bound == [3]
    with pytest.raises(ValueError, match="cuda:4 does not exist: 4 CUDA devices"):
        wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.CHUNKED, device="cuda:4")
    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(var)
    assert _binding.local_rank(comm) == comm.local_rank == 0  # no launcher: the communicator's


def test_barrier_synchronises_every_used_device(comm: wg.WholeMemoryCommunicator, fake_gpu: Any) -> None:
    # torch never initialised CUDA here (the fake says so): the barrier still waits for
    # the devices wholemem used, through the extension's own runtime calls
    assert fake_gpu.current_device() == (0, False)
    comm.barrier()
    assert fake_gpu.synced == []  # nothing used yet
    wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.CHUNKED, device="cuda")
    comm.barrier()
    assert fake_gpu.synced == [torch.device("cpu")]  # the fake's "device"


def test_views_share_the_base_table(comm: wg.WholeMemoryCommunicator, fake_gpu: Any) -> None:
    for ty in (T.CHUNKED, T.NCCL):
        for dev in ("cpu", "cuda"):
            t = wg.create_wm_tensor(comm, [10, 6], [], torch.int32, ty, device=dev)
            wg.scatter(t, torch.arange(10), torch.arange(60, dtype=torch.int32).reshape(10, 6))
            sub = wg.get_sub_tensor(t, [2, 1], [9, 5])
            subsub = wg.get_sub_tensor(sub, [3, 1], [5, 3])
            assert sub._table is t._table and subsub._table is t._table  # no table per view
            assert torch.equal(wg.gather(subsub, torch.tensor([1, 0])), torch.tensor([[38, 39], [32, 33]]).int())
            wg.scatter(subsub, torch.tensor([0]), torch.tensor([[-1, -2]], dtype=torch.int32))
            assert torch.equal(wg.gather(t, torch.tensor([5]))[0], torch.tensor([30, 31, -1, -2, 34, 35]).int())
            with pytest.raises(IndexError, match="index 2 at position 0 is out of range for 2 rows"):
                wg.gather(subsub, torch.tensor([2]))


def test_host_and_chunked_cuda_views(comm: wg.WholeMemoryCommunicator, fake_gpu: Any) -> None:
    h = wg.create_wm_tensor(comm, [6, 3], [4, 1], torch.float32, T.HOST)
    h.copy_(torch.arange(18.0).reshape(6, 3))
    v = wg.get_tensor_view(h, "cuda")
    assert fake_gpu.calls["host_register"] == 1
    assert v.shape == h.shape and v.stride() == (4, 1)
    v[2, 1] = -5.0  # the view aliases the shared pages
    assert h[2, 1] == -5.0
    sub = wg.get_sub_tensor(h, [2, 0], [5, 2])
    sv = wg.get_tensor_view(sub, torch.device("cuda"))
    assert fake_gpu.calls["host_register"] == 1  # one registration per segment and process
    assert torch.equal(sv, h[2:5, 0:2]) and wg.get_local_tensor(sv)[1] == 0
    assert torch.equal(wg.gather(sv, torch.tensor([2])), h[4:5, 0:2])
    assert wg.get_partition_plan(v) == (0, 6, 6, 6)
    del v, sv
    gc.collect()
    assert fake_gpu.calls["host_unregister"] == 1 and not fake_gpu.registered
    # HOST with device='cuda' returns the mapped view of a new segment
    hc = wg.create_wm_tensor(comm, [4, 2], [], torch.int32, T.HOST, device="cuda")
    assert fake_gpu.calls["host_register"] == 2 and torch.equal(hc, torch.zeros(4, 2, dtype=torch.int32))
    # a host CHUNKED tensor seen from the GPU: mapped chunks, same rows
    c = wg.create_wm_tensor(comm, [7, 2], [], torch.float64, T.CHUNKED)
    wg.scatter(c, torch.arange(7), torch.arange(14.0, dtype=torch.float64).reshape(7, 2))
    cv = wg.get_tensor_view(c, "cuda:0")
    assert isinstance(cv, wg.ChunkedTensor) and cv.is_gpu and not c.is_gpu
    wg.scatter(cv, torch.tensor([6]), torch.tensor([[-1.0, -2.0]], dtype=torch.float64))
    assert torch.equal(
        wg.gather(c, torch.tensor([6, 1])), torch.tensor([[-1.0, -2.0], [2.0, 3.0]], dtype=torch.float64)
    )
    assert torch.equal(wg.get_local_tensor(cv)[0], wg.get_local_tensor(c)[0])
    n = wg.create_wm_tensor(comm, [7, 2], [], torch.float32, T.NCCL)
    with pytest.raises(ValueError, match="private"):
        wg.get_tensor_view(n, "cuda")
    with pytest.raises(ValueError, match="HOST tensor made by create_wm_tensor"):
        wg.get_tensor_view(torch.zeros(3), "cuda")


def test_non_cpu_plain_tensor_checks(comm: wg.WholeMemoryCommunicator) -> None:
    # DEVICE tensors and CUDA views of HOST tensors are plain device tensors; the 'meta'
    # device stands in for CUDA here: the same checks run before torch's kernels
    t = torch.empty(10, 3, device="meta")
    assert wg.gather(t, torch.tensor([9, 0])).shape == (2, 3)
    with pytest.raises(IndexError, match=r"index 10 at position 1 is out of range for 10 rows"):
        wg.gather(t, torch.tensor([0, 10]))
    with pytest.raises(IndexError, match=r"index -4 at position 0"):
        wg.scatter(t, torch.tensor([-4]), torch.empty(1, 3, device="meta"))
    with pytest.raises(TypeError, match="int64 or int32"):
        wg.gather(t, torch.tensor([1.5]))
    with pytest.raises(ValueError, match="values must be on meta"):
        wg.scatter(t, torch.tensor([1]), torch.zeros(1, 3))
    with pytest.raises(TypeError, match="dtype torch.float32"):
        wg.scatter(t, torch.tensor([1]), torch.empty(1, 3, dtype=torch.float64, device="meta"))
    with pytest.raises(ValueError, match=r"out must have shape \(1, 3\)"):
        wg.gather(t, torch.tensor([1]), out=torch.empty(2, 3, device="meta"))


def test_gpu_tensor_files(comm: wg.WholeMemoryCommunicator, fake_gpu: Any, tmp_path: Any) -> None:
    # store from a GPU-resident tensor, load into a host one and back into another GPU type
    data = torch.arange(30, dtype=torch.int32).reshape(10, 3)
    g = wg.create_wm_tensor(comm, [10, 3], [], torch.int32, T.CHUNKED, device="cuda")
    wg.scatter(g, torch.arange(10), data)
    assert len(wg.store_to_files(g, tmp_path / "g", num_parts=3)) == 3
    h = wg.create_wm_tensor(comm, [10, 3], [], torch.int32, T.HOST)
    wg.load_from_files(h, tmp_path / "g")
    assert torch.equal(h, data)
    n = wg.create_wm_tensor(comm, [10, 3], [], torch.int32, T.NCCL, device="cuda")
    wg.load_from_files(n, tmp_path / "g")
    assert torch.equal(wg.gather(n, torch.arange(10)), data)
    # DEVICE tensors and CUDA views of HOST tensors (plain tensors in GPU memory): staged
    d = wg.create_wm_tensor(comm, [10, 3], [], torch.int32, T.DEVICE)
    assert wg.get_wm_tensor_type(d) is T.DEVICE
    wg.load_from_files(d, tmp_path / "g")
    assert torch.equal(d, data)
    wg.store_to_files(wg.get_sub_tensor(d, [2], [7]), tmp_path / "d")
    view = wg.get_tensor_view(wg.create_wm_tensor(comm, [5, 3], [], torch.int32, T.HOST), "cuda")
    wg.load_from_files(view, tmp_path / "d")
    assert torch.equal(view, data[2:7])


@pytest.mark.parametrize("ty", [T.CHUNKED, T.NCCL, T.DEVICE])
def test_gpu_embedding_routing(comm: wg.WholeMemoryCommunicator, fake_gpu: Any, ty: Any, monkeypatch: Any) -> None:
    # a GPU-resident table follows the host table step for step (same kernels underneath here)
    opt = wg.LazyAdam(lr=0.05)
    ref = wg.Embedding(comm, 12, 3, optimizer=opt, tensor_type=T.HOST if ty is T.DEVICE else ty, seed=3)
    gpu = wg.Embedding(comm, 12, 3, optimizer=opt, tensor_type=ty, seed=3, device="cuda")
    assert gpu._gpu and not ref._gpu
    from wholemem import _embedding

    def no_new_tables(*args: Any) -> None:
        raise AssertionError("Embedding.step built a row table")

    monkeypatch.setattr(_embedding, "Table", no_new_tables)  # tables are built once, at creation
    for step in range(3):
        idx = torch.tensor([step, 5, 5, 11 - step])
        for emb in (ref, gpu):
            emb(idx).pow(2).sum().backward()
            emb.step()
        assert torch.equal(wg.gather(gpu.weight, torch.arange(12)), wg.gather(ref.weight, torch.arange(12)))
    assert all(torch.equal(a, b) for a, b in zip(gpu.optimizer_states, ref.optimizer_states))
    with pytest.raises(IndexError, match="index 12 at position 0"):
        gpu(torch.tensor([12]))
    with pytest.raises(TypeError, match="int64 or int32"):
        gpu(torch.tensor([0.0]))
