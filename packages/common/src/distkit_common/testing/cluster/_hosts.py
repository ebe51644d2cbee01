"""Names, addresses and processes of the simulated hosts; cutting a host off or killing it.

The base of :mod:`distkit_common.testing.cluster`: what a host is, the commands
that reach into its namespaces, and the faults a test injects.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: host i is the namespace f"{HOST_PREFIX}{i}" (also its hostname)
HOST_PREFIX = "dkh"
#: root-namespace end of host i's veth: f"{LINK_PREFIX}{i}" (take it down to cut the host off)
LINK_PREFIX = "dkv"
#: the bridge in the root namespace that every host's veth is a port of
BRIDGE = "dkbr0"
#: the interface of every host inside its namespace (the same name on every host)
IFNAME = "dk0"
#: the private network of the simulated hosts: host i is .i, the bridge .254
SUBNET = ipaddress.ip_network("10.213.0.0/24")
BRIDGE_ADDRESS = SUBNET.network_address + 254
MAX_HOSTS = 32
#: ``net.ipv4.tcp_retries2`` inside every host (the kernel's default is 15). TCP keepalive only
#: probes an idle connection: a daemon or rank that has unacknowledged data in flight when its
#: host is cut off (output being forwarded to mpiexec, a message to a peer) waits for the
#: retransmission timeout instead, about 15 minutes with 15 retries, and outlives the job. With
#: 5 retries (0.2 s doubling: about 13 s) it notices the lost link about as fast as the keepalive
#: does. On a real cluster this is the hosts' sysctl (see ci/cluster/README.md).
TCP_RETRIES2 = 5
#: where runtime state lives (the lock serialising users of the machine)
STATE_DIR = Path("/run/distkit-cluster")
NETNS_ETC = Path("/etc/netns")
ETC_HOSTS = Path("/etc/hosts")
HOSTS_BEGIN = "# >>> distkit simulated cluster (distkit_common.testing.cluster; removed by `down`) >>>"
HOSTS_END = "# <<< distkit simulated cluster <<<"
#: how long session() waits for another process's cluster to be released
LOCK_WAIT_S = 1800.0
#: names an inherited fd of the lock file its holder passes to a command line it runs (see _cli_lock)
LOCK_FD_ENV = "DISTKIT_CLUSTER_LOCK_FD"
#: engine settings for jobs across the hosts (keepalives, timeouts); ci/env.cluster links here
ENV_FILE = Path(__file__).with_name("cluster.env")
#: Open MPI's launch agent: runs the remote daemon inside a host's namespaces (a stand-in for ssh)
AGENT = Path(__file__).with_name("cluster_agent.sh")
#: the command line (``python3 CLI up 3``); it also runs as a file from a source checkout (``ci/cluster/up``)
CLI = Path(__file__).with_name("__main__.py")

_HOST_RE = re.compile(rf"^{HOST_PREFIX}([1-9][0-9]*)$")
_LINK_RE = re.compile(rf"^{LINK_PREFIX}([1-9][0-9]*)$")


class ClusterError(RuntimeError):
    """The simulated cluster could not be brought up, used or removed."""


@dataclass(frozen=True)
class Host:
    """One simulated host.

    Parameters
    ----------
    index : int
        1-based index.
    name : str
        Namespace name = hostname = name in every hosts file.
    address : str
        Its IPv4 address on the cluster network.
    link : str
        Root-namespace end of its veth (``ip link set <link> down`` cuts it off).
    """

    index: int  #: 1-based.
    name: str  #: Namespace name = hostname = name in every hosts file.
    address: str  #: Its IPv4 address on the cluster network.
    link: str  #: Root-namespace end of its veth (``ip link set <link> down`` cuts it off).


def host(index: int) -> Host:
    """Return host ``index`` (1-based) of the simulated cluster (whether it is up or not).

    Parameters
    ----------
    index : int
        In ``[1, MAX_HOSTS]``.

    Returns
    -------
    Host
        Its names and address.

    Raises
    ------
    TypeError
        If ``index`` is not an int.
    ValueError
        If ``index`` is outside ``[1, MAX_HOSTS]``.
    """
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"host index must be an int, got {type(index).__name__}")
    if not 1 <= index <= MAX_HOSTS:
        raise ValueError(f"host index {index} is out of range [1, {MAX_HOSTS}]")
    return Host(index, f"{HOST_PREFIX}{index}", str(SUBNET.network_address + index), f"{LINK_PREFIX}{index}")


def _check_count(n: object) -> int:
    """``n`` as a number of hosts, checked (up() and session() refuse it before touching anything)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n = {n} is out of range [1, {MAX_HOSTS}]")
    return n


def resolve_host(h: Host | str | int) -> Host:
    """Return a :class:`Host` from itself, its name (``"dkh2"``) or its 1-based index.

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.

    Returns
    -------
    Host
        The host.

    Raises
    ------
    TypeError, ValueError
        If ``h`` names no simulated host.
    """
    if isinstance(h, Host):
        return h
    if isinstance(h, str):
        m = _HOST_RE.match(h)
        if not m:
            raise ValueError(f"{h!r} is not a simulated host name ({HOST_PREFIX}1, {HOST_PREFIX}2, ...)")
        return host(int(m.group(1)))
    return host(h)


@dataclass(frozen=True)
class Cluster:
    """The hosts of a simulated cluster that is up.

    Parameters
    ----------
    hosts : tuple of Host
        ``dkh1..dkhN``.
    rate : int or None
        The shaped rate of every host's link in bits/s (both directions), None: unshaped.
    """

    hosts: tuple[Host, ...]
    #: The shaped rate of every host's link in bits/s (both directions), None: unshaped.
    rate: int | None = None

    @property
    def names(self) -> list[str]:
        """List the hosts' names.

        Returns
        -------
        list of str
            ``["dkh1", ..., "dkhN"]``.
        """
        return [h.name for h in self.hosts]

    def __len__(self) -> int:
        return len(self.hosts)


# --------------------------------------------------------------------------- checks


def unavailable_reason() -> str | None:
    """Tell why this machine cannot host the simulated cluster.

    Checks root, ``ip``, ``unshare`` and that a network namespace and a UTS
    namespace can actually be made (containers often forbid them).

    Returns
    -------
    str or None
        The reason, or None when it can.
    """
    if sys.platform != "linux":
        return f"needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"needs root (network namespaces), running as uid {os.geteuid()}"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"dkprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip() or made.returncode}"
    try:
        res = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--uts", "sh", "-c", "hostname dkprobe && hostname"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if res.returncode != 0 or res.stdout.strip() != "dkprobe":
            return f"cannot make a UTS namespace in a network namespace: {res.stderr.strip() or res.returncode}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


# --------------------------------------------------------------------------- commands


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")
    return res


def exec_prefix(h: Host | str | int) -> list[str]:
    """Return the argv prefix that runs a command on host ``h`` (its network and a fresh UTS namespace).

    ``[*exec_prefix("dkh2"), "hostname"]`` prints ``dkh2``.

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.

    Returns
    -------
    list of str
        ``["ip", "netns", "exec", name, "unshare", "--uts", ...]``.

    Raises
    ------
    TypeError, ValueError
        If ``h`` names no simulated host.
    """
    hh = resolve_host(h)
    return ["ip", "netns", "exec", hh.name, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hh.name]


def _namespaces() -> list[str]:
    res = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
    return sorted((n for n in names if _HOST_RE.match(n)), key=lambda n: int(n[len(HOST_PREFIX) :]))


def _links() -> list[str]:
    res = _ip("-o", "link", "show", check=False)
    out = []
    for line in res.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name == BRIDGE or _LINK_RE.match(name):
                out.append(name)
    return out


def host_pids(h: Host | str | int) -> list[int]:
    """List every process whose network namespace is host ``h``'s.

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.

    Returns
    -------
    list of int
        Their pids (empty when the host is not up).

    Raises
    ------
    TypeError, ValueError
        If ``h`` names no simulated host.
    """
    hh = resolve_host(h)
    res = _ip("netns", "pids", hh.name, check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _kill(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_host(h: Host | str | int, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` (SIGKILL: a host crash) to every process on host ``h``.

    Every process in the host's network namespace is hit: the job's ranks and
    the launcher's daemon (``prted``, a torchrun agent) alike.

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.
    sig : int
        The signal.

    Returns
    -------
    list of int
        The pids signalled.

    Raises
    ------
    TypeError, ValueError
        If ``h`` names no simulated host.
    """
    pids = host_pids(h)
    _kill(pids, sig)
    return pids


def link_down(h: Host | str | int) -> None:
    """Cut host ``h`` off the network (its veth goes down at the bridge: a pulled cable).

    Its processes keep running; packets to and from it are dropped silently,
    so peers notice only through keepalives and timeouts.

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.

    Raises
    ------
    ClusterError
        If the link does not exist (the host is not up).
    """
    _ip("link", "set", resolve_host(h).link, "down")


def link_up(h: Host | str | int) -> None:
    """Reconnect host ``h`` (undo :func:`link_down`).

    Also forgets the neighbour (ARP) entries that failed while the link was
    down, on both sides: the kernel would otherwise refuse new connections
    with "no route to host" for a while, failing the next job's start.

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.

    Raises
    ------
    ClusterError
        If the link does not exist (the host is not up).
    """
    hh = resolve_host(h)
    _ip("link", "set", hh.link, "up")
    _ip("neigh", "flush", "dev", BRIDGE, check=False)
    _ip("-n", hh.name, "neigh", "flush", "dev", IFNAME, check=False)


def _wait_gone(pids: Sequence[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        if left:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    """True while pid runs (a zombie counts as gone: it holds no namespace)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
