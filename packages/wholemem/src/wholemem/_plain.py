"""Row operations on plain ``torch.Tensor`` objects: HOST and DEVICE tensors, their views,
and any other CPU tensor.

HOST / DEVICE tensors are normal torch tensors (the original's API), so their
behaviour cannot be methods; the module-level functions in ``_ops`` send them here.
What wholemem knows about them (communicator, layout, memory) is in ``_registry``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from distkit_common import rows as _rows
from distkit_common.dtypes import CODES, code_of

from . import _binding, _checks, _gpu, _hostmap, _registry
from ._layout import elements_overlap, local_range, plain_table_args
from ._wholemem import Segment, Table


def check_target(t: Any, what: str) -> _registry.HostInfo | None:
    """The wholemem facts of ``t`` (None for a tensor wholemem did not make).

    Raises
    ------
    TypeError
        ``t`` is not a tensor.
    RuntimeError
        ``t``'s communicator was destroyed or the library finalized.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, ChunkedTensor or NCCLTensor, got {type(t).__name__}")
    info = _registry.lookup(t)
    if info is not None:
        info.comm.check_alive(what)
    return info


def require_info(t: torch.Tensor, what: str) -> _registry.HostInfo:
    """The facts of a tensor made by wholemem.

    Raises
    ------
    TypeError
        ``t`` is a plain tensor wholemem did not make.
    """
    info = check_target(t, what)
    if info is None:
        raise TypeError(f"{what}: t is a plain torch.Tensor, not one made by create_wm_tensor")
    return info


def plain_table(t: torch.Tensor) -> Table | None:
    """A one-chunk CPU row table over a strided CPU tensor, or None if its trailing
    dimensions cannot be merged into one strided column dimension."""
    args = plain_table_args(t)
    if args is None or t.device.type != "cpu":
        return None
    nrows, ncols, rs, cs = args
    return Table([int(t.data_ptr())], max(nrows, 1), nrows, ncols, rs, cs, code_of(t.dtype), False)


def _has_code(dtype: torch.dtype) -> bool:
    """Whether the native row code takes ``dtype`` (it has a distkit code)."""
    return str(dtype).removeprefix("torch.") in CODES


def _device_rows(op: str, t: torch.Tensor, didx: torch.Tensor, data: torch.Tensor) -> bool:
    """Run ``op`` on a CUDA tensor ``t`` with distkit-common's row kernels (whole rows as
    the widest aligned words); False where they do not apply (distkit-common built without
    CUDA, a dtype without a code, a layout that is not one strided row table, a
    non-contiguous ``data``, rows that overlap). ``didx`` must be checked already: the
    kernels skip bad rows without a report (no stream synchronisation)."""
    if t.device.type != "cuda" or not _CUDA_ROWS or not _has_code(t.dtype):
        return False
    args = plain_table_args(t)
    if args is None:
        return False
    nrows, ncols, rs, cs = args
    # a scatter into rows that share memory is left to torch (which rejects it)
    if not data.is_contiguous() or (op != "gather" and ncols > 1 and (cs < 1 or rs < (ncols - 1) * cs + 1)):
        return False
    if op != "gather" and (rs < 1 and nrows > 1):
        return False
    if didx.numel() and ncols:
        _rows.row_op(
            op, [int(t.data_ptr())], max(nrows, 1), nrows, ncols, rs, cs, code_of(t.dtype),
            int(didx.data_ptr()), didx.dtype == torch.int64, int(didx.numel()), int(data.data_ptr()),
            on_device=True, stream=torch.cuda.current_stream(t.device).cuda_stream, validate=False,
        )  # fmt: skip
    return True


#: same-size stand-ins for dtypes without a distkit code (uint16, uint32, uint64, the float8
#: types): gather and scatter only copy whole elements, so the rows move as these integers'
#: bytes, bit for bit (torch has no index_copy_ for uint16 either)
_BYTES_AS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_coded(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself, or, for a dtype without a distkit code, ``x`` reinterpreted (a view, same
    strides) as the integer type of its element size; complex32 and other sizes stay as they are
    (and get code_of's TypeError)."""
    if _has_code(x.dtype) or x.dtype.is_complex:
        return x
    alias = _BYTES_AS.get(x.element_size())
    return x if alias is None else x.view(alias)


#: whether distkit-common's row kernels were compiled (they also need a visible GPU, as `t` is on one)
_CUDA_ROWS = _rows.cuda_compiled()


def gather(t: torch.Tensor, indices: Any, out: torch.Tensor | None) -> torch.Tensor:
    """``out[i] = t[indices[i]]`` (CPU: the native threaded gather; a GPU tensor: the row
    kernels of distkit-common, or torch's where they do not apply, after the indices were
    checked on the GPU)."""
    row_shape = tuple(t.shape[1:])
    if t.device.type != "cpu":
        didx = _checks.indices(indices, t.device, int(t.shape[0]))
        o = _checks.out_rows(out, didx.numel(), row_shape, t.dtype, t.device)
        t_, o_ = _as_coded(t), _as_coded(o)
        if not _device_rows("gather", t_, didx, o_):
            torch.index_select(t_, 0, didx, out=o_)
        return o
    idx = _checks.cpu_indices(indices, int(t.shape[0]))
    o = _checks.out_rows(out, idx.numel(), row_shape, t.dtype, t.device)
    t_, o_ = _as_coded(t), _as_coded(o)
    table = plain_table(t_)
    if table is None:
        torch.index_select(t_, 0, idx, out=o_)
    elif idx.numel():
        table.gather(int(idx.data_ptr()), idx.dtype == torch.int64, int(idx.numel()), int(o.data_ptr()))
    return o


def scatter(t: torch.Tensor, indices: Any, values: Any) -> None:
    """``t[indices[i]] = values[i]`` (last duplicate wins on the CPU; any one on a GPU).

    Raises
    ------
    ValueError
        Elements of ``t`` share memory (an expanded or overlapping ``as_strided`` view).
    """
    if t.numel() > 1 and elements_overlap(tuple(t.shape), tuple(t.stride())):
        raise ValueError(
            f"scatter: elements of t (shape {tuple(t.shape)}, strides {t.stride()}) share memory; "
            "scatter into a tensor without overlapping elements (e.g. t.clone())"
        )
    row_shape = tuple(t.shape[1:])
    if t.device.type != "cpu":
        didx = _checks.indices(indices, t.device, int(t.shape[0]))
        vals = _as_coded(_checks.rows_in(values, "values", didx.numel(), row_shape, t.dtype, t.device))
        t_ = _as_coded(t)
        if not _device_rows("scatter", t_, didx, vals):
            t_.index_copy_(0, didx.to(torch.int64), vals)
        return
    idx = _checks.cpu_indices(indices, int(t.shape[0]))
    vals = _as_coded(_checks.rows_in(values, "values", idx.numel(), row_shape, t.dtype, t.device).contiguous())
    t_ = _as_coded(t)
    table = plain_table(t_)
    if table is None:
        t_.index_copy_(0, idx.to(torch.int64), vals)
    elif idx.numel():
        table.scatter(int(idx.data_ptr()), idx.dtype == torch.int64, int(idx.numel()), int(vals.data_ptr()))


def local_part(t: torch.Tensor, what: str) -> tuple[torch.Tensor, int]:
    """This rank's rows of a HOST / DEVICE tensor (or view) and the first one's index in ``t``."""
    info = require_info(t, what)
    lo, hi = local_range(info.layout.nrows, info.comm.size, info.comm.rank)
    a = max(lo, info.row_offset)
    b = max(a, min(hi, info.row_offset + int(t.shape[0])))
    return t[a - info.row_offset : b - info.row_offset], min(a - info.row_offset, int(t.shape[0]))


def sub_tensor(t: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    """The view of ``t`` over ``ranges`` (one ``(start, end)`` per dimension)."""
    view = t[tuple(slice(s, e) for s, e in ranges)]
    info = _registry.lookup(t)
    if info is not None:
        _registry.register(view, dataclasses.replace(info, row_offset=info.row_offset + ranges[0][0]))
    return view


def cuda_view(t: torch.Tensor, device: torch.device, what: str) -> torch.Tensor:
    """``t`` seen from ``device`` (``cuda[:N]``, resolved): itself for a tensor already
    there; for a HOST tensor (or a view of one) a CUDA tensor over the same shared pages.

    Raises
    ------
    ValueError
        ``t`` lives on another GPU, or it is not a HOST tensor made by wholemem.
    """
    if t.device.type != "cpu":
        if t.device != device:
            raise ValueError(f"{what}: the tensor lives on {t.device}, not {device}")
        return t
    info = _registry.lookup(t)
    if info is None or not isinstance(info.memory, Segment):
        raise ValueError(f"{what}: a GPU view needs a HOST tensor made by create_wm_tensor (use .to(device))")
    seg = info.memory
    be = _gpu.backend()
    m = _hostmap.host_mapping(int(seg.address), int(seg.size), device, seg)
    raw = be.as_tensor(m.device_ptr, int(seg.size), device, m)
    item = t.element_size()
    offset = int(t.data_ptr()) - int(seg.address)
    assert 0 <= offset <= int(seg.size) and offset % item == 0
    flat = raw[: int(seg.size) // item * item].view(t.dtype)
    view = flat.as_strided(tuple(t.shape), tuple(t.stride()), offset // item)
    return _registry.register(view, info)


def no_cpu_view(device: torch.device) -> ValueError:
    """The error for a CPU view of memory on the GPU ``device``."""
    return ValueError(f"get_tensor_view: this tensor lives on {device} and has no CPU view (copy rows with .cpu())")


def resolve_cuda(device: Any, what: str, comm: Any) -> torch.device | None:
    """``device`` parsed: None for the CPU, the resolved GPU for ``cuda[:N]``.

    Raises
    ------
    TypeError
        Not a device.
    ValueError
        Another device type.
    RuntimeError
        A GPU without a usable GPU here.
    """
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"{what}: device must be 'cpu', 'cuda[:N]' or a torch.device, got {device!r}") from e
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(f"{what}: unsupported device {dev}")
    _gpu.backend().require(f"{what}(t, {str(device)!r})")
    return _binding.resolve(dev, comm)
