"""GPU placement on N ranks without a GPU (run under mpiexec by test_multirank.py).

1. A GPU request raises on every rank (also when only rank 0 asks): nobody hangs.
2. The GPU code paths over host memory (gpu_fake): CUDA-IPC-style chunk exchange between
   processes, GPU NCCL routing, writes seen by all, unmapping and freeing at destroy.
3. Two simulated nodes (WHOLEMEM_NODE_ID): HOST / CHUNKED / DEVICE refuse on every rank
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
from wholemem import _gpu

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
                assert fake.calls["ipc_open"] == opened and len(fake.opened) == opened
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
    assert fake.freed == []  # nothing freed before the collective destroy
    comm.destroy()
    gc.collect()
    assert fake.calls["ipc_close"] == opened and not fake.opened
    assert not fake.own and len(fake.freed) == 3, fake.freed
    _gpu.set_backend(_gpu.CudaBackend())

    # 3. two simulated nodes
    if size >= 2:
        os.environ["WHOLEMEM_NODE_ID"] = str(rank % 2)
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
        del os.environ["WHOLEMEM_NODE_ID"]
    wg.finalize_lib()
    if rank == 0:
        print(f"worker_gpu OK {size}", flush=True)


if __name__ == "__main__":
    main()
