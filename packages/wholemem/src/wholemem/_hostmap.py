"""Host memory mapped for GPU kernels (``cudaHostRegister``), once per range and process.

``get_tensor_view(host_tensor, 'cuda')`` and the CUDA view of a host CHUNKED tensor
page-lock the shared-memory segment and map it for the GPUs; kernels then read and
write the shared rows in place. CUDA refuses to register a range twice, so one
:class:`HostMapping` per segment is shared by every view of it, and it is undone
(after waiting for the kernels that may read it) when the last view dies.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from . import _gpu


class HostMapping:
    """A host range page-locked and mapped for the GPUs; unregistered when the last CUDA
    view of it dies."""

    def __init__(self, be: _gpu.Backend, addr: int, nbytes: int, device: torch.device, keep: Any) -> None:
        self.backend, self.addr, self.nbytes, self.device, self.keep = be, addr, nbytes, device, keep
        self.device_ptr = be.host_register(addr, nbytes, device)
        self.registered = True

    def __del__(self) -> None:
        if self.registered:
            self.registered = False
            try:
                self.backend.synchronize(self.device)  # no kernel still reads the pages
                self.backend.host_unregister(self.addr)
            except Exception:  # never raise from a finalizer (e.g. at exit)
                pass


_MAPPINGS: weakref.WeakValueDictionary[int, HostMapping] = weakref.WeakValueDictionary()


def host_mapping(addr: int, nbytes: int, device: torch.device, keep: Any) -> HostMapping:
    """The (shared) registration of ``[addr, addr + nbytes)`` for GPU access; ``keep`` (the
    segment) stays mapped while the registration lives.

    Raises
    ------
    ValueError
        The range is already mapped for another GPU (a process maps a segment for one GPU).
    """
    be = _gpu.backend()
    m = _MAPPINGS.get(addr)
    if m is not None and m.backend is be:
        if m.device != device:
            raise ValueError(
                f"this shared memory is already mapped for {m.device} in this process; a process maps it for "
                f"one GPU, not also for {device}"
            )
        return m
    m = HostMapping(be, addr, nbytes, device, keep)
    _MAPPINGS[addr] = m
    return m
