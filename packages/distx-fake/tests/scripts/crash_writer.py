"""Forks one checkpoint writer per line of stdin, for test_checkpoint's crash test.

torch is imported once, here; each line ``<path> <generation>`` forks a child that saves
:func:`state` of that generation to ``<path>`` and exits. This process prints the child's pid
(the test SIGKILLs it at a random moment of its save), then ``<status> <seconds>`` once the child
has ended: ``exit <code>`` or ``signal <number>``, and how long the child ran.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from distx_fake import checkpoint as cp

#: tensors of the state dict and their elements: about 3 MiB, written in 256 KiB pieces
SHAPES = {"w": 400_000, "emb": 300_000, "bias": 1000}


def state(generation: int) -> dict[str, torch.Tensor]:
    """The state dict of one generation: every element is a closed form of the generation."""
    return {name: torch.arange(n, dtype=torch.float64) * (generation + 1) + generation for name, n in SHAPES.items()}


def main() -> None:
    for line in sys.stdin:
        path, gen = line.split()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the writer: nothing but the save, then out without cleanup
            try:
                cp.save_state_dict(state(int(gen)), cp.FileSystemWriter(path, piece_bytes=256 << 10))
            except BaseException as e:  # a failed save is a failed trial
                print(f"writer failed: {e!r}", file=sys.stderr, flush=True)
                os._exit(1)
            os._exit(0)
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        took = time.monotonic() - t0
        if os.WIFSIGNALED(status):
            print(f"signal {os.WTERMSIG(status)} {took:.6f}", flush=True)
        else:
            print(f"exit {os.WEXITSTATUS(status)} {took:.6f}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
