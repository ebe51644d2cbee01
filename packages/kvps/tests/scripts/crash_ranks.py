"""One run of the crash series (distkit_common.testing.crash) under mpiexec: verify, save clean, save armed.

Usage: crash_ranks.py <checkpoint dir> <format: kvps | distx> [no-exchange] (commit as on a
filesystem without ``RENAME_EXCHANGE``: two renames). Generation g's server holds
key k's slot ``arange(len_k) + 1000 * k + g`` (float64, exact), so the generation that
loads is read from key 0 and verified bit for bit on every rank.
"""

from __future__ import annotations

import os
import sys
import traceback

import numpy as np
import torch
from mpi4py import MPI

import kvps
from distkit_common import collective, fsio
from distkit_common.testing import crash

PATH, FMT = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
NK = 3001
lengths = (1 + np.arange(NK) % 7).astype(np.int64)  # about 96 KiB of values
allk = np.arange(NK, dtype=np.int64)
total = int(lengths.sum())


def values(gen: int) -> torch.Tensor:
    return torch.cat([torch.arange(int(lengths[k]), dtype=torch.float64) + 1000.0 * k + gen for k in range(NK)])


def expected_files() -> set[str]:
    if FMT == "distx":
        return {"metadata.json", "rank0.bin"}
    return {"meta.json", "lengths.bin"} | {f"shard-{r}.{x}" for r in range(size) for x in ("keys", "vals")}


def main() -> None:
    writer = crash.Writer(rank)
    crash.audit_calls(fsio, "_native", ["fsync_path", "exchange_paths"])
    if sys.argv[3:] == ["no-exchange"]:
        fsio._native.exchange_paths = crash.audited(lambda a, b: False, "exchange_paths")
    kvps.setup(NK, 1, "none")
    server = kvps.Server(lengths, dtype=torch.float64)
    w = kvps.Worker(0, server)
    gen, error = None, None
    try:  # even where PATH is missing: the loader recovers a commit killed between its renames
        server.load(PATH, format=FMT)
        out = torch.zeros(total, dtype=torch.float64)
        w.pull(allk, out)
        gen = int(out[0].item())
        if not torch.equal(out, values(gen)):
            error = f"generation {gen} loads other values"
    except Exception:  # the test reports it as a torn checkpoint (a missing one: the test decides)
        if os.path.exists(PATH):
            error = traceback.format_exc()
    errors = collective.allgather_json(error, comm)  # one rank failed to load: all stop
    clean = 0 if gen is None else gen + 1
    mine = allk[allk % size == rank]
    w.set(mine, values(clean)[torch.from_numpy(np.repeat(np.isin(allk, mine), lengths))])
    w.barrier()
    if any(errors):
        writer.report(loaded=gen, error=error or "another rank failed", leftovers=[], clean=clean, armed=clean + 1)
        raise SystemExit(1)
    server.save(PATH, format=FMT)
    leftovers: list[str] = []
    if rank == 0:
        parent, name = os.path.split(PATH)
        leftovers = [n for n in os.listdir(parent) if n != name and n.startswith(name)]
        leftovers += [f"{name}/{n}" for n in sorted(set(os.listdir(PATH)) - expected_files())]
    writer.report(loaded=gen, error=error, leftovers=leftovers, clean=clean, armed=clean + 1)
    w.set(mine, values(clean + 1)[torch.from_numpy(np.repeat(np.isin(allk, mine), lengths))])
    w.barrier()
    os.fsync = crash.audited(os.fsync, "fsync")  # type: ignore[assignment]
    if FMT == "distx":
        from distx_fake.checkpoint import _engine, _metadata

        crash.audit_calls(_engine, "_native", ["write_pieces", "fsync_fd"])
        crash.audit_calls(_metadata, "_native", ["fsync_fd"])
    with writer.armed():
        server.save(PATH, format=FMT)
    server.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
