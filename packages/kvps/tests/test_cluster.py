"""kvps across the hosts of the simulated cluster (issue #14; runs in the `cluster` nox session).

Ranks on different hosts exchange messages over TCP, ranks on one host share
their shards in memory; a lost host ends the job everywhere, naming it, and a
save it interrupts leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from distkit_common.testing import ClusterResult, Fault, run_cluster, run_mpi

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

SCRIPTS = Path(__file__).parent / "scripts"
STATS = re.compile(r"nodes stats: rank (\d) on (\S+) (\w+) (\{.*\})$", re.M)


def test_suite_across_hosts_then_load_on_three_ranks(tmp_path: Path) -> None:
    """2 hosts x 2 ranks: the multi-rank suite, both access paths, exact sums; the save loads on 3 other ranks."""
    ck = tmp_path / "ckpt"
    res = run_cluster(2, 2, SCRIPTS / "cluster_suite.py", 240, args=[str(ck)])
    assert res.hosts == {"dkh1": [0, 1], "dkh2": [2, 3]}
    for tech in ("all", "relocation_only"):
        assert f"core ok: technique={tech} ranks=4 shm=False" in res.stdout, res.stdout
    assert "core ok: technique=none ranks=4 shm=False" in res.stdout
    assert "bags ok on 4 ranks (shared memory False)" in res.stdout and "persist save ok on 4 ranks" in res.stdout
    # every rank served keys of its host's other rank in place and the other host's through messages
    stats = {(int(m[1]), m[3]): (m[2], json.loads(m[4])) for m in STATS.finditer(res.stdout)}
    assert sorted(stats) == [(r, t) for r in range(4) for t in ("all", "relocation_only")], res.stdout
    for (rank, _), (host, st) in stats.items():
        assert host == f"dkh{rank // 2 + 1}"
        assert st["shared"] > 0 and st["remote"] > 0 and st["local"] > 0, st
    # saved by 4 ranks on dkh1/dkh2, loaded into 3 ranks on dkh3/dkh4 (and Adam's state with it)
    res = run_cluster(["dkh3", "dkh4"], [2, 1], SCRIPTS / "persist.py", 180, args=["load", str(ck), "float32", "4"])
    assert "persist load ok on 3 ranks" in res.stdout
    assert res.hosts == {"dkh3": [0, 1], "dkh4": [2]}


def test_relocation_sticks_across_three_hosts() -> None:
    """3 hosts x 1 rank at 1 Gbit/s: a key one host's rank intends stays there after its window, keys two
    intend at once are held by both, a later intender takes the key on; exact sums under concurrent pushes."""
    res = run_cluster(3, 1, SCRIPTS / "sticky.py", 180, rate="1gbit")
    assert res.hosts == {"dkh1": [0], "dkh2": [1], "dkh3": [2]}
    assert "sticky ok" in res.stdout, res.stdout


def _fault_during_save(tmp_path: Path, kind: str) -> ClusterResult:
    ck = tmp_path / "ckpt"
    fault = Fault(kind, "dkh2", after_line="WROTE SHARD 3")
    res = run_cluster(2, 2, SCRIPTS / "cluster_fault.py", 180, args=["loop", str(ck)], fault=fault)
    assert "SAVED 2" in res.stdout and "SAVED 3" not in res.stdout
    assert res.ended_after_fault is not None and res.ended_after_fault < 30  # (run_cluster checks it too)
    print(f"kvps {kind}: ended on every host {res.ended_after_fault:.1f} s after the fault")
    # the save of round 3 was cut off after some shards were written: its temporary folder is
    # left (claimed by processes of another host, so nothing here may remove it) and the
    # checkpoint is round 2's, complete
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt.tmp-")], list(tmp_path.iterdir())
    load = run_mpi(str(SCRIPTS / "cluster_fault.py"), 2, args=("load", str(ck), "2"), timeout=120)
    assert "fault load ok: round 2 on 2 ranks" in load.stdout
    return res


def test_killed_ranks_of_a_host_end_the_job_and_keep_the_checkpoint(tmp_path: Path) -> None:
    res = _fault_during_save(tmp_path, "kill_ranks")
    # mpiexec names the killed rank and its host; every rank of the job is gone
    assert re.search(r"process rank [23] with PID \d+ on node dkh2 exited on\s+signal 9", res.stderr), res.stderr
    assert res.launcher_codes[0] != 0


def test_host_losing_its_link_ends_the_job_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    res = _fault_during_save(tmp_path, "link_down")
    # PRRTE's keepalive (cluster.env) declares the host lost; its own daemon ends its ranks
    assert re.search(r"PRTE has lost communication with a remote daemon.*on node dkh2", res.stderr, re.S), res.stderr
    assert all(r.code is None or r.code != 0 for r in res.ranks)
