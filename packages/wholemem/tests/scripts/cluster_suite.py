"""wholemem across hosts: every check of one job (run by test_cluster.py on 2 hosts x 2 ranks).

Launcher-agnostic (mpiexec or torchrun): the ranks meet through ``torch.distributed``
(``MASTER_ADDR`` / ``MASTER_PORT``, rank and size from ``distkit_common.launch``), so
the communicators come from :func:`wholemem.get_global_communicator` as in a
pylibwholegraph job. Checked on every rank, each against a single-process reference:

1. communicators: the global one spans the hosts; ``get_local_node_communicator`` has
   exactly the ranks of this host (hostnames gathered independently over
   torch.distributed); ``create_group_communicator`` blocks and strides (a group
   across hosts); ``get_local_device_communicator``; bad arguments raise everywhere.
2. HOST / CHUNKED / DEVICE on the global communicator: a ValueError on every rank that
   names both hosts and the way out.
3. HOST / CHUNKED on each host's communicator: one tensor per host (written by its own
   ranks, different on the two hosts), read back exactly.
4. NCCL (DISTRIBUTED) tensors on the global communicator, several dtypes: rows written
   by their owners and by other ranks, random gathers across hosts; the GPU-resident
   NCCL path (routing, device all-to-all) over host memory (tests/scripts/gpu_fake.py).
5. Embedding training: an NCCL-type table on the global communicator (4 ranks' batches)
   and a HOST table on each host's communicator (its 2 ranks' batches), every optimizer's
   result vs the dense single-process reference of worker_embedding.py.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_embedding as ref
from gpu_fake import FakeGpuBackend

import wholemem as wg
from distkit_common import launch
from distkit_common.testing import collective_timeout
from wholemem import _gpu

T = wg.WmTensorType
ROWS, COLS = 29, 3


def enc(rows: torch.Tensor, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    return ((rows[:, None] * 3 + torch.arange(COLS)[None, :] * 5 + salt) % 101).to(dtype)


def expect(exc: type[BaseException], fn: object, *words: str) -> None:
    try:
        fn()  # type: ignore[operator]
    except exc as e:
        msg = str(e)
        assert all(w in msg for w in words), (words, msg)
        return
    raise AssertionError(f"no {exc.__name__} naming {words}")


def gather_names(name: str, size: int) -> list[str]:
    """Every rank's ``name`` over torch.distributed (bytes in a tensor: nothing unpickled)."""
    buf = torch.zeros(64, dtype=torch.uint8)
    raw = name.encode()[:64]
    buf[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    out = [torch.empty_like(buf) for _ in range(size)]
    dist.all_gather(out, buf)
    return [bytes(o.tolist()).rstrip(b"\0").decode() for o in out]


def check_communicators(
    rank: int, size: int, host: str
) -> tuple[wg.WholeMemoryCommunicator, wg.WholeMemoryCommunicator, list[str]]:
    hosts = gather_names(host, size)
    mine = [r for r in range(size) if hosts[r] == host]
    world = wg.get_global_communicator()
    assert world is wg.get_global_communicator()
    assert (world.rank, world.size, world.num_nodes) == (rank, size, len(set(hosts)))
    assert world.hosts == hosts and world.node_ranks == mine and world.local_rank == mine.index(rank)
    node = wg.get_local_node_communicator()
    assert node is wg.get_local_node_communicator(world) is world.node_communicator()
    assert (node.rank, node.size, node.num_nodes) == (mine.index(rank), len(mine), 1)
    assert node.hosts == [host] * len(mine)
    # the node communicator's own collectives see only this host's ranks
    assert [int(b) for b in node.allgather_bytes(str(rank).encode())] == mine
    # pylibwholegraph's grouping: blocks of consecutive ranks, or strided (across the hosts here)
    blocks = wg.create_group_communicator(2)
    assert (blocks.rank, blocks.size) == (rank % 2, 2)
    assert [int(b) for b in blocks.allgather_bytes(str(rank).encode())] == [rank - rank % 2, rank - rank % 2 + 1]
    strided = wg.create_group_communicator(2, 2)
    assert [int(b) for b in strided.allgather_bytes(str(rank).encode())] == [rank % 2, rank % 2 + 2]
    assert strided.num_nodes == 2 and strided.hosts == [hosts[rank % 2], hosts[rank % 2 + 2]]
    one = wg.get_local_device_communicator()
    assert (one.rank, one.size) == (0, 1) and one is wg.get_local_device_communicator()
    assert wg.create_group_communicator().size == size
    # bad arguments: the same error on every rank, nobody left waiting
    expect(ValueError, lambda: wg.create_group_communicator(3), "not a multiple")
    expect(ValueError, lambda: wg.create_group_communicator(0), "group_size")
    expect(TypeError, lambda: wg.create_group_communicator("2"), "group_size")
    expect(TypeError, lambda: wg.get_local_node_communicator("world"), "WholeMemoryCommunicator")
    expect(TypeError, lambda: wg.split_communicator(world, 1.5), "color")
    for c in (blocks, strided):
        c.destroy()
    return world, node, hosts


def check_span_error(world: wg.WholeMemoryCommunicator, hosts: list[str]) -> None:
    first, second = hosts[0], hosts[-1]
    for ty in (T.HOST, T.CHUNKED, T.DEVICE):
        expect(
            ValueError,
            lambda t=ty: wg.create_wm_tensor(world, [ROWS, COLS], [], torch.float32, t),
            f"spans 2 nodes: {first} (ranks 0, 1), {second} (ranks 2, 3)",
            "get_local_node_communicator",
            "NCCL",
        )
    world.barrier()  # every rank got here: nobody blocked in a half-made tensor


def check_node_tensors(world: wg.WholeMemoryCommunicator, node: wg.WholeMemoryCommunicator, hosts: list[str]) -> None:
    salt = sorted(set(hosts)).index(hosts[world.rank]) * 11  # each host writes its own values
    for ty in (T.HOST, T.CHUNKED):
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            t = wg.create_wm_tensor(node, [ROWS, COLS], [], dtype, ty)
            local, first = wg.get_local_tensor(t)
            rows = torch.arange(first, first + local.shape[0])
            wg.scatter(t, rows, enc(rows, dtype, salt))
            node.barrier()
            idx = torch.randint(0, ROWS, (50,), generator=torch.Generator().manual_seed(world.rank))
            assert torch.equal(wg.gather(t, idx), enc(idx, dtype, salt)), (ty, dtype)
            assert torch.equal(
                t[:, :] if ty is T.HOST else wg.gather(t, torch.arange(ROWS)), enc(torch.arange(ROWS), dtype, salt)
            )
            # the two hosts' tensors are different memory: their sums differ by the salt
            sums = [
                float(b)
                for b in world.allgather_bytes(str(float(wg.gather(t, torch.arange(ROWS)).double().sum())).encode())
            ]
            assert len({sums[0], sums[-1]}) == 2 and sums[0] == sums[1] and sums[2] == sums[3], sums
            node.barrier()
            del t, local


def check_nccl(world: wg.WholeMemoryCommunicator, *, device: str = "cpu") -> None:
    rank, size = world.rank, world.size
    for dtype in (torch.float32, torch.float16, torch.int8, torch.int64):
        t = wg.create_wm_tensor(world, [ROWS, COLS], [], dtype, T.DISTRIBUTED, device=device)
        local, first = wg.get_local_tensor(t)
        rows = torch.arange(first, first + local.shape[0])
        wg.scatter(t, rows, enc(rows, dtype))
        world.barrier()
        idx = torch.randint(0, ROWS, (64,), generator=torch.Generator().manual_seed(rank))
        assert torch.equal(wg.gather(t, idx), enc(idx, dtype)), dtype
        world.barrier()
        theirs = torch.arange(rank, ROWS, size)  # rows owned mostly by ranks on the other host
        wg.scatter(t, theirs, enc(theirs, dtype, 7))
        world.barrier()
        assert torch.equal(wg.gather(t, torch.arange(ROWS)), enc(torch.arange(ROWS), dtype, 7)), dtype
        world.barrier()


def check_embeddings(world: wg.WholeMemoryCommunicator, node: wg.WholeMemoryCommunicator) -> None:
    init = torch.randn(ref.N, ref.D, generator=torch.Generator().manual_seed(7))
    opts = (
        wg.SGD(lr=0.05, weight_decay=0.01),
        wg.Adagrad(lr=0.1),
        wg.LazyAdam(lr=0.01, betas=(0.8, 0.99)),
        wg.RMSProp(lr=0.01, alpha=0.9),
    )
    for opt in opts:
        for comm, ty in ((world, T.DISTRIBUTED), (node, T.HOST)):
            emb = wg.Embedding(
                comm, ref.N, ref.D, optimizer=opt, tensor_type=ty, dtype=torch.float64, init=init.double()
            )
            ref.train(emb, comm.rank)  # each communicator's ranks replay their own batches
            want = ref.manual_reference(opt, init, comm.size)
            err = (wg.gather(emb.weight, torch.arange(ref.N)) - want).abs().max().item()
            assert err <= 1e-6, (type(opt).__name__, ty, comm.size, err)  # as worker_embedding.py
            comm.barrier()


def main() -> None:
    info = launch.launch_info()
    rank, size = info.rank, info.world_size
    host = socket.gethostname()
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size, timeout=collective_timeout())
    wg.init_lib()
    world, node, hosts = check_communicators(rank, size, host)
    check_span_error(world, hosts)
    check_node_tensors(world, node, hosts)
    check_nccl(world)
    _gpu.set_backend(FakeGpuBackend())
    check_nccl(world, device="cuda")  # the GPU-resident NCCL path, over host memory
    _gpu.set_backend(_gpu.CudaBackend())
    check_embeddings(world, node)
    wg.finalize_lib()
    dist.barrier()
    dist.destroy_process_group()
    print(f"cluster_suite OK rank {rank} on {host} (node ranks {world.node_ranks})", flush=True)


if __name__ == "__main__":
    main()
