"""Which machine this process runs on, and how peers on other machines reach it.

Two ranks are on one node, and may share a HOST / CHUNKED / DEVICE tensor, only when
:func:`distkit_common.node.node_key` says so (the same hostname, boot id and
``/dev/shm``; ``$DISTKIT_NODE_ID`` makes ranks of one machine act as separate nodes
in tests), the decision kvps makes too.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from distkit_common.node import node_key, node_label

#: the address a rendezvous store started in this process is advertised under
HOST_ENV = "WHOLEMEM_HOST"
#: Linux ioctl reading an interface's IPv4 address (netdevice(7))
_SIOCGIFADDR = 0x8915
#: any port: connecting a UDP socket sends nothing, it only picks the route and source address
_PROBE_PORT = 9


@dataclass(frozen=True)
class NodeInfo:
    """What a rank tells its peers about its machine when a communicator is made."""

    key: str  # equal on ranks that share memory
    label: str  # how errors name the node (its hostname)
    addresses: list[str]  # IP addresses peers may see this rank's connections come from

    def to_json(self) -> list[object]:
        return [self.key, self.label, self.addresses]

    @staticmethod
    def from_json(obj: object) -> NodeInfo:
        if not (isinstance(obj, list) and len(obj) == 3 and isinstance(obj[2], list)):
            raise ValueError(f"malformed node description from a peer: {obj!r}")
        return NodeInfo(str(obj[0]), str(obj[1]), [str(a) for a in obj[2]])


def _interface_address(name: str) -> str | None:
    """IPv4 address of network interface ``name`` (Linux), or None."""
    with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    return None


def _resolve(name: str) -> list[str]:
    with contextlib.suppress(OSError, UnicodeError):
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})
    return []


def _route_source(host: str) -> str | None:
    """The local address this machine's connections to ``host`` leave from (nothing is sent)."""
    for family, _, _, _, addr in _getaddrinfo_udp(host):
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr[0], _PROBE_PORT))
            return str(s.getsockname()[0])
    return None


def _getaddrinfo_udp(host: str) -> list[tuple]:
    try:
        return list(socket.getaddrinfo(host, _PROBE_PORT, type=socket.SOCK_DGRAM))
    except (OSError, UnicodeError):
        return []


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def local_node() -> NodeInfo:
    """This process's :class:`NodeInfo`."""
    addresses = set(_resolve(socket.gethostname()))
    # gloo binds the interface GLOO_SOCKET_IFNAME names (else the hostname's address)
    for name in filter(None, os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")):
        addr = _interface_address(name.strip())
        if addr:
            addresses.add(addr)
    master = os.environ.get("MASTER_ADDR")
    if master:
        src = _route_source(master)
        if src:
            addresses.add(src)
    return NodeInfo(node_key(), node_label(), sorted(a for a in addresses if not _is_loopback(a)))


def advertised_host() -> str:
    """The address under which peers, on this node or others, reach a store started here.

    ``$WHOLEMEM_HOST`` if set; else, in a job with ``MASTER_ADDR`` (torchrun, or set by
    hand), this machine's address on the route towards it (``MASTER_ADDR`` itself when
    it is a loopback address: a one-machine job); else the hostname if it resolves,
    else ``127.0.0.1``. Advertising ``MASTER_ADDR`` from a process on another machine
    would send the peers to the wrong host.
    """
    explicit = os.environ.get(HOST_ENV)
    if explicit:
        return explicit
    master = os.environ.get("MASTER_ADDR")
    if master:
        resolved = _resolve(master)
        if resolved and all(_is_loopback(a) for a in resolved):
            return master
        src = _route_source(master)
        if src:
            return src
    name = socket.gethostname()
    return name if _resolve(name) else "127.0.0.1"
