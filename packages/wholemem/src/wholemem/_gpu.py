"""GPU-resident storage: device allocations, CUDA IPC chunk tables, host memory mapped for GPUs.

Everything that touches CUDA goes through a :class:`Backend`. :class:`CudaBackend` is the
real one: ``cudaMalloc`` / ``cudaIpcGetMemHandle`` / ``cudaIpcOpenMemHandle`` /
``cudaHostRegister`` from wholemem's extension, tensors over raw device memory through
``__cuda_array_interface__``, and torch's current stream for every kernel. Tests swap in
a host-memory backend (``tests/gpu_fake.py``) to run the same routing, IPC exchange and
lifetime logic on CPU-only machines.

Lifetime (as WholeGraph frees whole memory collectively): a rank's CHUNKED chunk and its
mappings of the peers' chunks stay valid until :meth:`Communicator.destroy` (collective):
every rank closes its IPC mappings, a barrier makes sure all peers did, then each rank
frees its own chunk as soon as no local view of it is alive. ``finalize_lib`` is not
collective: it closes the mappings and leaves the own chunks to process exit.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from . import _wholemem as _native


class _CudaArray:
    """Raw device memory exposed through ``__cuda_array_interface__`` (keeps ``owner`` alive)."""

    def __init__(self, ptr: int, nbytes: int, owner: Any) -> None:
        self._ptr, self._nbytes, self._owner = ptr, nbytes, owner

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # stream None: no synchronisation asked of the consumer (torch.as_tensor)
        return {
            "shape": (self._nbytes,),
            "typestr": "|u1",
            "data": (self._ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class Backend:
    """How GPU storage is made, shared and addressed (see the module docstring)."""

    #: whether row tables hold device addresses (CUDA kernels) or host addresses
    on_device = True

    def require(self, what: str) -> None:
        """Raise ``RuntimeError`` saying why ``what`` cannot run here."""
        raise NotImplementedError

    def resolve(self, device: torch.device) -> torch.device:
        """The concrete device (with index) a request for ``device`` means on this rank."""
        raise NotImplementedError

    def alloc(self, nbytes: int, device: torch.device) -> int:
        """Zero-filled memory, complete before return (peers may read it at once)."""
        raise NotImplementedError

    def free(self, ptr: int, device: torch.device) -> None:
        raise NotImplementedError

    def ipc_export(self, ptr: int) -> bytes:
        raise NotImplementedError

    def ipc_open(self, handle: bytes, device: torch.device) -> int:
        raise NotImplementedError

    def ipc_close(self, ptr: int) -> None:
        raise NotImplementedError

    def as_tensor(self, ptr: int, nbytes: int, device: torch.device, owner: Any) -> torch.Tensor:
        """A uint8 tensor over ``[ptr, ptr + nbytes)`` that keeps ``owner`` alive."""
        raise NotImplementedError

    def stream(self, device: torch.device) -> int:
        """The stream handle row kernels run on (torch's current stream)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for this process's device work (before a barrier publishes writes)."""

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

    def resolve(self, device: torch.device) -> torch.device:
        index = torch.cuda.current_device() if device.index is None else device.index
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device {device} does not exist: {torch.cuda.device_count()} CUDA devices are visible")
        return torch.device("cuda", index)

    def alloc(self, nbytes: int, device: torch.device) -> int:
        return int(_native.device_alloc(nbytes, _index(device)))

    def free(self, ptr: int, device: torch.device) -> None:
        _native.device_free(ptr, _index(device))

    def ipc_export(self, ptr: int) -> bytes:
        return bytes(_native.ipc_get_handle(ptr))

    def ipc_open(self, handle: bytes, device: torch.device) -> int:
        return int(_native.ipc_open_handle(handle, _index(device)))

    def ipc_close(self, ptr: int) -> None:
        _native.ipc_close_handle(ptr)

    def as_tensor(self, ptr: int, nbytes: int, device: torch.device, owner: Any) -> torch.Tensor:
        t = torch.as_tensor(_CudaArray(ptr, nbytes, owner), device=device)
        # torch infers the device from the pointer and would *copy* to another device: a
        # view must alias the memory, so anything else is an error, not a silent copy
        if t.device != device or t.data_ptr() != ptr:
            raise RuntimeError(
                f"wholemem: torch could not wrap memory at {ptr:#x} as a {device} tensor without copying "
                f"(it lives on {t.device}); views are only available on the device that maps the memory"
            )
        return t

    def stream(self, device: torch.device) -> int:
        return int(torch.cuda.current_stream(device).cuda_stream)

    def synchronize(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

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
    return old


class DeviceAlloc:
    """One rank's own device chunk; freed when it is unreferenced *and* released.

    ``released`` is set by the collective destroy once every peer has closed its
    mapping; local views (``get_local_tensor``) keep the object, hence the memory, alive.
    """

    def __init__(self, be: Backend, nbytes: int, device: torch.device) -> None:
        self.backend, self.nbytes, self.device = be, nbytes, device
        self.ptr = be.alloc(nbytes, device)
        self.released = False

    def __del__(self) -> None:
        if self.released and self.ptr:
            ptr, self.ptr = self.ptr, 0
            try:
                self.backend.free(ptr, self.device)
            except Exception:  # never raise from a finalizer (e.g. at exit)
                pass


class GpuChunks:
    """Chunk table of a GPU-resident CHUNKED tensor: own allocation + mapped peer chunks."""

    def __init__(self, be: Backend, device: torch.device, own: DeviceAlloc | None) -> None:
        self.backend, self.device, self.own = be, device, own
        self.addresses: list[int] = []
        self.imported: list[int] = []  # peer mappings to close
        self.mappings: list[HostMapping] = []  # host chunks mapped for the GPU (get_tensor_view)
        self.closed = False

    def close_imports(self) -> None:
        """Unmap the peers' chunks (idempotent); the table must not be used afterwards."""
        if self.closed:
            return
        self.closed = True
        errors = []
        for p in self.imported:
            try:
                self.backend.ipc_close(p)
            except Exception as e:  # close every mapping, report the first failure
                errors.append(e)
        self.imported = []
        if errors:
            raise errors[0]

    def own_bytes(self) -> torch.Tensor:
        """This rank's chunk as a uint8 tensor on the device (keeps the allocation alive)."""
        assert self.own is not None
        return self.backend.as_tensor(self.own.ptr, self.own.nbytes, self.device, self.own)


class HostMapping:
    """A host range page-locked and mapped for the GPUs (``cudaHostRegister``); unregistered
    when the last CUDA view of it dies."""

    def __init__(self, be: Backend, addr: int, nbytes: int, device: torch.device, keep: Any) -> None:
        self.backend, self.addr, self.nbytes, self.keep = be, addr, nbytes, keep
        self.device_ptr = be.host_register(addr, nbytes, device)
        self.registered = True

    def __del__(self) -> None:
        if self.registered:
            self.registered = False
            try:
                self.backend.synchronize()  # no kernel still reads the pages
                self.backend.host_unregister(self.addr)
            except Exception:  # never raise from a finalizer
                pass


# One registration per host range and process (cudaHostRegister refuses a second one).
_HOST_MAPPINGS: weakref.WeakValueDictionary[int, HostMapping] = weakref.WeakValueDictionary()


def host_mapping(addr: int, nbytes: int, device: torch.device, keep: Any) -> HostMapping:
    """The (shared) registration of ``[addr, addr + nbytes)`` for GPU access."""
    m = _HOST_MAPPINGS.get(addr)
    if m is None or m.backend is not backend():
        m = HostMapping(backend(), addr, nbytes, device, keep)
        _HOST_MAPPINGS[addr] = m
    return m
