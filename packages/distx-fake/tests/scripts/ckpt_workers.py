"""Bodies of the multi-rank checkpoint tests (run through distkit_common.testing.run_spawn)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from distkit_common.testing import init_process_group
from distx_fake import checkpoint as cp

ROWS_DT, ROWS_LS = 10, 11


def global_tensors() -> dict[str, torch.Tensor]:
    return {
        "dt": torch.arange(ROWS_DT * 6, dtype=torch.float32).reshape(ROWS_DT, 6),
        "dt_rep": torch.arange(12, dtype=torch.int64).reshape(3, 4) * 7,
        "ls": (torch.arange(ROWS_LS * 5, dtype=torch.float64).reshape(ROWS_LS, 5) / 3),
        "rep_a": torch.linspace(0, 1, 1000),
        "rep_b": torch.arange(64, dtype=torch.int16),
        "rep_c": torch.ones(5, 5, dtype=torch.bfloat16) * 2,
    }


def split(rows: int, size: int, rank: int) -> tuple[int, int]:
    """An uneven split: rank r gets rows [lo, hi)."""
    bounds = [round(rows * (r / size) ** 1.3) for r in range(size + 1)]
    return bounds[rank], bounds[rank + 1]


def state(rank: int, size: int, mesh: object, fill: bool) -> dict[str, object]:
    g = global_tensors()
    src = g if fill else {k: torch.zeros_like(v) for k, v in g.items()}
    lo, hi = split(ROWS_LS, size, rank)
    return {
        "model": {
            "dt": distribute_tensor(src["dt"], mesh, [Shard(0)]),
            "dt_rep": distribute_tensor(src["dt_rep"], mesh, [Replicate()]),
            "ls": cp.LocalShard(src["ls"][lo:hi].clone(), (ROWS_LS, 5), (lo, 0)),
            "rep": [src["rep_a"], src["rep_b"], {"c": src["rep_c"]}],
        },
        "step": 17 if fill else 0,
        "name": "run-1" if fill else "",
    }


def save_on_two_load_on_three_body(rank: int, size: int, store: str, path: str) -> None:
    """Ranks 0 and 1 save through their own group and mesh; then all 3 ranks load.

    One 3-process job for both halves: process starts dominate the cost of these tests.
    """
    init_process_group(rank, size, store)
    savers = [0, 1]
    mesh = DeviceMesh("cpu", savers)  # collective: every rank creates the savers' groups
    pair = dist.new_group(savers, backend="gloo")
    if rank in savers:
        save(rank, len(savers), path, mesh, pair)
    dist.barrier()
    load(rank, size, path, init_device_mesh("cpu", (size,)))
    dist.destroy_process_group()


def save(rank: int, size: int, path: str, mesh: object, group: object) -> None:
    sd = state(rank, size, mesh, True)
    cp.save_state_dict(sd, cp.FileSystemWriter(path), process_group=group)
    # async save of the same state into a second checkpoint, with the tensors modified
    # right after the call returns: the checkpoint must hold the values at call time
    fut = cp.async_save_state_dict(sd, cp.FileSystemWriter(path + "-async"), process_group=group)
    sd["model"]["rep"][0].add_(100.0)
    sd["model"]["ls"].tensor.zero_()
    assert fut.result(timeout=300) is None
    dist.barrier(group=group)
    if rank == 0:
        with open(os.path.join(path, "metadata.json")) as f:
            meta = json.load(f)
        by = {tuple(e["path"]): e for e in meta["entries"]}
        assert meta["world_size"] == size
        # replicated tensors (plain or DTensor Replicate) are written exactly once
        for key in (("model", "rep", 0), ("model", "rep", 1), ("model", "rep", 2, "c"), ("model", "dt_rep")):
            assert len(by[key]["chunks"]) == 1, key
        assert len(by[("model", "dt")]["chunks"]) == size
        assert len(by[("model", "ls")]["chunks"]) == size
        files = {c["file"] for e in meta["entries"] if e["kind"] == "tensor" for c in e["chunks"]}
        assert files == {f"rank{r}.bin" for r in range(size)}, files  # every rank wrote its shards
        assert by[("step",)]["value"] == 17


def load(rank: int, size: int, path: str, mesh: object) -> None:
    g = global_tensors()
    for p in (path, path + "-async"):
        sd = state(rank, size, mesh, False)
        cp.load_state_dict(sd, cp.FileSystemReader(p))
        m = sd["model"]
        assert torch.equal(m["dt"].full_tensor(), g["dt"])  # type: ignore[attr-defined]
        assert torch.equal(m["dt_rep"].to_local(), g["dt_rep"])  # type: ignore[attr-defined]
        lo, hi = split(ROWS_LS, size, rank)
        assert torch.equal(m["ls"].tensor, g["ls"][lo:hi])  # type: ignore[attr-defined]
        assert torch.equal(m["rep"][0], g["rep_a"])  # type: ignore[index]
        assert torch.equal(m["rep"][1], g["rep_b"])  # type: ignore[index]
        assert torch.equal(m["rep"][2]["c"], g["rep_c"])  # type: ignore[index]
        assert sd["step"] == 17 and sd["name"] == "run-1"
