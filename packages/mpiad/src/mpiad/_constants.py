"""Reduction-operation constants (same values as mpi4torch's)."""

from __future__ import annotations

MPI_MAX = 0
MPI_MIN = 1
MPI_SUM = 2
MPI_PROD = 3
MPI_LAND = 4
MPI_BAND = 5
MPI_LOR = 6
MPI_BOR = 7
MPI_LXOR = 8
MPI_BXOR = 9
MPI_MINLOC = 10
MPI_MAXLOC = 11

OP_NAMES: dict[int, str] = {
    MPI_MAX: "MPI_MAX",
    MPI_MIN: "MPI_MIN",
    MPI_SUM: "MPI_SUM",
    MPI_PROD: "MPI_PROD",
    MPI_LAND: "MPI_LAND",
    MPI_BAND: "MPI_BAND",
    MPI_LOR: "MPI_LOR",
    MPI_BOR: "MPI_BOR",
    MPI_LXOR: "MPI_LXOR",
    MPI_BXOR: "MPI_BXOR",
    MPI_MINLOC: "MPI_MINLOC",
    MPI_MAXLOC: "MPI_MAXLOC",
}

#: Ops whose backward is implemented.
DIFFERENTIABLE_OPS = frozenset({MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD, MPI_MINLOC, MPI_MAXLOC})

#: Tag offset of the messages that carry gradients backwards (as in mpi4torch).
BACKWARD_TAG_OFFSET = 10
