"""The composed training job across hosts: 2 simulated hosts x 2 ranks, bit-identical resume.

Ranks 0, 1 run on dkh1 and 2, 3 on dkh2: mpiad's Allreduce, kvps's messages and the
gloo group of shardlayers cross TCP; each host has its own wholemem HOST table (a
communicator of the node's ranks); the checkpoint folder is shared. The same checks
as the single-host test (``conftest.py``). Runs in the ``cluster`` nox session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distkit_common.testing import run_cluster

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

HOSTS = {"dkh1": [0, 1], "dkh2": [2, 3]}


def test_job_across_two_hosts_resumes_bit_identically(tmp_path: Path, recsys) -> None:
    def run(args: list[str]) -> None:
        res = run_cluster(2, 2, recsys.job, 300, args=args)  # asserts every rank exited 0
        assert res.hosts == HOSTS

    summary = recsys.check_resume_is_bit_identical(run, tmp_path)
    assert summary["ranks"] == 4
