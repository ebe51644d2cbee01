"""One run of the crash series (distkit_common.testing.crash): verify, save clean, save armed.

Usage: crash_ranks.py <checkpoint dir> [no-exchange], alone or under ``mpiexec -n N`` (then a
gloo group over a FileStore beside the run's report). ``no-exchange`` commits as on a filesystem
without ``RENAME_EXCHANGE`` (two renames). Every generation's state dict is a closed form
(crash_writer.state), so the generation that loads is verified bit for bit; on N ranks the
tensors are replicated, so each rank writes its share into its own ``rank<r>.bin``.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
from crash_writer import SHAPES, state

from distkit_common import fsio
from distkit_common.testing import crash
from distx_fake import checkpoint as cp
from distx_fake.checkpoint import _engine, _metadata

PATH = sys.argv[1]
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
SIZE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def loaded() -> tuple[int | None, str | None]:
    """The generation at PATH, verified (None when there is no checkpoint), and why it is torn."""
    out = {k: torch.zeros(n, dtype=torch.float64) for k, n in SHAPES.items()}
    try:  # even where PATH is missing: the loader recovers a commit killed between its renames
        cp.load_state_dict(out, cp.FileSystemReader(PATH))
    except FileNotFoundError:  # no checkpoint (the first run; after a kill the test fails)
        return None, None
    except Exception:  # the test reports it as a torn checkpoint
        return None, traceback.format_exc()
    gen = int(out["bias"][0].item())  # element 0 of every tensor is the generation
    bad = [k for k, v in state(gen).items() if not torch.equal(out[k], v)]
    return gen, f"generation {gen} loads other values in {bad}" if bad else None


def save(gen: int) -> None:
    cp.save_state_dict(state(gen), cp.FileSystemWriter(PATH, piece_bytes=256 << 10))


def leftovers() -> list[str]:
    parent, name = os.path.split(PATH)
    beside = [n for n in os.listdir(parent) if n != name and n.startswith(name)]
    files = {f"rank{r}.bin" for r in range(SIZE)} | {"metadata.json"}
    return beside + [f"{name}/{n}" for n in sorted(os.listdir(PATH)) if n not in files]


def main() -> None:
    writer = crash.Writer(RANK)
    # native steps: the data writes and fsyncs, the directory fsync and exchange
    crash.audit_calls(_engine, "_native", ["write_pieces", "fsync_fd"])
    crash.audit_calls(_metadata, "_native", ["fsync_fd"])
    crash.audit_calls(fsio, "_native", ["fsync_path", "exchange_paths"])
    if sys.argv[2:] == ["no-exchange"]:
        fsio._native.exchange_paths = crash.audited(lambda a, b: False, "exchange_paths")
    if SIZE > 1:
        store = dist.FileStore(writer.spec["report"] + ".store", SIZE)
        dist.init_process_group("gloo", store=store, rank=RANK, world_size=SIZE)
    gen, error = loaded()
    clean = 0 if gen is None else gen + 1
    save(clean)
    if SIZE > 1:
        dist.barrier()
    writer.report(loaded=gen, error=error, leftovers=leftovers() if RANK == 0 else [], clean=clean, armed=clean + 1)
    with writer.armed():
        save(clean + 1)
    if SIZE > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
