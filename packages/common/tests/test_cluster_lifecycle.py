"""The simulated cluster itself: up/down, names, resolution, cleanup after a killed owner.

These tests manage clusters themselves (``cluster(session=False)``): the plugin
runs them before any test holds the session's cluster. Each holds the
machine's cluster lock (``cluster.hold``) while it looks at or changes the
machine's state: another suite on the machine may hold a session meanwhile,
whose hosts these tests must neither count as leftovers nor remove.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from distkit_common.testing import cluster

pytest_plugins = ["distkit_common.testing.pytest_cluster"]
pytestmark = pytest.mark.cluster(session=False)

CLI = cluster.CLI
_SERVER = (
    "import socket\ns = socket.create_server(('0.0.0.0', 0))\nprint(s.getsockname()[1], flush=True)\n"
    "c, a = s.accept()\nprint(a[0], c.recv(64).decode())"
)
_CLIENT = (
    "import socket, sys\nsocket.create_connection(('dkh1', int(sys.argv[1])), timeout=10)"
    ".sendall(socket.gethostname().encode())"
)


def _on(host: str, *cmd: str) -> str:
    return subprocess.run(
        [*cluster.exec_prefix(host), *cmd], capture_output=True, text=True, check=True, timeout=300
    ).stdout


def _netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


@pytest.fixture
def machine_lock() -> Iterator[None]:
    with cluster.hold():
        yield


@pytest.mark.usefixtures("machine_lock")
def test_session_brings_up_named_resolvable_hosts_and_removes_everything() -> None:
    hosts_before = Path("/etc/hosts").read_text()
    assert cluster.leftovers() == []
    with cluster.session(3) as c:
        assert c.names == ["dkh1", "dkh2", "dkh3"]
        assert [h.address for h in c.hosts] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
        # each host has its own hostname, its address on dk0, loopback up
        for h in c.hosts:
            assert _on(h.name, "hostname").strip() == h.name
            addrs = _on(h.name, "ip", "-o", "-4", "addr", "show")
            assert f"{h.address}/24" in addrs and "127.0.0.1/8" in addrs
        # every host resolves every host; so does the root namespace
        for h in c.hosts:
            for other in c.hosts:
                assert _on(h.name, "getent", "hosts", other.name).split()[0] == other.address
        assert socket.gethostbyname("dkh3") == "10.213.0.3"
        # a host notices a cut link within seconds also with data in flight (see TCP_RETRIES2)
        for h in c.hosts:
            assert _on(h.name, "cat", "/proc/sys/net/ipv4/tcp_retries2").strip() == str(cluster.TCP_RETRIES2)
        # hosts reach each other over TCP (and only over the cluster's network: no default route)
        assert "default" not in _on("dkh2", "ip", "route")
        server = subprocess.Popen(
            [*cluster.exec_prefix("dkh1"), sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        _on("dkh2", sys.executable, "-c", _CLIENT, port)
        reply = server.communicate(timeout=300)[0]
        assert reply.split() == ["10.213.0.2", "dkh2"]
        # up is idempotent: the same healthy cluster is kept, not rebuilt
        inode = _netns_inode("dkh2")
        assert cluster.up(3) == c
        assert _netns_inode("dkh2") == inode
        assert sorted(cluster.leftovers()) == sorted(
            [f"netns dkh{i}" for i in (1, 2, 3)]
            + ["link dkbr0", "link dkv1", "link dkv2", "link dkv3"]
            + [f"/etc/netns/dkh{i}" for i in (1, 2, 3)]
            + ["/etc/hosts block"]
        )
    assert cluster.leftovers() == []
    assert Path("/etc/hosts").read_text() == hosts_before
    assert cluster.down() == []  # idempotent


@pytest.mark.usefixtures("machine_lock")
def test_up_removes_leftovers_of_a_killed_run_first() -> None:
    # what a run killed half-way through `up` would leave: a namespace, a stray link, a hosts block
    subprocess.run(["ip", "netns", "add", "dkh5"], check=True)
    subprocess.run(["ip", "link", "add", "dkv7", "type", "bridge"], check=True)
    with open("/etc/hosts", "a") as f:
        f.write(f"{cluster.HOSTS_BEGIN}\n10.213.0.5\tdkh5\n{cluster.HOSTS_END}\n")
    try:
        with cluster.session(2) as c:
            assert c.names == ["dkh1", "dkh2"]
            left = cluster.leftovers()
            assert "netns dkh5" not in left and "link dkv7" not in left
            assert "dkh5" not in Path("/etc/hosts").read_text()
    finally:
        cluster.down()
    assert cluster.leftovers() == []


def test_reaper_removes_the_cluster_of_a_killed_owner() -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom distkit_common.testing import cluster\n"
            "with cluster.session(2):\n    print('UP', flush=True)\n    time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "UP"
        assert "netns dkh2" in cluster.leftovers()
        os.kill(owner.pid, signal.SIGKILL)  # no finaliser, no atexit: only the reaper can clean up
        owner.wait(timeout=30)
        # the reaper keeps the lock until it has removed the cluster, then releases it
        with cluster.hold():
            assert cluster.leftovers() == []
            with cluster.session(1) as c:
                assert c.names == ["dkh1"]
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.communicate()
        with cluster.hold():
            cluster.down()


@pytest.mark.usefixtures("machine_lock")
def test_command_line_up_status_exec_down() -> None:
    env, fds = cluster.lock_env()  # the command line runs under this test's hold on the lock

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-I", str(CLI), *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, **env},
            pass_fds=fds,
        )

    try:
        up = cli("up", "2")
        assert up.returncode == 0, up.stderr
        assert up.stdout.split() == ["dkh1", "10.213.0.1", "link", "dkv1", "dkh2", "10.213.0.2", "link", "dkv2"]
        assert cli("up", "2").returncode == 0
        assert cli("exec", "dkh2", "hostname").stdout.strip() == "dkh2"
        status = cli("status").stdout
        assert "dkh1\t10.213.0.1\tlink dkv1 up\tprocesses 0" in status
        cluster.link_down("dkh1")
        assert "link dkv1 DOWN" in cli("status").stdout
        bad = cli("exec", "nohost", "true")
        assert bad.returncode == 1 and "not a simulated host name" in bad.stderr
    finally:
        down = cli("down")
    assert down.returncode == 0 and "removed netns dkh1" in down.stdout
    assert cli("status").stdout.strip() == "no simulated cluster"
    assert cluster.leftovers() == []
