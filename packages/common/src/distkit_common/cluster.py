"""A simulated cluster on one Linux machine: N hosts as network namespaces.

Host ``i`` (1-based) is the network namespace ``dkh<i>`` with the address
``10.213.0.<i>/24`` on its interface ``dk0``, a veth whose other end ``dkv<i>``
is a port of the bridge ``dkbr0`` (``10.213.0.254``) in the root namespace.
Every command run on a host also gets a UTS namespace of its own whose
hostname is the host's name, so ``socket.gethostname()`` differs per host, as
on a real cluster. Every host resolves every other host (``/etc/netns/<host>/
hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``), and so does the
root namespace (a marked block in ``/etc/hosts``, removed by :func:`down`).

Nothing leaves the machine: the namespaces have no default route, the bridge
has no uplink, and :func:`up` refuses to start when the subnet is already used
by an interface it did not make.

Needs root, ``ip`` (iproute2) and ``unshare`` (util-linux). Only the standard
library is used, so this file also runs as a script from a source checkout
(``ci/cluster/up``)::

    python3 cluster.py up 3         # hosts dkh1..dkh3 (idempotent)
    python3 cluster.py exec dkh2 hostname
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
import os
import re
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
    """The simulated cluster that is up now (hosts dkh1..dkhN all present), else None."""
    names = _namespaces()
    if not names:
        return None
    hosts = tuple(resolve_host(n) for n in names)
    if [h.index for h in hosts] != list(range(1, len(hosts) + 1)):
        return None
    return Cluster(hosts)


def _healthy(c: Cluster) -> bool:
    """Every link of c is up, every hosts file and the /etc/hosts block are in place."""
    links = set(_links())
    if BRIDGE not in links or any(h.link not in links for h in c.hosts):
        return False
    res = _ip("-o", "link", "show", "master", BRIDGE, check=False)
    if any(h.link not in res.stdout or "state DOWN" in _line_of(res.stdout, h.link) for h in c.hosts):
        return False
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


def up(n: int) -> Cluster:
    """Bring up hosts dkh1..dkhN (idempotent: an identical healthy cluster is kept as is).

    Anything else left over (a different size, a half-made cluster of a
    killed run) is removed first.

    Raises
    ------
    ClusterError
        If the machine cannot host the cluster or a step fails (what was
        made is removed again).
    ValueError
        If ``n`` is outside ``[1, MAX_HOSTS]``.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n = {n} is out of range [1, {MAX_HOSTS}]")
    reason = unavailable_reason()
    if reason:
        raise ClusterError(f"simulated cluster unavailable: {reason}")
    want = Cluster(tuple(host(i) for i in range(1, n + 1)))
    have = current()
    if have == want and _healthy(have) and not any(host_pids(h) for h in have.hosts):
        return have
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
    except BaseException:
        down()
        raise
    return want


def down() -> list[str]:
    """Remove every namespace, link, hosts file and hosts entry :func:`up` makes (idempotent).

    Processes still running on the hosts are killed first. Returns what was removed.
    """
    removed: list[str] = []
    names = _namespaces()
    pids = [p for n in names for p in host_pids(n)]
    _kill(pids)
    _wait_gone(pids)
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


def leftovers() -> list[str]:
    """What of a simulated cluster exists now (empty after :func:`down`)."""
    found = [f"netns {n}" for n in _namespaces()] + [f"link {link}" for link in _links()]
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


@contextlib.contextmanager
def session(n: int, *, wait: float = LOCK_WAIT_S) -> Iterator[Cluster]:
    """Hold the machine's simulated cluster of ``n`` hosts for the ``with`` block, then remove it.

    One session at a time per machine (a lock; another process waits up to
    ``wait`` seconds). A reaper process removes the cluster if this process
    dies without leaving the block (SIGKILL, ``os._exit``), and keeps the lock
    until it has. Nested sessions in one process share the outer cluster
    (which must be large enough).

    Raises
    ------
    ClusterError
        If the cluster cannot be brought up, or the lock is not free in time.
    """
    outer = active()
    if outer is not None:
        if len(outer) < n:
            raise ClusterError(f"a session of {len(outer)} hosts is active; {n} were asked for")
        _active.append(outer)
        try:
            yield outer
        finally:
            _active.pop()
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
        c = up(n)
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
    sub.add_parser("down", help="remove everything `up` made (idempotent)")
    sub.add_parser("status", help="hosts, addresses, links and processes")
    sub.add_parser("check", help="say whether this machine can host the cluster")
    sub.add_parser("env", help="print the settings of a job across the hosts, as shell `export` lines")
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
            fd = _lock(0.0)  # refuse while a test session holds the cluster
            try:
                c = up(a.n)
            finally:
                os.close(fd)
            for h in c.hosts:
                print(f"{h.name}\t{h.address}\tlink {h.link}")
            return 0
        if a.cmd == "down":
            fd = _lock(0.0)
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
                print(f"{h.name}\t{h.address}\tlink {h.link} {state}\tprocesses {len(host_pids(h))}")
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
