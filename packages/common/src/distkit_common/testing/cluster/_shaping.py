"""The shaped links of the simulated hosts: a tbf qdisc on both ends of every host's veth."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence

from ...rates import format_rate
from ._hosts import IFNAME, ClusterError, Host, resolve_host

#: the share of a shaped link's rate that one TCP stream carries as payload: tbf counts every
#: frame as 14 (Ethernet) + 20 (IP) + 32 (TCP with timestamps) + 1448 payload bytes (MTU 1500)
TCP_GOODPUT_SHARE = 1448 / 1514
#: tbf's bucket: SHAPE_BURST_S of the rate, at least SHAPE_MIN_BURST bytes (two 64 KiB GSO packets)
SHAPE_BURST_S = 0.004
SHAPE_MIN_BURST = 128 * 1024
#: tbf's queue beyond the bucket: SHAPE_QUEUE_S of the rate (tc's ``latency``), at least SHAPE_MIN_QUEUE bytes
SHAPE_QUEUE_S = 0.05
SHAPE_MIN_QUEUE = 1024 * 1024


def tbf_params(bits: int) -> tuple[int, int]:
    """Return ``(burst, limit)`` in bytes of the tbf qdisc that shapes a link to ``bits`` bits/s.

    The bucket (``burst``) holds :data:`SHAPE_BURST_S` of the rate, at least
    :data:`SHAPE_MIN_BURST` (a 64 KiB GSO packet larger than the bucket would be cut
    into segments on every enqueue); the queue behind it (``limit - burst``)
    :data:`SHAPE_QUEUE_S` of the rate, at least :data:`SHAPE_MIN_QUEUE`.

    Parameters
    ----------
    bits : int
        The rate in bits/s.

    Returns
    -------
    burst : int
        The bucket, in bytes.
    limit : int
        Bucket plus queue, in bytes.
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
    """Return the shaped rates of host ``h``'s link in bits/s: ``(towards the host, from the host)``.

    The first is the tbf on the bridge port ``dkv<i>`` (what the host receives),
    the second the tbf on ``dk0`` inside the host (what it sends); None where
    that end is not shaped (or the host is not up).

    Parameters
    ----------
    h : Host, str or int
        The host: itself, its name (``"dkh2"``) or its 1-based index.

    Returns
    -------
    tuple of (int or None, int or None)
        The two rates.

    Raises
    ------
    TypeError, ValueError
        If ``h`` names no simulated host.
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
