"""wholemem across simulated hosts (the `cluster` nox session; ci/cluster/README.md).

Few jobs, each covering many checks: one 2 hosts x 2 ranks job runs every check of
tests/scripts/cluster_suite.py; two run the training loop of cluster_loop.py and lose a
host's ranks (SIGKILL) or its link; one runs the cross-host gather benchmark in a short mode.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from distkit_common.testing import ClusterResult, Fault, run_cluster

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
BENCH = HERE.parent / "benchmarks" / "bench_gather.py"


def test_tensors_communicators_and_embeddings_across_two_hosts() -> None:
    res = run_cluster(2, 2, SCRIPTS / "cluster_suite.py", 180)
    for rank in range(4):
        host = f"dkh{rank // 2 + 1}"
        nodes = "[0, 1]" if rank < 2 else "[2, 3]"
        assert f"cluster_suite OK rank {rank} on {host} (node ranks {nodes})" in res.stdout, res.stdout
    assert res.hosts == {"dkh1": [0, 1], "dkh2": [2, 3]}


def _loop_with_fault(kind: str) -> ClusterResult:
    res = run_cluster(
        2,
        2,
        SCRIPTS / "cluster_loop.py",
        180,
        launcher="torchrun",
        fault=Fault(kind, "dkh2", after_line="LOOP RUNNING"),
    )
    print(f"{kind}: the job ended on every host {res.ended_after_fault:.1f} s after the fault")
    assert res.ended_after_fault is not None and res.ended_after_fault < 30
    return res


def test_training_loop_ends_naming_the_host_whose_ranks_were_killed() -> None:
    res = _loop_with_fault("kill_ranks")
    # a survivor's wholemem collective names the host and the ranks it lost (gloo gives an address only)
    assert re.search(
        r"RuntimeError: wholemem all_to_all: rank [01] on dkh1 lost its connection to "
        r"dkh2 \(10\.213\.0\.2; ranks 2, 3 of this communicator\)",
        res.stderr,
    ), res.stderr[-4000:]


def test_training_loop_ends_naming_the_host_that_lost_its_link() -> None:
    res = _loop_with_fault("link_down")
    # nothing closes a socket: the heartbeat names the silent ranks / the unreachable store
    assert re.search(r"rank [01] on dkh1 lost rank [23] on dkh2", res.stderr) or re.search(
        r"rank [23] on dkh2 lost contact with the job's store on dkh1", res.stderr
    ), res.stderr[-4000:]


def test_gather_benchmark_across_hosts_prints_its_ratio() -> None:
    res = run_cluster(2, 2, BENCH, 180, args=["--across-hosts", "--quick"])
    rows = [json.loads(line[6:]) for line in res.stdout.splitlines() if line.startswith("BENCH ")]
    assert [r["name"] for r in rows] == [
        "gather across 2 hosts x 2 ranks: NCCL type / torch.distributed all_to_all gather"
    ], res.stdout
    assert rows[0]["ratio"] > 0 and rows[0]["detail"]["hosts"] == 2
