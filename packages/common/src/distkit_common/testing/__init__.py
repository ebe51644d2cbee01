"""Test harness: run a body on N processes, or across simulated hosts, with a timeout.

Nothing here is needed at run time; the training code of every package imports
only the runtime modules of :mod:`distkit_common`. The harness ships in the
same wheel so that every package's tests, benchmarks and the composed job's CI
use one implementation.

- :func:`run_mpi` - a script on N ranks through ``mpiexec`` (``_process``).
- :func:`run_spawn`, :func:`run_spawn_rows` - a function on N processes (torch
  multiprocessing spawn), with :func:`init_process_group`,
  :func:`destroy_process_group` and :func:`collective_timeout` for its bodies (``_spawn``).
- :func:`run_cluster` - a script or pytest file across the hosts of the simulated
  cluster, with an injected :class:`Fault`; :func:`measure_mpi_sendrecv` - the MPI
  point-to-point bound between two hosts (``_cluster_run``, ``_cluster_job``,
  ``_cluster_rank``, :mod:`~distkit_common.testing.mpi_p2p`).
- :mod:`distkit_common.testing.cluster` - the simulated cluster itself (network
  namespaces; needs root).
- :mod:`distkit_common.testing.pytest_cluster` - the pytest plugin that holds a
  simulated cluster for tests marked ``cluster``.
- :mod:`distkit_common.testing.crash` - crash consistency: a writer SIGKILLed at I/O
  steps of its save drawn from a seed, and what each kill left checked.

Every runner starts its children in a new session, kills the whole group on
timeout, reaps every child and fails (``AssertionError`` with the output tail)
on any non-zero exit code, so a hung collective fails a test instead of hanging CI.
"""

from __future__ import annotations

from ._cluster_job import FAULT_DEADLINE_S, Fault, RankExit
from ._cluster_run import ClusterResult, measure_mpi_sendrecv, run_cluster
from ._process import DEFAULT_TIMEOUT, RunResult, mpi_env, mpiexec_command, run_mpi
from ._spawn import (
    SPAWN_START_TIMEOUT,
    collective_timeout,
    destroy_process_group,
    init_process_group,
    run_spawn,
    run_spawn_rows,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "FAULT_DEADLINE_S",
    "SPAWN_START_TIMEOUT",
    "ClusterResult",
    "Fault",
    "RankExit",
    "RunResult",
    "collective_timeout",
    "destroy_process_group",
    "init_process_group",
    "measure_mpi_sendrecv",
    "mpi_env",
    "mpiexec_command",
    "run_cluster",
    "run_mpi",
    "run_spawn",
    "run_spawn_rows",
]
