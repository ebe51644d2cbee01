"""Rank script of tests/test_cluster.py: shardlayers training across hosts of the simulated cluster.

``--layouts FOLDER`` (torchrun, 2 hosts x 2 ranks): the transformer block of ``training.py``
trained in TP=2 inside each host x DP=2 across hosts (DDP over the data-parallel group), every
loss and the trained weights equal to single-process training; a sharded checkpoint of it
(``ts.sharded_state_dict`` + distx-fake) written by ranks on both hosts; then the same ranks
regroup (a second rendezvous with permuted ranks) into TP=2 across hosts x DP=2 inside each host,
load that checkpoint, and train on, again equal to the single process.

``--loop FOLDER`` (mpiexec or torchrun, 2 hosts x 2 ranks): the typical training loop, TP=2 x DP=2 under
``heartbeat.watch()``, saving a sharded checkpoint to ``FOLDER/latest`` (replaced atomically)
every ``SAVE_EVERY`` steps. At the save of step ``STALL_STEP`` the ranks on ``--stall-host``
stall after writing their shards (a slow disk), print ``STALLED``, and the test kills their
host's ranks or takes its link down: the job must end everywhere, naming the lost host, and
``FOLDER/latest`` must still hold step ``SAVE_EVERY``'s checkpoint.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shardlayers as ts

try:
    from scripts.common import close
    from scripts.training import SEQ, VOCAB, Block, full_logits, lm_loss
except ImportError:  # run by file path (sys.path[0] is this folder)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from scripts.common import close
    from scripts.training import SEQ, VOCAB, Block, full_logits, lm_loss

#: global batch of every step (rows), split evenly over the data-parallel ranks
BATCH = 4
SAVE_EVERY = 2
#: the loop's save during which the stalled host is lost
STALL_STEP = 4
LR, MOMENTUM = 0.2, 0.9


def batches(seed: int = 1) -> Any:
    """The global batches of every step, identical on every rank and in the reference."""
    g = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        yield ids[:, :-1], ids[:, 1:]


def reference(steps: int) -> Block:
    """The single-process model after ``steps`` SGD steps of the loop (what a checkpoint must hold)."""
    torch.manual_seed(0)
    ref = Block(tp=False)
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    data = batches()
    for _ in range(steps):
        inp, tgt = next(data)
        opt.zero_grad()
        lm_loss(ref(inp), tgt).backward()
        opt.step()
    return ref


def _hosts(group: Any) -> list[str]:
    from distkit_common.collective import allgather_json

    return list(allgather_json(socket.gethostname(), comm=group))


def _train(model: Block, ref: Block, data: Any, steps: int, what: str) -> dict[str, torch.Tensor]:
    """``steps`` steps of DDP over the data-parallel group beside the single-process reference;
    the data-parallel mean loss equals the reference loss at every step, and the collected
    weights equal the reference weights at the end. Returns the collected weights."""
    dp, dp_rank = ts.distributed.get_data_parallel_size(), ts.distributed.get_data_parallel_rank()
    rows = BATCH // dp
    ddp = DDP(model, process_group=ts.distributed.get_data_parallel_group())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(steps):
        inp, tgt = next(data)
        loss_ref = lm_loss(ref(inp), tgt)
        opt_ref.zero_grad()
        loss_ref.backward()
        opt_ref.step()
        mine = slice(rows * dp_rank, rows * (dp_rank + 1))
        loss = lm_loss(ddp(inp[mine]), tgt[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg, group=ts.distributed.get_data_parallel_group())
        close(avg / dp, loss_ref, 1e-5, 1e-5, f"{what}: loss at step {step}")
    full = ts.collect_state_dict(model, model.state_dict())
    for k, v in ref.state_dict().items():
        close(full[k], v, 1e-5, 1e-5, f"{what}: trained {k}")
    return full


def layouts(folder: str) -> None:
    from distkit_common.testing import collective_timeout, destroy_process_group
    from distx_fake import checkpoint

    info_world = int(os.environ["WORLD_SIZE"])
    local, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    nodes = info_world // local_size
    assert (nodes, local_size) == (2, 2), (nodes, local_size)
    dist.init_process_group("gloo", timeout=collective_timeout())
    torch.set_num_threads(1)
    data = batches()

    # TP=2 inside each host x DP=2 across hosts: torchrun numbers a host's ranks consecutively
    ts.distributed.init_process_group(2)
    tp_hosts, dp_hosts = _hosts(ts.distributed.get_group()), _hosts(ts.distributed.get_data_parallel_group())
    assert len(set(tp_hosts)) == 1 and len(set(dp_hosts)) == 2, (tp_hosts, dp_hosts)
    torch.manual_seed(0)
    ref = Block(tp=False)
    torch.manual_seed(0)
    model = Block(tp=True)
    trained = _train(model, ref, data, 6, "TP inside hosts x DP across hosts")
    path = os.path.join(folder, "inside")
    checkpoint.save_state_dict(ts.sharded_state_dict(model), checkpoint.FileSystemWriter(path))
    print(f"rank {dist.get_rank()} on {socket.gethostname()}: TP {tp_hosts} x DP {dp_hosts} ok", flush=True)

    # TP=2 across hosts x DP=2 inside each host: a second rendezvous in the job's store with
    # rank = local * nodes + node, so consecutive ranks (one TP group) sit on different hosts
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=collective_timeout()
    )
    ts.distributed.destroy_process_group()
    destroy_process_group()  # frees _train's DDP first
    rank = local * nodes + node
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("shardlayers-across/", store),
        rank=rank,
        world_size=info_world,
        timeout=collective_timeout(),
    )
    ts.distributed.init_process_group(2)
    tp_hosts, dp_hosts = _hosts(ts.distributed.get_group()), _hosts(ts.distributed.get_data_parallel_group())
    assert len(set(tp_hosts)) == 2 and len(set(dp_hosts)) == 1, (tp_hosts, dp_hosts)
    torch.manual_seed(123)
    model = Block(tp=True)
    target = ts.sharded_state_dict(model)
    checkpoint.load_state_dict(target, checkpoint.FileSystemReader(path))
    ts.load_sharded_state_dict(model, target)
    # bit-identical to what was saved, parameter by parameter (names the one loaded wrongly and
    # the index range of the differing elements along each dimension)
    loaded = ts.collect_state_dict(model, model.state_dict())
    for k, v in trained.items():
        differ = (loaded[k] != v).nonzero()
        where = [(int(d.min()), int(d.max()) + 1) for d in differ.unbind(1)] if len(differ) else []
        close(loaded[k], v, 0, 0, f"rank {rank}: {k} loaded across hosts vs saved inside hosts (differ in {where})")
    probe = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        close(full_logits(model, probe), ref(probe), 1e-5, 1e-5, "checkpoint of TP inside hosts, loaded across")
    _train(model, ref, data, 6, "TP across hosts x DP inside hosts")
    print(f"rank {rank} on {socket.gethostname()}: TP {tp_hosts} x DP {dp_hosts} ok", flush=True)
    dist.barrier()
    destroy_process_group()


def loop(folder: str, stall_host: str) -> None:
    import torch.distributed.checkpoint as dcp

    from distkit_common import heartbeat
    from distkit_common.launch import launch_info
    from distkit_common.testing import collective_timeout
    from distx_fake import checkpoint

    here = socket.gethostname()

    class Writer(checkpoint.FileSystemWriter):
        """distx-fake's DCP writer, on ``stall_host`` slow to finish the save of ``STALL_STEP``."""

        stall = False

        def write_data(self, plan: Any, planner: Any) -> Any:
            done = super().write_data(plan, planner)
            if self.stall and here == stall_host:
                # shards written, nothing committed: the moment a lost host hurts most
                print(f"STALLED rank {dist.get_rank()} on {here}", flush=True)
                time.sleep(600)
            return done

    info = launch_info()
    dist.init_process_group("gloo", rank=info.rank, world_size=info.world_size, timeout=collective_timeout())
    torch.set_num_threads(1)
    ts.distributed.init_process_group(2)
    dp, dp_rank = ts.distributed.get_data_parallel_size(), ts.distributed.get_data_parallel_rank()
    rows = BATCH // dp
    torch.manual_seed(0)
    model = Block(tp=True)
    ddp = DDP(model, process_group=ts.distributed.get_data_parallel_group())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    data = batches()
    path = os.path.join(folder, "latest")
    with heartbeat.watch():
        for step in range(1, 10**6):
            inp, tgt = next(data)
            mine = slice(rows * dp_rank, rows * (dp_rank + 1))
            loss = lm_loss(ddp(inp[mine]), tgt[mine])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % SAVE_EVERY == 0:
                writer = Writer(path)
                writer.stall = step == STALL_STEP
                dcp.save(ts.sharded_state_dict(model), storage_writer=writer)
                if dist.get_rank() == 0:
                    print(f"CHECKPOINT step {step} saved", flush=True)
            if step > STALL_STEP:
                raise AssertionError(f"the save of step {STALL_STEP} completed although {stall_host} stalled")


def main() -> None:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--layouts", metavar="FOLDER")
    mode.add_argument("--loop", metavar="FOLDER")
    parser.add_argument("--stall-host", default="dkh2")
    args = parser.parse_args()
    if args.layouts:
        layouts(args.layouts)
    else:
        loop(args.loop, args.stall_host)


if __name__ == "__main__":
    main()
