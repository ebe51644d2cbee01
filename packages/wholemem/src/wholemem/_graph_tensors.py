"""How the graph code reads the tensors of a graph, through wholemem's public API only.

A graph's arrays are wholemem tensors of any type, or plain torch tensors (a private
graph). Two kinds of access follow:

- direct: a ``torch.Tensor`` (a HOST or DEVICE wholemem tensor, a CUDA view of a HOST
  tensor, or a plain tensor) is one block of memory this process can address, so the
  native samplers read it in place;
- gathered: a :class:`ChunkedTensor` / :class:`NCCLTensor` is read with
  :func:`wholemem.gather` (collective for NCCL tensors, whose rows are private to
  their owners).
"""

from __future__ import annotations

from typing import Any

import torch

from ._comm import WholeMemoryCommunicator
from ._compat import get_wm_communicator, get_wm_tensor_type
from ._create import create_wm_tensor
from ._io import create_wm_tensor_from_file, load_from_files, stat_filelist_element_count, store_to_files
from ._ops import gather, get_local_tensor, get_tensor_view, scatter
from ._tensor import ChunkedTensor, NCCLTensor, WmTensorType


def is_wholemem(t: Any) -> bool:
    """Whether ``t`` was made by wholemem (any tensor type)."""
    try:
        get_wm_tensor_type(t)
    except TypeError:
        return False
    return True


def is_array(t: Any) -> bool:
    """A torch tensor or a wholemem tensor object."""
    return isinstance(t, (torch.Tensor, ChunkedTensor, NCCLTensor))


def comm_of(t: Any) -> WholeMemoryCommunicator | None:
    """The communicator of a wholemem tensor; None for a plain tensor."""
    return get_wm_communicator(t) if is_wholemem(t) else None


def is_direct(t: Any) -> bool:
    """Whether the native code can read ``t`` in place (one addressable block)."""
    return isinstance(t, torch.Tensor)


def is_collective(t: Any) -> bool:
    """Whether reading ``t`` is a collective (NCCL / DISTRIBUTED tensors)."""
    return isinstance(t, NCCLTensor)


def tensor_type_name(t: Any) -> str:
    """``HOST`` / ``CHUNKED`` / ... for wholemem tensors, ``private`` for plain tensors."""
    return get_wm_tensor_type(t).name if is_wholemem(t) else "private"


def device_of(t: Any) -> torch.device:
    """Where the elements of ``t`` live."""
    return t.device if isinstance(t, (torch.Tensor, ChunkedTensor, NCCLTensor)) else torch.device("cpu")


def local_part(t: Any) -> tuple[torch.Tensor, int]:
    """This rank's rows of ``t`` and the first of them (a plain tensor: all of it)."""
    if is_wholemem(t):
        return get_local_tensor(t)
    return t, 0


def read_rows(t: Any, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` (int64, valid) of ``t``; collective for NCCL tensors (call on every rank)."""
    if isinstance(t, torch.Tensor):
        return t.index_select(0, idx.to(t.device))
    return gather(t, idx)


def create_array(
    comm: WholeMemoryCommunicator | None, shape: list[int], dtype: torch.dtype, tensor_type: WmTensorType
) -> Any:
    """Collective: a zeroed wholemem tensor on ``comm`` (a plain tensor for comm None)."""
    if comm is None:
        return torch.zeros(shape, dtype=dtype)
    return create_wm_tensor(comm, shape, [], dtype, tensor_type)


def scatter_rows(t: Any, idx: torch.Tensor, values: torch.Tensor) -> None:
    """``t[idx] = values``; collective for NCCL tensors (call on every rank)."""
    if is_wholemem(t):
        scatter(t, idx, values)
    else:
        t[idx] = values


def view_on(t: Any, device: Any) -> Any:
    """``t`` as seen from ``device``: :func:`get_tensor_view` for wholemem tensors; a plain
    tensor must already be there (no silent copies of a graph)."""
    dev = torch.device(device)
    if is_wholemem(t):
        return get_tensor_view(t, dev)
    if device_of(t) != dev:
        raise ValueError(f"a private graph array on {device_of(t)} has no view on {dev}; move it with .to()")
    return t


def create_from_file(
    comm: WholeMemoryCommunicator, filename: Any, dtype: torch.dtype, tensor_type: WmTensorType, count: int
) -> Any:
    """Collective: a 1-D tensor of ``count`` elements filled from a WholeGraph file list."""
    return create_wm_tensor_from_file([count], dtype, comm, filename, tensor_type)


def store_files(t: Any, directory: Any, num_parts: int | None, prefix: str) -> list[str]:
    """Collective: :func:`store_to_files` under ``prefix``."""
    return store_to_files(t, directory, num_parts=num_parts, prefix=prefix)


def load_files(t: Any, directory: Any, prefix: str) -> None:
    """Collective: :func:`load_from_files` of the parts stored under ``prefix``."""
    load_from_files(t, directory, prefix=prefix)


def element_count(filename: Any, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in a WholeGraph file list (:func:`stat_filelist_element_count`)."""
    return stat_filelist_element_count(filename, dtype)
