"""A typical wholemem training loop across hosts, for the fault tests of test_cluster.py.

An Embedding of the NCCL (DISTRIBUTED) type on the global communicator and a HOST
feature table on each host's communicator; every step gathers features, trains the
embedding (two all-to-alls across the hosts) and prints ``STEP n``; after a few steps
``LOOP RUNNING`` (where the fault is injected). The loop runs until the job is killed
or a collective fails; ``distkit_common.heartbeat`` ends a rank whose peers went silent.
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

import wholemem as wg
from distkit_common import heartbeat, launch
from distkit_common.testing import collective_timeout

N, D, B = 4096, 16, 256
LIMIT_S = 120  # a loop still running this long means the fault went unnoticed


def main() -> None:
    info = launch.launch_info()
    dist.init_process_group(
        "gloo", init_method="env://", rank=info.rank, world_size=info.world_size, timeout=collective_timeout()
    )
    wg.init_lib()
    world = wg.get_global_communicator()
    node = wg.get_local_node_communicator(world)
    features = wg.create_wm_tensor(node, [N, D], [], torch.float32, wg.WmTensorType.HOST)
    local, first = wg.get_local_tensor(features)
    local.copy_(torch.arange(first, first + local.shape[0], dtype=torch.float32)[:, None].expand(-1, D))
    node.barrier()
    emb = wg.Embedding(world, N, D, optimizer=wg.SGD(lr=0.01), tensor_type=wg.WmTensorType.DISTRIBUTED)
    g = torch.Generator().manual_seed(info.rank)
    start = time.monotonic()
    with heartbeat.watch():
        step = 0
        while time.monotonic() - start < LIMIT_S:
            step += 1
            idx = torch.randint(0, N, (B,), generator=g)
            x = wg.gather(features, idx)
            loss = ((emb(idx) - x / N) ** 2).mean()
            loss.backward()
            emb.step()
            print(f"STEP {step} rank {info.rank} on {socket.gethostname()}", flush=True)
            if step == 3 and info.rank == 0:
                print("LOOP RUNNING", flush=True)
            time.sleep(0.05)
    raise SystemExit(f"rank {info.rank}: the loop ran {LIMIT_S} s without noticing a fault")


if __name__ == "__main__":
    main()
