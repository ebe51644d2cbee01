"""The cluster helpers' checks and the heartbeat - nothing here needs root or namespaces."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from distkit_common import heartbeat, rates, testing
from distkit_common.testing import Fault, cluster, mpi_p2p
from distkit_common.testing._cluster_job import placement
from distkit_common.testing._cluster_rank import is_pytest_file

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parents[3]


def test_hosts_are_named_and_addressed_deterministically() -> None:
    h = cluster.host(3)
    assert (h.index, h.name, h.address, h.link) == (3, "dkh3", "10.213.0.3", "dkv3")
    assert cluster.resolve_host("dkh12") == cluster.host(12)
    assert cluster.resolve_host(h) is h
    assert cluster.exec_prefix("dkh2")[:4] == ["ip", "netns", "exec", "dkh2"]


def test_bad_hosts_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"host index 0 is out of range \[1, 32\]"):
        cluster.host(0)
    with pytest.raises(TypeError, match="host index must be an int, got bool"):
        cluster.host(True)
    with pytest.raises(ValueError, match="'eth0' is not a simulated host name"):
        cluster.resolve_host("eth0")
    with pytest.raises(ValueError, match=r"n = 33 is out of range"):
        cluster.up(33)
    with pytest.raises(TypeError, match="n must be an int, got str"):
        cluster.up("2")  # type: ignore[arg-type]


def test_placement_fills_hosts_in_order() -> None:
    p = placement(2, 2)
    assert [h.name for h in p.hosts] == ["dkh1", "dkh2"] and p.ranks == [2, 2] and p.total == 4
    assert [p.host_of(r).name for r in range(4)] == ["dkh1", "dkh1", "dkh2", "dkh2"]
    q = placement(["dkh3", 4], [2, 1])
    assert [h.name for h in q.hosts] == ["dkh3", "dkh4"] and q.host_of(2).name == "dkh4"
    with pytest.raises(ValueError, match="rank 3 is outside the job"):
        q.host_of(3)


@pytest.mark.parametrize(
    ("hosts", "ranks", "error", "match"),
    [
        (0, 2, ValueError, r"hosts = 0 is out of range"),
        (True, 2, TypeError, "hosts must be an int or a sequence of host names, got bool"),
        ("dkh1", 2, TypeError, "hosts must be an int or a sequence of host names, got str"),
        ([], 2, ValueError, "hosts is empty"),
        (["dkh1", "dkh1"], 2, ValueError, "hosts has duplicates"),
        (["dkh1", "lo"], 2, ValueError, "'lo' is not a simulated host name"),
        (2, [1, 2, 3], ValueError, "ranks_per_host has 3 entries for 2 hosts"),
        (2, 0, ValueError, r"ranks_per_host entry 0 is out of range \[1, 64\]"),
        (2, 2.0, TypeError, "ranks_per_host must be an int or a sequence of ints, got float"),
        (2, [1, "2"], TypeError, "ranks_per_host entries must be ints, got str"),
    ],
)
def test_bad_placement(hosts: object, ranks: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        placement(hosts, ranks)  # type: ignore[arg-type]


def test_bad_fault() -> None:
    with pytest.raises(ValueError, match="fault kind must be one of"):
        Fault("reboot", "dkh2")
    with pytest.raises(ValueError, match="not a simulated host name"):
        Fault("kill", "eth0")
    with pytest.raises(ValueError, match=r"after_seconds = -1 is out of range"):
        Fault("kill", 2, after_seconds=-1)
    with pytest.raises(TypeError, match="after_seconds must be a number, got str"):
        Fault("kill", 2, after_seconds="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after_line must be a non-empty string"):
        Fault("link_down", 2, after_line="")


def test_run_cluster_rejects_bad_arguments_before_touching_the_machine() -> None:
    job = SCRIPTS / "cluster_mpi.py"
    with pytest.raises(ValueError, match="launcher must be one of"):
        testing.run_cluster(2, 2, job, 10, launcher="srun")
    with pytest.raises(TypeError, match="fault must be a Fault, got str"):
        testing.run_cluster(2, 2, job, 10, fault="kill")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fault host 'dkh3' is not one of the job's hosts \['dkh1', 'dkh2'\]"):
        testing.run_cluster(2, 2, job, 10, fault=Fault("kill", "dkh3"))
    with pytest.raises(FileNotFoundError, match="no such script"):
        testing.run_cluster(2, 2, SCRIPTS / "missing.py", 10)
    with pytest.raises(ValueError, match="timeout must be positive"):
        testing.run_cluster(2, 2, job, 0)
    with pytest.raises(ValueError, match="rate '1 gigabit' is not a link rate"):
        testing.run_cluster(2, 2, job, 10, rate="1 gigabit")


@pytest.mark.parametrize(
    ("rate", "bits", "shown"),
    [
        ("100mbit", 10**8, "100mbit"),
        ("1gbit", 10**9, "1gbit"),
        ("10Gbit", 10**10, "10gbit"),
        ("1.5gbit", 15 * 10**8, "1500mbit"),
        ("125MBps", 10**9, "1gbit"),  # tc: ...bps is bytes per second
        ("1mibit", 2**20, "1048576bit"),
        ("1000001bit", 1000000, "1mbit"),  # rounded down to whole bytes per second, as the kernel keeps it
        ("100gbit", 10**11, "100gbit"),
    ],
)
def test_rates_are_read_in_tc_syntax(rate: str, bits: int, shown: str) -> None:
    assert rates.parse_rate(rate) == bits
    assert rates.format_rate(bits) == shown
    assert rates.parse_rate(shown) == bits


@pytest.mark.parametrize("bits", [1.5e9, "1gbit", None, True])
def test_format_rate_refuses_a_non_int(bits: object) -> None:
    with pytest.raises(TypeError, match=f"bits must be an int, got {type(bits).__name__}"):
        rates.format_rate(bits)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rate", "error", "match"),
    [
        ("", ValueError, "rate '' is not a link rate"),
        ("100", ValueError, "rate '100' is not a link rate: a number and one of the units bit, kbit"),
        ("100mb", ValueError, "rate '100mb' is not a link rate"),
        ("-1gbit", ValueError, "rate '-1gbit' is not a link rate"),
        ("1e9bit", ValueError, "rate '1e9bit' is not a link rate"),
        ("0gbit", ValueError, r"rate '0gbit' \(0 bit/s\) is out of range \[1mbit, 100gbit\]"),
        ("999kbit", ValueError, r"out of range \[1mbit, 100gbit\]"),
        ("1tbit", ValueError, r"rate '1tbit' \(1000000000000 bit/s\) is out of range"),
        (10**9, TypeError, "rate must be a str like '1gbit', got int"),
    ],
)
def test_bad_rates_are_rejected_before_touching_the_machine(rate: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        rates.parse_rate(rate)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        cluster.up(2, rate=rate)  # type: ignore[arg-type]
    with pytest.raises(error, match=match), cluster.session(2, rate=rate):  # type: ignore[arg-type]
        pass
    with pytest.raises(error, match=match):
        cluster.shape(rate)  # type: ignore[arg-type]


def test_tbf_bucket_and_queue_grow_with_the_rate() -> None:
    # bucket: 4 ms of the rate (>= rate / HZ, HZ = 250), at least 128 KiB; queue: 50 ms, at least 1 MiB
    assert cluster.tbf_params(10**8) == (131072, 131072 + 1048576)
    assert cluster.tbf_params(10**9) == (500_000, 500_000 + 6_250_000)
    assert cluster.tbf_params(10**10) == (5_000_000, 5_000_000 + 62_500_000)
    assert pytest.approx(0.9564, abs=1e-4) == cluster.TCP_GOODPUT_SHARE


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"src": "dkh1", "dst": "dkh1"}, ValueError, "src and dst are the same host dkh1"),
        ({"src": "dkh1", "dst": "eth0"}, ValueError, "'eth0' is not a simulated host name"),
        ({"src": 1, "dst": 2, "seconds": 0}, ValueError, r"seconds = 0 is out of range \(0, 60.0\]"),
        ({"src": 1, "dst": 2, "seconds": 61}, ValueError, r"seconds = 61 is out of range"),
        ({"src": 1, "dst": 2, "seconds": "1"}, TypeError, "seconds must be a number, got str"),
        ({"src": 1, "dst": 2, "nbytes": 1000}, ValueError, "nbytes = 1000 is below 1 MiB"),
        ({"src": 1, "dst": 2, "nbytes": 2.0**30}, TypeError, "nbytes must be an int, got float"),
        ({"src": 1, "dst": 2, "timeout": 0}, ValueError, "timeout must be a positive number, got 0"),
    ],
)
def test_measure_tcp_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        cluster.measure_tcp(**kwargs)


def test_pytest_targets_are_recognised() -> None:
    assert is_pytest_file("a/test_x.py") and is_pytest_file("x_test.py")
    assert not is_pytest_file("a/cluster_mpi.py") and not is_pytest_file("test_x.txt")


def test_cluster_env_file_and_its_ci_link() -> None:
    env = cluster.read_env_file()
    assert env["OMPI_MCA_btl"] == "tcp,self,sm"
    assert (
        int(env["PRTE_MCA_oob_tcp_keepalive_time"])
        + int(env["PRTE_MCA_oob_tcp_keepalive_intvl"]) * int(env["PRTE_MCA_oob_tcp_keepalive_probes"])
        < 30
    )
    full = cluster.job_env()
    assert full["OMPI_MCA_btl_tcp_if_include"] == full["PRTE_MCA_prte_if_include"] == "10.213.0.0/24"
    assert full["GLOO_SOCKET_IFNAME"] == "dk0" and full["PRTE_MCA_plm_ssh_agent"].endswith("cluster_agent.sh")
    ci = ROOT / "ci" / "env.cluster"
    if ci.exists():  # a source checkout: ci/env.cluster is this very file
        assert cluster.read_env_file(ci) == env


def test_collective_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTKIT_COLLECTIVE_TIMEOUT_S", raising=False)
    assert testing.collective_timeout() == datetime.timedelta(minutes=30)
    monkeypatch.setenv("DISTKIT_COLLECTIVE_TIMEOUT_S", "20")
    assert testing.collective_timeout() == datetime.timedelta(seconds=20)
    monkeypatch.setenv("DISTKIT_COLLECTIVE_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="DISTKIT_COLLECTIVE_TIMEOUT_S='soon' is not a number"):
        testing.collective_timeout()
    monkeypatch.setenv("DISTKIT_COLLECTIVE_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="must be positive"):
        testing.collective_timeout()


def test_unavailable_machine_skips_with_one_message(tmp_path: Path) -> None:
    # a machine without namespaces: every cluster test is skipped with the same message, none fails
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "from distkit_common.testing import cluster\n"
        "pytest_plugins = ['distkit_common.testing.pytest_cluster']\n"
        "cluster.unavailable_reason = lambda: 'needs root (network namespaces), running as uid 1000'\n"
        "@pytest.mark.cluster\n"
        "def test_a(simulated_cluster):\n    raise AssertionError('must not run')\n"
        "@pytest.mark.cluster\n"
        "def test_b():\n    raise AssertionError('must not run')\n"
        "@pytest.mark.cluster(session=False)\n"
        "def test_c():\n    raise AssertionError('must not run')\n"
        "def test_plain():\n    pass\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", str(tmp_path / "test_x.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 3 skipped" in res.stdout
    assert res.stdout.count("simulated cluster unavailable: needs root (network namespaces), running as uid 1000") == 3


# --------------------------------------------------------------------------- heartbeat


_STORE = (
    "import datetime, sys, time\nimport torch.distributed as dist\n"
    "s = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
    "print(s.port, flush=True)\ntime.sleep(600)\n"
)
_RANK = (
    "import sys, time\nfrom distkit_common.heartbeat import Heartbeat\n"
    "Heartbeat('127.0.0.1', int(sys.argv[1]), int(sys.argv[2]), 3, interval=0.2, timeout=8.0).start()\n"
    "print('UP', flush=True)\ntime.sleep(600)\n"
)


def _child(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


def _wait_for(messages: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not messages and time.monotonic() < deadline:
        time.sleep(0.05)


def test_heartbeat_names_a_frozen_peer_and_ignores_one_that_stopped() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    frozen, up = _child(_RANK, str(store.port), "2")
    try:
        assert up == "UP"
        lost: list[str] = []
        watchers = [
            heartbeat.Heartbeat("127.0.0.1", store.port, r, 3, interval=0.2, timeout=8.0, on_lost=lost.append).start()
            for r in range(2)
        ]
        # a timeout of 8 s (40 beats): a peer that a loaded machine leaves unscheduled for seconds
        # is not lost, so the empty list below says "a stopped peer is not reported", not "fast"
        time.sleep(0.6)
        watchers[1].stop(wait_for_peers=False)  # finished: never reported
        time.sleep(9.0)  # past the timeout
        assert lost == []
        os.kill(frozen.pid, signal.SIGSTOP)  # rank 2 freezes without a word, as a host cut off would
        _wait_for(lost, 120.0)
        host = socket.gethostname()
        assert len(lost) == 1 and f"rank 0 on {host} lost rank 2 on {host} (no heartbeat for" in lost[0]
        watchers[0].stop()
    finally:
        frozen.kill()
        frozen.communicate()


def test_heartbeat_explains_an_error_that_beat_its_timeout(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """TCP may give up on a cut link before the heartbeat's timeout: the exception leaving
    watch() is then preceded by the heartbeat's account of who went silent."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    frozen, up = _child(_RANK, str(store.port), "2")
    try:
        assert up == "UP"
        peer = heartbeat.Heartbeat("127.0.0.1", store.port, 1, 3, interval=1.0, timeout=60.0).start()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(store.port))
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "3")

        def job() -> None:
            # beats each second: explain() counts 3 s of silence, more than a loaded machine
            # leaves a live process unscheduled
            with heartbeat.watch(interval=1.0, timeout=60.0) as hb:
                time.sleep(1.0)
                assert hb.explain() is None  # everyone beats: nothing to say
                os.kill(frozen.pid, signal.SIGSTOP)
                deadline = time.monotonic() + 120
                while not hb.silent_peers(3.0) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert [(r, s >= 3.0) for r, _, s in hb.silent_peers(3.0)] == [(2, True)]
                with pytest.raises(ValueError, match="at_least must be >= 0"):
                    hb.silent_peers(-1.0)
                raise RuntimeError("Read error [10.213.0.2]:49855: Connection timed out")

        with pytest.raises(RuntimeError, match="Connection timed out"):
            job()
        host = socket.gethostname()
        err = capsys.readouterr().err
        assert f"distkit heartbeat: rank 0 on {host} lost rank 2 on {host} (no heartbeat for" in err
        assert "before the error below" in err
        peer.stop(wait_for_peers=False)
    finally:
        frozen.kill()
        frozen.communicate()


def test_heartbeat_stop_waits_until_every_peer_stopped() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    # stop() waits up to the timeout for the peers: 60 s, however slowly rank 1 comes to stop
    hbs = [heartbeat.Heartbeat("127.0.0.1", store.port, r, 2, interval=0.1, timeout=60.0) for r in range(2)]
    for hb in hbs:
        hb.start()
    order: list[str] = []
    first = threading.Thread(target=lambda: (hbs[0].stop(), order.append("rank 0 stopped")))
    first.start()
    time.sleep(0.5)
    order.append("rank 1 stops")
    hbs[1].stop()
    first.join(120)
    # rank 0 (which could host the store) returned only once rank 1 had stopped as well
    assert order == ["rank 1 stops", "rank 0 stopped"]


def test_heartbeat_names_a_store_that_stops_answering() -> None:
    store, port = _child(_STORE)
    try:
        lost: list[str] = []
        hb = heartbeat.Heartbeat("127.0.0.1", int(port), 1, 2, interval=0.2, timeout=1.0, on_lost=lost.append)
        hb.start()
        os.kill(store.pid, signal.SIGSTOP)  # the store's host freezes: requests hang unanswered
        _wait_for(lost, 120.0)
        assert len(lost) == 1
        assert f"rank 1 on {socket.gethostname()} lost contact with the job's store on 127.0.0.1:{port}" in lost[0]
        assert "(no answer for" in lost[0]
    finally:
        store.kill()
        store.communicate()
    hb.stop()  # the store is gone: returns after at most timeout + interval per thread


def test_heartbeat_ends_the_process_by_default() -> None:
    res = subprocess.run(
        [sys.executable, "-c", "from distkit_common.heartbeat import _default_on_lost as f; f('lost rank 3 on dkh2')"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (res.returncode, res.stderr.strip()) == (heartbeat.LOST_PEER_EXIT_CODE, "lost rank 3 on dkh2")


def test_heartbeat_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="rank 2 is outside world size 2"):
        heartbeat.Heartbeat("h", 1, 2, 2)
    with pytest.raises(ValueError, match="need 0 < interval < timeout"):
        heartbeat.Heartbeat("h", 1, 0, 2, interval=5, timeout=5)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError, match="heartbeat needs MASTER_ADDR and MASTER_PORT"):
        heartbeat.start()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("DISTKIT_HEARTBEAT_TIMEOUT_S", "ten")
    with pytest.raises(ValueError, match="DISTKIT_HEARTBEAT_TIMEOUT_S='ten' is not a number"):
        heartbeat.start()


def test_mpi_p2p_sizes_results_and_bad_arguments() -> None:
    assert [mpi_p2p.parse_size(t) for t in ("4096", "64KiB", "16MiB", "1GiB")] == [4096, 65536, 2**24, 2**30]
    for bad, match in (("0", "out of range"), ("2GiB", "out of range"), ("1MB", "not an integer"), ("", "not")):
        with pytest.raises(ValueError, match=match):
            mpi_p2p.parse_size(bad)
    assert mpi_p2p.parse_result('x\nDISTKIT_P2P {"bytes": 5}\n') == {"bytes": 5}
    with pytest.raises(ValueError, match="expected one DISTKIT_P2P line in the output, found 0"):
        mpi_p2p.parse_result("no result\n")
    with pytest.raises(ValueError, match="hosts must be 2 hosts"):
        testing.measure_mpi_sendrecv(["dkh1"])
    with pytest.raises(ValueError, match="hosts must be 2 hosts"):
        testing.measure_mpi_sendrecv("dkh1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"hosts must be 2 different hosts, got \['dkh2', 'dkh2'\]"):
        testing.measure_mpi_sendrecv(["dkh2", 2])
    with pytest.raises(ValueError, match=r"nbytes = 0 is out of range \[1, 2147483647\]"):
        testing.measure_mpi_sendrecv(nbytes=0)
    with pytest.raises(TypeError, match="iters must be an int, got float"):
        testing.measure_mpi_sendrecv(iters=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate 'fast' is not a link rate"):
        testing.measure_mpi_sendrecv(rate="fast")


def test_plugin_reads_the_session_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from distkit_common.testing import pytest_cluster

    monkeypatch.delenv(pytest_cluster.RATE_ENV, raising=False)
    assert pytest_cluster._rate() is None
    monkeypatch.setenv(pytest_cluster.RATE_ENV, "10gbit")
    assert pytest_cluster._rate() == "10gbit"
    monkeypatch.setenv(pytest_cluster.RATE_ENV, "10gb")
    with pytest.raises(pytest.UsageError, match="DISTKIT_CLUSTER_RATE: rate '10gb' is not a link rate"):
        pytest_cluster._rate()
