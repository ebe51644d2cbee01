"""Bodies of the DCP-through-distkit-storage tests (run through distkit_common.testing.run_spawn).

A two-layer MLP, tensor parallel over a CPU device mesh (column- then row-parallel, uneven on
3 ranks), trained a few steps with Adam; its model and optimizer state go through
``torch.distributed.checkpoint`` with distx-fake's ``FileSystemWriter`` / ``FileSystemReader``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from distkit_common.testing import init_process_group
from distx_fake import checkpoint as cp

STEPS = 3


class AppState(Stateful):
    """The DCP tutorial's pattern: model and optimizer state keyed by parameter names."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt

    def state_dict(self) -> dict[str, Any]:
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def build(seed: int, mesh: Any = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    if mesh is not None:
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(123)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g)  # the same batch on every rank (tensor parallel)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def full(sd: Any) -> Any:
    """A copy of a (nested) state dict with every DTensor as a full tensor."""
    if isinstance(sd, dict):
        return {k: full(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [full(v) for v in sd]
    if isinstance(sd, DTensor):
        return sd.full_tensor().clone()  # a Replicate DTensor's full tensor is its (live) local one
    if isinstance(sd, torch.Tensor):
        return sd.clone()
    return sd


def zeros_like(sd: Any) -> Any:
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [zeros_like(v) for v in sd]
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    return sd


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (where, a.keys(), b.keys())
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}.{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, (where, a, b)


def save_on_two_load_on_three_body(rank: int, size: int, store: str, path: str) -> None:
    """Ranks 0 and 1 save (their own 2-rank mesh and groups); then all 3 ranks load.

    One 3-process job for both halves: process starts dominate the cost of these tests.
    """
    init_process_group(rank, size, store)
    savers = [0, 1]
    # every rank takes part in creating the savers' groups (new_group is collective)
    mesh = DeviceMesh("cpu", savers)
    pair = dist.new_group(savers, backend="gloo")
    side = dist.new_group(savers, backend="gloo")
    if rank in savers:
        save(path, mesh, pair, side)
    dist.barrier()
    load_and_check(path, init_device_mesh("cpu", (size,)))
    dist.destroy_process_group()


def save(path: str, mesh: Any, group: Any, side: Any) -> None:
    model, opt = build(0, mesh)
    train(model, opt, STEPS)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "step": STEPS}, storage_writer=cp.FileSystemWriter(path), process_group=group)
    # async_save through the same storage: the values at call time are saved; its collectives
    # run on their own group so they never interleave with training's
    fut = dcp.async_save(
        {"app": AppState(model, opt)}, storage_writer=cp.FileSystemWriter(path + "-async"), process_group=side
    )
    reference = {"model": full(msd), "optim": full(osd)}
    train(model, opt, 1)  # training goes on while the async save runs
    fut.result()
    if dist.get_rank() == 0:  # the full state, for the loaders to compare with
        cp.save_state_dict(reference, cp.FileSystemWriter(path + "-ref"), no_dist=True)


def reference(path: str, like: Any) -> Any:
    ref = zeros_like(like)
    cp.load_state_dict(ref, cp.FileSystemReader(path + "-ref"), no_dist=True)
    return ref


def load_and_check(path: str, mesh: Any, **kw: Any) -> None:
    for p in (path, path + "-async"):
        model, opt = build(7, mesh)  # other initial values; uneven shards on 3 ranks
        if p == path:  # plain state dicts
            msd, osd = get_state_dict(model, opt)  # (DCP initializes the Adam state with zeros)
            sd: dict[str, Any] = {"model": msd, "optim": osd, "step": 0}
            dcp.load(sd, storage_reader=cp.FileSystemReader(p), **kw)
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            assert sd["step"] == STEPS
        else:  # a Stateful object
            dcp.load({"app": AppState(model, opt)}, storage_reader=cp.FileSystemReader(p), **kw)
        msd, osd = get_state_dict(model, opt)
        got = {"model": full(msd), "optim": full(osd)}
        assert_same(reference(path, got), got, p)
