"""Job for test_cluster: every rank reports where it runs and an exact all_reduce sum (gloo, torchrun).

--loop: all_reduce under the distkit heartbeat until killed, rank 0 printing LOOP RUNNING
once under way (fault tests).
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from distkit_common import heartbeat
from distkit_common.testing import collective_timeout

parser = argparse.ArgumentParser()
parser.add_argument("--loop", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=collective_timeout())
rank, size = dist.get_rank(), dist.get_world_size()
x = torch.full((1024,), float(rank + 1), dtype=torch.float64)
dist.all_reduce(x)
# one write per line: ranks of a host share the launcher's pipe, and two-part writes interleave
sys.stdout.write(
    f"rank {rank} size {size} host {socket.gethostname()} local {os.environ['LOCAL_RANK']} "
    f"master {os.environ['MASTER_ADDR']} sum {int(x[0])} exact {bool((x == size * (size + 1) / 2).all())}\n"
)
sys.stdout.flush()
if args.loop:
    y = torch.ones(1024)
    with heartbeat.watch():
        for i in range(10**9):
            z = y.clone()
            dist.all_reduce(z)
            if i == 100 and rank == 0:
                print("LOOP RUNNING", flush=True)
            time.sleep(0.005)
dist.destroy_process_group()
