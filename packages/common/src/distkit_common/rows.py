"""Row gather / scatter / scatter-add over a table of memory chunks: the native row kernels.

The kernels of ``distkit/rows.hpp`` (CPU threads) and ``distkit/rows_cuda.cuh`` (CUDA) that
the packages' extensions compile in, callable from Python on raw addresses, for a package (or
user) whose rows live in memory torch does not describe as one tensor: a table of equally sized
chunks, strided rows and columns. A row table is ``nrows`` rows of ``ncols`` elements of one
dtype; row ``r`` starts at ``chunks[r // rows_per_chunk] + (r % rows_per_chunk) * row_stride``
elements and its elements are ``col_stride`` elements apart.

The addresses are not checked (they come from ``tensor.data_ptr()`` or a mapping the caller
holds): the caller keeps the memory alive and large enough for the table it describes. Sizes,
strides, the dtype, the op and the indices are checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _distkit_common as _native
from .dtypes import NAMES, code_of
from .validate import check_int

__all__ = ["ROW_OPS", "cuda_compiled", "row_op"]

#: the row operations :func:`row_op` runs
ROW_OPS: tuple[str, ...] = ("gather", "scatter", "scatter_add")


def cuda_compiled() -> bool:
    """Return whether this build of distkit-common has its CUDA row kernels.

    Returns
    -------
    bool
        ``True`` when the wheel was built with nvcc: :func:`row_op` then runs on GPU memory
        with ``on_device=True`` (a GPU must also be visible to the process).

    Examples
    --------
    >>> isinstance(cuda_compiled(), bool)
    True
    """
    return bool(_native.cuda_compiled())


_CUDA = bool(_native.cuda_compiled())


def _dtype_code(dtype: Any) -> int:
    if type(dtype) is int:
        if dtype not in NAMES:
            raise TypeError(f"row_op: unknown dtype code {dtype}; known: {sorted(NAMES)}")
        return dtype
    return code_of(dtype)


def row_op(
    op: str,
    chunks: Sequence[int],
    rows_per_chunk: int,
    nrows: int,
    ncols: int,
    row_stride: int,
    col_stride: int,
    dtype: Any,
    idx: int,
    idx64: bool,
    n: int,
    data: int,
    *,
    alpha: float = 1.0,
    on_device: bool = False,
    stream: int = 0,
    validate: bool = True,
) -> None:
    """Run a row gather, scatter or scatter-add between a row table and a dense block.

    ``"gather"``: ``data[i, :] = table[idx[i], :]``; ``"scatter"``: ``table[idx[i], :] =
    data[i, :]`` (for a repeated index one of the writes wins); ``"scatter_add"``:
    ``table[idx[i], :] += alpha * data[i, :]`` (16-bit floats added in float32). ``data`` is
    ``n`` dense rows of ``ncols`` elements. On the CPU the call runs on the distkit thread
    pool without the GIL; on a GPU it is queued on ``stream``.

    Parameters
    ----------
    op : str
        One of :data:`ROW_OPS`: ``"gather"``, ``"scatter"`` or ``"scatter_add"``.
    chunks : sequence of int
        The addresses of the table's chunks (one address for a table in one buffer).
    rows_per_chunk : int
        Rows held by every chunk but the last (``>= 1``).
    nrows : int
        Rows of the table (``>= 0``, at most ``len(chunks) * rows_per_chunk``).
    ncols : int
        Elements per row (``>= 0``).
    row_stride : int
        Elements between the starts of consecutive rows of a chunk.
    col_stride : int
        Elements between consecutive elements of a row.
    dtype : int, torch.dtype, numpy.dtype or str
        The elements' dtype: a code of :data:`distkit_common.dtypes.CODES`, or a dtype as
        :func:`distkit_common.dtypes.code_of` takes.
    idx : int
        The address of the ``n`` row indices (int64 or int32).
    idx64 : bool
        Whether the indices are int64 (else int32).
    n : int
        Number of indices, and of rows of ``data`` (``>= 0``).
    data : int
        The address of the dense ``[n, ncols]`` block of ``dtype``.
    alpha : float, optional
        The scale of ``"scatter_add"`` (ignored by the other ops).
    on_device : bool, optional
        The table, indices and data are in GPU memory: run the CUDA kernels.
    stream : int, optional
        The CUDA stream (``torch.cuda.Stream.cuda_stream``; 0, the default stream) of a
        device call.
    validate : bool, optional
        Check the indices before any row moves (on a GPU this waits for ``stream``). With
        ``False`` a device call never synchronizes (it may run inside CUDA graph capture)
        and rows with a bad index are skipped without a report (a gather writes zeros
        there); the caller must have checked the indices. The CPU always checks them.

    Returns
    -------
    None
        The rows of ``data`` (gather) or of the table (scatter, scatter-add) are written in
        place.

    Raises
    ------
    TypeError
        If an argument has the wrong type, or ``dtype`` is no distkit dtype.
    ValueError
        If ``op`` is unknown, a size is negative, ``chunks`` is empty or cannot hold
        ``nrows`` rows, an address is negative or ``stream`` is given for a CPU call.
    IndexError
        If an index is outside ``[0, nrows)`` (the message names the first bad one).
    RuntimeError
        If ``on_device`` is set and distkit-common was built without CUDA
        (:func:`cuda_compiled`), or a CUDA call fails.

    Examples
    --------
    >>> import torch
    >>> table = torch.arange(12.0).reshape(6, 2)
    >>> idx = torch.tensor([5, 0, 5])
    >>> out = torch.empty(3, 2)
    >>> row_op("gather", [table.data_ptr()], 6, 6, 2, 2, 1, table.dtype,
    ...        idx.data_ptr(), True, 3, out.data_ptr())
    >>> out.tolist()
    [[10.0, 11.0], [0.0, 1.0], [10.0, 11.0]]
    """
    if op not in ROW_OPS:
        raise ValueError(f"row_op: unknown op {op!r}; one of {', '.join(ROW_OPS)}")
    if type(chunks) is not list and (isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence)):
        raise TypeError(f"row_op: chunks must be a sequence of addresses, got {type(chunks).__name__}")
    if not chunks:
        raise ValueError("row_op: chunks is empty (a table needs at least one chunk)")
    # the common case in plain comparisons (a GPU gather calls this per batch); named checks on a miss
    ok = (
        type(rows_per_chunk) is int and type(nrows) is int and type(ncols) is int and type(row_stride) is int
        and type(col_stride) is int and type(idx) is int and type(n) is int and type(data) is int
        and type(stream) is int and rows_per_chunk >= 1 and nrows >= 0 and ncols >= 0 and idx >= 0 and n >= 0
        and data >= 0 and stream >= 0
    )  # fmt: skip
    for c in chunks:
        if type(c) is not int or c < 0:
            ok = False
    if not ok:
        chunks = [check_int(c, f"row_op: chunks[{i}]", lo=0) for i, c in enumerate(chunks)]
        rows_per_chunk = check_int(rows_per_chunk, "row_op: rows_per_chunk", lo=1)
        nrows, ncols, n = (
            check_int(nrows, "row_op: nrows", lo=0),
            check_int(ncols, "row_op: ncols", lo=0),
            check_int(n, "row_op: n", lo=0),
        )
        row_stride, col_stride = (
            check_int(row_stride, "row_op: row_stride"),
            check_int(col_stride, "row_op: col_stride"),
        )
        idx, data, stream = (
            check_int(idx, "row_op: idx", lo=0),
            check_int(data, "row_op: data", lo=0),
            check_int(stream, "row_op: stream", lo=0),
        )
    if len(chunks) * rows_per_chunk < nrows:
        raise ValueError(f"row_op: {len(chunks)} chunks of {rows_per_chunk} rows cannot hold nrows={nrows} rows")
    code = _dtype_code(dtype)
    for flag, name in ((idx64, "idx64"), (on_device, "on_device"), (validate, "validate")):
        if type(flag) is not bool:
            raise TypeError(f"row_op: {name} must be a bool, got {type(flag).__name__} {flag!r}")
    if type(alpha) is not float and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise TypeError(f"row_op: alpha must be a float, got {type(alpha).__name__} {alpha!r}")
    if stream and not on_device:
        raise ValueError(f"row_op: stream={stream} is given for a CPU call (on_device=False)")
    if on_device and not _CUDA:
        raise RuntimeError("row_op: this build of distkit-common has no CUDA row kernels (built without nvcc)")
    _native.row_op(
        op, list(chunks), rows_per_chunk, nrows, ncols, row_stride, col_stride, code, idx, idx64, n, data,
        alpha=float(alpha), on_device=on_device, stream=stream, validate=validate,
    )  # fmt: skip
