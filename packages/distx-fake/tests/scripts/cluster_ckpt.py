"""Checkpoint jobs across simulated hosts (run by tests/test_cluster.py through ``run_cluster``).

Every rank opens a gloo group (``env://``: rank and size from the launcher, ``MASTER_ADDR`` the
first host) under the distkit heartbeat, so a lost host ends the job with its name.

``save PATH``: the ranks save the state of ``ckpt_workers.state`` (DTensor shards, uneven
LocalShards, replicated tensors) into PATH; before that, the stale-temporary-folder cleanup is
checked across hosts (see :class:`StaleFolders`).

``load PATH``: the ranks (any number, on any hosts) load PATH and compare every value.

``fault PATH --stall-host H``: save a first checkpoint, then a second one with other values in
which the ranks on host H stop in the middle of writing their file, printing ``STALLED
MID-WRITE``; the test then kills them or cuts H off.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from distkit_common import collective, fsio, heartbeat, launch_info
from distkit_common.testing import collective_timeout
from distx_fake import checkpoint as cp
from distx_fake.checkpoint import _engine, _saver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_workers

#: a temporary folder's writer: claims it, says so, then lives until its stdin closes
WRITER = (
    "import sys; from distkit_common import fsio; fsio.claim(sys.argv[1], int(sys.argv[2])); "
    "print('claimed', flush=True); sys.stdin.read()"
)


def say(text: str) -> None:
    # one write per line: the ranks of a host share the launcher's pipe
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def spawn_writer(tmp: str, rank: int, *, own_pid_namespace: bool = False) -> subprocess.Popen[str]:
    """A process on this host that claims ``tmp`` and stays alive until its stdin closes.

    With ``own_pid_namespace`` it runs in a pid namespace of its own, as a process on a real
    other host would: its recorded pid means nothing (or another process) on the other hosts,
    which share this machine's process table in the simulation.
    """
    os.makedirs(tmp)
    cmd = [sys.executable, "-c", WRITER, tmp, str(rank)]
    if own_pid_namespace:
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "claimed", tmp
    return p


def end_writer(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    assert p.wait(timeout=30) == 0


class StaleFolders:
    """``fsio.clean_stale`` across hosts; rank 0 runs on the first host, rank ``size - 1`` on another.

    Temporary siblings of the checkpoint, made before the save:

    - ``alive``: a writer alive on the other host, in its own pid namespace (its pid names
      another process, or none, here);
    - ``gone_there``: a writer that claimed it on the other host and exited;
    - ``gone_here``: a writer that claimed it on rank 0's host and exited.

    Rank 0 may remove only ``gone_here`` (``save_state_dict`` cleans up before it writes);
    the other host removes ``gone_there`` and, once its writer ended, ``alive`` itself.
    """

    def __init__(self, path: str, rank: int, size: int) -> None:
        self.path, self.rank, self.other = path, rank, size - 1
        self.names = {k: fsio.temporary_sibling(path, k.replace("_", "")) for k in ("alive", "gone_there", "gone_here")}
        self.writer: subprocess.Popen[str] | None = None
        if rank == self.other:
            self.writer = spawn_writer(self.names["alive"], rank, own_pid_namespace=True)
            end_writer(spawn_writer(self.names["gone_there"], rank))
        if rank == 0:
            end_writer(spawn_writer(self.names["gone_here"], 0))
        dist.barrier()

    def check_after_save(self) -> None:
        hosts = collective.allgather_json(socket.gethostname())
        assert hosts[0] != hosts[self.other], hosts
        if self.rank == 0:
            assert not os.path.exists(self.names["gone_here"])  # removed by save_state_dict
            assert os.path.isdir(self.names["alive"]) and os.path.isdir(self.names["gone_there"])
            assert fsio.clean_stale(self.path) == []  # another host's folders, dead or alive, stay
            say(f"stale: rank 0 on {hosts[0]} kept both folders of {hosts[self.other]}")
        dist.barrier()
        if self.writer is not None:
            # (while it lives, this host must not look: the simulated hosts share one process
            # table, so the pid the writer recorded in its own namespace names another process)
            end_writer(self.writer)
            assert sorted(fsio.clean_stale(self.path)) == sorted([self.names["alive"], self.names["gone_there"]])
            say(f"stale: rank {self.rank} on {hosts[self.rank]} removed its own dead writers' folders")
        dist.barrier()


def check_loaded(sd: dict[str, Any], rank: int, size: int, offset: float = 0.0) -> None:
    g = {k: v + offset if v.is_floating_point() else v for k, v in ckpt_workers.global_tensors().items()}
    m = sd["model"]
    assert torch.equal(m["dt"].full_tensor(), g["dt"])
    assert torch.equal(m["dt_rep"].to_local(), g["dt_rep"])
    lo, hi = ckpt_workers.split(ckpt_workers.ROWS_LS, size, rank)
    assert torch.equal(m["ls"].tensor, g["ls"][lo:hi])
    assert torch.equal(m["rep"][0], g["rep_a"]) and torch.equal(m["rep"][1], g["rep_b"])
    assert torch.equal(m["rep"][2]["c"], g["rep_c"])
    assert sd["step"] == 17 and sd["name"] == "run-1"


def shifted(sd: dict[str, Any], offset: float) -> dict[str, Any]:
    """The same layout with every floating-point value moved by ``offset`` (a later step)."""

    def move(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        if isinstance(v, list):
            return [move(x) for x in v]
        if isinstance(v, cp.LocalShard):
            return cp.LocalShard(move(v.tensor), v.global_shape, v.offsets)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v + offset
        return v

    out = move(sd)
    out["step"] = 18
    return out


def stall_mid_write(host: str) -> None:
    """On ``host``, stop every rank's save after the first chunk of its file reached the disk."""
    if socket.gethostname() != host:
        return
    _engine.BATCH_BYTES = 1  # every chunk is written before the next one is asked for
    real = _saver.write_chunks

    def items_then_stall(items: Any) -> Iterator[Any]:
        it = iter(items)
        yield next(it)
        say(f"STALLED MID-WRITE rank {dist.get_rank()} on {host}")
        time.sleep(600)  # until the fault ends this process
        yield from it

    def write_chunks(fname: str, items: Any, **kw: Any) -> Any:
        return real(fname, items_then_stall(items), **kw)

    _saver.write_chunks = write_chunks  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "load", "fault"])
    parser.add_argument("path")
    parser.add_argument("--stall-host", default="")
    args = parser.parse_args()
    info = launch_info()
    dist.init_process_group(
        "gloo", init_method="env://", rank=info.rank, world_size=info.world_size, timeout=collective_timeout()
    )
    rank, size = dist.get_rank(), dist.get_world_size()
    with heartbeat.watch():
        mesh = init_device_mesh("cpu", (size,))
        if args.mode == "save":
            stale = StaleFolders(args.path, rank, size)
            cp.save_state_dict(ckpt_workers.state(rank, size, mesh, True), cp.FileSystemWriter(args.path))
            stale.check_after_save()
            say(f"saved rank {rank} of {size} on {socket.gethostname()}")
        elif args.mode == "load":
            sd = ckpt_workers.state(rank, size, mesh, False)
            cp.load_state_dict(sd, cp.FileSystemReader(args.path))
            check_loaded(sd, rank, size)
            say(f"loaded equal rank {rank} of {size} on {socket.gethostname()}")
        else:
            sd = ckpt_workers.state(rank, size, mesh, True)
            cp.save_state_dict(sd, cp.FileSystemWriter(args.path))
            dist.barrier()
            if rank == 0:
                say("SAVED PREVIOUS")
            stall_mid_write(args.stall_host)
            cp.save_state_dict(shifted(sd, 1000.0), cp.FileSystemWriter(args.path))
            say(f"rank {rank}: the second save completed although it should have stalled")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
