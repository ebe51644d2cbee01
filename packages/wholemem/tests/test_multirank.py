"""Multi-rank tests: every type x dtype x layout, files, optimizers, crash cleanup (mpiexec / spawn)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distkit_common.testing import init_process_group, run_mpi, run_spawn

SCRIPTS = Path(__file__).parent / "scripts"


def shm_names() -> set[str]:
    """wholemem's segments currently in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("wholemem-")}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_tensor_types(nprocs: int, tmp_path: Path) -> None:
    before = shm_names()
    res = run_mpi(SCRIPTS / "worker_tensors.py", nprocs, args=[str(tmp_path)], timeout=300)
    assert f"worker_tensors OK {nprocs}" in res.stdout
    assert shm_names() <= before, "shared-memory segments left behind"


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_embedding_optimizers(nprocs: int, tmp_path: Path) -> None:
    res = run_mpi(SCRIPTS / "worker_embedding.py", nprocs, args=[str(tmp_path)], timeout=300)
    assert f"worker_embedding OK {nprocs}" in res.stdout


@pytest.mark.mpi
def test_no_shm_leftovers_after_sigkill() -> None:
    before = shm_names()
    res = run_mpi(SCRIPTS / "worker_kill.py", 2, timeout=300, check=False)
    assert res.returncode != 0
    assert "rank 1: tensors created" in res.stdout, res.stdout + res.stderr
    assert shm_names() <= before, "a SIGKILLed run left shared memory behind"


def _pg_body(rank: int, size: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    import wholemem as wg

    init_process_group(rank, size, store)
    wg.init_lib()
    with pytest.raises(TypeError, match="device_group must be a torch.distributed.ProcessGroup"):
        wg.communicator_from_process_group(None, device_group="gloo")
    comm = wg.communicator_from_process_group()
    assert (comm.rank, comm.size) == (rank, size)
    for ty in (wg.WmTensorType.HOST, wg.WmTensorType.CHUNKED, wg.WmTensorType.NCCL):
        t = wg.create_wm_tensor(comm, [11, 3], [], torch.int64, ty)
        local, first = wg.get_local_tensor(t)
        rows = torch.arange(first, first + local.shape[0])
        wg.scatter(t, rows, rows[:, None] * 10 + torch.arange(3))
        comm.barrier()
        idx = torch.tensor([10, 0, 5, 5])
        assert torch.equal(wg.gather(t, idx), idx[:, None] * 10 + torch.arange(3))
    comm.destroy()
    wg.finalize_lib()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.spawn
def test_communicator_from_process_group() -> None:
    run_spawn(_pg_body, 2, timeout=300)


@pytest.mark.mpi
def test_gpu_placement_and_two_nodes() -> None:
    # 3 ranks: GPU requests fail on every rank without a GPU; the GPU paths over host memory
    # (IPC-style chunk exchange, GPU NCCL routing, destroy); two simulated nodes
    before = shm_names()
    res = run_mpi(SCRIPTS / "worker_gpu.py", 3, timeout=300)
    assert "worker_gpu OK 3" in res.stdout
    assert shm_names() <= before, "shared-memory segments left behind"
