"""Argument checks shared by every distkit package's public boundary.

Each check raises a specific exception whose message names the argument and
the offending value; nothing is converted silently except where documented.

A package whose errors are its own subclasses (``MpiadTypeError``,
``KeyRangeError``, ...) makes one :class:`Checks` with those classes; the
module-level functions use the builtin ``TypeError`` / ``ValueError`` /
``IndexError``. Every check is a single pass over its argument's metadata (and,
for index ranges, one ``aminmax`` over the data), so hot paths call it directly
instead of keeping a private copy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from .dtypes import dtype_name

_torch_module: Any = None


def _torch() -> Any:
    # torch is imported on first use: distkit-common itself does not depend on it
    global _torch_module
    if _torch_module is None:
        import torch

        _torch_module = torch
    return _torch_module


def describe(x: Any) -> str:
    """Describe a value in a few words for an error message.

    Parameters
    ----------
    x : object
        Any value.

    Returns
    -------
    str
        Type, dtype, shape and device of a tensor or array; else the type and the
        ``repr``, cut to 120 characters.
    """
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return f"tensor(dtype={x.dtype}, shape={tuple(x.shape)}, device={x.device})"
    if isinstance(x, np.ndarray):
        return f"ndarray(dtype={x.dtype}, shape={x.shape})"
    return f"{type(x).__name__} {x!r}"[:120]


# `Checks.int` shadows the builtin inside the class body: annotations there use this name
_Int = int

#: integer dtypes without CPU min/max kernels in torch: widened for the range check
_WIDEN = ("uint16", "uint32", "uint64")


class Checks:
    """The argument checks, raising the given exception classes.

    Parameters
    ----------
    type_error, value_error, index_error : type
        Raised for a wrong type / dtype, a wrong value / shape / device, and an
        index out of range. Subclasses of the builtins keep ``except TypeError``
        working for callers.

    Examples
    --------
    >>> class KeyRangeError(IndexError, ValueError): ...
    >>> checks = Checks(index_error=KeyRangeError)
    >>> keys = checks.index(np.array([3, 1]), "keys", upper=10)
    """

    def __init__(
        self,
        *,
        type_error: type[Exception] = TypeError,
        value_error: type[Exception] = ValueError,
        index_error: type[Exception] = IndexError,
    ) -> None:
        self.type_error = type_error
        self.value_error = value_error
        self.index_error = index_error

    # ------------------------------------------------------------------ tensors
    def tensor(
        self,
        t: Any,
        name: str,
        *,
        dtype: Any | Iterable[Any] | None = None,
        device: Any = None,
        ndim: int | Iterable[int] | None = None,
        shape: Sequence[int | None] | None = None,
        contiguous: bool = False,
    ) -> Any:
        """Check that ``t`` is a ``torch.Tensor`` with the given properties.

        Parameters
        ----------
        t : object
            The value to check.
        name : str
            Argument name used in error messages.
        dtype : torch.dtype or collection of torch.dtype, optional
            Accepted dtype(s).
        device : str, torch.device or collection of str, optional
            A device type (``"cpu"``, ``"cuda"``), several accepted types, or an
            exact ``torch.device`` (``cuda:1``).
        ndim : int or iterable of int, optional
            Accepted number(s) of dimensions.
        shape : sequence of int or None, optional
            Required shape; ``None`` entries accept any size.
        contiguous : bool
            Require a contiguous tensor.

        Returns
        -------
        torch.Tensor
            ``t`` itself.

        Raises
        ------
        TypeError
            Not a tensor, or the wrong dtype.
        ValueError
            Wrong device, number of dimensions, shape or layout.
        """
        torch = _torch()
        if not isinstance(t, torch.Tensor):
            raise self.type_error(f"{name} must be a torch.Tensor, got {describe(t)}")
        if dtype is not None and t.dtype is not dtype:
            allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
            if t.dtype not in allowed:
                want = " or ".join(str(d) for d in allowed)
                raise self.type_error(f"{name} must have dtype {want}, got {t.dtype}")
        if device is not None:
            self._device(t, name, device)
        if ndim is not None:
            dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
            if t.dim() not in dims:
                raise self.value_error(
                    f"{name} must have {' or '.join(map(str, dims))} dimension(s), got shape {tuple(t.shape)}"
                )
        if shape is not None:
            got = t.shape
            if len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got)):
                want_s = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ")"
                raise self.value_error(f"{name} must have shape {want_s}, got {tuple(got)}")
        if contiguous and not t.is_contiguous():
            raise self.value_error(f"{name} must be contiguous (call .contiguous()), got strides {t.stride()}")
        return t

    def _device(self, t: Any, name: str, device: Any) -> None:
        torch = _torch()
        if isinstance(device, str):
            ok = t.device.type == device
            want = repr(device)
        elif isinstance(device, torch.device):
            ok = t.device == device or (device.index is None and t.device.type == device.type)
            want = repr(str(device))
        else:
            types = tuple(device)
            ok = t.device.type in types
            want = " or ".join(repr(d) for d in types)
        if not ok:
            raise self.value_error(f"{name} must be on device {want}, got {t.device}")

    def array(self, x: Any, name: str) -> Any:
        """Return a torch view of a tensor or numpy array (no copy).

        Parameters
        ----------
        x : torch.Tensor or numpy.ndarray
            The array.
        name : str
            Argument name for messages.

        Returns
        -------
        torch.Tensor
            ``x`` itself, or ``torch.from_numpy(x)``.

        Raises
        ------
        TypeError
            Anything else, or a numpy array not in native byte order.
        """
        torch = _torch()
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, np.ndarray):
            if x.dtype.byteorder not in ("=", "|", "<"):
                raise self.type_error(f"{name} must be in native byte order, got {x.dtype}")
            return torch.from_numpy(x)
        raise self.type_error(f"{name} must be a torch.Tensor or numpy.ndarray, got {describe(x)}")

    def index(
        self,
        x: Any,
        name: str,
        *,
        upper: int | None = None,
        dtypes: Collection[str] = ("int64",),
        device: Any = "cpu",
        allow_sequence: bool = False,
    ) -> Any:
        """Validate a 1-D integer index array and return it as a contiguous tensor.

        Parameters
        ----------
        x : torch.Tensor or numpy.ndarray (or a sequence when ``allow_sequence``)
            The indices.
        name : str
            Argument name for messages.
        upper : int, optional
            Exclusive upper bound; every index must lie in ``[0, upper)``.
        dtypes : collection of str
            Accepted integer dtype names (``"int64"``, ``"int32"``, ...).
        device : str, torch.device, collection of str or None
            Accepted device(s) as for :meth:`tensor`; ``None`` accepts any.
        allow_sequence : bool
            Also accept a Python sequence of ints (converted to int64).

        Returns
        -------
        torch.Tensor
            ``x`` as a contiguous tensor (a view of a numpy array, no copy).

        Raises
        ------
        TypeError
            Not an array, or not one of ``dtypes`` (a float array is refused).
        ValueError
            Not 1-D, or on another device.
        IndexError
            An index is negative or ``>= upper`` (the message names it and its position).
        """
        torch = _torch()
        if allow_sequence and isinstance(x, (list, tuple, range)):
            x = torch.as_tensor(list(x), dtype=torch.int64)
        t = self.array(x, name)
        dname = _dtype_label(t.dtype)
        if dname not in dtypes:
            raise self.type_error(f"{name} must be an integer array of dtype {' or '.join(dtypes)}, got {t.dtype}")
        if device is not None:
            self._device(t, name, device)
        if t.dim() != 1:
            raise self.value_error(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        t = t.contiguous()
        if t.numel():
            self.index_range(t, name, upper)
        return t

    def index_range(self, t: Any, name: str, upper: int | None) -> None:
        """Check that every element of the integer tensor ``t`` lies in ``[0, upper)``.

        One ``aminmax`` pass over the data; the position of an offending index is
        searched only on the error path.

        Parameters
        ----------
        t : torch.Tensor
            A non-empty integer tensor.
        name : str
            Argument name for messages.
        upper : int or None
            Exclusive upper bound; None checks only that no index is negative.

        Raises
        ------
        IndexError
            An index is negative or ``>= upper`` (the message names it and its position).
        """
        torch = _torch()
        c = t.to(torch.int64) if t.dtype in _unsigned() else t
        lo_t, hi_t = torch.aminmax(c)
        lo, hi = int(lo_t), int(hi_t)
        if lo < 0:
            pos = int((c < 0).nonzero()[0])
            raise self.index_error(f"{name}[{pos}] = {int(c[pos])} is negative")
        if upper is not None and hi >= upper:
            pos = int((c >= upper).nonzero()[0])
            raise self.index_error(f"{name}[{pos}] = {int(c[pos])} is out of range [0, {upper})")

    # ------------------------------------------------------------------ scalars
    def int(self, value: Any, name: str, *, lo: _Int | None = None, hi: _Int | None = None) -> _Int:
        """Check an integer argument (bool refused) lies in ``[lo, hi)``.

        Parameters
        ----------
        value : int or numpy.int64
            The argument.
        name : str
            Argument name for messages.
        lo : int, optional
            Inclusive lower bound.
        hi : int, optional
            Exclusive upper bound.

        Returns
        -------
        int
            ``value`` as a Python int.

        Raises
        ------
        TypeError
            Not an integer.
        ValueError
            Outside the range.
        """
        if isinstance(value, bool) or not isinstance(value, (_Int, np.integer)):
            raise self.type_error(f"{name} must be an int, got {describe(value)}")
        v = _Int(value)
        if lo is not None and v < lo:
            raise self.value_error(f"{name} must be >= {lo}, got {v}")
        if hi is not None and v >= hi:
            raise self.value_error(f"{name} must be < {hi}, got {v}")
        return v

    def rank(self, value: Any, name: str, size: _Int) -> _Int:
        """Check a rank of a group of ``size`` processes.

        Parameters
        ----------
        value : int
            The rank.
        name : str
            Argument name for messages.
        size : int
            Size of the group.

        Returns
        -------
        int
            ``value`` as a Python int.

        Raises
        ------
        TypeError
            Not an integer.
        ValueError
            Outside ``[0, size)``.
        """
        v = self.int(value, name)
        if not 0 <= v < size:
            raise self.value_error(
                f"{name} = {v} is out of range for a communicator of size {size} (valid: 0..{size - 1})"
            )
        return v

    def axis(self, value: Any, name: str, ndim: _Int) -> _Int:
        """Check a dimension of an ``ndim``-dimensional tensor and normalise it to ``[0, ndim)``.

        Parameters
        ----------
        value : int
            The dimension; negative counts from the end.
        name : str
            Argument name for messages.
        ndim : int
            Number of dimensions of the tensor.

        Returns
        -------
        int
            ``value % ndim``.

        Raises
        ------
        TypeError
            Not an integer.
        ValueError
            Outside ``[-ndim, ndim)``.
        """
        v = self.int(value, name)
        if not -ndim <= v < ndim:
            raise self.value_error(f"{name} = {v} is out of range for a tensor with {ndim} dimension(s)")
        return v % ndim

    def choice(self, value: Any, name: str, choices: Collection[Any]) -> Any:
        """Check that ``value`` is one of ``choices``.

        Parameters
        ----------
        value : object
            The argument.
        name : str
            Argument name for messages.
        choices : collection
            The values accepted.

        Returns
        -------
        object
            ``value``.

        Raises
        ------
        ValueError
            Any other value (the message lists the choices).
        """
        try:
            ok = value in choices
        except TypeError:  # unhashable value tested against a set
            ok = False
        if not ok:
            raise self.value_error(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value


_UNSIGNED: tuple[Any, ...] | None = None


def _dtype_label(dtype: Any) -> str:
    """distkit's name of a dtype, or torch's for dtypes distkit has no code for (uint16, float8, ...)."""
    try:
        return dtype_name(dtype)
    except TypeError:
        return str(dtype).removeprefix("torch.")


def _unsigned() -> tuple[Any, ...]:
    global _UNSIGNED
    if _UNSIGNED is None:
        torch = _torch()
        _UNSIGNED = tuple(getattr(torch, n) for n in _WIDEN)
    return _UNSIGNED


#: the checks with the builtin exception types
DEFAULT = Checks()

check_tensor = DEFAULT.tensor
as_tensor = DEFAULT.array
as_index_tensor = DEFAULT.index
check_index_range = DEFAULT.index_range
check_int = DEFAULT.int
check_rank = DEFAULT.rank
check_axis = DEFAULT.axis
check_choice = DEFAULT.choice

__all__ = [
    "DEFAULT",
    "Checks",
    "as_index_tensor",
    "as_tensor",
    "check_axis",
    "check_choice",
    "check_index_range",
    "check_int",
    "check_rank",
    "check_tensor",
    "describe",
]
