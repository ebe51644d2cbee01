"""shardlayers across hosts of the simulated cluster (ci/cluster/README.md; `cluster` nox session).

One torchrun job checks both layouts against single-process training; two mpiexec jobs lose a
host in the middle of a sharded checkpoint save and must end everywhere, naming it, with the
previous checkpoint intact.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from distkit_common.testing import ClusterResult, Fault, run_cluster

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

JOB = Path(__file__).parent / "scripts" / "cluster_job.py"


def test_tp_inside_and_across_hosts_match_one_process(tmp_path: Path) -> None:
    """2 hosts x 2 ranks (torchrun): TP=2 inside each host x DP=2 across hosts, 6 steps equal to
    one process; its sharded checkpoint, written from both hosts, loaded after regrouping into
    TP=2 across hosts x DP=2 inside each host; 6 more steps, equal to one process."""
    res = run_cluster(2, 2, JOB, 240, args=["--layouts", str(tmp_path)], launcher="torchrun")
    assert res.hosts == {"dkh1": [0, 1], "dkh2": [2, 3]}
    inside = re.findall(
        r"rank (\d) on (dkh\d): TP \['(dkh\d)', '(dkh\d)'\] x DP \['(dkh\d)', '(dkh\d)'\] ok", res.stdout
    )
    assert len(inside) == 8, res.stdout  # every rank reports each layout once
    for _, host, tp_a, tp_b, dp_a, dp_b in inside:
        assert (tp_a == tp_b) != (dp_a == dp_b) and host in (tp_a, tp_b)
    # each rank's TP group was inside its host in the first layout and across hosts in the second
    assert sorted(tp_a == tp_b for _, _, tp_a, tp_b, _, _ in inside) == [False] * 4 + [True] * 4


def _lose_host_while_saving(tmp_path: Path, kind: str, launcher: str) -> ClusterResult:
    """The loop on 2 hosts x 2 ranks; dkh2 is lost while it writes the step-4 checkpoint.
    run_cluster asserts the job failed and ended on every host within 30 s of the fault."""
    res = run_cluster(
        2,
        2,
        JOB,
        180,
        args=["--loop", str(tmp_path), "--stall-host", "dkh2"],
        launcher=launcher,
        fault=Fault(kind, "dkh2", after_line="STALLED rank"),
    )
    print(f"{kind}: ended on every host {res.ended_after_fault:.1f} s after the fault")
    assert "CHECKPOINT step 2 saved" in res.stdout and "CHECKPOINT step 4 saved" not in res.stdout
    assert all(r.code is None for r in res.ranks if r.host == "dkh2")
    _previous_checkpoint_loads(tmp_path / "latest")
    return res


def _previous_checkpoint_loads(path: Path) -> None:
    """The interrupted save left the step-2 checkpoint in place, and it loads into one process."""
    import torch
    from scripts.cluster_job import SAVE_EVERY, reference

    import shardlayers as ts
    from distx_fake import checkpoint

    model = reference(0)  # the untrained single-process model, overwritten by the checkpoint
    sd = ts.sharded_state_dict(model)
    checkpoint.load_state_dict(sd, checkpoint.FileSystemReader(path), no_dist=True)
    ts.load_sharded_state_dict(model, sd)
    expect, later = reference(SAVE_EVERY).state_dict(), reference(2 * SAVE_EVERY).state_dict()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, expect[k], atol=1e-5, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert any(not torch.allclose(model.state_dict()[k], later[k]) for k in later)


def test_losing_a_hosts_ranks_mid_save_ends_the_job_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    res = _lose_host_while_saving(tmp_path, "kill_ranks", "mpiexec")
    # mpiexec names the lost rank and host (OMPI_MCA_mpi_abort_delay lets it hear of them first)
    assert re.search(r"process rank [23] with PID \d+ on node dkh2 exited on\s+signal 9", res.stderr), res.stderr
    assert res.launcher_codes[0] != 0


def test_losing_a_hosts_link_mid_save_ends_the_job_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    # torchrun: the heartbeat of dkh1's ranks names the silent ranks and their host (under
    # mpiexec, see docs/packages/shardlayers/guide.md, "Running on a cluster")
    res = _lose_host_while_saving(tmp_path, "link_down", "torchrun")
    assert re.search(r"distkit heartbeat: rank [01] on dkh1 lost rank [23] on dkh2", res.stderr), res.stderr
