"""A pytest file that runs on every rank of a cluster job (test_cluster_jobs.py launches it with run_cluster)."""

import os
import socket

import pytest

pytestmark = pytest.mark.skipif(
    not os.environ.get("DISTKIT_CLUSTER_STATUS_DIR"),
    reason="runs on the ranks of a cluster job (see test_cluster_jobs.py)",
)


def test_allreduce_across_hosts() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    assert comm.allreduce(comm.rank + 1) == comm.size * (comm.size + 1) // 2
    hosts = comm.allgather(socket.gethostname())
    assert len(set(hosts)) == 2, hosts
    print(f"rank {comm.rank} on {socket.gethostname()} passed", flush=True)
