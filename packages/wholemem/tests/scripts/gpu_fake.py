"""A host-memory stand-in for wholemem's CUDA backend (tests only).

"Device" allocations are shared-memory segments, an "IPC handle" is the segment's name,
opening a handle maps the segment, and row tables stay on the host. The GPU-resident
code paths of wholemem (device binding, collective IPC exchange, chunk tables over
mapped peer chunks, reference-counted chunk lifetimes, the torch-op routing of GPU NCCL
tensors, host registration, barrier synchronisation) then run on CPU-only machines and
their results can be checked exactly. Tensors over raw memory go through the same DLPack
capsule as on a GPU (with a CPU device). Every call is counted so tests can assert what
was allocated, mapped, closed, synchronised and freed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from wholemem import _wholemem
from wholemem._gpu import Backend
from wholemem._wholemem import Segment


class FakeGpuBackend(Backend):
    on_device = False  # tables hold host addresses: the CPU row code runs

    def __init__(self, count: int = 1, current: int = 0, initialized: bool = False) -> None:
        self.own: dict[int, Any] = {}  # address -> Segment allocated here
        self.opened: dict[int, Any] = {}  # address -> Segment mapped from a peer
        self.registered: dict[int, int] = {}  # host_register'ed address -> bytes
        self.calls: Counter[str] = Counter()
        self.freed: list[int] = []
        self.synced: list[torch.device] = []
        self.count, self.current, self.initialized = count, current, initialized
        self.bound: list[int] = []  # set_device calls

    def require(self, what: str) -> None:
        self.calls["require"] += 1

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> tuple[int, bool]:
        return self.current, self.initialized

    def set_device(self, index: int) -> None:
        self.bound.append(index)
        self.current, self.initialized = index, True

    def device(self, index: int) -> torch.device:
        return torch.device("cpu")  # "device" memory is host memory here

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

    def ipc_close(self, ptr: int, device: torch.device) -> None:
        self.calls["ipc_close"] += 1
        del self.opened[ptr]

    def as_tensor(self, ptr: int, nbytes: int, device: torch.device, owner: Any) -> torch.Tensor:
        cap = _wholemem.bytes_as_dlpack(ptr, nbytes, _wholemem.DLPACK_CPU, 0, owner)
        return torch.from_dlpack(cap)

    def stream(self, device: torch.device) -> int:
        return 0

    def synchronize(self, device: torch.device) -> None:
        self.calls["synchronize"] += 1
        self.synced.append(device)

    def check_indices(self, idx: torch.Tensor, nrows: int) -> None:
        bad = (idx < 0) | (idx >= nrows)
        if bool(bad.any()):
            pos = int(torch.nonzero(bad)[0, 0])
            raise IndexError(f"index {int(idx[pos])} at position {pos} is out of range for {nrows} rows")

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
