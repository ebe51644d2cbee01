"""Jobs across the simulated cluster: mpiexec and torchrun on 2 hosts x 2 ranks, failures, faults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distkit_common.testing import ClusterResult, Fault, cluster, run_cluster

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster

SCRIPTS = Path(__file__).parent / "scripts"
MPI_JOB = SCRIPTS / "cluster_mpi.py"
GLOO_JOB = SCRIPTS / "cluster_gloo.py"
REPORT = re.compile(
    r"rank (\d+) size (\d+) host (\S+) local (\d+) (?:node_size (\d+) )?master (\S+) sum (\d+) exact (True|False)$",
    re.M,
)


def _reports(res: ClusterResult) -> dict[int, tuple[str, ...]]:
    return {int(m.group(1)): m.groups() for m in REPORT.finditer(res.stdout)}


def _no_job_left() -> None:
    c = cluster.current()
    assert c is not None
    assert {h.name: cluster.host_pids(h) for h in c.hosts} == {h.name: [] for h in c.hosts}


def test_mpiexec_2x2_places_ranks_on_hosts_and_sums_exactly() -> None:
    res = run_cluster(2, 2, MPI_JOB, 120)
    reports = _reports(res)
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, (_, size, host, local, node_size, master, total, exact) in reports.items():
        assert (size, host, local) == ("4", f"dkh{rank // 2 + 1}", str(rank % 2))
        assert node_size == "2"  # Open MPI sees the two ranks of a host as co-located, and only them
        assert (master, total, exact) == ("dkh1", "10", "True")
    assert res.hosts == {"dkh1": [0, 1], "dkh2": [2, 3]}
    assert [r.code for r in res.ranks] == [0, 0, 0, 0]
    _no_job_left()


def test_mpiexec_uneven_ranks_on_chosen_hosts() -> None:
    res = run_cluster(["dkh2", "dkh3"], [1, 2], MPI_JOB, 120)
    reports = _reports(res)
    assert {r: (v[2], v[3], v[6]) for r, v in reports.items()} == {
        0: ("dkh2", "0", "6"),
        1: ("dkh3", "0", "6"),
        2: ("dkh3", "1", "6"),
    }


def test_pytest_file_runs_on_every_rank() -> None:
    res = run_cluster(2, 1, SCRIPTS / "test_rank_suite.py", 120, args=["-q", "-s", "--color=no"])
    assert [r.code for r in res.ranks] == [0, 0]  # pytest's exit code on each rank
    assert "rank 0 on dkh1 passed" in res.stdout and "rank 1 on dkh2 passed" in res.stdout


def test_failing_rank_fails_the_call_with_its_output() -> None:
    with pytest.raises(AssertionError) as info:
        run_cluster(2, 2, MPI_JOB, 120, args=["--fail-rank", "3"])
    msg = str(info.value)
    assert "rank 3 on dkh2: exit code 1" in msg
    assert "ValueError: boom from rank 3" in msg
    _no_job_left()


def test_timeout_kills_every_process_on_the_hosts() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 10s") as info:
        run_cluster(2, 2, MPI_JOB, 10, args=["--hang-rank", "2"])
    assert "rank 2 on dkh2: no exit code" in str(info.value)
    _no_job_left()


# Faults: the job must end on every host within 30 s with an error naming the lost host
# (run_cluster asserts the deadline; the measured times go to ci/cluster/README.md).


def _fault(launcher: str, kind: str) -> ClusterResult:
    script = MPI_JOB if launcher == "mpiexec" else GLOO_JOB
    res = run_cluster(
        2, 2, script, 180, args=["--loop"], launcher=launcher, fault=Fault(kind, "dkh2", after_line="LOOP RUNNING")
    )
    print(f"{launcher} {kind}: ended on every host {res.ended_after_fault:.1f} s after the fault")
    _no_job_left()
    return res


def test_mpi_job_ends_when_a_host_is_killed() -> None:
    res = _fault("mpiexec", "kill")
    # Whichever mpiexec hears first names dkh2: the launch agent (our ssh) reporting its host lost
    # (it exits 255 as ssh would), or the daemon's dropped connection (then mpiexec kills the agent
    # before it can report).
    assert re.search(
        r"distkit cluster agent: the command on dkh2 was killed by signal 9 \(host dkh2 lost\)"
        r"|PRTE has lost communication with a remote daemon.*on node dkh2",
        res.stderr,
        re.S,
    ), res.stderr
    assert res.returncode != 0
    assert all(r.code is None for r in res.ranks if r.host == "dkh2")


def test_mpi_job_ends_when_the_ranks_of_a_host_are_killed() -> None:
    res = _fault("mpiexec", "kill_ranks")
    # mpi_abort_delay lets mpiexec hear of the killed ranks before the survivors' aborts
    assert re.search(
        r"prterun noticed that process rank [23] with PID \d+ on node dkh2 exited on\s+signal 9", res.stderr
    )
    assert res.launcher_codes[0] != 0


def test_mpi_job_ends_when_a_host_loses_its_link() -> None:
    res = _fault("mpiexec", "link_down")
    assert re.search(r"PRTE has lost communication with a remote daemon.*on node dkh2", res.stderr, re.S)
    # Open MPI 5.0.11's mpiexec exits 0 here; run_cluster fails the job by its ranks' missing exit codes
    assert res.returncode != 0 and all(r.code is None for r in res.ranks)
    assert [r.rank for r in res.failed_ranks()] == [0, 1, 2, 3]


def test_mpi_job_ends_when_a_host_loses_its_link_with_output_in_flight() -> None:
    # keepalive probes only idle connections: dkh2's daemon, forwarding its ranks' output, has
    # unacknowledged data when the link goes, and notices only through TCP's retransmission
    # timeout (cluster.TCP_RETRIES2; with the kernel's default it outlived the job, 2 of 2 runs)
    res = run_cluster(
        2, 2, MPI_JOB, 180, args=["--chatty-host", "dkh2"], fault=Fault("link_down", "dkh2", after_line="LOOP RUNNING")
    )
    print(f"mpiexec link_down, output in flight: ended on every host {res.ended_after_fault:.1f} s after the fault")
    _no_job_left()
    assert re.search(r"PRTE has lost communication with a remote daemon.*on node dkh2", res.stderr, re.S)
    assert all(r.code is None for r in res.ranks if r.host == "dkh2")


def test_torchrun_2x2_gloo_sums_exactly_then_ends_when_a_host_is_killed() -> None:
    res = _fault("torchrun", "kill")
    # before the fault: every rank on its host, MASTER_ADDR the first host, an exact sum (one job
    # checks both: each torchrun job costs ~15 s of torch imports on 2 cores)
    reports = _reports(res)
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, (_, size, host, local, _, master, total, exact) in reports.items():
        assert (size, host, local, master, total, exact) == (
            "4",
            f"dkh{rank // 2 + 1}",
            str(rank % 2),
            "dkh1",
            "10",
            "True",
        )
    # gloo names the lost peer by its address (dkh2 is 10.213.0.2)
    assert re.search(r"RuntimeError: .*(Connection reset by peer|Connection closed by peer).*", res.stderr)
    assert re.search(r"RuntimeError: .*\[10\.213\.0\.2\]", res.stderr)
    assert res.launcher_codes[0] != 0


def test_gloo_job_ends_when_a_host_loses_its_link() -> None:
    res = _fault("torchrun", "link_down")
    # the heartbeat names the lost ranks on the connected side and the lost store on the other
    # (one or both of dkh2's ranks: those silent past the timeout at the check that fired first)
    assert re.search(r"rank [01] on dkh1 lost rank [23] on dkh2", res.stderr)
    assert re.search(r"rank [23] on dkh2 lost contact with the job's store on dkh1", res.stderr)
    assert all(c != 0 for c in res.launcher_codes)
