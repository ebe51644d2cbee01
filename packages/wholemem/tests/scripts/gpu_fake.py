"""A host-memory stand-in for wholemem's CUDA backend (tests only).

"Device" allocations are shared-memory segments, an "IPC handle" is the segment's name,
opening a handle maps the segment, and row tables stay on the host. The GPU-resident
code paths of wholemem (collective IPC exchange, chunk tables over mapped peer chunks,
the torch-op routing of GPU NCCL tensors, host registration, the lifetime rules) then
run on CPU-only machines and their results can be checked exactly. Every call is
counted so tests can assert what was allocated, mapped, closed and freed.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from typing import Any

import torch

from wholemem._gpu import Backend
from wholemem._wholemem import Segment


class FakeGpuBackend(Backend):
    on_device = False  # tables hold host addresses: the CPU row code runs

    def __init__(self) -> None:
        self.own: dict[int, Any] = {}  # address -> Segment allocated here
        self.opened: dict[int, Any] = {}  # address -> Segment mapped from a peer
        self.registered: dict[int, int] = {}  # host_register'ed address -> bytes
        self.calls: Counter[str] = Counter()
        self.freed: list[int] = []

    def require(self, what: str) -> None:
        self.calls["require"] += 1

    def resolve(self, device: torch.device) -> torch.device:
        assert device.type == "cuda", device
        return torch.device("cpu")

    def alloc(self, nbytes: int, device: torch.device) -> int:
        self.calls["alloc"] += 1
        seg = Segment.create(nbytes)  # zero-filled, like device_alloc
        self.own[int(seg.address)] = seg
        return int(seg.address)

    def free(self, ptr: int, device: torch.device) -> None:
        self.calls["free"] += 1
        seg = self.own.pop(ptr)
        if seg.linked:
            seg.unlink()
        self.freed.append(ptr)

    def ipc_export(self, ptr: int) -> bytes:
        seg = self.own[ptr]
        return f"{seg.name}:{seg.size}".encode()

    def ipc_open(self, handle: bytes, device: torch.device) -> int:
        self.calls["ipc_open"] += 1
        name, size = handle.decode().rsplit(":", 1)
        seg = Segment.open(name, int(size))
        self.opened[int(seg.address)] = seg
        return int(seg.address)

    def ipc_close(self, ptr: int) -> None:
        self.calls["ipc_close"] += 1
        del self.opened[ptr]

    def as_tensor(self, ptr: int, nbytes: int, device: torch.device, owner: Any) -> torch.Tensor:
        buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
        buf.owner = owner  # type: ignore[attr-defined]  # the tensor keeps the owner alive
        return torch.frombuffer(buf, dtype=torch.uint8)

    def stream(self, device: torch.device) -> int:
        return 0

    def synchronize(self) -> None:
        self.calls["synchronize"] += 1

    def host_register(self, addr: int, nbytes: int, device: torch.device) -> int:
        self.calls["host_register"] += 1
        assert addr not in self.registered, "registered twice"
        self.registered[addr] = nbytes
        return addr  # unified addressing: the device sees the same address

    def host_unregister(self, addr: int) -> None:
        self.calls["host_unregister"] += 1
        del self.registered[addr]

    def unlink_all(self) -> None:
        """After every rank mapped the chunks: remove their names (no /dev/shm leftovers)."""
        for seg in self.own.values():
            if seg.linked:
                seg.unlink()
