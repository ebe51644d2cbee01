"""mpiad across hosts: the multi-rank suite on 2 simulated hosts x 2 ranks (TCP between
hosts, shared memory within one), and a DataParallel training loop that loses a host.

The worker scripts are the ones ``test_mpi.py`` runs on one host; here one job runs
several of them in a row (``run_scripts.py``) to pay for the processes' start once.
The simulated cluster needs root and network namespaces (``ci/cluster/README.md``);
elsewhere these tests skip with one message. They run in the ``cluster`` nox session.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distkit_common.testing import ClusterResult, Fault, run_cluster

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

SCRIPTS = Path(__file__).parent / "scripts"
HOSTS = {"dkh1": [0, 1], "dkh2": [2, 3]}


def _suite(*scripts: str, timeout: float = 420) -> ClusterResult:
    res = run_cluster(2, 2, SCRIPTS / "run_scripts.py", timeout, args=list(scripts))
    assert res.hosts == HOSTS  # two ranks per host: TCP between dkh1 and dkh2
    for spec in scripts:
        assert f"run_scripts: {spec} done" in res.stdout, spec
    return res


def test_rank_suite_across_hosts() -> None:
    # one job (one start of 4 processes) runs, over TCP between the hosts:
    # mpi4torch's suite (every collective and Isend/Irecv/Wait with autograd, exact values),
    # every differentiable op against a single-process reference with gradcheck, every
    # dtype/op with bad input and debug mode, the large-count paths (derived datatypes,
    # chunked reductions, MPI_Alltoallw), every non-blocking collective against its blocking
    # twin (values, gradients, double backward, gradcheck, several in flight), then
    # DataParallel's 20 steps of an MLP and a transformer equal to single-process training
    res = _suite(
        "port_mpi4torch.py",
        "grads.py",
        "extensions.py",
        "large_counts.py:small",
        "nonblocking.py",
        "data_parallel.py",
    )
    for line in (
        "port_mpi4torch: all checks passed on 4 ranks",
        "grads: all checks passed on 4 ranks",
        "extensions: all checks passed on 4 ranks",
        "large counts (small): all checks passed on 4 ranks",
        "nonblocking: all checks passed on 4 ranks",
        "mlp: 20 steps match",
        "transformer: 20 steps match",
        "data_parallel: all checks passed on 4 ranks",
    ):
        assert line in res.stdout, line


# Faults in mpiad's typical loop (DataParallel): the job must end on every host within
# 30 s of the fault (run_cluster asserts it) with an error naming the lost rank or host.
# What makes it end is Open MPI's runtime with the settings of distkit_common/testing/cluster/cluster.env
# (docs/packages/mpiad/guide.md, "Running on a cluster"): mpiad's worker thread blocks in MPI like any
# MPI call, and the job is ended by mpiexec.


def _loop_with_fault(kind: str) -> ClusterResult:
    res = run_cluster(
        2, 2, SCRIPTS / "train_loop.py", 240, args=["100000"], fault=Fault(kind, "dkh2", after_line="STEP 5")
    )
    print(f"DataParallel loop, {kind} on dkh2: ended on every host {res.ended_after_fault:.1f} s after the fault")
    assert "STEP 5 " in res.stdout  # the loop was running across both hosts when the fault came
    assert "same weights" not in res.stdout
    return res


def test_data_parallel_loop_ends_when_the_ranks_of_a_host_are_killed() -> None:
    res = _loop_with_fault("kill_ranks")
    assert re.search(r"process rank [23] with PID \d+ on node dkh2 exited on\s+signal 9", res.stderr), res.stderr
    assert res.launcher_codes[0] != 0
    assert all(r.code is None for r in res.ranks if r.host == "dkh2")


def test_data_parallel_loop_ends_when_a_host_loses_its_link() -> None:
    res = _loop_with_fault("link_down")
    assert re.search(r"PRTE has lost communication with a remote daemon.*on node dkh2", res.stderr, re.S), res.stderr
    # Open MPI 5.0.11's mpiexec exits 0 here; run_cluster fails the job by the ranks' missing exit codes
    assert res.returncode != 0 and all(r.code != 0 for r in res.ranks)
