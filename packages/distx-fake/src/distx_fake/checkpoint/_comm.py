"""The ranks saving or loading together: rank, size, and JSON exchanged without pickle."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


class Comm:
    """A process group (or this process alone) with JSON all-gather and broadcast.

    Objects travel as UTF-8 JSON in byte tensors (never pickled): they are small dicts of
    ints and strings produced by this package.
    """

    def __init__(self, group: Any = None, *, alone: bool = False) -> None:
        self.on = not alone and dist.is_available() and dist.is_initialized()
        self.group = group
        self.rank = dist.get_rank(group) if self.on else 0
        self.size = dist.get_world_size(group) if self.on else 1
        self.device = torch.device("cpu")
        if self.on:
            pg = group if group is not None else dist.distributed_c10d._get_default_group()
            types = getattr(pg, "_device_types", None)
            if types and torch.device("cpu") not in types and torch.cuda.is_available():
                self.device = torch.device("cuda", torch.cuda.current_device())  # an NCCL-only group

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.on or self.size == 1:
            return [json.loads(json.dumps(obj))]
        dev = self.device
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.int64, device=dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self.size)]
        dist.all_gather(sizes, n, group=self.group)
        top = max(int(s) for s in sizes)
        buf = torch.zeros(top, dtype=torch.uint8)
        buf[: data.numel()] = data
        outs = [torch.empty(top, dtype=torch.uint8, device=dev) for _ in range(self.size)]
        dist.all_gather(outs, buf.to(dev), group=self.group)
        return [json.loads(bytes(o[: int(s)].cpu().numpy())) for o, s in zip(outs, sizes)]

    def broadcast(self, obj: Any) -> Any:
        """``obj`` of rank 0 on every rank."""
        if not self.on or self.size == 1:
            return obj
        return self.all_gather(obj if self.rank == 0 else None)[0]
