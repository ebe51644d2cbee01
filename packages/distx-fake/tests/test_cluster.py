"""Checkpoints across simulated hosts (the ``cluster`` nox session; ci/cluster/README.md).

Hosts dkh1..dkh4 share the filesystem (as a cluster's shared filesystem) but not the network
or the hostname. Saved by 4 ranks on dkh1 + dkh2, loaded by 3 ranks on dkh3 + dkh4; the
stale-folder cleanup never removes another host's folder; a host lost in the middle of a save
(its ranks killed, or its link down) ends the job everywhere with its name, and the previous
checkpoint stays the one that loads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distkit_common import fsio
from distkit_common.testing import ClusterResult, Fault, run_cluster
from distx_fake import checkpoint as cp

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

JOB = Path(__file__).parent / "scripts" / "cluster_ckpt.py"


def test_saved_on_two_hosts_loads_on_three_ranks_of_two_other_hosts(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    res = run_cluster(["dkh1", "dkh2"], 2, JOB, 180, args=["save", str(ck)])
    assert res.hosts == {"dkh1": [0, 1], "dkh2": [2, 3]}
    assert "stale: rank 0 on dkh1 kept both folders of dkh2" in res.stdout
    assert "stale: rank 3 on dkh2 removed its own dead writers' folders" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary folder left
    files = {c["file"] for e in cp.FileSystemReader(ck).read_index()["entries"] for c in e.get("chunks", [])}
    assert files == {f"rank{r}.bin" for r in range(4)}  # every rank wrote its shards

    res = run_cluster(["dkh3", "dkh4"], [2, 1], JOB, 180, args=["load", str(ck)])
    assert res.hosts == {"dkh3": [0, 1], "dkh4": [2]}
    for rank, host in ((0, "dkh3"), (1, "dkh3"), (2, "dkh4")):
        assert f"loaded equal rank {rank} of 3 on {host}" in res.stdout


def _only_previous_checkpoint_loads(ck: Path) -> None:
    """The committed checkpoint is the first save's; what the second left is never complete."""
    g = {k: v.clone() for k, v in _globals().items()}
    sd = {"model": {"dt": torch.zeros_like(g["dt"]), "ls": torch.zeros_like(g["ls"])}, "step": 0}
    cp.load_state_dict(sd, cp.FileSystemReader(ck), no_dist=True)
    assert sd["step"] == 17  # not the interrupted save's 18
    assert torch.equal(sd["model"]["dt"], g["dt"]) and torch.equal(sd["model"]["ls"], g["ls"])
    for tmp in ck.parent.glob(ck.name + fsio.TMP_INFIX + "*"):
        assert not (tmp / "metadata.json").exists()
        with pytest.raises(FileNotFoundError):
            cp.FileSystemReader(tmp).read_index()
        # its writers ran on dkh1 and dkh2: this process (another host name) leaves it alone
        assert fsio.clean_stale(ck) == []


def _globals() -> dict[str, torch.Tensor]:
    import sys

    sys.path.insert(0, str(JOB.parent))
    import ckpt_workers

    return ckpt_workers.global_tensors()


def _interrupted_save(ck: Path, kind: str, launcher: str) -> ClusterResult:
    res = run_cluster(
        2,
        2,
        JOB,
        180,
        args=["fault", str(ck), "--stall-host", "dkh2"],
        launcher=launcher,
        fault=Fault(kind, "dkh2", after_line="STALLED MID-WRITE"),
    )  # asserts the job failed and ended on every host within 30 s of the fault
    assert "SAVED PREVIOUS" in res.stdout
    assert "second save completed" not in res.stdout
    print(f"{launcher} {kind}: ended on every host {res.ended_after_fault:.1f} s after the fault")
    _only_previous_checkpoint_loads(ck)
    return res


def test_ranks_of_a_host_killed_mid_save_end_the_job_and_keep_the_previous_checkpoint(tmp_path: Path) -> None:
    res = _interrupted_save(tmp_path / "ck", "kill_ranks", "mpiexec")
    assert re.search(r"process rank [23] with PID \d+ on node dkh2 exited on\s+signal 9", res.stderr), res.stderr


def test_host_cut_off_mid_save_ends_the_job_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    res = _interrupted_save(tmp_path / "ck", "link_down", "torchrun")
    # the survivors' heartbeat names the ranks and the host they lost
    assert re.search(r"distkit heartbeat: rank [01] on dkh1 lost rank [23] on dkh2", res.stderr), res.stderr
