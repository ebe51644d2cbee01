"""Dtype codes shared by every distkit extension (must match ``distkit/dtype.hpp``)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: name -> code, the stable numbering of ``distkit::DType``.
CODES: dict[str, int] = {
    "float16": 0,
    "bfloat16": 1,
    "float32": 2,
    "float64": 3,
    "int8": 4,
    "int32": 5,
    "int64": 6,
    "uint8": 7,
    "bool": 8,
    "complex64": 9,
    "complex128": 10,
    "int16": 11,
}
NAMES: dict[int, str] = {v: k for k, v in CODES.items()}
ITEMSIZE: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "int16": 2,
}


def dtype_name(dtype: Any) -> str:
    """Return the canonical name of a torch dtype, numpy dtype or name string.

    Parameters
    ----------
    dtype : torch.dtype, numpy.dtype or str
        The dtype; torch's aliases (``"half"``, ``"float"``, ``"long"``, ...) are accepted.

    Returns
    -------
    str
        A key of :data:`CODES` (``"float32"``, ``"bfloat16"``, ``"int64"``, ...).

    Raises
    ------
    TypeError
        If the dtype has no distkit code.
    """
    if isinstance(dtype, str):
        name = dtype
    else:
        mod = type(dtype).__module__
        if mod.startswith("torch"):
            name = str(dtype).removeprefix("torch.")
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                raise TypeError(f"not a dtype: {dtype!r}") from None
    name = {"half": "float16", "float": "float32", "double": "float64", "long": "int64", "int": "int32"}.get(name, name)
    if name not in CODES:
        raise TypeError(f"unsupported dtype {dtype!r}; supported: {', '.join(CODES)}")
    return name


def code_of(dtype: Any) -> int:
    """Return the distkit dtype code of a torch / numpy dtype or name.

    Parameters
    ----------
    dtype : torch.dtype, numpy.dtype or str
        The dtype, as for :func:`dtype_name`.

    Returns
    -------
    int
        The code the native extensions take (``CODES[dtype_name(dtype)]``).

    Raises
    ------
    TypeError
        If the dtype has no distkit code.
    """
    return CODES[dtype_name(dtype)]


def torch_dtype(code_or_name: int | str) -> Any:
    """Return the ``torch.dtype`` for a distkit code or name (imports torch lazily).

    Parameters
    ----------
    code_or_name : int or str
        A value of :data:`CODES`, or a name as for :func:`dtype_name`.

    Returns
    -------
    torch.dtype
        The dtype.

    Raises
    ------
    TypeError
        If the code or name is no distkit dtype.
    """
    import torch

    if isinstance(code_or_name, int) and not isinstance(code_or_name, bool):
        if code_or_name not in NAMES:
            raise TypeError(f"unknown dtype code {code_or_name!r}; known: {sorted(NAMES)}")
        name = NAMES[code_or_name]
    else:
        name = dtype_name(code_or_name)
    return getattr(torch, name)
