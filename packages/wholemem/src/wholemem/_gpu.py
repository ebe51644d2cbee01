"""The CUDA backend: every call wholemem makes into CUDA goes through a :class:`Backend`.

:class:`CudaBackend` is the real one: ``cudaMalloc`` / CUDA IPC / ``cudaHostRegister`` /
device synchronisation from wholemem's extension, tensors over raw device memory as
DLPack capsules (placed on the device this rank computes on, see
``csrc/dlpack_bytes.hpp``), and torch's current stream for every kernel. Tests swap in a
host-memory backend (``tests/scripts/gpu_fake.py``) to run the same collective exchange,
routing and lifetime logic on CPU-only machines.

This module also remembers which devices this process ran work on, so that
:meth:`WholeMemoryCommunicator.barrier` can wait for all of them (:func:`synchronize_used`).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _wholemem as _native


class Backend:
    """How GPU storage is made, shared and addressed (see the module docstring)."""

    #: whether row tables hold device addresses (CUDA kernels) or host addresses
    on_device = True

    def require(self, what: str) -> None:
        """Raise ``RuntimeError`` saying why ``what`` cannot run here."""
        raise NotImplementedError

    def device_count(self) -> int:
        """Number of visible devices."""
        raise NotImplementedError

    def current_device(self) -> tuple[int, bool]:
        """(torch's current device index, whether torch initialised CUDA in this process)."""
        raise NotImplementedError

    def set_device(self, index: int) -> None:
        """Make ``index`` torch's current device (binds this rank to it)."""
        raise NotImplementedError

    def device(self, index: int) -> torch.device:
        """The torch device tensors on GPU ``index`` have."""
        return torch.device("cuda", index)

    def alloc(self, nbytes: int, device: torch.device) -> int:
        """Zero-filled memory, complete before return (peers may read it at once)."""
        raise NotImplementedError

    def free(self, ptr: int, device: torch.device) -> None:
        raise NotImplementedError

    def ipc_export(self, ptr: int) -> bytes:
        raise NotImplementedError

    def ipc_open(self, handle: bytes, device: torch.device) -> int:
        raise NotImplementedError

    def ipc_close(self, ptr: int, device: torch.device) -> None:
        raise NotImplementedError

    def as_tensor(self, ptr: int, nbytes: int, device: torch.device, owner: Any) -> torch.Tensor:
        """A uint8 tensor over ``[ptr, ptr + nbytes)`` on ``device`` that keeps ``owner`` alive."""
        raise NotImplementedError

    def stream(self, device: torch.device) -> int:
        """The stream handle row kernels run on (torch's current stream)."""
        raise NotImplementedError

    def synchronize(self, device: torch.device) -> None:
        """Wait for the work of this process on ``device``."""

    def check_indices(self, idx: torch.Tensor, nrows: int) -> None:
        """IndexError naming the first entry of the device-resident ``idx`` outside ``[0, nrows)``."""
        raise NotImplementedError

    def host_register(self, addr: int, nbytes: int, device: torch.device) -> int:
        raise NotImplementedError

    def host_unregister(self, addr: int) -> None:
        raise NotImplementedError


class CudaBackend(Backend):
    """The real backend: wholemem's CUDA helpers and torch's CUDA runtime."""

    def require(self, what: str) -> None:
        if not _native.cuda_compiled():
            raise RuntimeError(f"{what} needs CUDA, and this build of wholemem was compiled without nvcc")
        if not torch.cuda.is_available() or _native.cuda_device_count() == 0:
            raise RuntimeError(
                f"{what} needs a CUDA GPU, and none is visible (torch.cuda.is_available() is False); "
                "use WmTensorType.HOST, CHUNKED or NCCL on the CPU (device='cpu') on CPU-only machines"
            )

    def device_count(self) -> int:
        return int(torch.cuda.device_count())

    def current_device(self) -> tuple[int, bool]:
        if not torch.cuda.is_initialized():
            return 0, False
        return int(torch.cuda.current_device()), True

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def alloc(self, nbytes: int, device: torch.device) -> int:
        return int(_native.device_alloc(nbytes, _index(device)))

    def free(self, ptr: int, device: torch.device) -> None:
        _native.device_free(ptr, _index(device))

    def ipc_export(self, ptr: int) -> bytes:
        return bytes(_native.ipc_get_handle(ptr))

    def ipc_open(self, handle: bytes, device: torch.device) -> int:
        return int(_native.ipc_open_handle(handle, _index(device)))

    def ipc_close(self, ptr: int, device: torch.device) -> None:
        _native.ipc_close_handle(ptr, _index(device))

    def as_tensor(self, ptr: int, nbytes: int, device: torch.device, owner: Any) -> torch.Tensor:
        cap = _native.bytes_as_dlpack(ptr, nbytes, _native.DLPACK_CUDA, _index(device), owner)
        t = torch.from_dlpack(cap)
        if t.device != device or (nbytes and t.data_ptr() != ptr):  # never a silent copy
            raise RuntimeError(f"wholemem: torch could not wrap memory at {ptr:#x} as a {device} tensor")
        return t

    def stream(self, device: torch.device) -> int:
        return int(torch.cuda.current_stream(device).cuda_stream)

    def synchronize(self, device: torch.device) -> None:
        # the extension's own runtime call: it works whether or not torch initialised CUDA
        _native.device_synchronize(_index(device))

    def check_indices(self, idx: torch.Tensor, nrows: int) -> None:
        if idx.numel():
            _native.check_indices_device(
                int(idx.data_ptr()),
                idx.dtype == torch.int64,
                int(idx.numel()),
                int(nrows),
                _index(idx.device),
                self.stream(idx.device),
            )

    def host_register(self, addr: int, nbytes: int, device: torch.device) -> int:
        return int(_native.host_register(addr, nbytes, _index(device)))

    def host_unregister(self, addr: int) -> None:
        _native.host_unregister(addr)


def _index(device: torch.device) -> int:
    return -1 if device.index is None else int(device.index)


_BACKEND: list[Backend] = [CudaBackend()]


def backend() -> Backend:
    """The backend new GPU tensors use."""
    return _BACKEND[0]


def set_backend(b: Backend) -> Backend:
    """Install ``b`` for new GPU tensors (tests); returns the previous backend."""
    old = _BACKEND[0]
    _BACKEND[0] = b
    _USED.clear()
    return old


# Devices this process made wholemem tensors, views or tables on.
_USED: dict[torch.device, Backend] = {}


def note_used(device: torch.device, be: Backend) -> None:
    """Remember that this process runs work on ``device`` (see :func:`synchronize_used`)."""
    _USED[device] = be


def synchronize_used() -> None:
    """Wait for this process's work on every device it used for wholemem (before a barrier
    publishes GPU writes to the other ranks). Runs whether or not torch initialised CUDA:
    the extension's kernels and copies do not need torch's runtime state."""
    for device, be in list(_USED.items()):
        be.synchronize(device)
