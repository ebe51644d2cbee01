"""Save a large state dict to argv[1] (to be SIGKILLed mid-save by the test)."""

from __future__ import annotations

import sys

import torch

from distx_fake import checkpoint as cp

if __name__ == "__main__":
    sd = {f"t{i}": torch.full((8 << 20,), float(i + 100)) for i in range(12)}  # 12 x 32 MiB
    print("ready", flush=True)
    cp.save_state_dict(sd, cp.FileSystemWriter(sys.argv[1], piece_bytes=1 << 20))
    print("done", flush=True)
