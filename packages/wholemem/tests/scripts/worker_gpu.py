"""GPU placement on N ranks without a GPU (run under mpiexec by test_multirank.py).

1. A GPU request raises on every rank (also when only rank 0 asks): nobody hangs.
2. The GPU code paths over host memory (gpu_fake): CUDA-IPC-style chunk exchange between
   processes (GPU CHUNKED and DEVICE), GPU NCCL routing, writes seen by all, reference-
   counted lifetimes (a tensor deleted on every rank is unmapped and freed by the next
   collective call; tensors made in a loop do not accumulate), unmapping at destroy.
3. Two simulated nodes (DISTKIT_NODE_ID): HOST / CHUNKED / DEVICE refuse on every rank
   and name NCCL; NCCL works.
"""

from __future__ import annotations

import gc
import os
import sys

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_fake import FakeGpuBackend

import wholemem as wg
from wholemem import _devmem, _gpu

T = wg.WmTensorType


def enc(rows: torch.Tensor, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    return ((rows[:, None] * 3 + torch.arange(3)[None, :] * 5 + salt) % 101).to(dtype)


def expect_error(fn: object, *words: str) -> str:
    try:
        fn()  # type: ignore[operator]
    except (RuntimeError, ValueError) as e:
        msg = str(e)
        assert all(w in msg for w in words), msg
        return msg
    raise AssertionError(f"no error, expected one naming {words}")


def main() -> None:
    mpi = MPI.COMM_WORLD
    wg.init_lib()
    comm = wg.communicator_from_mpi4py(mpi)
    rank, size = comm.rank, comm.size

    # 1. no GPU here: every rank raises, whoever asked
    if not torch.cuda.is_available():
        for asks in ([True] * size, [r == 0 for r in range(size)]):
            dev = "cuda" if asks[rank] else "cpu"
            expect_error(
                lambda d=dev: wg.create_wm_tensor(comm, [10, 3], [], torch.float32, T.CHUNKED, device=d), "CUDA GPU"
            )
        comm.barrier()

    # 2. GPU paths over host memory
    fake = FakeGpuBackend()
    _gpu.set_backend(fake)
    opened = 0
    for ty in (T.CHUNKED, T.NCCL):
        for dtype in (torch.float32, torch.bfloat16, torch.int8):
            t = wg.create_wm_tensor(comm, [10, 3], [], dtype, ty, device="cuda")
            assert t.is_gpu
            if ty is T.CHUNKED:
                opened += size - 1
                assert fake.calls["ipc_open"] == opened
                fake.unlink_all()  # every rank mapped every chunk
            local, first = wg.get_local_tensor(t)
            rows = torch.arange(first, first + local.shape[0])
            wg.scatter(t, rows, enc(rows, dtype))
            comm.barrier()
            g = torch.Generator().manual_seed(rank)
            idx = torch.randint(0, 10, (25,), generator=g)
            assert torch.equal(wg.gather(t, idx), enc(idx, dtype)), (ty, dtype)
            comm.barrier()
            # rows owned by others, written by rank (row % size): seen by everyone
            mine = torch.arange(rank, 10, size)
            wg.scatter(t, mine, enc(mine, dtype, salt=7))
            comm.barrier()
            assert torch.equal(wg.gather(t, torch.arange(10)), enc(torch.arange(10), dtype, salt=7)), (ty, dtype)
            comm.barrier()
    del t, local
    gc.collect()
    comm.barrier()  # every rank dropped every tensor: every chunk is unmapped and freed
    assert fake.calls["ipc_close"] == opened and not fake.opened
    assert not fake.own and len(fake.freed) == 3, (fake.own, fake.freed)

    # DEVICE: one allocation on the node leader, mapped by the peers; writes seen by all
    d = wg.create_wm_tensor(comm, [10, 3], [], torch.int64, T.DEVICE)
    fake.unlink_all()
    assert wg.get_wm_tensor_type(d) is T.DEVICE and len(fake.own) == (1 if rank == 0 else 0)
    d[rank::size] = enc(torch.arange(rank, 10, size), torch.int64)
    comm.barrier()
    assert torch.equal(d, enc(torch.arange(10), torch.int64))
    assert torch.equal(wg.gather(d, torch.tensor([9, 2])), enc(torch.tensor([9, 2]), torch.int64))
    comm.barrier()
    del d
    gc.collect()
    comm.barrier()
    assert not fake.own and not fake.opened

    # tensors made and dropped in a loop do not accumulate device memory
    for _ in range(6):
        t = wg.create_wm_tensor(comm, [10, 3], [], torch.float32, T.CHUNKED, device="cuda")
        fake.unlink_all()
        assert len(fake.own) <= 2  # this one, and at most the previous one not yet released by a peer
        del t
        gc.collect()
    comm.barrier()
    assert not fake.own and _devmem.live_chunks() == 0

    # destroy while a tensor and a local view of it are alive: unmapped at destroy, the own
    # chunk freed only when the local view dies
    t = wg.create_wm_tensor(comm, [10, 3], [], torch.float32, T.CHUNKED, device="cuda")
    fake.unlink_all()
    local, _ = wg.get_local_tensor(t)
    own = list(fake.own)
    comm.destroy()
    gc.collect()
    assert not fake.opened and list(fake.own) == own
    local[0, 0] = 1.0  # still valid
    del t, local
    gc.collect()
    assert not fake.own, fake.own
    _gpu.set_backend(_gpu.CudaBackend())

    # 3. two simulated nodes
    if size >= 2:
        os.environ["DISTKIT_NODE_ID"] = str(rank % 2)
        c2 = wg.communicator_from_mpi4py(mpi)
        assert c2.num_nodes == 2 and c2.local_size == len(range(rank % 2, size, 2))
        for ty in (T.HOST, T.CHUNKED, T.DEVICE):
            expect_error(lambda t=ty: wg.create_wm_tensor(c2, [10, 3], [], torch.float32, t), "2 nodes", "NCCL")
        n = wg.create_wm_tensor(c2, [10, 3], [], torch.int64, T.DISTRIBUTED)
        local, first = wg.get_local_tensor(n)
        rows = torch.arange(first, first + local.shape[0])
        wg.scatter(n, rows, enc(rows, torch.int64))
        c2.barrier()
        assert torch.equal(wg.gather(n, torch.tensor([9, 0, 4])), enc(torch.tensor([9, 0, 4]), torch.int64))
        c2.destroy()
        del os.environ["DISTKIT_NODE_ID"]
    wg.finalize_lib()
    if rank == 0:
        print(f"worker_gpu OK {size}", flush=True)


if __name__ == "__main__":
    main()
