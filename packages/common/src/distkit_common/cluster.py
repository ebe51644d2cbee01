"""A simulated cluster on one Linux machine: N hosts as network namespaces.

Host ``i`` (1-based) is the network namespace ``dkh<i>`` with the address
``10.213.0.<i>/24`` on its interface ``dk0``, a veth whose other end ``dkv<i>``
is a port of the bridge ``dkbr0`` (``10.213.0.254``) in the root namespace.
Every command run on a host also gets a UTS namespace of its own whose
hostname is the host's name, so ``socket.gethostname()`` differs per host, as
on a real cluster. Every host resolves every other host (``/etc/netns/<host>/
hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``), and so does the
root namespace (a marked block in ``/etc/hosts``, removed by :func:`down`).

With a rate (:func:`up`, :func:`session`, :func:`shape`) a tbf qdisc on both ends
of each host's veth limits what the host sends (``dk0``) and receives (``dkv<i>``);
``tc`` (iproute2) is then needed too. The rate is read back from the kernel
(:func:`current`, :func:`link_rates`); :func:`measure_tcp` measures a link.

Nothing leaves the machine: the namespaces have no default route, the bridge
has no uplink, and :func:`up` refuses to start when the subnet is already used
by an interface it did not make.

Needs root, ``ip`` (iproute2) and ``unshare`` (util-linux). Only the standard
library is used, so this file also runs as a script from a source checkout
(``ci/cluster/up``)::

    python3 cluster.py up 3         # hosts dkh1..dkh3 (idempotent)
    python3 cluster.py up 3 --rate 1gbit   # every host's link shaped to 1 Gbit/s each way
    python3 cluster.py exec dkh2 hostname
    python3 cluster.py measure dkh1 dkh2   # one TCP stream's goodput
    python3 cluster.py status
    python3 cluster.py down         # removes everything up made (idempotent)

Tests use :func:`session` (through the ``distkit_common.pytest_cluster``
plugin) which serialises users of the machine with a lock and removes the
cluster even when the test process is killed (a reaper process watches it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
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
HOSTS_BEGIN = "# >>> distkit simulated cluster (distkit_common.cluster; removed by `down`) >>>"
HOSTS_END = "# <<< distkit simulated cluster <<<"
#: how long session() waits for another process's cluster to be released
LOCK_WAIT_S = 1800.0
#: names an inherited fd of the lock file its holder passes to a command line it runs (see _cli_lock)
LOCK_FD_ENV = "DISTKIT_CLUSTER_LOCK_FD"
#: engine settings for jobs across the hosts (keepalives, timeouts); ci/env.cluster links here
ENV_FILE = Path(__file__).with_name("cluster.env")
#: Open MPI's launch agent: runs the remote daemon inside a host's namespaces (a stand-in for ssh)
AGENT = Path(__file__).with_name("cluster_agent.sh")

_HOST_RE = re.compile(rf"^{HOST_PREFIX}([1-9][0-9]*)$")
_LINK_RE = re.compile(rf"^{LINK_PREFIX}([1-9][0-9]*)$")


class ClusterError(RuntimeError):
    """The simulated cluster could not be brought up, used or removed."""


@dataclass(frozen=True)
class Host:
    """One simulated host."""

    index: int  #: 1-based
    name: str  #: namespace name = hostname = name in every hosts file
    address: str  #: its IPv4 address on the cluster network
    link: str  #: root-namespace end of its veth (``ip link set <link> down`` cuts it off)


def host(index: int) -> Host:
    """Host ``index`` (1-based) of the simulated cluster (whether it is up or not).

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


def resolve_host(h: Host | str | int) -> Host:
    """A :class:`Host` from itself, its name (``"dkh2"``) or its 1-based index.

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
    """The hosts of a simulated cluster that is up."""

    hosts: tuple[Host, ...]
    #: the shaped rate of every host's link in bits/s (both directions), None: unshaped
    rate: int | None = None

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def __len__(self) -> int:
        return len(self.hosts)


# --------------------------------------------------------------------------- checks


def unavailable_reason() -> str | None:
    """Why this machine cannot host the simulated cluster, or None when it can.

    Checks root, ``ip``, ``unshare`` and that a network namespace and a UTS
    namespace can actually be made (containers often forbid them).
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
    """The argv prefix that runs a command on host ``h`` (its network and a fresh UTS namespace).

    ``[*exec_prefix("dkh2"), "hostname"]`` prints ``dkh2``.
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
    """Every process whose network namespace is host ``h``'s (empty when it is not up)."""
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
    """Send ``sig`` (SIGKILL: a host crash) to every process on host ``h``; returns their pids.

    Every process in the host's network namespace is hit: the job's ranks and
    the launcher's daemon (``prted``, a torchrun agent) alike.
    """
    pids = host_pids(h)
    _kill(pids, sig)
    return pids


def link_down(h: Host | str | int) -> None:
    """Cut host ``h`` off the network (its veth goes down at the bridge: a pulled cable).

    Its processes keep running; packets to and from it are dropped silently,
    so peers notice only through keepalives and timeouts.

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


# --------------------------------------------------------------------------- shaped links

#: tc's rate units (iproute2's ``get_rate64``, case-insensitive): bits per second, or bytes
#: per second for the ``...bps`` ones, with decimal (k, m, g, t) or binary (ki, mi, gi, ti) prefixes
RATE_UNITS: dict[str, int] = {
    **{f"{p}bit": m for p, m in (("", 1), ("k", 10**3), ("m", 10**6), ("g", 10**9), ("t", 10**12))},
    **{f"{p}bit": m for p, m in (("ki", 2**10), ("mi", 2**20), ("gi", 2**30), ("ti", 2**40))},
    **{f"{p}bps": 8 * m for p, m in (("", 1), ("k", 10**3), ("m", 10**6), ("g", 10**9), ("t", 10**12))},
    **{f"{p}bps": 8 * m for p, m in (("ki", 2**10), ("mi", 2**20), ("gi", 2**30), ("ti", 2**40))},
}
_RATE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-z]+)$", re.IGNORECASE)
#: the rates a link can be shaped to, bits/s (tbf's 32-bit bucket and queue sizes bound them)
MIN_RATE = 10**6
MAX_RATE = 100 * 10**9
#: the share of a shaped link's rate that one TCP stream carries as payload: tbf counts every
#: frame as 14 (Ethernet) + 20 (IP) + 32 (TCP with timestamps) + 1448 payload bytes (MTU 1500)
TCP_GOODPUT_SHARE = 1448 / 1514
#: tbf's bucket: SHAPE_BURST_S of the rate, at least SHAPE_MIN_BURST bytes (two 64 KiB GSO packets)
SHAPE_BURST_S = 0.004
SHAPE_MIN_BURST = 128 * 1024
#: tbf's queue beyond the bucket: SHAPE_QUEUE_S of the rate (tc's ``latency``), at least SHAPE_MIN_QUEUE bytes
SHAPE_QUEUE_S = 0.05
SHAPE_MIN_QUEUE = 1024 * 1024


def parse_rate(rate: str) -> int:
    """The link rate ``rate`` (tc's syntax: ``"100mbit"``, ``"1gbit"``, ``"10gbit"``, ``"125MBps"``) in bits/s.

    A unit is required (tc reads a bare number as bits/s, old tc documentation as
    bytes/s). The rate is rounded down to whole bytes per second, as the kernel
    stores it.

    Parameters
    ----------
    rate : str
        A decimal number and one of :data:`RATE_UNITS` (case-insensitive).

    Returns
    -------
    int
        Bits per second, a multiple of 8.

    Raises
    ------
    TypeError
        If ``rate`` is not a str.
    ValueError
        If ``rate`` is not a number with a known unit, or outside ``[MIN_RATE, MAX_RATE]``.
    """
    if not isinstance(rate, str):
        raise TypeError(f"rate must be a str like '1gbit', got {type(rate).__name__}")
    m = _RATE_RE.match(rate.strip())
    unit = m.group(2).lower() if m else ""
    if not m or unit not in RATE_UNITS:
        raise ValueError(
            f"rate {rate!r} is not a link rate: a number and one of the units {', '.join(RATE_UNITS)} "
            "(tc's syntax, e.g. '100mbit', '1gbit', '10gbit')"
        )
    whole, _, frac = m.group(1).partition(".")
    scale = RATE_UNITS[unit]
    bits = (int(whole + frac) * scale) // 10 ** len(frac)
    bits -= bits % 8
    if not MIN_RATE <= bits <= MAX_RATE:
        raise ValueError(
            f"rate {rate!r} ({bits} bit/s) is out of range [{format_rate(MIN_RATE)}, {format_rate(MAX_RATE)}]"
        )
    return bits


def format_rate(bits: int) -> str:
    """A rate in bits/s as tc writes it, with the largest unit that divides it (``10**9`` -> ``"1gbit"``)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


def tbf_params(bits: int) -> tuple[int, int]:
    """``(burst, limit)`` in bytes of the tbf qdisc that shapes a link to ``bits`` bits/s.

    The bucket (``burst``) holds :data:`SHAPE_BURST_S` of the rate, at least
    :data:`SHAPE_MIN_BURST` (a 64 KiB GSO packet larger than the bucket would be cut
    into segments on every enqueue); the queue behind it (``limit - burst``)
    :data:`SHAPE_QUEUE_S` of the rate, at least :data:`SHAPE_MIN_QUEUE`.
    """
    rate = bits // 8
    burst = max(SHAPE_MIN_BURST, int(rate * SHAPE_BURST_S))
    return burst, burst + max(SHAPE_MIN_QUEUE, int(rate * SHAPE_QUEUE_S))


def _tc(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["tc", *(("-n", netns) if netns else ()), *args]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ClusterError("shaping links needs `tc` (iproute2), which is not installed") from None
    if check and res.returncode != 0:
        raise ClusterError(
            f"`{' '.join(argv)}` failed: {res.stderr.strip() or res.returncode} "
            "(shaping needs the kernel's tbf qdisc, CONFIG_NET_SCH_TBF)"
        )
    return res


def _ends(h: Host) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
    """The two ends of host h's veth as (device, namespace): the bridge port, then dk0 inside the host."""
    return (h.link, None), (IFNAME, h.name)


def _root_tbf(dev: str, netns: str | None) -> int | None:
    """The rate in bits/s of the tbf qdisc at the root of ``dev``, None when there is none."""
    if shutil.which("tc") is None:
        return None
    res = _tc("-j", "qdisc", "show", "dev", dev, netns=netns, check=False)
    try:
        qdiscs = json.loads(res.stdout or "[]")
    except ValueError:
        return None
    for q in qdiscs:
        if q.get("kind") == "tbf" and q.get("root"):
            return int(q.get("options", {}).get("rate", 0)) * 8
    return None


def link_rates(h: Host | str | int) -> tuple[int | None, int | None]:
    """The shaped rates of host ``h``'s link in bits/s: ``(towards the host, from the host)``.

    The first is the tbf on the bridge port ``dkv<i>`` (what the host receives),
    the second the tbf on ``dk0`` inside the host (what it sends); None where
    that end is not shaped (or the host is not up).
    """
    hh = resolve_host(h)
    return tuple(_root_tbf(dev, ns) for dev, ns in _ends(hh))  # type: ignore[return-value]


def _apply_rate(hosts: Sequence[Host], bits: int | None) -> None:
    """Shape both ends of every host's veth to ``bits`` bits/s (replace), or remove the shaping (None)."""
    if bits is None:
        if shutil.which("tc") is None:
            return
        for h in hosts:
            for dev, ns in _ends(h):
                if _root_tbf(dev, ns) is not None:
                    _tc("qdisc", "del", "dev", dev, "root", netns=ns)
        return
    burst, limit = tbf_params(bits)
    for h in hosts:
        for dev, ns in _ends(h):
            _tc(
                "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{bits}bit", "burst", str(burst), "limit", str(limit),
                netns=ns,
            )  # fmt: skip
            if _root_tbf(dev, ns) != bits:
                raise ClusterError(f"the kernel did not shape {dev} to {format_rate(bits)}: `tc qdisc show` differs")


def shape(rate: str | None) -> Cluster:
    """Shape (or unshape: None) every host's link of the cluster that is up now, in both directions.

    :func:`up` and :func:`session` do this; call it directly only on a cluster you hold.

    Parameters
    ----------
    rate : str or None
        A rate in tc's syntax (:func:`parse_rate`), or None to remove the shaping.

    Returns
    -------
    Cluster
        The cluster, with its new rate.

    Raises
    ------
    ClusterError
        If no cluster is up, ``tc`` is missing or the kernel refuses the qdisc.
    TypeError, ValueError
        If ``rate`` is not a valid rate (:func:`parse_rate`).
    """
    bits = None if rate is None else parse_rate(rate)
    c = current()
    if c is None:
        raise ClusterError("no simulated cluster is up")
    _apply_rate(c.hosts, bits)
    return Cluster(c.hosts, bits)


#: measure_tcp's default duration of the stream, seconds (and the most it accepts)
MEASURE_SECONDS = 2.0
MEASURE_MAX_SECONDS = 60.0
#: the receiving end: listen on the host's address, count the bytes from the first to the last
_RECEIVER = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 0))
s.settimeout(float(sys.argv[2]))
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.settimeout(float(sys.argv[2]))
buf = bytearray(1 << 22)
first = c.recv_into(buf)
t0 = time.perf_counter()
n = 0
while first:
    k = c.recv_into(buf)
    if not k:
        break
    n += k
t1 = time.perf_counter()
c.close()
print(n, t1 - t0, flush=True)
"""
#: the sending end: send zeros for a while (or a number of bytes), then close and wait for the receiver
_SENDER = """
import socket, sys, time
addr, port, seconds, nbytes, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
c = socket.create_connection((addr, port), timeout=timeout)
buf = memoryview(bytes(1 << 20))
end = time.monotonic() + seconds
sent = 0
while sent < nbytes and time.monotonic() < end:
    k = min(len(buf), nbytes - sent)
    c.sendall(buf[:k])
    sent += k
c.shutdown(socket.SHUT_WR)
c.recv(1)
"""


def measure_tcp(
    src: Host | str | int,
    dst: Host | str | int,
    *,
    seconds: float = MEASURE_SECONDS,
    nbytes: int | None = None,
    timeout: float | None = None,
) -> float:
    """Goodput in bytes/s of one TCP stream from host ``src`` to host ``dst`` of the cluster that is up.

    A Python receiver on ``dst`` listens on its cluster address; a Python
    sender on ``src`` sends for ``seconds`` (or ``nbytes``, whichever ends
    first) and closes. The receiver counts the payload from its first read to
    the end of the stream. Both run through :func:`exec_prefix` and are
    killed and reaped on a timeout. On a shaped link expect about 95.6 % of
    the rate: tbf counts every frame's Ethernet, IP and TCP headers (1514
    bytes on the link carry 1448 of payload, with TCP timestamps).

    Parameters
    ----------
    src, dst : Host, str or int
        Two different hosts of the cluster that is up.
    seconds : float
        How long the sender sends, ``(0, MEASURE_MAX_SECONDS]``.
    nbytes : int, optional
        Stop after this many bytes instead, if sooner.
    timeout : float, optional
        Seconds before both ends are killed and the call fails (default ``seconds + 30``).

    Returns
    -------
    float
        Payload bytes per second received.

    Raises
    ------
    TypeError, ValueError
        On bad hosts, ``seconds``, ``nbytes`` or ``timeout``.
    ClusterError
        If a host is not up, or the stream fails or times out.
    """
    s, d = resolve_host(src), resolve_host(dst)
    if s == d:
        raise ValueError(f"src and dst are the same host {s.name}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(seconds).__name__}")
    if not 0 < seconds <= MEASURE_MAX_SECONDS:
        raise ValueError(f"seconds = {seconds} is out of range (0, {MEASURE_MAX_SECONDS}]")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int)):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes is not None and nbytes < 1 << 20:
        raise ValueError(f"nbytes = {nbytes} is below 1 MiB: too short to measure a link")
    if timeout is None:
        timeout = seconds + 30.0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > seconds:
        raise ValueError(f"timeout must be a number above seconds = {seconds}, got {timeout!r}")
    c = current()
    if c is None or s not in c.hosts or d not in c.hosts:
        raise ClusterError(f"hosts {s.name} and {d.name} are not both up")
    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen[str]] = []

    def start(h: Host, script: str, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [*exec_prefix(h), sys.executable, "-I", "-c", script, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        procs.append(p)
        return p

    try:
        rx = start(d, _RECEIVER, d.address, str(timeout))
        assert rx.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(rx.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise ClusterError(f"the receiver on {d.name} did not start within {timeout:.0f}s")
        port = rx.stdout.readline().strip()
        if not port.isdigit():
            raise ClusterError(f"the receiver on {d.name} failed: {rx.communicate(timeout=10)[1].strip()}")
        tx = start(s, _SENDER, d.address, port, str(seconds), str(nbytes or 1 << 62), str(timeout))
        try:
            out, err = rx.communicate(timeout=max(0.0, deadline - time.monotonic()))
            tx_err = tx.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
        except subprocess.TimeoutExpired:
            raise ClusterError(f"the TCP stream {s.name} -> {d.name} did not end within {timeout:.0f}s") from None
        if rx.returncode != 0 or tx.returncode != 0:
            raise ClusterError(
                f"the TCP stream {s.name} -> {d.name} failed: receiver {rx.returncode} {err.strip()!r}, "
                f"sender {tx.returncode} {tx_err.strip()!r}"
            )
        got, elapsed = out.split()
        if int(got) == 0 or float(elapsed) <= 0:
            raise ClusterError(f"the TCP stream {s.name} -> {d.name} carried too little to measure")
        return int(got) / float(elapsed)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=10)


# --------------------------------------------------------------------------- job settings


def read_env_file(path: Path = ENV_FILE) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
    return env


def job_env() -> dict[str, str]:
    """Every setting a job across the hosts needs: :data:`ENV_FILE` plus the cluster's network."""
    env = read_env_file()
    env.update(
        {
            # TCP between ranks and between PRRTE daemons only over the cluster's network
            # (a CIDR: valid in the root namespace, where mpiexec runs, and inside every host)
            "OMPI_MCA_btl_tcp_if_include": str(SUBNET),
            "PRTE_MCA_prte_if_include": str(SUBNET),
            # `sh AGENT`: an installed wheel may not keep the script's executable bit
            "PRTE_MCA_plm_ssh_agent": f"/bin/sh {AGENT}",
            "GLOO_SOCKET_IFNAME": IFNAME,
        }
    )
    return env


# --------------------------------------------------------------------------- up / down


def _hosts_lines(hosts: Sequence[Host]) -> list[str]:
    return [f"{h.address}\t{h.name}" for h in hosts]


def _check_subnet_free() -> None:
    """Refuse to run when an interface we did not make already uses the subnet."""
    res = _ip("-o", "-4", "addr", "show", check=False)
    for line in res.stdout.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        name, addr = fields[1], fields[3]
        try:
            iface = ipaddress.ip_interface(addr)
        except ValueError:
            continue
        if iface.ip in SUBNET and name != BRIDGE:
            raise ClusterError(
                f"the simulated cluster's subnet {SUBNET} is already in use on interface {name} ({addr}); "
                "refusing to touch a real network"
            )


def _write_root_hosts(hosts: Sequence[Host]) -> None:
    text = _strip_block(ETC_HOSTS.read_text())
    if not text.endswith("\n") and text:
        text += "\n"
    block = "\n".join([HOSTS_BEGIN, *_hosts_lines(hosts), HOSTS_END]) + "\n"
    _rewrite(ETC_HOSTS, text + block)


def _strip_block(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == HOSTS_BEGIN:
            inside = True
        elif line.rstrip("\n") == HOSTS_END and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def _rewrite(path: Path, text: str) -> None:
    """Rewrite in place (``/etc/hosts`` is often a bind mount that cannot be replaced by a rename)."""
    with open(path, "r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


def current() -> Cluster | None:
    """The simulated cluster that is up now (hosts dkh1..dkhN all present), else None.

    Its ``rate`` is read from the kernel: the rate of the tbf qdiscs when both
    ends of every host's link have one of the same rate, else None.
    """
    names = _namespaces()
    if not names:
        return None
    hosts = tuple(resolve_host(n) for n in names)
    if [h.index for h in hosts] != list(range(1, len(hosts) + 1)):
        return None
    rates = {r for h in hosts for r in link_rates(h)}
    return Cluster(hosts, rates.pop() if len(rates) == 1 else None)


def _healthy(c: Cluster) -> bool:
    """Every link of c is up, every hosts file and the /etc/hosts block are in place."""
    links = set(_links())
    if BRIDGE not in links or any(h.link not in links for h in c.hosts):
        return False
    res = _ip("-o", "link", "show", "master", BRIDGE, check=False)
    if any(h.link not in res.stdout or "state DOWN" in _line_of(res.stdout, h.link) for h in c.hosts):
        return False
    if any(r != c.rate for h in c.hosts for r in link_rates(h)):
        return False  # half shaped (a killed shape()) or shaped otherwise
    want = _hosts_lines(c.hosts)
    if not all(line in ETC_HOSTS.read_text().splitlines() for line in want):
        return False
    for h in c.hosts:
        f = NETNS_ETC / h.name / "hosts"
        if not f.is_file() or not all(line in f.read_text().splitlines() for line in want):
            return False
    return True


def _line_of(text: str, link: str) -> str:
    return next((line for line in text.splitlines() if f" {link}@" in line or f" {link}:" in line), "")


def up(n: int, rate: str | None = None) -> Cluster:
    """Bring up hosts dkh1..dkhN (idempotent: an identical healthy cluster is kept as is).

    Anything else left over (a different size, a half-made cluster of a
    killed run) is removed first. A healthy cluster of ``n`` idle hosts
    shaped otherwise is only re-shaped.

    Parameters
    ----------
    n : int
        Number of hosts, ``[1, MAX_HOSTS]``.
    rate : str, optional
        Shape every host's link to this rate in both directions (tc's syntax,
        :func:`parse_rate`: ``"100mbit"``, ``"10gbit"``): a tbf qdisc on both
        ends of its veth. None (default): unshaped.

    Returns
    -------
    Cluster
        The hosts and the rate.

    Raises
    ------
    ClusterError
        If the machine cannot host the cluster, ``tc`` is missing (with a
        rate), or a step fails (what was made is removed again).
    TypeError, ValueError
        If ``n`` is outside ``[1, MAX_HOSTS]`` or ``rate`` is not a valid rate.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n = {n} is out of range [1, {MAX_HOSTS}]")
    bits = None if rate is None else parse_rate(rate)
    reason = unavailable_reason()
    if reason:
        raise ClusterError(f"simulated cluster unavailable: {reason}")
    if bits is not None and shutil.which("tc") is None:
        raise ClusterError("shaping links needs `tc` (iproute2), which is not installed")
    want = Cluster(tuple(host(i) for i in range(1, n + 1)), bits)
    have = current()
    if have is not None and have.hosts == want.hosts and _healthy(have) and not any(host_pids(h) for h in have.hosts):
        if have.rate != bits:
            try:
                _apply_rate(want.hosts, bits)
            except BaseException:
                down()
                raise
        return want
    down()
    _check_subnet_free()
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        lines = _hosts_lines(want.hosts)
        for h in want.hosts:
            _ip("netns", "add", h.name)
            _ip("link", "add", h.link, "type", "veth", "peer", "name", IFNAME, "netns", h.name)
            _ip("link", "set", h.link, "master", BRIDGE)
            _ip("link", "set", h.link, "up")
            _ip("-n", h.name, "addr", "add", f"{h.address}/{SUBNET.prefixlen}", "dev", IFNAME)
            _ip("-n", h.name, "link", "set", IFNAME, "up")
            _ip("-n", h.name, "link", "set", "lo", "up")
            _ip("netns", "exec", h.name, "sh", "-c", f"echo {TCP_RETRIES2} > /proc/sys/net/ipv4/tcp_retries2")
            etc = NETNS_ETC / h.name
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(["127.0.0.1\tlocalhost", "::1\tlocalhost", *lines]) + "\n")
            # no name server inside the cluster: unknown names fail at once instead of waiting
            # on a resolver the namespace cannot reach
            (etc / "resolv.conf").write_text("# distkit simulated host: names come from /etc/hosts only\n")
        _write_root_hosts(want.hosts)
        _apply_rate(want.hosts, bits)
    except BaseException:
        down()
        raise
    return want


def down() -> list[str]:
    """Remove every qdisc, namespace, link, hosts file and hosts entry :func:`up` makes (idempotent).

    Processes still running on the hosts are killed first. Returns what was removed.
    """
    removed: list[str] = []
    names = _namespaces()
    pids = [p for n in names for p in host_pids(n)]
    _kill(pids)
    _wait_gone(pids)
    for dev, ns in _shaped_ends(names):  # they would go with their veths; removed first to say so
        if _tc("qdisc", "del", "dev", dev, "root", netns=ns, check=False).returncode == 0:
            removed.append(_qdisc_name(dev, ns))
    for n in names:
        if _ip("netns", "del", n, check=False).returncode == 0:
            removed.append(f"netns {n}")
    for link in _links():  # veths die with their namespace; the bridge (and strays) are removed here
        if _ip("link", "del", link, check=False).returncode == 0:
            removed.append(f"link {link}")
    if NETNS_ETC.is_dir():
        for d in NETNS_ETC.iterdir():
            if _HOST_RE.match(d.name):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"{d}")
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only when empty: other tools may keep files there
    if ETC_HOSTS.is_file():
        text = ETC_HOSTS.read_text()
        stripped = _strip_block(text)
        if stripped != text:
            _rewrite(ETC_HOSTS, stripped)
            removed.append(f"{ETC_HOSTS} block")
    return removed


def _shaped_ends(names: Sequence[str]) -> list[tuple[str, str | None]]:
    """Every veth end of the cluster (root ends of any dkv link, dk0 in the namespaces) with a tbf at its root."""
    if shutil.which("tc") is None:
        return []
    ends: list[tuple[str, str | None]] = [(link, None) for link in _links() if link != BRIDGE]
    ends += [(IFNAME, n) for n in names]
    return [(dev, ns) for dev, ns in ends if _root_tbf(dev, ns) is not None]


def _qdisc_name(dev: str, netns: str | None) -> str:
    return f"qdisc tbf dev {dev}" + (f" in {netns}" if netns else "")


def leftovers() -> list[str]:
    """What of a simulated cluster exists now (empty after :func:`down`)."""
    names = _namespaces()
    found = [_qdisc_name(dev, ns) for dev, ns in _shaped_ends(names)]
    found += [f"netns {n}" for n in names] + [f"link {link}" for link in _links()]
    if NETNS_ETC.is_dir():
        found += [str(d) for d in NETNS_ETC.iterdir() if _HOST_RE.match(d.name)]
    if ETC_HOSTS.is_file() and HOSTS_BEGIN in ETC_HOSTS.read_text():
        found.append(f"{ETC_HOSTS} block")
    return found


# --------------------------------------------------------------------------- session (lock + reaper)

_active: list[Cluster] = []  # the cluster of the session() this process holds, if any


def active() -> Cluster | None:
    """The cluster of the :func:`session` this process holds, or None."""
    return _active[-1] if _active else None


def _lock(wait: float) -> int:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            os.close(fd)
            raise ClusterError(f"the simulated cluster is in use by another process (see {STATE_DIR / 'lock'})")
        if not told:
            print(f"waiting for the simulated cluster held by another process ({STATE_DIR / 'lock'})", file=sys.stderr)
            told = True
        time.sleep(0.5)


def _cli_lock() -> int:
    """The lock for a command line (``up``, ``down``, ``measure``): refused while someone else holds it.

    A caller that holds the lock (a test's :func:`session`) can run the command line
    under it: it passes its open lock file as an inherited fd named by
    ``$DISTKIT_CLUSTER_LOCK_FD`` (flock belongs to that open file, so locking it again succeeds).
    """
    raw = os.environ.get(LOCK_FD_ENV, "")
    if raw.isdigit():
        fd = int(raw)
        try:
            st, want = os.fstat(fd), os.stat(STATE_DIR / "lock")
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return os.dup(fd)
        except OSError:
            pass
    return _lock(0.0)


@contextlib.contextmanager
def session(n: int, rate: str | None = None, *, wait: float = LOCK_WAIT_S) -> Iterator[Cluster]:
    """Hold the machine's simulated cluster of ``n`` hosts for the ``with`` block, then remove it.

    One session at a time per machine (a lock; another process waits up to
    ``wait`` seconds). A reaper process removes the cluster if this process
    dies without leaving the block (SIGKILL, ``os._exit``), and keeps the lock
    until it has. Nested sessions in one process share the outer cluster
    (which must be large enough); a nested session with another ``rate``
    re-shapes it for its block and restores the outer session's shaping after.

    Parameters
    ----------
    n : int
        Number of hosts.
    rate : str, optional
        Shape every host's link to this rate in both directions (tc's syntax,
        :func:`parse_rate`). None: unshaped, or in a nested session the
        outer session's shaping.
    wait : float
        Seconds to wait for another process's session to end.

    Yields
    ------
    Cluster
        The hosts and the rate.

    Raises
    ------
    ClusterError
        If the cluster cannot be brought up or shaped, or the lock is not free in time.
    TypeError, ValueError
        If ``rate`` is not a valid rate (or ``n`` not a valid size).
    """
    bits = None if rate is None else parse_rate(rate)
    outer = active()
    if outer is not None:
        if len(outer) < n:
            raise ClusterError(f"a session of {len(outer)} hosts is active; {n} were asked for")
        inner = outer if rate is None or bits == outer.rate else Cluster(outer.hosts, bits)
        if inner is not outer:
            _apply_rate(outer.hosts, bits)
        _active.append(inner)
        try:
            yield inner
        finally:
            _active.pop()
            if inner is not outer:
                _apply_rate(outer.hosts, outer.rate)
        return
    fd = _lock(wait)
    reaper: subprocess.Popen[bytes] | None = None
    tell = -1
    try:
        r, tell = os.pipe()
        reaper = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve()), "_reap", str(r)],
            pass_fds=(r, fd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        os.close(r)
        c = up(n, rate)
        _active.append(c)
        try:
            yield c
        finally:
            _active.pop()
    finally:
        try:
            down()
        finally:
            if reaper is not None:
                with contextlib.suppress(OSError):
                    os.write(tell, b"q")  # we cleaned up: the reaper leaves without touching anything
                with contextlib.suppress(subprocess.TimeoutExpired):
                    reaper.wait(timeout=10)
            if tell >= 0:
                os.close(tell)
            os.close(fd)  # releases the lock (the reaper's copy is gone with it)


def _reap(fd: int) -> int:
    """Reaper: wait for the session's owner; if it died without saying 'q', remove the cluster."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C at the terminal must not stop the cleanup
    try:
        data = os.read(fd, 1)
    except OSError:
        data = b""
    if data != b"q":
        down()
    return 0


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="cluster", description="The distkit simulated cluster (network namespaces).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="bring up hosts dkh1..dkhN (idempotent)")
    p_up.add_argument("n", type=int)
    p_up.add_argument("--rate", help="shape every host's link to this rate, both directions (tc syntax: 1gbit)")
    sub.add_parser("down", help="remove everything `up` made (idempotent)")
    sub.add_parser("status", help="hosts, addresses, links and processes")
    sub.add_parser("check", help="say whether this machine can host the cluster")
    sub.add_parser("env", help="print the settings of a job across the hosts, as shell `export` lines")
    p_measure = sub.add_parser("measure", help="goodput of one TCP stream from one host to another")
    p_measure.add_argument("src")
    p_measure.add_argument("dst")
    p_measure.add_argument("--seconds", type=float, default=MEASURE_SECONDS)
    p_exec = sub.add_parser("exec", help="run a command on a host")
    p_exec.add_argument("host")
    p_exec.add_argument("command", nargs=argparse.REMAINDER)
    p_reap = sub.add_parser("_reap")
    p_reap.add_argument("fd", type=int)
    a = parser.parse_args(argv)
    try:
        if a.cmd == "_reap":
            return _reap(a.fd)
        if a.cmd == "check":
            reason = unavailable_reason()
            print(
                f"simulated cluster unavailable: {reason}" if reason else "this machine can host the simulated cluster"
            )
            return 1 if reason else 0
        if a.cmd == "env":
            for key, value in job_env().items():
                print(f"export {key}={shlex.quote(value)}")
            return 0
        if a.cmd == "up":
            fd = _cli_lock()  # refuse while a test session holds the cluster
            try:
                c = up(a.n, a.rate)
            finally:
                os.close(fd)
            for h in c.hosts:
                print(f"{h.name}\t{h.address}\tlink {h.link}")
            if c.rate is not None:
                print(f"every link shaped to {format_rate(c.rate)} in both directions")
            return 0
        if a.cmd == "measure":
            fd = _cli_lock()  # never disturb a test session's cluster
            try:
                bps = measure_tcp(a.src, a.dst, seconds=a.seconds)
            finally:
                os.close(fd)
            print(f"{resolve_host(a.src).name} -> {resolve_host(a.dst).name}: {bps * 8 / 1e6:.1f} Mbit/s TCP goodput")
            return 0
        if a.cmd == "down":
            fd = _cli_lock()
            try:
                for item in down():
                    print(f"removed {item}")
            finally:
                os.close(fd)
            return 0
        if a.cmd == "status":
            now = current()
            if now is None:
                left = leftovers()
                print("no simulated cluster" + (f" (leftovers: {', '.join(left)})" if left else ""))
                return 0
            links = _ip("-o", "link", "show", "master", BRIDGE, check=False).stdout
            for h in now.hosts:
                state = "DOWN" if "state DOWN" in _line_of(links, h.link) else "up"
                rates = "/".join("unshaped" if r is None else format_rate(r) for r in link_rates(h))
                shaped = "unshaped" if rates == "unshaped/unshaped" else f"in/out {rates}"
                print(f"{h.name}\t{h.address}\tlink {h.link} {state}\tprocesses {len(host_pids(h))}\t{shaped}")
            if now.rate is not None:
                print(f"links: shaped to {format_rate(now.rate)} in both directions")
            elif any(r is not None for h in now.hosts for r in link_rates(h)):
                print("links: shaped unevenly (`up N --rate R` re-shapes them)")
            else:
                print("links: unshaped")
            return 0
        if a.cmd == "exec":
            if not a.command:
                parser.error("exec needs a command")
            return subprocess.call([*exec_prefix(a.host), *a.command])
    except (ClusterError, ValueError, TypeError) as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
