"""Shaped links of the simulated cluster: tbf on both ends of every host's veth, measured with TCP.

A single TCP stream's goodput is compared with ``rate * TCP_GOODPUT_SHARE``: tbf counts
each frame's Ethernet, IP and TCP headers (1514 bytes on the link for 1448 of payload,
95.6 %), so 100mbit carries about 95.6 Mbit/s of payload.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distkit_common.rates import parse_rate
from distkit_common.testing import cluster, measure_mpi_sendrecv

pytest_plugins = ["distkit_common.testing.pytest_cluster"]

CLI = cluster.CLI
TOLERANCE = 0.15


def _within(rate: int, src: str, dst: str) -> list[float]:
    """Goodput / expected goodput of up to 3 streams src -> dst: each must stay below the bound, one must reach it.

    The upper bound shows the shaping holds (unshaped, a stream carries several Gbit/s);
    the lower one that the link is not slower than asked. Up to 3 tries for the lower
    one only: the machine's 2 cores are shared, and a stream can lose the CPU for a while.
    """
    expected = rate / 8 * cluster.TCP_GOODPUT_SHARE
    ratios: list[float] = []
    for _ in range(3):
        ratios.append(cluster.measure_tcp(src, dst, seconds=1.5) / expected)
        assert ratios[-1] <= 1 + TOLERANCE, f"goodput / expected {ratios}: the link is not shaped to {rate} bit/s"
        if ratios[-1] >= 1 - TOLERANCE:
            return ratios
    raise AssertionError(f"goodput / expected {ratios}: below {1 - TOLERANCE} in 3 tries")


def _ifindex(link: str) -> int:
    return int(Path(f"/sys/class/net/{link}/ifindex").read_text())


@pytest.mark.cluster
def test_shaped_links_limit_a_tcp_stream_in_both_directions(simulated_cluster: cluster.Cluster) -> None:
    outer = cluster.current()
    assert outer is not None and outer == simulated_cluster  # unshaped unless $DISTKIT_CLUSTER_RATE says otherwise
    for rate, src, dst in (("100mbit", "dkh1", "dkh2"), ("1gbit", "dkh2", "dkh1")):
        bits = parse_rate(rate)
        with cluster.session(2, rate=rate) as c:  # nested in the plugin's session: re-shapes its cluster
            assert c.rate == bits and c.hosts == outer.hosts
            assert cluster.active() == c and cluster.current() == c
            assert all(cluster.link_rates(h) == (bits, bits) for h in c.hosts)
            _within(bits, src, dst)
            assert cluster.host_pids(src) == [] and cluster.host_pids(dst) == []  # both ends reaped
        # the outer session's links are as they were
        assert cluster.current() == outer
        assert all(cluster.link_rates(h) == (outer.rate, outer.rate) for h in outer.hosts)


@pytest.mark.cluster
def test_measure_tcp_is_bounded_in_time_and_reaps_its_ends(simulated_cluster: cluster.Cluster) -> None:
    # a 30 s stream cut off by a 3 s timeout (at 1mbit, so that it costs no CPU meanwhile)
    with cluster.session(2, rate="1mbit"):
        with pytest.raises(cluster.ClusterError, match=r"the TCP stream dkh1 -> dkh2 did not end within 3s"):
            cluster.measure_tcp("dkh1", "dkh2", seconds=30, timeout=3)
        assert cluster.host_pids("dkh1") == [] and cluster.host_pids("dkh2") == []
    with pytest.raises(cluster.ClusterError, match="hosts dkh1 and dkh9 are not both up"):
        cluster.measure_tcp("dkh1", "dkh9")


@pytest.mark.cluster
def test_mpi_sendrecv_bound_follows_the_shaped_rate(simulated_cluster: cluster.Cluster) -> None:
    # 4 MiB from dkh1 to dkh2 over 100mbit: ~0.35 s per message. One way: both ways at once, an
    # exchange on the loaded cores sometimes runs one direction after the other, all 3 in one of 3
    # runs (half the rate each way; see ci/cluster/README.md)
    res = measure_mpi_sendrecv(("dkh1", "dkh2"), 4 * 2**20, 3, timeout=120, rate="100mbit", one_way=True)
    assert res["hosts"] == ["dkh1", "dkh2"] and res["bytes"] == 4 * 2**20 and len(res["seconds"]) == 3
    assert res["best_s"] == min(res["seconds"]) and res["median_s"] == sorted(res["seconds"])[1]
    assert res["bytes_per_s"] == res["bytes"] / res["median_s"] and res["one_way"]
    ratio = res["bytes_per_s"] / (1e8 / 8 * cluster.TCP_GOODPUT_SHARE)
    assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, res
    assert cluster.current() == simulated_cluster  # the session's links as they were


@pytest.mark.cluster(session=False)
def test_shaped_cluster_reshapes_repairs_and_down_leaves_nothing() -> None:
    # every check runs under the session's lock: other users of the machine may hold the cluster before and after
    with cluster.session(2, rate="100mbit") as c:
        assert c.rate == 10**8 and cluster.current() == c
        ifindex = _ifindex("dkv2")  # a new veth gets a new one
        assert sorted(x for x in cluster.leftovers() if x.startswith("qdisc")) == [
            "qdisc tbf dev dk0 in dkh1",
            "qdisc tbf dev dk0 in dkh2",
            "qdisc tbf dev dkv1",
            "qdisc tbf dev dkv2",
        ]
        # both ends carry the qdisc, with a bucket >= rate / HZ (250 here: 4 ms) and >= 128 KiB
        burst, limit = cluster.tbf_params(10**8)
        assert (burst, limit) == (128 * 1024, 128 * 1024 + 1024 * 1024)
        shown = subprocess.run(["tc", "-n", "dkh2", "qdisc", "show", "dev", "dk0"], capture_output=True, text=True)
        assert "tbf" in shown.stdout and "rate 100Mbit" in shown.stdout
        # another rate on the same idle cluster: re-shaped in place, not rebuilt
        assert cluster.up(2, rate="1gbit") == cluster.Cluster(c.hosts, 10**9)
        assert _ifindex("dkv2") == ifindex
        assert cluster.current() == cluster.Cluster(c.hosts, 10**9)
        assert cluster.tbf_params(10**10) == (5_000_000, 5_000_000 + 62_500_000)  # 10gbit: 4 ms bucket, 50 ms queue
        # half shaped (one end's qdisc gone): current() reports no rate and up() rebuilds the cluster
        subprocess.run(["tc", "qdisc", "del", "dev", "dkv2", "root"], check=True)
        assert cluster.current() == cluster.Cluster(c.hosts, None)
        assert cluster.link_rates("dkh2") == (None, 10**9)
        assert cluster.up(2, rate="1gbit") == cluster.Cluster(c.hosts, 10**9)
        assert _ifindex("dkv2") > ifindex
        assert all(cluster.link_rates(h) == (10**9, 10**9) for h in c.hosts)
        # down removes the qdiscs (and says so), then everything else
        removed = cluster.down()
        assert {"qdisc tbf dev dkv1", "qdisc tbf dev dk0 in dkh2", "netns dkh1", "link dkbr0"} <= set(removed)
        assert cluster.leftovers() == []
        tc_left = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True).stdout
        assert "dkv" not in tc_left and "tbf" not in tc_left
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
        assert "dkv" not in links and cluster.BRIDGE not in links
        assert "dkh" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


@pytest.mark.cluster(session=False)
def test_command_line_up_with_rate_status_measure() -> None:
    # the commands run under this test's lock (inherited), so no other user's session takes the machine between them
    lock = cluster._session._lock(cluster.LOCK_WAIT_S)
    env = {**os.environ, cluster.LOCK_FD_ENV: str(lock)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-I", str(CLI), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
            pass_fds=(lock,),
        )

    try:
        up = cli("up", "2", "--rate", "100mbit")
        assert up.returncode == 0, up.stderr
        assert "every link shaped to 100mbit in both directions" in up.stdout
        status = cli("status").stdout
        assert "dkh2\t10.213.0.2\tlink dkv2 up\tprocesses 0\tin/out 100mbit/100mbit" in status
        assert "links: shaped to 100mbit in both directions" in status
        measured = cli("measure", "dkh2", "dkh1", "--seconds", "1")
        assert measured.returncode == 0, measured.stderr
        mbit = float(measured.stdout.split(": ")[1].split()[0])
        assert 100 * cluster.TCP_GOODPUT_SHARE * (1 - TOLERANCE) <= mbit <= 100 * (1 + TOLERANCE)
        bad = cli("up", "2", "--rate", "100mb")
        assert bad.returncode == 1 and "rate '100mb' is not a link rate" in bad.stderr
        assert cli("up", "2").returncode == 0  # unshaped again
        assert "links: unshaped" in cli("status").stdout
        # without the lock the commands are refused while it is held
        refused = subprocess.run(
            [sys.executable, "-I", str(CLI), "down"], capture_output=True, text=True, timeout=60, check=False
        )
        assert refused.returncode == 1 and "in use by another process" in refused.stderr
    finally:
        try:
            down = cli("down")
            assert down.returncode == 0, down.stderr
            assert cluster.leftovers() == []
        finally:
            os.close(lock)
