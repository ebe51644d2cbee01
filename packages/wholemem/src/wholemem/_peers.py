"""Turning a failed collective into an error that names the lost peer.

When a rank or a whole host of a job is lost, gloo reports it on the survivors as
``Read error [10.213.0.2]:51234: Connection reset by peer`` (a peer process died: its
sockets closed) or, when the peer vanished without closing them (a host cut off the
network), ``Timed out waiting 20000ms for recv operation to complete`` after the
group's timeout. Neither names a rank or a host. Every communicator knows the host
name and addresses of each of its ranks (exchanged when it was made), so the address
in gloo's message is mapped back to the host and its ranks here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._node import NodeInfo

_ADDRESS = re.compile(r"\[?((?:\d{1,3}\.){3}\d{1,3})\]?")
_TIMEOUT_HINT = (
    "the communicator's timeout is create_communicator(timeout=...) / communicator_from_mpi4py(timeout=...), "
    "or the process group's for communicator_from_process_group; distkit_common.heartbeat names a lost host "
    "within seconds"
)


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def hosts_of(nodes: Sequence[NodeInfo], ranks: Sequence[int] | None = None) -> str:
    """``"dkh1 (ranks 0, 1), dkh2 (ranks 2, 3)"`` for the given ranks (default: all)."""
    groups: dict[str, list[int]] = {}
    for r in range(len(nodes)) if ranks is None else ranks:
        groups.setdefault(nodes[r].label, []).append(r)
    return ", ".join(f"{label} ({_ranks_text(rs)})" for label, rs in groups.items())


def describe_failure(
    what: str, rank: int, nodes: Sequence[NodeInfo], timeout_s: float | None, exc: BaseException
) -> str:
    """The message of the error a failed collective raises on ``rank``."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    me = f"wholemem {what}: rank {rank} on {nodes[rank].label}"
    peers = [r for r in range(len(nodes)) if r != rank]
    named = []
    for addr in dict.fromkeys(_ADDRESS.findall(str(exc))):
        owners = [r for r in peers if addr in nodes[r].addresses]
        if owners:
            named.append(f"{nodes[owners[0]].label} ({addr}; {_ranks_text(owners)} of this communicator)")
    if named:
        return (
            f"{me} lost its connection to {', '.join(named)}: {first}. A process or host of the job was lost; "
            "the job cannot go on"
        )
    if "timed out" in first.lower() or "timeout" in first.lower():
        within = f" within {timeout_s:g} s" if timeout_s else ""
        return (
            f"{me} got no answer{within} from its peers ({hosts_of(nodes, peers)}): {first}. A rank may be lost, "
            f"its host cut off, or it is slower than the timeout ({_TIMEOUT_HINT})"
        )
    return f"{me} failed to communicate with its peers ({hosts_of(nodes, peers)}): {first}"
