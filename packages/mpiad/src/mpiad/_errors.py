"""Exception classes for bad arguments.

mpi4torch's communicator was a TorchScript class, so every error it raised
(unknown op, unsupported dtype, sizes that do not add up, a non-tensor
argument) reached Python as a ``RuntimeError``. mpiad raises the precise
``ValueError`` / ``TypeError`` instead, through these subclasses that are
also ``RuntimeError``: code written against mpi4torch (``except RuntimeError``)
keeps working.
"""

from __future__ import annotations


class MpiadValueError(ValueError, RuntimeError):
    """A bad argument value (out-of-range root/axis/tag, sizes that do not add up, ...)."""


class MpiadTypeError(TypeError, RuntimeError):
    """A bad argument type (not a tensor, unsupported dtype, op undefined for a dtype, ...)."""
