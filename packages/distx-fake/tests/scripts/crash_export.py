"""One run of the export crash series (distkit_common.testing.crash): verify, export clean, export armed.

Usage: crash_export.py <output folder>. Each generation's state dict (crash_writer.state) is saved
as a checkpoint beside the run's report, unarmed, and exported to the output folder in three
shards, over the previous export. The export that loads is read as Hugging Face loaders read it
(the index, then ``safetensors.torch.load_file`` of every file it names) and verified bit for bit.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
from crash_writer import SHAPES, state
from safetensors.torch import load_file

from distkit_common import fsio
from distkit_common.testing import crash
from distx_fake import checkpoint as cp
from distx_fake.checkpoint import _safetensors

PATH = sys.argv[1]
INDEX = "model.safetensors.index.json"
#: one shard per tensor of crash_writer.state (400 000, 300 000 and 1000 float64): 3 files
SHARD_BYTES = "1MB"


def indexed() -> dict[str, str]:
    with open(os.path.join(PATH, INDEX), encoding="utf-8") as f:
        weight_map: dict[str, str] = json.load(f)["weight_map"]
    return weight_map


def loaded() -> tuple[int | None, str | None]:
    """The generation of the export at PATH, verified (None when there is none), and why it is torn."""
    if not os.path.exists(os.path.join(PATH, INDEX)):
        return None, None  # the first run (after a kill the test fails: a generation was expected)
    try:
        weight_map = indexed()
        got: dict[str, torch.Tensor] = {}
        for fn in sorted(set(weight_map.values())):
            part = load_file(os.path.join(PATH, fn))
            if any(weight_map.get(k) != fn for k in part):
                return None, f"{fn} holds tensors its index puts elsewhere: {sorted(part)}"
            got.update(part)
    except Exception:  # the test reports it as a torn export
        return None, traceback.format_exc()
    if got.keys() != SHAPES.keys():
        return None, f"the index names {sorted(got)}, not {sorted(SHAPES)}"
    gen = int(got["bias"][0].item())  # element 0 of every tensor is the generation
    bad = [k for k, v in state(gen).items() if not torch.equal(got[k], v)]
    return gen, f"generation {gen} loads other values in {bad}" if bad else None


def leftovers() -> list[str]:
    parent, name = os.path.split(PATH)
    beside = [n for n in os.listdir(parent) if n != name and n.startswith(name)]
    files = set(indexed().values()) | {INDEX}
    return beside + [f"{name}/{n}" for n in sorted(os.listdir(PATH)) if n not in files]


def main() -> None:
    writer = crash.Writer(0)
    # native steps: the data writes and fsyncs, the folder fsyncs
    crash.audit_calls(_safetensors, "_native", ["copy_pieces", "fsync_fd"])
    crash.audit_calls(fsio, "_native", ["fsync_path"])
    gen, error = loaded()
    clean = 0 if gen is None else gen + 1
    sources = {}
    for g, tag in ((clean, "clean"), (clean + 1, "armed")):  # the checkpoints to export, saved unarmed
        sources[g] = f"{writer.spec['report']}.src-{tag}"
        cp.save_state_dict(state(g), cp.FileSystemWriter(sources[g]), no_dist=True)
    cp.export_safetensors(sources[clean], PATH, max_shard_size=SHARD_BYTES)
    writer.report(loaded=gen, error=error, leftovers=leftovers(), clean=clean, armed=clean + 1)
    with writer.armed():
        cp.export_safetensors(sources[clean + 1], PATH, max_shard_size=SHARD_BYTES)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
