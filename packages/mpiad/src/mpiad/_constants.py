"""Reduction-operation constants, read from the extension (mpi4torch's values, plus MPI_AVG)."""

from __future__ import annotations

from . import _mpiad

MPI_MAX: int = _mpiad.MPI_MAX
MPI_MIN: int = _mpiad.MPI_MIN
MPI_SUM: int = _mpiad.MPI_SUM
MPI_PROD: int = _mpiad.MPI_PROD
MPI_LAND: int = _mpiad.MPI_LAND
MPI_BAND: int = _mpiad.MPI_BAND
MPI_LOR: int = _mpiad.MPI_LOR
MPI_BOR: int = _mpiad.MPI_BOR
MPI_LXOR: int = _mpiad.MPI_LXOR
MPI_BXOR: int = _mpiad.MPI_BXOR
MPI_MINLOC: int = _mpiad.MPI_MINLOC
MPI_MAXLOC: int = _mpiad.MPI_MAXLOC
#: SUM divided by the communicator size (floating and complex dtypes); its backward
#: is the AVG of the upstream gradients (mpiad's addition to mpi4torch's constants).
MPI_AVG: int = _mpiad.MPI_AVG

OP_NAMES: dict[int, str] = dict(_mpiad.OP_NAMES)

#: Ops whose backward is implemented.
DIFFERENTIABLE_OPS = frozenset({MPI_SUM, MPI_AVG, MPI_MAX, MPI_MIN, MPI_PROD, MPI_MINLOC, MPI_MAXLOC})

#: Tag offset of the messages that carry gradients backwards (as in mpi4torch).
BACKWARD_TAG_OFFSET = 10
