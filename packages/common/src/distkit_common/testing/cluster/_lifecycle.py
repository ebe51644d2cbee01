"""Bringing the simulated cluster up and down, reading what is up, and the settings of a job across it."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
from collections.abc import Sequence
from pathlib import Path

from ...rates import parse_rate
from ._hosts import (
    _HOST_RE,
    AGENT,
    BRIDGE,
    BRIDGE_ADDRESS,
    ENV_FILE,
    ETC_HOSTS,
    HOSTS_BEGIN,
    HOSTS_END,
    IFNAME,
    NETNS_ETC,
    SUBNET,
    TCP_RETRIES2,
    Cluster,
    ClusterError,
    Host,
    _check_count,
    _ip,
    _kill,
    _links,
    _namespaces,
    _wait_gone,
    host,
    host_pids,
    resolve_host,
    unavailable_reason,
)
from ._shaping import _apply_rate, _root_tbf, _tc, link_rates

# --------------------------------------------------------------------------- job settings


def read_env_file(path: Path = ENV_FILE) -> dict[str, str]:
    """Read the KEY=VALUE lines of an env file (comments and blank lines skipped).

    Parameters
    ----------
    path : pathlib.Path
        The file; :data:`ENV_FILE` by default.

    Returns
    -------
    dict of str to str
        The settings, in file order.

    Raises
    ------
    OSError
        If the file cannot be read.
    """
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
    return env


def job_env() -> dict[str, str]:
    """Return every setting a job across the hosts needs: :data:`ENV_FILE` plus the cluster's network.

    Returns
    -------
    dict of str to str
        Environment variables (Open MPI / PRRTE interfaces and launch agent, ``GLOO_SOCKET_IFNAME``, ...).
    """
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
    """Return the simulated cluster that is up now (hosts dkh1..dkhN all present).

    Its ``rate`` is read from the kernel: the rate of the tbf qdiscs when both
    ends of every host's link have one of the same rate, else None.

    Returns
    -------
    Cluster or None
        The cluster, or None when none is up.
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
    _check_count(n)
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

    Processes still running on the hosts are killed first.

    Returns
    -------
    list of str
        What was removed.
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
    """List what of a simulated cluster exists now (empty after :func:`down`).

    Returns
    -------
    list of str
        Namespaces, links, qdiscs, hosts files and the ``/etc/hosts`` block that remain.
    """
    names = _namespaces()
    found = [_qdisc_name(dev, ns) for dev, ns in _shaped_ends(names)]
    found += [f"netns {n}" for n in names] + [f"link {link}" for link in _links()]
    if NETNS_ETC.is_dir():
        found += [str(d) for d in NETNS_ETC.iterdir() if _HOST_RE.match(d.name)]
    if ETC_HOSTS.is_file() and HOSTS_BEGIN in ETC_HOSTS.read_text():
        found.append(f"{ETC_HOSTS} block")
    return found


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
