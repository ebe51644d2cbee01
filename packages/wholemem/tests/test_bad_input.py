"""Bad input gets a clear exception naming the problem, before any communication."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import wholemem as wg
from wholemem import _wholemem

T = wg.WmTensorType
TYPES = [T.HOST, T.CHUNKED, T.NCCL]
# whether the GPU placements work here (then they must succeed instead of raising)
GPU = bool(_wholemem.cuda_compiled() and torch.cuda.is_available() and _wholemem.cuda_device_count() > 0)


@pytest.mark.parametrize("ty", TYPES)
def test_bad_indices(comm: wg.WholeMemoryCommunicator, ty: wg.WmTensorType) -> None:
    t = wg.create_wm_tensor(comm, [10, 3], [], torch.float32, ty)
    with pytest.raises(IndexError, match="10"):
        wg.gather(t, torch.tensor([1, 10]))
    with pytest.raises(IndexError, match="-3"):
        wg.gather(t, torch.tensor([0, -3]))
    with pytest.raises(IndexError, match="12"):
        wg.scatter(t, torch.tensor([12]), torch.zeros(1, 3))
    with pytest.raises(TypeError, match="int64 or int32"):
        wg.gather(t, torch.tensor([1.0]))
    with pytest.raises(TypeError, match="int64 or int32"):
        wg.gather(t, torch.tensor([1], dtype=torch.int16))
    with pytest.raises(ValueError, match="1-D"):
        wg.gather(t, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor or numpy"):
        wg.gather(t, [1, 2])
    # every op: negative / too large -> IndexError naming the index and its position,
    # non-integer dtypes -> TypeError, and nothing is written by a rejected scatter
    before = wg.gather(t, torch.arange(10))
    with pytest.raises(IndexError, match=r"index -1 at position 2 is out of range for 10 rows"):
        wg.scatter(t, torch.tensor([0, 1, -1]), torch.ones(3, 3))
    with pytest.raises(IndexError, match=r"index 10 at position 0"):
        wg.scatter(t, torch.tensor([10, 1], dtype=torch.int32), torch.ones(2, 3))
    with pytest.raises(IndexError, match=r"index -2147483648 at position 0"):
        wg.gather(t, torch.tensor([-(2**31)], dtype=torch.int32))
    with pytest.raises(IndexError, match=r"index 4294967296 at position 1"):
        wg.gather(t, torch.tensor([0, 2**32]))
    for bad in (
        torch.tensor([1.0]),
        torch.tensor([1], dtype=torch.uint8),
        torch.tensor([True]),
        np.array([1.0]),
        np.array([1], dtype=np.int16),
    ):
        with pytest.raises(TypeError, match="int64 or int32"):
            wg.scatter(t, bad, torch.ones(1, 3))
        with pytest.raises(TypeError, match="int64 or int32"):
            wg.gather(t, bad)
    assert torch.equal(wg.gather(t, torch.arange(10)), before)
    # sub-tensor indices are checked against the view
    sub = wg.get_sub_tensor(t, [2], [5])
    with pytest.raises(IndexError, match="3"):
        wg.gather(sub, torch.tensor([3]))
    # numpy indices work
    assert wg.gather(t, np.array([1, 2], dtype=np.int64)).shape == (2, 3)


@pytest.mark.parametrize("ty", TYPES)
def test_bad_values_and_out(comm: wg.WholeMemoryCommunicator, ty: wg.WmTensorType) -> None:
    t = wg.create_wm_tensor(comm, [10, 3], [], torch.float32, ty)
    idx = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="float32"):
        wg.scatter(t, idx, torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        wg.scatter(t, idx, torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        wg.gather(t, idx, out=torch.empty(2, 4))
    with pytest.raises(TypeError, match="float32"):
        wg.gather(t, idx, out=torch.empty(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        wg.gather(t, idx, out=torch.empty(3, 2).t())
    with pytest.raises(TypeError, match="ChunkedTensor"):
        wg.gather("not a tensor", idx)
    # nothing was written by the failed calls
    assert torch.equal(wg.gather(t, torch.arange(10)), torch.zeros(10, 3))


def test_bad_create_arguments(comm: wg.WholeMemoryCommunicator) -> None:
    with pytest.raises(TypeError, match="dtype"):
        wg.create_wm_tensor(comm, [4], [], torch.complex64, T.HOST)
    with pytest.raises(TypeError, match="WmTensorType"):
        wg.create_wm_tensor(comm, [4], [], torch.float32, "HOST")
    with pytest.raises(ValueError, match="non-negative"):
        wg.create_wm_tensor(comm, [-1, 2], [], torch.float32, T.CHUNKED)
    with pytest.raises(TypeError, match="ints"):
        wg.create_wm_tensor(comm, [2.5], [], torch.float32, T.HOST)
    with pytest.raises(ValueError, match="one entry per dimension"):
        wg.create_wm_tensor(comm, [4, 2], [2], torch.float32, T.HOST)
    with pytest.raises(ValueError, match="overlap"):
        wg.create_wm_tensor(comm, [4, 3], [2, 1], torch.float32, T.NCCL)
    with pytest.raises(ValueError, match=">= 1"):
        wg.create_wm_tensor(comm, [4, 3], [0, 1], torch.float32, T.HOST)
    with pytest.raises(TypeError, match="WholeMemoryCommunicator"):
        wg.create_wm_tensor(None, [4], [], torch.float32, T.HOST)  # type: ignore[arg-type]
    if GPU:
        d = wg.create_wm_tensor(comm, [4], [], torch.float32, T.DEVICE)
        assert d.is_cuda and torch.equal(d.cpu(), torch.zeros(4))
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            wg.create_wm_tensor(comm, [4], [], torch.float32, T.DEVICE)


def test_views_and_local(comm: wg.WholeMemoryCommunicator) -> None:
    t = wg.create_wm_tensor(comm, [10, 4], [], torch.float32, T.CHUNKED)
    with pytest.raises(ValueError, match="range"):
        wg.get_sub_tensor(t, [0], [11])
    with pytest.raises(TypeError, match="lists"):
        wg.get_sub_tensor(t, 0, 5)
    with pytest.raises(TypeError, match="plain"):
        wg.get_local_tensor(torch.zeros(3))
    if GPU:
        v = wg.get_tensor_view(t, torch.device("cuda"))
        assert v.is_gpu and v.device.type == "cuda" and tuple(v.shape) == (10, 4)
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            wg.get_tensor_view(t, torch.device("cuda"))
    assert wg.get_tensor_view(t, "cpu") is t
    h = wg.create_wm_tensor(comm, [10, 4], [], torch.float32, T.HOST)
    assert wg.get_tensor_view(h, torch.device("cpu")) is h
    assert wg.get_partition_plan(h) == (0, 10, 10, 10)
    local, first = wg.get_local_tensor(h)
    local[3] = 5.0  # the local part shares memory
    assert first == 0 and torch.all(h[3] == 5.0)
    # a CHUNKED tensor's local part shares memory with the chunk
    cl, _ = wg.get_local_tensor(t)
    cl[2, 1] = 9.0
    assert wg.gather(t, torch.tensor([2]))[0, 1] == 9.0


def test_communicator_arguments() -> None:
    wg.init_lib()
    uid = wg.get_unique_id()
    assert len(uid.token) == 32 and pickle.loads(pickle.dumps(uid)) == uid
    assert "bits" in repr(uid) and uid.token not in repr(uid)
    with pytest.raises(ValueError, match="rank"):
        wg.create_communicator(2, uid, 2)
    with pytest.raises(ValueError, match="size"):
        wg.create_communicator(0, uid, 0)
    with pytest.raises(TypeError, match="UniqueId"):
        wg.create_communicator(1, "abc", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device_backend must be one of"):
        wg.create_communicator(1, uid, 0, device_backend="mpi")
    with pytest.raises(TypeError, match="mpi4py"):
        wg.communicator_from_mpi4py(object())
    with pytest.raises(RuntimeError, match="not initialized"):
        wg.communicator_from_process_group()
    wg.finalize_lib()


def test_use_after_finalize(tmp_path: Path) -> None:
    wg.init_lib()
    comm = wg.create_communicator(1, wg.get_unique_id(), 0)
    ts = [wg.create_wm_tensor(comm, [4, 2], [], torch.float32, ty) for ty in TYPES]
    emb = wg.Embedding(comm, 5, 2, optimizer=wg.SGD(lr=0.1))
    wg.finalize_lib()
    for t in ts:
        with pytest.raises(RuntimeError, match="finalize"):
            wg.gather(t, torch.tensor([0]))
        with pytest.raises(RuntimeError, match="finalize"):
            wg.scatter(t, torch.tensor([0]), torch.zeros(1, 2))
        with pytest.raises(RuntimeError, match="finalize"):
            wg.store_to_files(t, tmp_path)
    with pytest.raises(RuntimeError, match="finalize"):
        ts[1].get_ptr()
    with pytest.raises(RuntimeError, match="finalize"):
        emb(torch.tensor([0]))
    with pytest.raises(RuntimeError, match="finalize"):
        wg.get_unique_id()
    with pytest.raises(RuntimeError, match="finalize"):
        comm.barrier()
    with pytest.raises(RuntimeError, match="finalize"):
        wg.create_wm_tensor(comm, [4], [], torch.float32, T.HOST)


def test_files_bad_input(comm: wg.WholeMemoryCommunicator, tmp_path: Path) -> None:
    t = wg.create_wm_tensor(comm, [6, 2], [], torch.float32, T.NCCL)
    wg.scatter(t, torch.arange(6), torch.arange(12.0).reshape(6, 2))
    files = wg.store_to_files(t, tmp_path / "a", num_parts=4)
    assert len(files) == 4
    with pytest.raises(ValueError, match="num_parts"):
        wg.store_to_files(t, tmp_path / "b", num_parts=0)
    other = wg.create_wm_tensor(comm, [7, 2], [], torch.float32, T.HOST)
    with pytest.raises(ValueError, match="shape"):
        wg.load_from_files(other, tmp_path / "a")
    with pytest.raises(ValueError, match="rows"):
        wg.load_from_files(other, files)
    wrong = wg.create_wm_tensor(comm, [6, 2], [], torch.float64, T.HOST)
    with pytest.raises(TypeError, match="float32"):
        wg.load_from_files(wrong, tmp_path / "a")
    with pytest.raises(FileNotFoundError):
        wg.load_from_files(other, tmp_path / "missing_dir_is_a_file_list")
    with pytest.raises(TypeError, match="create_wm_tensor"):
        wg.store_to_files(torch.zeros(3), tmp_path / "c")
    ok = wg.create_wm_tensor(comm, [6, 2], [], torch.float32, T.HOST)
    wg.load_from_files(ok, files[::-1][::-1])
    assert torch.equal(ok, torch.arange(12.0).reshape(6, 2))


def test_embedding_bad_input(comm: wg.WholeMemoryCommunicator) -> None:
    with pytest.raises(TypeError, match="floating"):
        wg.Embedding(comm, 4, 2, dtype=torch.int32)
    with pytest.raises(TypeError, match="optimizer"):
        wg.Embedding(comm, 4, 2, optimizer=torch.optim.SGD)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="init"):
        wg.Embedding(comm, 4, 2, init=torch.zeros(3, 2))
    emb = wg.Embedding(comm, 4, 2)
    with pytest.raises(IndexError, match=r"index 4 at position 0 is out of range for 4 rows"):
        emb(torch.tensor([4]))
    with pytest.raises(IndexError, match=r"index -1 at position 1"):
        emb(torch.tensor([0, -1], dtype=torch.int32))
    for bad in (torch.tensor([1.0]), torch.tensor([1], dtype=torch.int16), np.array([0.5])):
        with pytest.raises(TypeError, match="int64 or int32"):
            emb(bad)
    with pytest.raises(ValueError, match="1-D"):
        emb(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="no optimizer"):
        emb.step()
    # default init is independent of the partition and deterministic
    again = wg.Embedding(comm, 4, 2)
    assert torch.equal(emb.weight, again.weight) and emb.weight.abs().sum() > 0


def test_plain_tensors_and_strides(comm: wg.WholeMemoryCommunicator) -> None:
    # gather / scatter also work on any CPU tensor, strided or not
    base = torch.arange(30.0).reshape(6, 5)
    view = base[:, 1:4]
    assert torch.equal(wg.gather(view, torch.tensor([5, 0])), view[[5, 0]])
    wg.scatter(view, torch.tensor([2]), torch.full((1, 3), -1.0))
    assert torch.equal(base[2], torch.tensor([10.0, -1, -1, -1, 14]))
    # a padded-row HOST tensor honours its stride
    h = wg.create_wm_tensor(comm, [5, 3], [8, 2], torch.int32, T.HOST)
    assert h.stride() == (8, 2)
    wg.scatter(h, torch.tensor([4]), torch.tensor([[1, 2, 3]], dtype=torch.int32))
    assert torch.equal(h[4], torch.tensor([1, 2, 3], dtype=torch.int32))
    # a 3-D tensor with mergeable trailing dims
    c = wg.create_wm_tensor(comm, [4, 2, 3], [], torch.float64, T.CHUNKED)
    v = torch.arange(6.0, dtype=torch.float64).reshape(1, 2, 3)
    wg.scatter(c, torch.tensor([3]), v)
    assert torch.equal(wg.gather(c, torch.tensor([3])), v)
    with pytest.raises(ValueError, match="mergeable"):
        wg.create_wm_tensor(comm, [4, 2, 3], [6, 1, 2], torch.float32, T.HOST)


def test_host_tensor_is_a_normal_tensor(comm: wg.WholeMemoryCommunicator, tmp_path: Path) -> None:
    import copy

    h = wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.HOST)
    h.copy_(torch.arange(8.0).reshape(4, 2))
    torch.save(h, tmp_path / "h.pt")
    assert torch.equal(torch.load(tmp_path / "h.pt"), h)
    c = copy.deepcopy(h)
    c[0] = -1.0
    assert torch.equal(h[0], torch.tensor([0.0, 1.0]))  # the copy is private
    assert wg.get_partition_plan(h) == (0, 4, 4, 4)
    with pytest.raises(TypeError, match="plain"):
        wg.get_partition_plan(c)


def test_original_api_spellings(comm: wg.WholeMemoryCommunicator) -> None:
    # create_wm_tensor(wm_comm, sizes, strides=[], tensor_dtype=torch.float32, wm_tensor_type=CHUNKED)
    t = wg.create_wm_tensor(comm, [6, 3])
    assert isinstance(t, wg.ChunkedTensor) and t.dtype == torch.float32 and t.stride() == (3, 1)
    i = wg.create_wm_tensor(comm, [5], [], torch.int32)
    assert isinstance(i, wg.ChunkedTensor) and i.dtype == torch.int32 and tuple(i.shape) == (5,)
    assert wg.get_rank(comm) == 0 and wg.get_size(comm) == 1
    wg.barrier(comm)
    # partition plan from a communicator and an entry count
    assert wg.get_partition_plan(comm, 7) == (0, 7, 7, 7)
    assert wg.get_partition_plan(t, 6) == (0, 6, 6, 6)
    with pytest.raises(ValueError, match="total_entry_count is required"):
        wg.get_partition_plan(comm)
    with pytest.raises(ValueError, match="t.shape"):
        wg.get_partition_plan(t, 5)
    with pytest.raises(TypeError, match="int"):
        wg.get_partition_plan(comm, 2.5)
    with pytest.raises(ValueError, match=">= 0"):
        wg.get_partition_plan(comm, -1)
    # (start, count) sub-tensors, count -1 = to the end, missing entries = whole dimension
    wg.scatter(t, torch.arange(6), torch.arange(18.0).reshape(6, 3))
    s = wg.get_sub_chunked_tensor(t, [1, 1], [-1, 1])
    assert tuple(s.shape) == (5, 1)
    assert torch.equal(wg.gather(s, torch.tensor([0, 4])), torch.tensor([[4.0], [16.0]]))
    assert tuple(wg.get_sub_chunked_tensor(t, [], []).shape) == (6, 3)
    with pytest.raises(ValueError, match="count"):
        wg.get_sub_chunked_tensor(t, [2], [5])
    with pytest.raises(ValueError, match="start"):
        wg.get_sub_chunked_tensor(t, [-1], [])
    with pytest.raises(ValueError, match="more entries"):
        wg.get_sub_chunked_tensor(t, [0], [1, 1])
    with pytest.raises(TypeError, match="ints"):
        wg.get_sub_chunked_tensor(t, [0.5], [])
    with pytest.raises(TypeError, match="ChunkedTensor"):
        wg.get_sub_chunked_tensor(torch.zeros(3), [0], [1])
    n = wg.create_wm_tensor(comm, [4, 2], [], torch.float32, T.NCCL)
    with pytest.raises(TypeError, match="NCCLTensor"):
        wg.get_sub_nccl_tensor(t, [0], [1])
    assert tuple(wg.get_sub_nccl_tensor(n, [3], [1]).shape) == (1, 2)
    assert wg.get_wm_tensor_type(n) is T.NCCL and wg.get_wm_communicator(n) is comm
    with pytest.raises(TypeError, match="not a wholemem tensor"):
        wg.get_wm_tensor_type(torch.zeros(2))
    with pytest.raises(TypeError, match="plain"):
        wg.get_wm_communicator(torch.zeros(2))
    for fn in (wg.get_rank, wg.get_size, wg.barrier, wg.destroy_communicator):
        with pytest.raises(TypeError, match="WholeMemoryCommunicator"):
            fn(3)
    # the original's optimizer defaults: Adagrad eps 1e-8, LazyAdam (0.9, 0.999, 1e-8), RMSProp (0.99, 1e-8)
    assert wg.Adagrad().eps == 1e-8 and wg.RMSProp().eps == 1e-8 and wg.RMSProp().alpha == 0.99
    assert wg.LazyAdam().betas == (0.9, 0.999) and wg.LazyAdam().eps == 1e-8
    wg.destroy_communicator(comm)
    with pytest.raises(RuntimeError, match="destroyed"):
        wg.get_size(comm)


def test_wholegraph_file_lists(comm: wg.WholeMemoryCommunicator, tmp_path: Path) -> None:
    # <prefix>_part_<i>_of_<n> parts, not aligned with the ranks' rows, in part order (not name order)
    data = torch.arange(24, dtype=torch.int32).reshape(12, 2)
    for i, (a, b) in enumerate(((0, 1), (1, 10), (10, 11), (11, 12))):
        data[a:b].numpy().tofile(tmp_path / f"f_part_{i}_of_4")
    assert wg.stat_filelist_element_count(tmp_path / "f", torch.int32) == 24
    assert wg.stat_filelist_element_count(tmp_path / "f", torch.int64) == 12
    t = wg.create_wm_tensor_from_file([12, 2], torch.int32, comm, str(tmp_path / "f"), T.HOST)
    assert torch.equal(t, data)
    t2 = wg.create_wm_tensor(comm, [12, 2], [], torch.int32, T.NCCL)
    wg.load_from_files(t2, tmp_path / "f")
    assert torch.equal(wg.gather(t2, torch.arange(12)), data)
    # a single file named exactly like the prefix
    data.numpy().tofile(tmp_path / "single")
    assert torch.equal(
        wg.gather(wg.create_wm_tensor_from_file([], torch.int32, comm, tmp_path / "single"), torch.arange(24)),
        data.reshape(-1),
    )
    with pytest.raises(ValueError, match="holds 24 elements"):
        wg.create_wm_tensor_from_file([5, 2], torch.int32, comm, tmp_path / "f")
    (tmp_path / "f_part_3_of_4").rename(tmp_path / "g_part_0_of_2")
    with pytest.raises(FileNotFoundError, match="f_part_3_of_4 is missing"):
        wg.stat_filelist_element_count(tmp_path / "f", torch.int32)
    with pytest.raises(FileNotFoundError, match="g_part_1_of_2 is missing"):
        wg.load_from_files(t2, tmp_path / "g")
    with pytest.raises(FileNotFoundError, match="no file"):
        wg.stat_filelist_element_count(tmp_path / "nothing", torch.int32)
    with pytest.raises(TypeError, match="dtype"):
        wg.stat_filelist_element_count(tmp_path / "single", "int32")
    (tmp_path / "odd").write_bytes(b"12345")
    with pytest.raises(ValueError, match="whole number"):
        wg.stat_filelist_element_count(tmp_path / "odd", torch.int32)
