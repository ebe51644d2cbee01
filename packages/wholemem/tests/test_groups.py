"""Communicators made from others (pylibwholegraph's names) on one machine, and the error
messages that name a lost peer. Across real (simulated) hosts: test_cluster.py."""

from __future__ import annotations

import datetime
import os

import pytest
import torch

import wholemem as wg
from distkit_common.testing import init_process_group, run_spawn
from wholemem import _peers
from wholemem._node import NodeInfo


def _groups_body(rank: int, size: int, store: str) -> None:
    import torch.distributed as dist

    # three ranks on two simulated nodes: ranks 0, 2 on node "a", rank 1 on node "b"
    os.environ["DISTKIT_NODE_ID"] = "a" if rank in (0, 2) else "b"
    init_process_group(rank, size, store)
    wg.init_lib()
    world = wg.get_global_communicator()
    assert world is wg.get_global_communicator() and world.num_nodes == 2
    assert world.node_groups() == [[0, 2], [1]]
    assert world.describe_nodes() == "node a (ranks 0, 2), node b (rank 1)"
    # the span error names the nodes and the way out, on every rank
    with pytest.raises(ValueError, match=r"spans 2 nodes: node a \(ranks 0, 2\), node b \(rank 1\)\. .*get_local_node"):
        wg.create_wm_tensor(world, [10, 3], [], torch.float32, wg.WmTensorType.HOST)
    node = wg.get_local_node_communicator()
    assert node is wg.get_local_node_communicator(world)
    mine = [0, 2] if rank in (0, 2) else [1]
    assert (node.rank, node.size, node.num_nodes) == (mine.index(rank), len(mine), 1)
    # HOST and CHUNKED on the node communicator: one tensor per node, written by its ranks
    for ty in (wg.WmTensorType.HOST, wg.WmTensorType.CHUNKED):
        t = wg.create_wm_tensor(node, [10, 3], [], torch.int64, ty)
        local, first = wg.get_local_tensor(t)
        rows = torch.arange(first, first + local.shape[0])
        wg.scatter(t, rows, (rows[:, None] * 10 + len(mine)).expand(-1, 3))
        node.barrier()
        assert torch.equal(wg.gather(t, torch.arange(10)), (torch.arange(10)[:, None] * 10 + len(mine)).expand(-1, 3))
        node.barrier()
    # split_communicator: key orders the ranks, a negative color opts out
    sub = wg.split_communicator(world, -1 if rank == 1 else 0, key=-rank)
    if rank == 1:
        assert sub is None
    else:
        assert sub is not None and (sub.rank, sub.size) == ({0: 1, 2: 0}[rank], 2)
        assert [int(b) for b in sub.allgather_bytes(str(rank).encode())] == [2, 0]
    # create_group_communicator: 3 ranks in groups of 1 (stride 1), or one group
    solo = wg.create_group_communicator(1)
    assert (solo.rank, solo.size) == (0, 1)
    assert wg.create_group_communicator().size == 3
    dev = wg.get_local_device_communicator()
    assert dev.size == 1 and dev is wg.get_local_device_communicator()
    # bad arguments raise on every rank (nobody waits in a collective)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        wg.create_group_communicator(2)
    with pytest.raises(ValueError, match="comm_stride"):
        wg.create_group_communicator(1, 0)
    with pytest.raises(TypeError, match="color must be an int"):
        wg.split_communicator(world, "red" if rank == 0 else 1)  # one rank's bad value: raised on every rank
    world.barrier()
    # a split child outlives its parent's destroy; finalize_lib ends everything
    world.destroy()
    node.barrier()
    wg.finalize_lib()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.spawn
def test_node_group_and_split_communicators() -> None:
    run_spawn(_groups_body, 3, timeout=300)


def test_group_functions_bad_input() -> None:
    with pytest.raises(RuntimeError, match="init_lib"):
        wg.get_global_communicator()
    wg.init_lib()
    try:
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            wg.get_global_communicator()
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            wg.get_local_node_communicator()
        with pytest.raises(TypeError, match="comm must be a wholemem.WholeMemoryCommunicator"):
            wg.get_local_node_communicator("world")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="comm must be a wholemem.WholeMemoryCommunicator"):
            wg.split_communicator(None, 0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="group_size"):
            wg.create_group_communicator(2.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="group_size"):
            wg.create_group_communicator(0)
        c = wg.create_communicator(1, wg.get_unique_id(), 0)
        assert wg.get_local_node_communicator(c) is c  # one node: the communicator itself
        with pytest.raises(TypeError, match="key must be an int"):
            wg.split_communicator(c, 0, key=None)  # type: ignore[arg-type]
        child = wg.split_communicator(c, 5)
        assert child is not None and (child.rank, child.size) == (0, 1)
        c.destroy()
        with pytest.raises(RuntimeError, match="destroyed"):
            wg.get_local_node_communicator(c)
        with pytest.raises(TypeError, match="timeout must be a datetime.timedelta"):
            wg.create_communicator(1, wg.get_unique_id(), 0, timeout=5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be positive"):
            wg.get_unique_id(datetime.timedelta(0))
    finally:
        wg.finalize_lib()


NODES = [
    NodeInfo("k1", "dkh1", ["10.213.0.1"]),
    NodeInfo("k1", "dkh1", ["10.213.0.1"]),
    NodeInfo("k2", "dkh2", ["10.213.0.2"]),
    NodeInfo("k2", "dkh2", ["10.213.0.2"]),
]


def test_failure_messages_name_the_lost_host() -> None:
    reset = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Read error [10.213.0.2]:40321: Connection reset by peer")
    msg = _peers.describe_failure("all_to_all", 1, NODES, 20.0, reset)
    assert msg.startswith("wholemem all_to_all: rank 1 on dkh1 lost its connection to dkh2 (10.213.0.2; ranks 2, 3")
    timeout = RuntimeError("Timed out waiting 20000ms for recv operation to complete")
    msg = _peers.describe_failure("barrier", 0, NODES, 20.0, timeout)
    assert "got no answer within 20 s from its peers (dkh1 (rank 1), dkh2 (ranks 2, 3))" in msg
    other = RuntimeError("something else")
    assert "failed to communicate with its peers" in _peers.describe_failure("allgather", 3, NODES, None, other)
    assert _peers.hosts_of(NODES) == "dkh1 (ranks 0, 1), dkh2 (ranks 2, 3)"
    with pytest.raises(ValueError, match="malformed node description"):
        NodeInfo.from_json(["only", "two"])
